"""python -m zoffload.bench: tokens/s of a GPT-2-shaped model trained through zoffload beside
plain PyTorch on the same machine in the same run (ratios, since these machines are noisy).

  resident  zoffload, every parameter in device memory, optimizer states on the host
  offload   zoffload, parameters and optimizer states on NVMe, device budget 1/4 of the
            16-bit parameters (the "practicality" DeepSpeed quotes: offloaded / resident)
  torch     plain PyTorch: fp32 parameters, bf16 autocast, torch.optim.AdamW(fused=True)
  torch32   plain PyTorch in fp32 throughout (no autocast), the same optimizer: on a CPU
            without fast bf16 it can beat autocast, so the ratio is taken against the faster

Runs alternate (torch, resident, offload, torch, ...) and each figure is the median over its
rounds; the first steps of every run are warm-up and not timed."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def gpt2(layers, width, heads, vocab, seq):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=width,
                                      n_layer=layers, n_head=heads, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0))


def batch(a):
    import torch
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.micro_batch, a.seq), generator=g).to(a.device)
    return {"input_ids": ids, "labels": ids}


def sync(a):
    import torch
    if a.device == "cuda":
        torch.cuda.synchronize()


def run_torch(a, autocast: bool = True) -> float:
    import torch
    model = gpt2(a.layers, a.width, a.heads, a.vocab, a.seq).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    b = batch(a)
    times = []
    for i in range(a.warmup + a.steps):
        sync(a)
        t = time.perf_counter()
        for _ in range(a.grad_accum):
            with torch.autocast(a.device, dtype=torch.bfloat16, enabled=autocast):
                loss = model(**b).loss
            (loss / a.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(a)
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    return a.micro_batch * a.seq * a.grad_accum / statistics.median(times)


def _initialize(model, cfg, n16: int):
    """The engine; with n16 (16-bit parameter bytes) the device budget is a quarter of them,
    or the least above that the plan accepts (a chunk holds the largest tensor whole, so a
    model with a big embedding needs more), recorded in BUDGET."""
    import zoffload
    if not n16:
        return zoffload.initialize(model=model, config=cfg)[0]
    budget = n16 // 4
    while True:
        cfg["zoffload"]["device_mem"] = budget
        try:
            eng = zoffload.initialize(model=model, config=cfg)[0]
            BUDGET["fraction"] = budget / n16
            return eng
        except zoffload.ZoOutOfMemoryError:
            budget = budget * 5 // 4


BUDGET = {}


def run_zoffload(a, offload: bool) -> float:
    import torch
    import zoffload
    model = gpt2(a.layers, a.width, a.heads, a.vocab, a.seq).to(a.device)
    n16 = sum(p.numel() for p in model.parameters()) * 2
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "bf16": {"enabled": True},
           "gradient_accumulation_steps": a.grad_accum,
           "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"offload_optimizer": {"device": "cpu"}},
           "zoffload": {"optimizer_mode": a.mode}}
    swap = None
    if offload:
        swap = tempfile.mkdtemp(prefix="zo-bench-", dir=a.nvme_path)
        cfg["zero_optimization"] = {"offload_param": {"device": "nvme", "nvme_path": swap},
                                    "offload_optimizer": {"device": "nvme", "nvme_path": swap}}
    eng = _initialize(model, cfg, n16 if offload else 0)
    b = batch(a)
    times = []
    for i in range(a.warmup + a.steps):
        sync(a)
        t = time.perf_counter()
        for _ in range(a.grad_accum):
            loss = eng(**b).loss
            eng.backward(loss)
            eng.step()
        sync(a)
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    eng.destroy()
    if swap:
        import shutil
        shutil.rmtree(swap, ignore_errors=True)
    return a.micro_batch * a.seq * a.grad_accum / statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoffload.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step (each run the same)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three runs")
    p.add_argument("--mode", default="overlap", choices=["sync", "overlap", "dpu"])
    p.add_argument("--nvme-path", default=None, help="directory for the offload run's swap")
    p.add_argument("--runs", default="torch,torch32,resident,offload")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: zoffload's emulated device beside PyTorch on the CPU; cuda: a GPU")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    import torch
    res = {k: [] for k in a.runs.split(",")}
    for r in range(a.rounds):
        for k in res:
            f = {"torch": lambda: run_torch(a), "torch32": lambda: run_torch(a, False),
                 "resident": lambda: run_zoffload(a, False),
                 "offload": lambda: run_zoffload(a, True)}[k]()
            res[k].append(f)
            if not a.json:
                print(f"round {r + 1}/{a.rounds}: {k:8s} {f:8.1f} tokens/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"model": f"GPT-2 {a.layers}x{a.width}, vocab {a.vocab}", "device": a.device,
           "seq": a.seq,
           "micro_batch": a.micro_batch, "grad_accum": a.grad_accum,
           "threads": torch.get_num_threads(), "mode": a.mode,
           "tokens_per_s": med, "rounds": res}
    peers = [med[k] for k in ("torch", "torch32") if k in med]
    if peers and "resident" in med:
        out["resident_vs_torch"] = med["resident"] / max(peers)
    if "offload" in med and "resident" in med:
        out["offload_vs_resident"] = med["offload"] / med["resident"]
        out["offload_device_budget_vs_params"] = BUDGET.get("fraction")
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in med.items():
            print(f"{k:9s} {v:9.1f} tokens/s (median of {len(res[k])})")
        for k in ("resident_vs_torch", "offload_vs_resident", "offload_device_budget_vs_params"):
            if k in out:
                print(f"{k}: {out[k]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
