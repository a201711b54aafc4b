#!/usr/bin/env python3
"""zo-train across ranks (ZeRO stages 1, 2 and 3) on the cpu device, under mpirun.

N ranks with --grad-accum 1 against one rank with --grad-accum N over the same
data: the losses, the validation loss and the final fp32 master weights (their
--weights-digest, each tensor hashed by its owner) are bitwise equal, for
stages 1, 2 and 3 with the optimizer states in host memory and on NVMe, in
sync, overlap and dpu modes, with fp32 parameters too (--dtype fp32), and with
the 16-bit parameters on NVMe (--offload-param nvme: every chunk in each rank's
files at stages 1 and 2, its own at stage 3; with --offload-optimizer cpu the other ranks' chunks at stages 1 and 2, stage 3 refused); each
rank's NVMe bytes are its own chunks' share; a flag that differs on one rank is
refused naming it; layer-major groups in the global reduction order are refused
naming what works.

usage: test_train_zero.py MPIEXEC ZO_TRAIN
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from mpi_test_util import ENV, check, failures, finish, mpi

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
MPI = mpi(MPIEXEC)
TINY = ["--steps", "3", "--micro-batch", "2", "--seq", "32", "--val-batches", "2",
        "--offload-param", "cpu", "--json", "--weights-digest"]


def run(cmd):
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


def train(ranks, extra, swap):
    os.makedirs(swap, exist_ok=True)
    cmd = [EXE] + TINY + ["--nvme-path", swap] + extra
    if ranks > 1:
        cmd = MPI + ["-np", str(ranks)] + cmd
    rc, out, err = run(cmd)
    if rc != 0:
        failures.append("%s: exit %d\n%s" % (" ".join(cmd), rc, err[-2000:]))
        return None
    return json.loads(out)


def exact(ranks, stage, optim, mode="sync", param="cpu", dtype="bf16"):
    with tempfile.TemporaryDirectory() as d:
        both = ["--offload-optimizer", optim, "--optimizer-mode", mode, "--offload-param", param,
                "--dtype", dtype]
        one = train(1, ["--grad-accum", str(ranks)] + both, d + "/one")
        many = train(ranks, ["--zero-stage", str(stage)] + both, d + "/z")
        if one is None or many is None:
            return
        what = "%d ranks, stage %d, optimizer %s, mode %s, param %s, %s" % (ranks, stage, optim,
                                                                           mode, param, dtype)
        check(one["losses"] == many["losses"],
              "%s: losses %s, one rank %s" % (what, many["losses"], one["losses"]))
        check(one["val_loss"] == many["val_loss"],
              "%s: val_loss %r, one rank %r" % (what, many["val_loss"], one["val_loss"]))
        check(one["weights_digest"] == many["weights_digest"],
              "%s: weights digest %s, one rank %s" %
              (what, many["weights_digest"], one["weights_digest"]))
        check(many["config"]["world_size"] == ranks and many["config"]["zero_stage"] == stage,
              "%s: config says %r" % (what, many["config"]))
        n = many["config"]["chunks"]
        owned = math.ceil(n / ranks)  # rank 0 reports: contiguous, the first ranks one more
        if param == "nvme":  # stages 1-2: every chunk's 16-bit copy in each rank's files
            check(os.path.isdir(d + "/z/rank-0") and os.path.isdir(d + "/z/rank-1"),
                  "%s: no per-rank swap directories" % what)
            check(many["peak_bytes"]["nvme"] > 0, "%s: no NVMe bytes on rank 0" % what)
        elif optim == "nvme":
            check(many["peak_bytes"]["nvme"] * n == one["peak_bytes"]["nvme"] * owned,
                  "%s: rank 0's NVMe bytes %d, one rank's %d, %d of %d chunks" %
                  (what, many["peak_bytes"]["nvme"], one["peak_bytes"]["nvme"], owned, n))
            check(os.path.isdir(d + "/z/rank-0") and os.path.isdir(d + "/z/rank-1"),
                  "%s: no per-rank swap directories" % what)
        elif stage == 2:
            check(many["peak_bytes"]["host"] < one["peak_bytes"]["host"] * (1.0 / ranks + 0.1),
                  "%s: rank 0's host bytes %d, one rank's %d" %
                  (what, many["peak_bytes"]["host"], one["peak_bytes"]["host"]))


def refused(cmd, words):
    rc, out, err = run(cmd)
    check(rc != 0, "%s: exit 0, expected a refusal" % " ".join(cmd))
    for w in words:
        check(w in err, "%s: %r not in the error:\n%s" % (" ".join(cmd), w, err[-2000:]))


for stage in (1, 2, 3):
    for optim in ("cpu", "nvme"):
        exact(2, stage, optim)
exact(4, 2, "nvme")
exact(4, 3, "cpu")
exact(2, 3, "nvme", "overlap")
exact(2, 2, "nvme", "dpu")
exact(2, 3, "cpu", "dpu")
# 16-bit parameters on NVMe: stages 1-2 every chunk in each rank's files, stage 3 its own
for stage in (1, 2, 3):
    exact(2, stage, "nvme", param="nvme")
exact(2, 3, "nvme", "overlap", param="nvme")
exact(2, 2, "nvme", "dpu", param="nvme")
# fp32 parameters (--dtype fp32): 4-byte broadcasts, gathers and widened gradients
for stage in (1, 2, 3):
    exact(2, stage, "nvme", dtype="fp32")
exact(2, 3, "cpu", "overlap", dtype="fp32")
exact(2, 2, "nvme", "dpu", param="nvme", dtype="fp32")
exact(2, 3, "nvme", param="nvme", dtype="fp32")

# 16-bit parameters on NVMe with the optimizer states in host memory: each rank keeps its own
# chunks beside their states and the other ranks' on NVMe (stages 1-2); one rank keeps all of
# them beside the states, so the reference runs with --offload-param cpu
for stage in (1, 2):
    with tempfile.TemporaryDirectory() as d:
        one = train(1, ["--grad-accum", "2", "--offload-optimizer", "cpu"], d + "/one")
        many = train(2, ["--zero-stage", str(stage), "--offload-optimizer", "cpu",
                         "--offload-param", "nvme"], d + "/z")
        what = "2 ranks, stage %d, --offload-param nvme --offload-optimizer cpu" % stage
        if one is not None and many is not None:
            for key in ("losses", "val_loss", "weights_digest"):
                check(one[key] == many[key],
                      "%s: %s %r, one rank %r" % (what, key, many[key], one[key]))
            check(many["peak_bytes"]["nvme"] > 0, "%s: no NVMe bytes on rank 0" % what)
with tempfile.TemporaryDirectory() as d:  # stage 3: a rank's own chunks only, none on NVMe
    refused(MPI + ["-np", "2", EXE] + TINY + ["--nvme-path", d, "--zero-stage", "3",
                                              "--offload-optimizer", "cpu", "--offload-param",
                                              "nvme"],
            ["--offload-param nvme needs --offload-optimizer nvme at --zero-stage 3"])

# DeepSpeed's zero_optimization.stage becomes the stage across ranks
with tempfile.TemporaryDirectory() as d:
    with open(d + "/ds.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}, f)
    ds = train(2, ["--config", d + "/ds.json"], d + "/swap")
    check(ds is not None and ds["config"]["zero_stage"] == 1,
          "zero_optimization.stage 1: the run says %r" % (ds and ds["config"]))
    # stage 3 with DeepSpeed's persistence threshold (elements): mapped, not warned about
    with open(d + "/ds3.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2,
                   "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 4096}},
                  f)
    cmd = MPI + ["-np", "2", EXE] + TINY + ["--config", d + "/ds3.json", "--nvme-path", d + "/s3"]
    rc, out, err = run(cmd)
    ds3 = json.loads(out) if rc == 0 else None
    check(ds3 is not None and ds3["config"]["zero_stage"] == 3 and
          ds3["config"]["zero_persist_elems"] == 4096,
          "zero_optimization.stage 3: exit %d, the run says %r\n%s" %
          (rc, ds3 and ds3["config"], err[-2000:]))
    check("stage3_param_persistence_threshold" not in err,
          "stage3_param_persistence_threshold warned about:\n%s" % err[-2000:])

with tempfile.TemporaryDirectory() as d:
    base = [EXE] + TINY + ["--nvme-path", d]
    refused(MPI + ["-np", "1"] + base + ["--lr", "1e-3", ":", "-np", "1"] + base + ["--lr", "2e-3"],
            ["--lr"])
    # the values as a user writes them (they were hex floats and enum numbers)
    for flag, a, b in (("--lr", "1e-3", "2e-3"), ("--dtype", "fp16", "bf16"),
                       ("--offload-optimizer", "nvme", "cpu")):
        rc, out, err = run(MPI + ["-np", "1"] + base + [flag, a, ":", "-np", "1"] + base +
                           [flag, b])
        shown = {"1e-3": "'0.001'", "2e-3": "'0.002'"}
        check(rc != 0 and ("have %s" % shown.get(a, "'%s'" % a) in err or
                           "have %s" % shown.get(b, "'%s'" % b) in err) and "0x1." not in err,
              "%s %s vs %s: the values are not shown as given:\n%s" % (flag, a, b, err[-2000:]))
    # layer-major groups sum on the device: the global reduction order cannot take them
    refused(MPI + ["-np", "2"] + base + ["--grad-accum", "4", "--micro-group", "2"],
            ["--micro-group 1", "--reduce-order rank"])

finish("test_train_zero")
