"""Memory-centric tiling (tiles.py): a weight cut into row tiles trains as the untiled model
does (within the same yardstick as test_models: twice the distance between an fp32-math and
an fp64-math PyTorch reference), trains bitwise alike in every placement, lets a model whose
embedding alone exceeds the device budget train within it, and checkpoints in the untiled
format (a tiled engine's checkpoint is byte for byte an untiled engine's, both ways)."""
from __future__ import annotations

import pytest
import torch

import zoffload
from models import batches, gpt2, loss_of
from test_models import config, rel_err, train_reference, train_zoffload
from test_placements import placed

# Tiles of 4 KiB: in bf16 the GPT-2 test model's wte (96 x 64, 12 KiB) in 32-row tiles, and the
# tiny LLaMA's every projection (8 KiB: each is a unit of its own at this size) as well; in fp32
# (16 KiB) the embeddings, LLaMA's lm_head and MLP projections. Every tiled Linear's input
# gradient sums its tiles' products in another order than one GEMM does: in fp32, Adam makes
# that ~2e-6 of the weights after 10 steps (the references' own spread is 1.6e-7: they run the
# same GEMMs as the untiled engine, which agrees with them to 1.6e-7): the first update is lr *
# g / (|g| + eps), so an element whose gradient is near eps moves by a different amount when g
# changes in its last bits. FP32_SPLIT bounds that.
TILE = {"bf16": 4 << 10, "fp32": 16 << 10}
FP32_SPLIT = 1e-5


def tiled_config(dtype, accum=1, clip=0.0, **zo):
    return config(dtype, accum, clip, tile_size=TILE[dtype], **zo)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_tiled_training_equals_pytorch_reference(kind, dtype):
    accum, clip = 2, 0.5
    zl, zw, info = train_zoffload(kind, tiled_config(dtype, accum, clip), accum=accum,
                                  steps=10)
    t = torch.bfloat16 if dtype == "bf16" else torch.float32
    rl32, rw32 = train_reference(kind, t, torch.float32, accum, clip, steps=10)
    rl64, rw64 = train_reference(kind, t, torch.float64, accum, clip, steps=10)
    spread_l, spread_w = rel_err(rl32, rl64), rel_err(rw32, rw64)
    err_l, err_w = rel_err(zl, rl64), rel_err(zw, rw64)
    print(f"{kind} {dtype} tiled: loss err {err_l:.3g} (spread {spread_l:.3g}), weight err "
          f"{err_w:.3g} (spread {spread_w:.3g})")
    assert info["tiles"] > 0
    assert zl[0] == pytest.approx(rl32[0], rel=1e-6)  # the forward is the untiled math
    assert err_l <= max(2 * spread_l, 1e-6)
    assert err_w <= max(2 * spread_w, 1e-6 if dtype == "bf16" else FP32_SPLIT)


def test_tiled_placements_train_bitwise_alike(tmp_path):
    cases = [("none", "cpu", "sync", 0), ("cpu", "cpu", "overlap", 3 << 16),
             ("nvme", "nvme", "sync", 3 << 16), ("cpu", "nvme", "overlap", 0)]
    runs = []
    for i, (p, o, mode, budget) in enumerate(cases):
        d = tmp_path / f"run{i}"
        d.mkdir()
        cfg = placed(d, p, o, mode, budget, tile_size=TILE["bf16"])
        runs.append(((p, o, mode, budget),) + train_zoffload("gpt2", cfg, steps=4, accum=2))
    assert {info["direct"] for *_, info in runs} == {True, False}
    case0, l0, w0, _ = runs[0]
    for case, losses, weights, info in runs[1:]:
        assert info["tiles"] > 0
        assert losses == l0, f"{case} vs {case0}: losses differ"
        for name in w0:
            assert torch.equal(weights[name], w0[name]), f"{case}: {name} differs"


def wide_vocab():
    """A GPT-2 whose tied embedding is most of the model: larger alone than a quarter of it."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1234)
    return GPT2LMHeadModel(GPT2Config(vocab_size=4096, n_positions=16, n_embd=16, n_layer=2,
                                      n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, attn_implementation="eager"))


def test_embedding_larger_than_the_budget_trains_within_it():
    model = wide_vocab()
    n16 = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * 2
    wte = model.transformer.wte.weight.numel() * 2
    budget = n16 // 4
    assert wte > budget
    cfg = config("bf16", chunk_size=4 << 10, device_mem=budget)
    cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    eng, _, _, _ = zoffload.initialize(model=model, config=cfg)
    try:
        assert eng.tile_rows, "auto tiling cut the embedding"
        assert "row tiles" in eng.plan_summary()
        fn = loss_of("gpt2", torch.bfloat16)
        losses = []
        for b in batches("gpt2", 8):
            loss = fn(eng, b)
            losses.append(loss.item())
            eng.backward(loss)
            eng.step()
        mem = eng.device_memory()
    finally:
        eng.destroy()
    assert not eng.direct
    assert 0 < mem["high_water"] <= budget
    assert sum(losses[-3:]) < sum(losses[:3])


def _train_some(cfg, steps=3):
    model = wide_vocab()
    eng, _, _, _ = zoffload.initialize(model=model, config=cfg)
    fn = loss_of("gpt2", torch.bfloat16)
    for b in batches("gpt2", steps):
        loss = fn(eng, b)
        eng.backward(loss)
        eng.step()
    return eng


def _fresh(cfg):
    return zoffload.initialize(model=wide_vocab(), config=cfg)[0]


@pytest.mark.parametrize("state", ["fp32", "int8"])
def test_tiled_checkpoints_are_untiled_checkpoints(tmp_path, state):
    plain = config("bf16", optimizer_state_dtype=state)
    tiled = tiled_config("bf16", optimizer_state_dtype=state)
    a = _train_some(tiled)
    assert len(a.params) > len(a.tensors) + 1, "the embedding is tiled"
    a.save_checkpoint(tmp_path / "a", tag="t")
    a.destroy()
    for name, cfg in (("b", plain), ("c", tiled)):
        e = _fresh(cfg)
        e.load_checkpoint(tmp_path / "a", tag="t")
        e.save_checkpoint(tmp_path / name, tag="t")
        e.destroy()
        for f in ("model.safetensors", "optimizer.safetensors"):
            assert (tmp_path / name / "t" / f).read_bytes() == \
                (tmp_path / "a" / "t" / f).read_bytes(), f"{name}: {f} differs"


def test_unusable_weights_stay_whole():
    """An Embedding with max_norm renormalizes rows in place: its weight is never tiled."""
    model = gpt2()
    model.transformer.wte.max_norm = 1.0
    eng = zoffload.initialize(model=model, config=tiled_config("bf16"))[0]
    try:
        assert not eng.tile_rows
    finally:
        eng.destroy()
