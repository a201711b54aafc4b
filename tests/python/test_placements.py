"""Placements are exact: the same GPT-2 run with its parameters on the device, the host or
NVMe, its optimizer states on the host or NVMe, sync and overlap modes, resident (direct) or
paged through a small device budget (GPT-2's tied lm_head: recompute; a LLaMA: refetch),
gives bitwise the same losses and weights;
gradient accumulation and clipping included. And the budget holds: parameters 4x the device
budget train, and the device's high-water mark stays within it."""
from __future__ import annotations

import pytest
import torch

from test_models import config, train_zoffload

CHUNK = 64 << 10
SMALL = 3 * CHUNK  # device bytes: two parameter slots and a gradient slot


def placed(tmp_path, params, optim, mode, budget=0, **extra):
    zo = {"chunk_size": CHUNK, "optimizer_mode": mode, **extra}
    if budget:
        zo["device_mem"] = budget
    cfg = config("bf16", accum=2, clip=0.3, **zo)
    z = cfg["zero_optimization"]
    z["offload_param"] = {"device": params}
    z["offload_optimizer"] = {"device": optim}
    for part in ("offload_param", "offload_optimizer"):
        if z[part]["device"] == "nvme":
            z[part]["nvme_path"] = str(tmp_path)
    return cfg


CASES = [("none", "cpu", "sync", 0), ("cpu", "cpu", "sync", SMALL), ("cpu", "cpu", "overlap", SMALL),
         ("cpu", "nvme", "overlap", 0), ("nvme", "nvme", "sync", SMALL),
         ("cpu", "nvme", "sync", SMALL),
         ("nvme", "nvme", "overlap", SMALL)]  # clipped steps update behind the next forward


def test_every_placement_trains_bitwise_alike(tmp_path):
    runs = []
    for i, (p, o, mode, budget) in enumerate(CASES):
        d = tmp_path / f"run{i}"
        d.mkdir()
        losses, weights, info = train_zoffload("gpt2", placed(d, p, o, mode, budget), steps=6,
                                               accum=2)
        runs.append(((p, o, mode, budget), losses, weights, info))
    modes = {info["direct"] for *_, info in runs}
    assert modes == {True, False}, "both the direct and the recompute paths ran"
    (case0, l0, w0, _) = runs[0]
    for case, losses, weights, _ in runs[1:]:
        assert losses == l0, f"{case} vs {case0}: losses differ"
        for name in w0:
            assert torch.equal(weights[name], w0[name]), f"{case}: {name} differs"


# (params, optimizer, mode, chunk, device budget in chunks): smaller chunks make more layers
# than slots, so a layer's backward fetch lands in another slot than its forward's
LLAMA_CASES = [("none", "cpu", "sync", CHUNK, 0), ("cpu", "cpu", "sync", CHUNK, 3),
               ("cpu", "nvme", "overlap", CHUNK // 2, 5), ("nvme", "nvme", "overlap", CHUNK // 2, 3),
               ("cpu", "cpu", "overlap", CHUNK // 4, 3)]


def test_refetch_trains_bitwise_alike(tmp_path):
    """Below a resident budget, a model whose layers tie nothing untiled (this LLaMA) runs
    its forward as PyTorch does and fetches autograd's saved parameters again in the backward
    (refetch): the resident run's bits, the same ops on the same values. (Recompute, which
    holds a layer's gradient buffers from its first module's backward to its last one's,
    cannot page this LLaMA at all: its layers, modules merged in module order, interleave in
    the backward, and the plan gives one gradient slot.)"""
    runs = []
    for i, (p, o, mode, chunk, slots) in enumerate(LLAMA_CASES):
        d = tmp_path / f"run{i}"
        d.mkdir()
        cfg = placed(d, p, o, mode, slots * chunk, chunk_size=chunk)
        losses, weights, info = train_zoffload("llama", cfg, steps=6, accum=2)
        runs.append(((p, o, mode, chunk, slots), losses, weights, info))
    assert [info["mode"] for *_, info in runs] == ["direct"] + ["refetch"] * 4
    (case0, l0, w0, _) = runs[0]
    for case, losses, weights, _ in runs[1:]:
        assert losses == l0, f"{case} vs {case0}: losses differ"
        for name in w0:
            assert torch.equal(weights[name], w0[name]), f"{case}: {name} differs"


def test_parameters_four_times_the_device_budget_train():
    from models import MAKERS, gpt2
    MAKERS["gpt2_deep"] = lambda: gpt2(layers=24, width=32)
    try:
        model = MAKERS["gpt2_deep"]()
        n16 = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * 2
        budget = n16 // 4
        cfg = config("bf16", chunk_size=8 << 10, device_mem=budget)
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
        losses, _, info = train_zoffload("gpt2_deep", cfg, steps=8)
    finally:
        del MAKERS["gpt2_deep"]
    assert not info["direct"]
    assert info["budget"] == budget
    assert 0 < info["device"]["high_water"] <= budget
    assert sum(losses[-3:]) < sum(losses[:3])
