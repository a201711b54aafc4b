#!/usr/bin/env python3
"""The host gathers of --tensor-parallel on the cpu device under mpirun: staged through
device buffers, a rank that fails to read, and resume with fewer key/value heads than T.

- NCCL takes device memory only, so zt_host_all_gather stages the checkpoint gathers and
  the weights' reads (--weights-digest) through device buffers in pieces there.
  zo-train-test's hook (ZT_TEST_STAGE_BYTES=N) forces that path on the cpu device over
  mpi with N-byte pieces (1000: most tensors take many pieces and a short last one): the
  checkpoint (fp32 and int8 states, int8's straddling tensors saved decoded), the
  losses and the digest are bitwise the direct path's. Measured by mutation: the staged
  copy back written one piece off changes the checkpoint.
- ZT_TEST_READ_FAIL=R makes world rank R fail to read its master weights for the
  digest: every rank still joins the exchange, and the others fail naming rank R
  within 60 s (T 2; T 2 x D 2; T 2 staged). Measured by mutation: a rank that stops
  joining its group's gathers after the failure (the old behaviour) hangs the group
  past 300 s.
- On a GPU the tensor group's activations and gathered weights go over NCCL, a second
  communicator beside the host one (the engine's, the checkpoints' and the ranks' host
  exchanges). ZT_TEST_TP_DEVICE_COMM=1 opens that second one on the cpu device over mpi
  taking device allocations only, as NCCL does: plain and sequence-parallel T 2, and
  2 x 2 x 2 with stages and data-parallel ranks, train and save bitwise as with the one
  communicator. Measured by mutation: the second communicator opened without the
  device-only flag is what -v names, and this test checks -v names the flag.
- --hf-model with fewer key/value heads than T (1 of 4 at T 2, 2 of 4 at T 4: a head
  shared by the ranks whose query heads use it): saved after 2 steps and resumed at the
  same T, the losses, validation loss, digest and next checkpoint bitwise equal the
  uninterrupted run's.

usage: test_train_tp_gather.py MPIEXEC ZO_TRAIN_TEST
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from mpi_test_util import ENV, check, failures, finish, latest, llama_dir, mpi, read_set

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
MPI = mpi(MPIEXEC)
TINY = ["--micro-batch", "2", "--seq", "32", "--val-batches", "2", "--json", "--dtype", "fp32",
        "--weights-digest", "--grad-accum", "2"]
HOOKS = ("ZT_TEST_STAGE_BYTES", "ZT_TEST_READ_FAIL", "ZT_TEST_TP_DEVICE_COMM")


def run(ranks, args, swap, timeout=300, **hooks):
    os.makedirs(swap, exist_ok=True)
    env = dict(ENV, **{k: hooks.get(k, "") for k in HOOKS})
    fwd = [a for k in HOOKS for a in ("-x", k)]
    cmd = MPI + fwd + ["-np", str(ranks), EXE] + TINY + ["--nvme-path", swap] + args
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # a hang: the run is ended here and fails
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        p = subprocess.CompletedProcess(cmd, -1, "", err + "\n(still running after %d s)" % timeout)
    return cmd, p, time.monotonic() - t0


def train(ranks, args, swap, **hooks):
    cmd, p, _ = run(ranks, args, swap, **hooks)
    if p.returncode != 0:
        failures.append("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
        return None
    return json.loads(p.stdout)


def same_files(a, b, what):
    for base in ("model", "optimizer"):
        x, y = read_set(a, base), read_set(b, base)
        diff = sorted(n for n in x if x[n] != y.get(n))
        check(set(x) == set(y) and not diff, "%s: %s tensors differ: %r" % (what, base, diff[:4]))


def same_run(what, ref, got):
    if ref is None or got is None:
        return
    for key in ("losses", "val_loss", "weights_digest"):
        check(ref[key] == got[key], "%s: %s %r, want %r" % (what, key, got[key], ref[key]))


def staged(d):
    for fmt in ("fp32", "int8"):
        flags = ["--tensor-parallel", "2", "--steps", "2", "--state-dtype", fmt]
        direct = train(2, flags + ["--save", d + "/direct-" + fmt], d + "/s")
        piece = train(2, flags + ["--save", d + "/staged-" + fmt], d + "/s",
                      ZT_TEST_STAGE_BYTES="1000")
        what = "%s states, T 2, staged in 1000-byte pieces" % fmt
        same_run(what, direct, piece)
        if direct is not None and piece is not None:
            same_files(latest(d + "/staged-" + fmt), latest(d + "/direct-" + fmt), what)


def read_fails(d):
    for ranks, flags, bad, hooks in ((2, ["--tensor-parallel", "2"], 1, {}),
                                     (4, ["--tensor-parallel", "2"], 3, {}),
                                     (2, ["--tensor-parallel", "2"], 0,
                                      {"ZT_TEST_STAGE_BYTES": "4096"})):
        cmd, p, took = run(ranks, flags + ["--steps", "1"], d + "/s", timeout=120,
                           ZT_TEST_READ_FAIL=str(bad), **hooks)
        want = "rank %d could not read its weights" % bad
        check(p.returncode != 0 and want in p.stderr and took < 60,
              "%s: exit %d after %.0f s, want '%s' within 60 s in\n%s" %
              (" ".join(cmd), p.returncode, took, want, p.stderr[-2000:]))


def device_comm(d):
    for ranks, flags in ((2, ["--tensor-parallel", "2"]),
                         (2, ["--tensor-parallel", "2", "--sequence-parallel"]),
                         (8, ["--tensor-parallel", "2", "--pipeline-stages", "2"])):
        flags = flags + ["--steps", "2"]
        tag = "%d-%d" % (ranks, len(flags))
        one = train(ranks, flags + ["--save", d + "/one" + tag], d + "/s")
        two = train(ranks, flags + ["--save", d + "/two" + tag, "-v"], d + "/s",
                    ZT_TEST_TP_DEVICE_COMM="1")
        what = "%s over a device-only second communicator" % " ".join(flags)
        same_run(what, one, two)
        if one is not None and two is not None:
            same_files(latest(d + "/two" + tag), latest(d + "/one" + tag), what)
    cmd, p, _ = run(2, ["--tensor-parallel", "2", "--steps", "1", "-v"], d + "/s",
                    ZT_TEST_TP_DEVICE_COMM="1")
    want = "tensor group reduces device memory over mpi (device allocations only)"
    check(p.returncode == 0 and p.stderr.count(want) == 2,
          "%s: exit %d, want '%s' from both ranks in\n%s" % (" ".join(cmd), p.returncode, want,
                                                            p.stderr[-2000:]))


def kv_heads_below_t(d):
    for kv, T in ((1, 2), (2, 4)):
        sub = "%s/kv%d-t%d" % (d, kv, T)
        flags = ["--hf-model", llama_dir(sub + "/hf", kv, False), "--tensor-parallel", str(T)]
        ref = train(T, flags + ["--steps", "4", "--save", sub + "/ref"], sub + "/s")
        first = train(T, flags + ["--steps", "2", "--save", sub + "/ck"], sub + "/s")
        again = train(T, flags + ["--steps", "4", "--resume", sub + "/ck", "--save",
                                  sub + "/again"], sub + "/s")
        if ref is None or first is None or again is None:
            continue
        what = "%d key/value heads of 4, T %d, resumed at T %d" % (kv, T, T)
        same_run(what, ref, dict(again, losses=first["losses"] + again["losses"]))
        same_files(latest(sub + "/again"), latest(sub + "/ref"), what)


with tempfile.TemporaryDirectory() as tmp:
    staged(tmp + "/staged")
    read_fails(tmp + "/fail")
    device_comm(tmp + "/dev")
    kv_heads_below_t(tmp + "/kv")
finish("test_train_tp_gather")
