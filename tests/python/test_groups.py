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
    if groups_as == "optimizer":
        cfg.pop("optimizer")
        opt = torch.optim.AdamW(groups, lr=3e-3, weight_decay=WD)
        eng, zopt, _, _ = zoffload.initialize(model=model, optimizer=opt, config=cfg)
    else:
        eng, zopt, _, _ = zoffload.initialize(model=model, model_parameters=groups, config=cfg)
    assert sorted(g["weight_decay"] for g in zopt.param_groups) == [0.0, WD]
    assert len(eng.effective_config()["optimizer"]["own_weight_decay"]) == len(no_decay)
    losses = []
    for b in data:
        loss = fn(eng, b)
        losses.append(loss.item())
        eng.backward(loss)
        eng.step()
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


def test_group_with_its_own_lr_is_refused():
    model = MAKERS["gpt2"]()
    groups = [{"params": list(model.parameters()), "lr": 1.0}]
    with pytest.raises(zoffload.ZoArgumentError, match="lr"):
        zoffload.initialize(model=model, model_parameters=groups, config=config("fp32"))


def test_negative_group_decay_is_refused():
    model = MAKERS["gpt2"]()
    groups = [{"params": list(model.parameters()), "weight_decay": -1.0}]
    with pytest.raises(zoffload.ZoArgumentError, match="weight_decay"):
        zoffload.initialize(model=model, model_parameters=groups, config=config("fp32"))
