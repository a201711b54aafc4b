"""Parameter groups with their own weight decay, as Hugging Face's Trainer builds them (no
decay on biases and norm weights): the engine decays per tensor, and training equals a
PyTorch reference that does the same (fp32, within 2x the distance between an fp32-math and
an fp64-math reference), and not one that decays everything."""
from __future__ import annotations

import pytest
import torch

import zoffload
from models import MAKERS, batches, loss_of
from reference import ReferenceTrainer
from test_models import config, rel_err

WD = 0.5  # large, so that decaying the wrong tensors shows far above rounding
STEPS = 8


def hf_groups(model):
    """transformers.Trainer.get_decay_parameter_names: every weight but biases and norms."""
    mods = dict(model.named_modules())
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        owner = type(mods[n.rpartition(".")[0]]).__name__
        (no_decay if n.endswith("bias") or "Norm" in owner else decay).append((n, p))
    return decay, no_decay


def start(model, groups, groups_as, cfg):
    """zoffload over the groups, given as a client AdamW's or as model_parameters."""
    if groups_as == "optimizer":
        cfg.pop("optimizer")
        opt = torch.optim.AdamW(groups, lr=3e-3, weight_decay=WD)
        eng, zopt, _, _ = zoffload.initialize(model=model, optimizer=opt, config=cfg)
    else:
        eng, zopt, _, _ = zoffload.initialize(model=model, model_parameters=groups, config=cfg)
    return eng, zopt


def run_steps(eng, fn, data):
    losses = []
    for b in data:
        loss = fn(eng, b)
        losses.append(loss.item())
        eng.backward(loss)
        eng.step()
    return losses


def train(kind, groups_as, math=None, uniform=False, tiles=False):
    model = MAKERS[kind]()
    decay, no_decay = hf_groups(model)
    assert decay and no_decay
    fn = loss_of(kind, torch.float32)
    data = batches(kind, STEPS)
    if math is not None:
        own = {} if uniform else {n: 0.0 for n, _ in no_decay}
        ref = ReferenceTrainer(model, torch.float32, lr=3e-3, weight_decay=WD, math_dtype=math,
                               decay_of=own)
        return [ref.step([b], fn)[0] for b in data], ref.master
    cfg = config("fp32", **({"tile_size": 16 << 10} if tiles else {}))
    cfg["optimizer"]["params"]["weight_decay"] = WD
    groups = [{"params": [p for _, p in decay]},
              {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
    eng, zopt = start(model, groups, groups_as, cfg)
    assert sorted(g["weight_decay"] for g in zopt.param_groups) == [0.0, WD]
    assert len(eng.effective_config()["optimizer"]["own_weight_decay"]) == len(no_decay)
    losses = run_steps(eng, fn, data)
    names = [n for n, _ in decay + no_decay]
    weights = {n: eng.master_weight(n) for n in names}
    eng.destroy()
    return losses, weights


@pytest.mark.parametrize("kind,groups_as", [("gpt2", "model_parameters"), ("llama", "optimizer"),
                                            ("gpt2", "tiled")])
def test_group_weight_decay_equals_reference(kind, groups_as):
    zl, zw = train(kind, "optimizer" if groups_as == "optimizer" else "model_parameters",
                   tiles=groups_as == "tiled")
    rl32, rw32 = train(kind, None, torch.float32)
    rl64, rw64 = train(kind, None, torch.float64)
    _, uw = train(kind, None, torch.float64, uniform=True)
    spread = rel_err(rw32, rw64)
    err, wrong = rel_err(zw, rw64), rel_err(uw, rw64)
    print(f"{kind} {groups_as}: weight err {err:.3g} (spread {spread:.3g}); decaying every "
          f"tensor would be {wrong:.3g} away")
    assert err <= max(2 * spread, 1e-6)
    assert wrong > 100 * max(2 * spread, 1e-6)  # the test sees a decay applied to the wrong tensors
    assert zl[0] == pytest.approx(rl32[0], rel=1e-6)


def own_groups(model):
    """Three groups as LLRD-style fine-tuning builds them: the first half of the decayed
    weights at the optimizer's settings, the second half at 3x the rate with another eps,
    the undecayed at half the rate with their own betas (name -> settings for the
    reference, and the groups for zoffload)."""
    decay, no_decay = hf_groups(model)
    half = len(decay) // 2
    fast = {"lr": 9e-3, "eps": 1e-6}
    slow = {"lr": 1.5e-3, "betas": (0.8, 0.95), "weight_decay": 0.0}
    groups = [{"params": [p for _, p in decay[:half]]},
              {"params": [p for _, p in decay[half:]], **fast},
              {"params": [p for _, p in no_decay], **slow}]
    own = {n: fast for n, _ in decay[half:]}
    own.update((n, {k: v for k, v in slow.items() if k != "weight_decay"}) for n, _ in no_decay)
    return groups, own, {n: 0.0 for n, _ in no_decay}


def train_own(kind, groups_as, math=None, ignore_own=False):
    model = MAKERS[kind]()
    groups, own, decays = own_groups(model)
    fn = loss_of(kind, torch.float32)
    data = batches(kind, STEPS)
    if math is not None:
        ref = ReferenceTrainer(model, torch.float32, lr=3e-3, weight_decay=WD, math_dtype=math,
                               decay_of=decays, group_of={} if ignore_own else own)
        return [ref.step([b], fn)[0] for b in data], ref.master
    cfg = config("fp32")
    cfg["optimizer"]["params"]["weight_decay"] = WD
    eng, zopt = start(model, groups, groups_as, cfg)
    pg = zopt.param_groups
    assert [g["lr"] for g in pg] == pytest.approx([3e-3, 9e-3, 1.5e-3], rel=1e-7)
    assert eng.get_lr() == [g["lr"] for g in pg]
    assert [tuple(g["betas"]) for g in pg][2] == pytest.approx((0.8, 0.95))
    assert [g["eps"] for g in pg][1] == 1e-6
    assert len(eng.effective_config()["optimizer"]["own_adam"]) == len(own)
    losses = run_steps(eng, fn, data)
    weights = {n: eng.master_weight(n) for n in own.keys() | decays.keys()}
    eng.destroy()
    return losses, weights


@pytest.mark.parametrize("kind,groups_as", [("gpt2", "model_parameters"), ("llama", "optimizer")])
def test_group_own_lr_betas_eps_equal_reference(kind, groups_as):
    """Groups with their own lr, betas and eps (the engine's rate scale, betas and eps per
    tensor) train as the reference that gives each group its own, within 2x the fp32/fp64
    references' spread, and far from the reference that ignores them."""
    zl, zw = train_own(kind, groups_as)
    rl32, rw32 = train_own(kind, None, torch.float32)
    rl64, rw64 = train_own(kind, None, torch.float64)
    _, iw = train_own(kind, None, torch.float64, ignore_own=True)
    pick = lambda w: {n: w[n] for n in zw}
    spread = rel_err(pick(rw32), pick(rw64))
    err, wrong = rel_err(zw, pick(rw64)), rel_err(pick(iw), pick(rw64))
    print(f"{kind} {groups_as}: weight err {err:.3g} (spread {spread:.3g}); ignoring the "
          f"groups' settings would be {wrong:.3g} away")
    assert err <= max(2 * spread, 1e-6)
    assert wrong > 100 * max(2 * spread, 1e-6)
    assert zl == pytest.approx(rl32, rel=1e-5)


def test_group_lr_under_schedules():
    """DeepSpeed's WarmupLR sets every group's lr to its rate (a group's own lr is replaced,
    with a warning naming it); WarmupCosineLR scales each group's own."""
    model = MAKERS["gpt2"]()
    groups, _, _ = own_groups(model)
    cfg = config("fp32")
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
                                                       "warmup_max_lr": 3e-3,
                                                       "warmup_num_steps": 4}}
    with pytest.warns(UserWarning) as rec:
        eng, _, _, _ = zoffload.initialize(model=model, model_parameters=groups, config=cfg)
    said = sorted(str(w.message).split(" is replaced")[0] for w in rec)
    assert said == ["parameter group 1's lr 0.009", "parameter group 2's lr 0.0015"]
    lrs = eng.get_lr()
    assert lrs[0] == lrs[1] == lrs[2]
    eng.destroy()
    model = MAKERS["gpt2"]()
    groups, _, _ = own_groups(model)
    cfg = config("fp32")
    cfg["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": 10,
                                                             "warmup_num_steps": 3}}
    eng, _, _, _ = zoffload.initialize(model=model, model_parameters=groups, config=cfg)
    fn, data = loss_of("gpt2", torch.float32), batches("gpt2", 4)
    seen = []
    for b in data:
        run_steps(eng, fn, [b])
        lrs = eng.get_lr()
        seen.append(lrs[0])
        if lrs[0] > 0:  # the warmup starts at warmup_min_ratio 0
            assert lrs[1] / lrs[0] == pytest.approx(3.0, rel=1e-6)
            assert lrs[2] / lrs[0] == pytest.approx(0.5, rel=1e-6)
    assert len(set(seen)) == len(seen) and sum(x > 0 for x in seen) >= 2  # it moves
    eng.destroy()


@pytest.mark.parametrize("group,match", [
    ({"betas": (1.0, 0.9)}, r"parameter group 0: betas=\(1.0, 0.9\) must be two numbers in"),
    ({"lr": -1.0}, r"parameter group 0: lr=-1.0 must be finite and >= 0"),
    ({"eps": float("nan")}, r"parameter group 0: eps=nan must be finite"),
    ({"betas": "x"}, r"parameter group 0: betas='x' must be"),
])
def test_bad_group_settings_are_refused(group, match):
    model = MAKERS["gpt2"]()
    groups = [{"params": list(model.parameters()), **group}]
    with pytest.raises(zoffload.ZoArgumentError, match=match):
        zoffload.initialize(model=model, model_parameters=groups, config=config("fp32"))


def test_group_rate_beside_a_zero_first_rate_is_refused():
    model = MAKERS["gpt2"]()
    ps = list(model.parameters())
    cfg = config("fp32")
    cfg["optimizer"]["params"]["lr"] = 0.0
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-3}]
    with pytest.raises(zoffload.ZoArgumentError, match="first group's is 0"):
        zoffload.initialize(model=model, model_parameters=groups, config=cfg)


def test_negative_group_decay_is_refused():
    model = MAKERS["gpt2"]()
    groups = [{"params": list(model.parameters()), "weight_decay": -1.0}]
    with pytest.raises(zoffload.ZoArgumentError, match="weight_decay"):
        zoffload.initialize(model=model, model_parameters=groups, config=config("fp32"))
