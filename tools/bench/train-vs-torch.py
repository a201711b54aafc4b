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
            weights, per-layer activation checkpointing, fused AdamW, gradient clipping at 1

Each run does --steps optimizer steps of seq x micro-batch tokens; tokens/s is over all of
them (zo-train's own figure, which leaves out set-up and validation; torch's is timed the
same way). Both use every core the process may run on (torch.set_num_threads; zo-train's
compute pool). Targets (issue 34): torch ratio >= 0.8, practicality (offload/resident) >= 0.85.
"""
import argparse
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


def run_torch(a):
    """One run in a fresh process, so both sides pay the same cold caches."""
    code = "import sys; sys.path.insert(0, %r); import importlib; " \
           "m = importlib.import_module('train-vs-torch'); print(m.torch_tokens_per_s(%d, %d, %d))" % (
               os.path.dirname(os.path.abspath(__file__)), a.steps, a.seq, a.micro_batch)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("train-vs-torch: the torch run failed:\n" + out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def torch_tokens_per_s(steps, seq, micro_batch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16)
    model.gradient_checkpointing_enable()  # per layer, as zo-train recomputes
    model.config.use_cache = False
    model.train()
    params = [p for p in model.parameters()]
    master = [p.detach().float().clone().requires_grad_(False) for p in params]
    opt = torch.optim.AdamW(master, lr=2e-3, weight_decay=0.0, fused=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (micro_batch, seq), generator=g)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for p, m in zip(params, master):
            m.grad = p.grad.float()
            p.grad = None
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)
    return steps * seq * micro_batch / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.environ.get("ZOFFLOAD_BUILD_DIR", "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--runs", default="torch,resident,offload")
    p.add_argument("--nvme-path", default=None)
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
    for rnd in range(a.rounds):
        for r in runs:
            got[r].append(fns[r]())
            if not a.json:
                print("round %d %-8s %8.1f tokens/s" % (rnd + 1, r, got[r][-1]), file=sys.stderr)
    med = {r: statistics.median(v) for r, v in got.items()}
    res = {"tokens_per_s": med, "rounds": got, "load_before": load0, "load_after": os.getloadavg(),
           "cpus": len(os.sched_getaffinity(0))}
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
    for r in runs:
        print("  %-8s %8.1f tokens/s (median; rounds %s)" % (r, med[r], ", ".join("%.1f" % v for v in got[r])))
    if "resident_vs_torch" in res:
        print("  zo-train resident / torch: %.3f (target >= 0.8)" % res["resident_vs_torch"])
    if "practicality" in res:
        print("  practicality offload / resident: %.3f (target >= 0.85)" % res["practicality"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
