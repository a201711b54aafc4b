#!/usr/bin/env python3
"""zo-train's pipeline stages (--pipeline-stages) on the cpu device, under mpirun.

S stages over M = 4 (and 2) micro-batches against one rank with --grad-accum M: the
losses, the validation loss and the final fp32 master weights (their
--weights-digest, each tensor hashed by the stage holding it) are bitwise
equal, for S = 2 and S = 4 (the tiny model's 6 engine layers split unevenly),
with the optimizer states on NVMe and the parameters in host memory, in sync,
overlap and dpu modes, with parameters on the device, with a split given
by --pipeline-split, and in fp32 (--dtype fp32: 4-byte activations between stages); 2 stages x 2 data-parallel ranks (ZeRO 1, 2 and 3 in
each stage's group) equal 2 data-parallel ranks at the same M; the trace shows each
stage's forwards and backwards per micro-batch in 1F1B order; a pipeline's
checkpoint (each stage's tensors in its own shard, under Hugging Face names)
resumes bitwise as one rank and as the pipeline again, and its hf-model holds
one rank's tensors bit for bit; DeepSpeed's pipeline.stages and
pipeline.partition ("uniform") set the stages; S above the layer count and ranks not a
multiple of S are refused by name; a tied model (its head on the last stage,
the embedding on the first) is bitwise one rank too.

usage: test_train_pipe.py MPIEXEC ZO_TRAIN ZO_TRAIN_TEST
  ZO_TRAIN_TEST: zo-train built with the tests' hook (tests/train/pipe_staged.c),
  which runs the staged path's cases
"""
import json
import os
import subprocess
import sys
import tempfile

from mpi_test_util import ENV, check, failures, finish, mpi

MPIEXEC, EXE, TEST_EXE = sys.argv[1], sys.argv[2], sys.argv[3]
MPI = mpi(MPIEXEC)
TINY = ["--steps", "3", "--micro-batch", "2", "--seq", "32", "--val-batches", "2", "--json",
        "--weights-digest"]
STAGED = {}  # ZT_TEST_PIPE_STAGED=1 while staged() runs: transfers through pinned buffers


def run(cmd):
    p = subprocess.run(cmd, env=dict(ENV, **STAGED), capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


def command(ranks, extra, swap):
    os.makedirs(swap, exist_ok=True)
    cmd = [TEST_EXE if STAGED else EXE] + TINY + ["--nvme-path", swap] + extra
    return MPI + ["-np", str(ranks)] + cmd if ranks > 1 else cmd


def train(ranks, extra, swap):
    cmd = command(ranks, extra, swap)
    rc, out, err = run(cmd)
    if rc != 0:
        failures.append("%s: exit %d\n%s" % (" ".join(cmd), rc, err[-2000:]))
        return None
    return json.loads(out)


def same(what, ref, got):
    for key in ("losses", "val_loss", "weights_digest"):
        check(ref[key] == got[key], "%s: %s %r, reference %r" % (what, key, got[key], ref[key]))


def exact(stages, flags, split=None, micro=4, ref_cache={}):
    """S stages against one rank with --grad-accum M, both with flags."""
    with tempfile.TemporaryDirectory() as d:
        ga = ["--grad-accum", str(micro)]
        key = tuple(flags + ga)
        if key not in ref_cache:
            ref_cache[key] = train(1, ga + flags, d + "/one")
        pipe = ["--pipeline-stages", str(stages)] + (["--pipeline-split", split] if split else [])
        got = train(stages, ga + flags + pipe, d + "/p")
        ref = ref_cache[key]
        if ref is None or got is None:
            return None
        what = "%d stages%s, M %d, %s" % (stages, " split " + split if split else "", micro,
                                          " ".join(flags))
        same(what, ref, got)
        check(got["config"]["pipeline_stages"] == stages,
              "%s: config says %r" % (what, got["config"]))
        check((got["config"]["pipeline_pinned_bytes"] > 0) == bool(STAGED),
              "%s%s: %d pinned staging bytes" % (what, " staged" if STAGED else "",
                                                 got["config"]["pipeline_pinned_bytes"]))
        # rank 0's engine holds the first stage's chunks only, and tiers only them
        check(got["config"]["chunks"] < ref["config"]["chunks"] and
              (got["peak_bytes"]["nvme"] < ref["peak_bytes"]["nvme"] or
               ref["peak_bytes"]["nvme"] == 0),
              "%s: stage 0 holds %d chunks, %d NVMe bytes; one rank %d, %d" %
              (what, got["config"]["chunks"], got["peak_bytes"]["nvme"], ref["config"]["chunks"],
               ref["peak_bytes"]["nvme"]))
        print("%s: %s, losses %s" % (what, got["config"]["pipeline_split"], got["losses"]))
        return got


def three_d(stage):
    """2 stages x 2 data-parallel ranks against 2 data-parallel ranks, M = 2."""
    with tempfile.TemporaryDirectory() as d:
        flags = ["--grad-accum", "2", "--zero-stage", str(stage), "--offload-param", "cpu",
                 "--offload-optimizer", "nvme"]
        ref = train(2, flags, d + "/dp")
        got = train(4, flags + ["--pipeline-stages", "2"], d + "/pp")
        if ref is not None and got is not None:
            same("2 x 2 ranks, ZeRO %d" % stage, ref, got)
            check(got["config"]["world_size"] == 4, "2 x 2: config %r" % got["config"])


def refused(ranks, extra, words):
    with tempfile.TemporaryDirectory() as d:
        cmd = command(ranks, extra, d)
        rc, out, err = run(cmd)
        check(rc != 0 and all(w in err for w in words),
              "%s: exit %d, expected a refusal naming %r:\n%s" % (" ".join(cmd), rc, words,
                                                                   err[-1500:]))


def spans(path):
    """The trace's per-micro-batch spans (F0, B0, ...) in start order."""
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [(e["ts"], e["name"]) for e in events
             if e.get("ph") == "X" and e["name"][:1] in "FB" and e["name"][1:].isdigit()]
    return [n for _, n in sorted(names)]


def trace_1f1b():
    with tempfile.TemporaryDirectory() as d:
        path = d + "/trace.json"
        got = train(2, ["--grad-accum", "4", "--pipeline-stages", "2", "--steps", "1",
                        "--trace", path], d + "/p")
        if got is None:
            return
        want = {path: ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
                path + ".rank-1": ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]}
        for p, order in want.items():
            if not os.path.exists(p):
                failures.append("trace: no %s" % p)
                continue
            s = spans(p)
            check(s == order, "trace %s: spans %s, 1F1B is %s" % (os.path.basename(p), s, order))


def tensors(d):
    """name -> (dtype, shape, bytes) of every safetensors file in d."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, t in header.items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                out[name] = (t["dtype"], t["shape"], data[a:b])
    return out


def checkpoint():
    """2 stages save after 3 steps; one rank and 2 stages resume to 5: both
    equal one rank's 5 steps."""
    with tempfile.TemporaryDirectory() as d:
        flags = ["--grad-accum", "4"] + HOST_NVME
        full = train(1, flags + ["--steps", "5"], d + "/full")
        one3 = train(1, flags + ["--save", d + "/one"], d + "/one-swap")
        pipe = ["--pipeline-stages", "2"]
        saved = train(2, flags + pipe + ["--save", d + "/save"], d + "/p")
        r1 = train(1, flags + ["--steps", "5", "--resume", d + "/save"], d + "/r1")
        r2 = train(2, flags + pipe + ["--steps", "5", "--resume", d + "/save"], d + "/r2")
        if None in (full, one3, saved, r1, r2):
            return
        for what, got in (("one rank", r1), ("2 stages", r2)):
            check(got["losses"] == full["losses"][3:] and got["val_loss"] == full["val_loss"] and
                  got["weights_digest"] == full["weights_digest"],
                  "%s resumed from 2 stages' checkpoint: losses %s val %r digest %s; one rank "
                  "straight %s %r %s" % (what, got["losses"], got["val_loss"],
                                         got["weights_digest"], full["losses"][3:],
                                         full["val_loss"], full["weights_digest"]))
        step = os.path.join(d, "save", "step-00000003")
        check(sorted(f for f in os.listdir(step) if f.startswith("model-")) ==
              ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
              "2 stages' checkpoint holds %s" % sorted(os.listdir(step)))
        mine, ref = tensors(d + "/save/hf-model"), tensors(d + "/one/hf-model")
        check(sorted(mine) == sorted(ref) and all(mine[k] == ref[k] for k in ref),
              "2 stages' hf-model differs from one rank's: %s" %
              [k for k in ref if mine.get(k) != ref[k]][:5])


def from_config():
    """DeepSpeed's pipeline keys: stages and partition "uniform"."""
    with tempfile.TemporaryDirectory() as d:
        base = {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": 2}
        with open(d + "/one.json", "w") as f:
            json.dump(base, f)
        with open(d + "/pipe.json", "w") as f:
            json.dump(dict(base, pipeline={"stages": 4, "partition": "uniform"}), f)
        ref = train(1, ["--config", d + "/one.json"], d + "/one")
        got = train(4, ["--config", d + "/pipe.json"], d + "/p")
        if ref is not None and got is not None:
            same("pipeline.stages 4, partition uniform", ref, got)
            check(got["config"]["pipeline_split"] == "0-1,2-3,4-4,5-5",
                  "partition uniform: split %s" % got["config"]["pipeline_split"])


def tied_model(d):
    """A tied Hugging Face model directory: one rank's saved one, with
    tie_word_embeddings and without lm_head.weight."""
    if train(1, ["--steps", "1", "--save", d + "/init"], d + "/init-swap") is None:
        return None
    src, dst = d + "/init/hf-model", d + "/tied"
    os.makedirs(dst)
    with open(src + "/config.json") as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = True
    with open(dst + "/config.json", "w") as f:
        json.dump(cfg, f)
    t = {k: v for k, v in tensors(src).items() if k != "lm_head.weight"}
    header, blob = {}, b""
    for k in sorted(t):
        header[k] = {"dtype": t[k][0], "shape": t[k][1],
                     "data_offsets": [len(blob), len(blob) + len(t[k][2])]}
        blob += t[k][2]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(dst + "/model.safetensors", "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + blob)
    return dst


def tied():
    """A tied model's head on the last stage: layer 0 copied there, the head's
    gradients summed into the first stage's embedding gradient first, as one
    rank sums them; 2 x 2 ranks as 2 data-parallel ones."""
    with tempfile.TemporaryDirectory() as d:
        model = tied_model(d)
        if model is None:
            return
        hf = ["--hf-model", model] + HOST_NVME
        for stages, mode in ((2, "sync"), (3, "overlap"), (2, "dpu")):
            flags = hf + ["--grad-accum", "4", "--optimizer-mode", mode]
            ref = train(1, flags, d + "/one-" + mode)
            got = train(stages, flags + ["--pipeline-stages", str(stages)], d + "/p")
            if ref is not None and got is not None:
                same("tied, %d stages, %s" % (stages, mode), ref, got)
        flags = hf + ["--grad-accum", "2", "--zero-stage", "1"]
        ref = train(2, flags, d + "/dp")
        got = train(4, flags + ["--pipeline-stages", "2"], d + "/pp")
        if ref is not None and got is not None:
            same("tied, 2 x 2 ranks", ref, got)


def staged():
    """The staged path a CUDA device's mpi group takes (device -> pinned -> send, recv ->
    pinned -> device), forced on the cpu device: as bitwise as the direct path, tied too."""
    STAGED["ZT_TEST_PIPE_STAGED"] = "1"
    try:
        exact(2, HOST_NVME)
        exact(4, HOST_NVME)
        with tempfile.TemporaryDirectory() as d:
            model = tied_model(d)
            if model is None:
                return
            flags = ["--hf-model", model, "--grad-accum", "4"] + HOST_NVME
            ref = train(1, flags, d + "/one")
            got = train(2, flags + ["--pipeline-stages", "2"], d + "/p")
            if ref and got:
                same("tied, 2 stages, staged", ref, got)
                check(got["config"]["pipeline_pinned_bytes"] > 0, "tied staged: nothing pinned")
    finally:
        STAGED.clear()


HOST_NVME = ["--offload-param", "cpu", "--offload-optimizer", "nvme"]
exact(2, HOST_NVME)
exact(4, HOST_NVME)  # 6 engine layers in 4 stages
exact(2, HOST_NVME + ["--optimizer-mode", "overlap"])
exact(4, HOST_NVME + ["--optimizer-mode", "overlap"])
exact(2, HOST_NVME + ["--optimizer-mode", "dpu"])
exact(2, ["--offload-param", "none", "--offload-optimizer", "cpu"])
exact(2, HOST_NVME, split="1")  # the embedding alone, then 5 layers
exact(3, HOST_NVME, split="2,5")
exact(4, HOST_NVME, micro=2)  # fewer micro-batches than stages
exact(2, HOST_NVME + ["--dtype", "fp32"])  # fp32 activations and parameters between stages
exact(3, HOST_NVME + ["--dtype", "fp32", "--optimizer-mode", "overlap"], split="2,5")
three_d(1)
three_d(2)
three_d(3)
trace_1f1b()
checkpoint()
from_config()
tied()
staged()
refused(4, ["--pipeline-stages", "7"], ["--pipeline-stages 7", "6 layers", "at most 6"])
refused(3, ["--pipeline-stages", "2"], ["--pipeline-stages 2", "multiple of 2", "has 3"])
refused(2, ["--pipeline-stages", "2", "--pipeline-split", "9"], ["--pipeline-split '9'"])
finish("test_train_pipe")
