#!/usr/bin/env python3
"""zo-train on the cpu device beside transformers' LlamaForCausalLM of the same shape, on the
same CPU, in interleaved rounds; prints each one's tokens/s (median over rounds) and the ratios.

    ~/.cache/zoffload/venv/bin/python tools/bench/train-vs-torch.py [--build DIR] [--rounds N]

  resident  zo-train --preset small --seq 128 --micro-batch 8 --offload-param none
            --offload-optimizer cpu (every parameter in device memory)
  offload   zo-train's default on the cpu device: 16-bit parameters on the host, optimizer
            states on NVMe (--nvme-path, default a temporary directory)
  torch     LlamaForCausalLM with the small preset's shape (dim 640, 12 layers, 10 heads,
            ffn 1728, vocab 32000, untied head): bf16 weights and activations, fp32 master
            weights, per-layer activation checkpointing, fused AdamW, gradient clipping at 1;
            with --torch-dtype fp32, fp32 weights updated in place (no master copy)

Before the rounds, torch's GEMM of one of the shape's projections (1024 x 640 x 1728) is
timed in fp32 and bf16. A CPU without native bf16 (no AVX512_BF16 or AMX) runs torch's bf16
GEMM through a fallback tens of times slower than its fp32: there the bf16 torch figure
measures that fallback, and the script says so; --torch-dtype fp32 is the fair peer.

Each run does --steps optimizer steps of seq x micro-batch tokens; tokens/s is over all of
them (zo-train's own figure, which leaves out set-up and validation; torch's is timed the
same way). Both use every core the process may run on (torch.set_num_threads; zo-train's
compute pool). Targets (issue 34): torch ratio >= 0.8, practicality (offload/resident) >= 0.85.
"""
import argparse
import ast
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SHAPE = dict(vocab_size=32000, hidden_size=640, intermediate_size=1728, num_hidden_layers=12,
             num_attention_heads=10, num_key_value_heads=10, rms_norm_eps=1e-5,
             max_position_embeddings=2048, tie_word_embeddings=False, hidden_act="silu")


def run_zo_train(a, offload):
    exe = os.path.join(a.build, "tools", "zo-train", "zo-train")
    cmd = [exe, "--preset", "small", "--steps", str(a.steps), "--seq", str(a.seq),
           "--micro-batch", str(a.micro_batch), "--val-batches", "1"]
    if offload:
        cmd += ["--nvme-path", a.nvme_path]
    else:
        cmd += ["--offload-param", "none", "--offload-optimizer", "cpu"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"tokens in ([0-9.]+) s", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        sys.exit("train-vs-torch: %s failed (exit %d):\n%s" % (" ".join(cmd), out.returncode,
                                                               (out.stdout + out.stderr)[-2000:]))
    return a.steps * a.seq * a.micro_batch / float(m.group(1))


def in_fresh_torch(call):
    """The value this module's call (a Python expression) prints, from a fresh process, so
    both sides pay the same cold caches and torch's threads leave with it."""
    code = "import sys; sys.path.insert(0, %r); import importlib; " \
           "m = importlib.import_module('train-vs-torch'); print(repr(m.%s))" % (
               os.path.dirname(os.path.abspath(__file__)), call)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("train-vs-torch: the torch run failed:\n" + out.stderr[-2000:])
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def run_torch(a):
    return in_fresh_torch("torch_tokens_per_s(%d, %d, %d, %r)" % (a.steps, a.seq, a.micro_batch,
                                                                   a.torch_dtype))


def torch_gemm_rates(seconds=0.5):
    """torch's CPU capability and its GFLOP/s, fp32 and bf16, on one projection of the shape."""
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    m, k, n = 1024, SHAPE["hidden_size"], SHAPE["intermediate_size"]
    rates = {"capability": torch.backends.cpu.get_cpu_capability()}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, w = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
        x @ w
        t0, runs = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            x @ w
            runs += 1
        rates[name + "_gflops"] = 2.0 * m * k * n * runs / (time.perf_counter() - t0) / 1e9
    return rates


def torch_tokens_per_s(steps, seq, micro_batch, dtype="bf16"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.gradient_checkpointing_enable()  # per layer, as zo-train recomputes
    model.config.use_cache = False
    model.train()
    params = [p for p in model.parameters()]
    # bf16: an fp32 master copy that the optimizer steps, copied back after; fp32: in place
    master = [p.detach().float().clone().requires_grad_(False) for p in params] if dtype == "bf16" else params
    opt = torch.optim.AdamW(master, lr=2e-3, weight_decay=0.0, fused=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (micro_batch, seq), generator=g)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if master is not params:
            for p, m in zip(params, master):
                m.grad = p.grad.float()
                p.grad = None
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step()
        if master is not params:
            with torch.no_grad():
                for p, m in zip(params, master):
                    p.copy_(m)
        else:
            opt.zero_grad(set_to_none=True)
    return steps * seq * micro_batch / (time.perf_counter() - t0)


def bf16_fallback(rates):
    """Whether torch's bf16 GEMM here is a fallback: below a quarter of its fp32 rate (a CPU
    with native bf16 runs it at or above fp32's)."""
    return rates["bf16_gflops"] < 0.25 * rates["fp32_gflops"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.environ.get("ZOFFLOAD_BUILD_DIR", "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--runs", default="torch,resident,offload")
    p.add_argument("--nvme-path", default=None)
    p.add_argument("--torch-dtype", choices=("bf16", "fp32"), default="bf16",
                   help="torch's weights: bf16 with an fp32 master copy (default), or fp32")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = p.parse_args()
    if a.rounds < 1 or a.steps < 1:
        p.error("--rounds and --steps must be >= 1")
    runs = [r for r in a.runs.split(",") if r]
    bad = [r for r in runs if r not in ("torch", "resident", "offload")]
    if bad:
        p.error("--runs: unknown %s; expected a comma list of torch, resident, offload" % bad)
    tmp = tempfile.TemporaryDirectory(prefix="zo-train-vs-torch-")
    if a.nvme_path is None:
        a.nvme_path = tmp.name
    fns = {"torch": lambda: run_torch(a), "resident": lambda: run_zo_train(a, False),
           "offload": lambda: run_zo_train(a, True)}
    got = {r: [] for r in runs}
    load0 = os.getloadavg()
    gemm = in_fresh_torch("torch_gemm_rates()") if "torch" in runs else None
    for rnd in range(a.rounds):
        for r in runs:
            got[r].append(fns[r]())
            if not a.json:
                print("round %d %-8s %8.1f tokens/s" % (rnd + 1, r, got[r][-1]), file=sys.stderr)
    med = {r: statistics.median(v) for r, v in got.items()}
    res = {"tokens_per_s": med, "rounds": got, "load_before": load0, "load_after": os.getloadavg(),
           "cpus": len(os.sched_getaffinity(0))}
    if gemm:
        res["torch_dtype"] = a.torch_dtype
        res["torch_gemm"] = dict(gemm, bf16_fallback=bf16_fallback(gemm))
    if "torch" in med and "resident" in med:
        res["resident_vs_torch"] = med["resident"] / med["torch"]
    if "offload" in med and "resident" in med:
        res["practicality"] = med["offload"] / med["resident"]
    if a.json:
        print(json.dumps(res))
        return 0
    print("train-vs-torch: small preset, seq %d, micro-batch %d, %d steps, %d rounds, %d cpus, "
          "load %.2f -> %.2f" % (a.seq, a.micro_batch, a.steps, a.rounds, res["cpus"], load0[0],
                                 res["load_after"][0]))
    if gemm:
        print("  torch on %s: GEMM 1024x640x1728 fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s; torch runs %s" % (
            gemm["capability"], gemm["fp32_gflops"], gemm["bf16_gflops"], a.torch_dtype))
    for r in runs:
        print("  %-8s %8.1f tokens/s (median; rounds %s)" % (r, med[r], ", ".join("%.1f" % v for v in got[r])))
    if "resident_vs_torch" in res:
        print("  zo-train resident / torch: %.3f (target >= 0.8)" % res["resident_vs_torch"])
        if a.torch_dtype == "bf16" and bf16_fallback(gemm):
            print("  note: torch has no native bf16 GEMM on this CPU (bf16 at %.3fx its fp32), so this "
                  "ratio measures that fallback; --torch-dtype fp32 gives the fair peer" % (
                      gemm["bf16_gflops"] / gemm["fp32_gflops"]))
    if "practicality" in res:
        print("  practicality offload / resident: %.3f (target >= 0.85)" % res["practicality"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
