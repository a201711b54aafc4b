#!/usr/bin/env python3
"""zo-train's checkpoints across the tensor-parallel degree T, on the cpu device under mpirun.

A run at T saves whole tensors under Hugging Face names, the files a run at T = 1 with
the same stages and data-parallel ranks writes (model.safetensors and
optimizer.safetensors, or one shard per tensor-parallel group with the indices), and a
checkpoint loads at any T, each rank keeping its part. Against the uninterrupted run:
  - resumed at the same T (2; and 2 stages x T 2 x D 2 with ZeRO 3): losses, validation
    loss, --weights-digest and the next checkpoint's tensors bitwise equal (fp32, and
    bf16 states; int8 states where every part is a whole number of 256-element blocks);
  - saved at T = 2, resumed at T = 1 and T = 4; saved at T = 1, resumed at T = 2; the
    2 x 2 x 2 checkpoint resumed at T = 1 and T = 4: losses within 2e-5 relative of the
    run continued at the saving T, the bound test_train_tp.py holds T against T = 1 to
    (not bitwise: the row-parallel sums add T partial products in another order than one
    rank's GEMM; measured about 1e-7);
  - int8 states whose blocks straddle the parts (o_proj and down_proj at T = 2 of the
    tiny model) are stored decoded in fp32; the rest stay u8 codes with their scales;
  - --init-weights of a T = 1 checkpoint's weights at T = 2 within the bound of T = 1;
  - a corrupted shard, and a shard swapped for another, refused naming the file;
  - the writing rank of a group failing its write (a file-size limit): both ranks fail,
    the other naming it, and `latest` keeps the checkpoint before.

usage: test_train_tp_ckpt.py MPIEXEC ZO_TRAIN
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from mpi_test_util import ENV, check, failures, finish, latest, mpi, read_safetensors, read_set

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
MPI = mpi(MPIEXEC)
TINY = ["--micro-batch", "2", "--seq", "32", "--val-batches", "2", "--json", "--dtype", "fp32",
        "--weights-digest"]
FP32_REL = 2e-5


def command(ranks, args, swap):
    os.makedirs(swap, exist_ok=True)
    cmd = [EXE] + TINY + ["--nvme-path", swap] + args
    return MPI + ["-np", str(ranks)] + cmd if ranks > 1 else cmd


def train(ranks, args, swap):
    cmd = command(ranks, args, swap)
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        failures.append("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
        return None
    return json.loads(p.stdout)


def tp(T):
    return ["--tensor-parallel", str(T)] if T > 1 else []


def same_files(a, b, what):
    """Two checkpoints' tensors bitwise equal."""
    for base in ("model", "optimizer"):
        x, y = read_set(a, base), read_set(b, base)
        diff = sorted(n for n in x if x[n] != y.get(n))
        check(set(x) == set(y) and not diff,
              "%s: %s tensors differ from the uninterrupted run's: %r" % (what, base, diff[:4]))


def close(what, ref, got, rel=FP32_REL):
    if ref is None or got is None:
        return
    check(len(ref["losses"]) == len(got["losses"]), "%s: %d losses" % (what, len(got["losses"])))
    for a, b in list(zip(ref["losses"], got["losses"])) + [(ref["val_loss"], got["val_loss"])]:
        check(abs(a - b) <= rel * abs(a), "%s: loss %r, continued at the saving T %r (bound %g "
              "relative)" % (what, b, a, rel))


def bitwise(what, ref, got):
    if ref is None or got is None:
        return
    for key in ("losses", "val_loss", "weights_digest"):
        check(ref[key] == got[key], "%s: %s %r, uninterrupted %r" % (what, key, got[key],
                                                                      ref[key]))


def across_t(d, saved_at, extra, ranks_of, resumes):
    """saved_at ranks (a grid: extra) run 4 steps uninterrupted, and 2 steps saved; the
    checkpoint resumed at the same grid is bitwise the uninterrupted run, and at each
    (ranks, flags) of resumes within the fp32 bound of it."""
    ref = train(ranks_of, extra + ["--steps", "4", "--save", d + "/ref"], d + "/s")
    first = train(ranks_of, extra + ["--steps", "2", "--save", d + "/ck"], d + "/s")
    again = train(ranks_of, extra + ["--steps", "4", "--resume", d + "/ck", "--save",
                                     d + "/again"], d + "/s")
    what = "saved at %s" % saved_at
    if ref is None or first is None:
        return None
    if again is not None:
        bitwise(what + ", resumed there", ref, dict(again, losses=first["losses"] +
                                                     again["losses"]))
        same_files(latest(d + "/again"), latest(d + "/ref"), what + ", resumed there")
    for ranks, flags in resumes:
        got = train(ranks, flags + ["--steps", "4", "--resume", d + "/ck"], d + "/s")
        if got is not None:
            close("%s, resumed on %d ranks %s" % (what, ranks, " ".join(flags)), ref,
                  dict(got, losses=first["losses"] + got["losses"]))
    return latest(d + "/ck")


def layout_of_t1(d):
    """The checkpoint of T = 2 (one group) is the files of T = 1: the same names,
    dtypes and shapes, single files without an index; its master weights within
    the fp32 bound of T = 1's."""
    flags = ["--grad-accum", "2", "--steps", "2"]
    one = train(1, flags + ["--save", d + "/one"], d + "/s")
    two = train(2, flags + tp(2) + ["--save", d + "/two"], d + "/s")
    if one is None or two is None:
        return
    a, b = latest(d + "/one"), latest(d + "/two")
    check(sorted(os.listdir(a)) == sorted(os.listdir(b)),
          "T 2 wrote %r, T 1 %r" % (sorted(os.listdir(b)), sorted(os.listdir(a))))
    for base in ("model", "optimizer"):
        x, y = read_set(a, base), read_set(b, base)
        check({n: t[:2] for n, t in x.items()} == {n: t[:2] for n, t in y.items()},
              "T 2's %s tensors are not T 1's names, dtypes and shapes" % base)
    # Adam's steps carry the round-off of the row-parallel sums into the weights, most
    # where an element's gradient is near zero (its update is lr times the sign of a
    # tiny m): held in norm, ||w2 - w1|| / ||w1||
    x, y = read_set(a, "model"), read_set(b, "model")
    worst = 0.0
    for n in x:
        u = struct.unpack("<%df" % (len(x[n][2]) // 4), x[n][2])
        v = struct.unpack("<%df" % (len(y[n][2]) // 4), y[n][2])
        rel = (sum((e - f) ** 2 for e, f in zip(u, v)) / sum(e * e for e in u)) ** 0.5
        worst = max(worst, rel)
        check(rel <= 1e-4, "T 2's %s differs from T 1's by %g relative in norm" % (n, rel))
    print("T 2's master weights after 2 steps: within %.3g of T 1's relative in norm" % worst)
    # the Hugging Face copy beside it: one file, the tensors of T = 1's
    x = read_set(d + "/one/hf-model", "model")
    y = read_set(d + "/two/hf-model", "model")
    check({n: t[:2] for n, t in x.items()} == {n: t[:2] for n, t in y.items()},
          "T 2's hf-model holds other tensors than T 1's")


def state_formats(d):
    """bf16 states at T 2 resume bitwise; int8 states: bitwise where every part is
    whole blocks (--dim 512 --ffn 1024), and in the tiny shape o_proj and down_proj
    (128 and 384 columns a part) stored fp32, resumed within the bound."""
    for fmt, shape, exact in (("bf16", [], True), ("int8", ["--dim", "512", "--ffn", "1024"], True),
                              ("int8", [], False)):
        sub = "%s/%s-%d" % (d, fmt, len(shape))
        flags = ["--grad-accum", "2", "--state-dtype", fmt] + shape + tp(2)
        ref = train(2, flags + ["--steps", "3", "--save", sub + "/ref"], sub + "/s")
        first = train(2, flags + ["--steps", "2", "--save", sub + "/ck"], sub + "/s")
        got = train(2, flags + ["--steps", "3", "--resume", sub + "/ck", "--save", sub + "/b"],
                    sub + "/s")
        if ref is None or first is None or got is None:
            continue
        what = "%s states%s, T 2 resumed at T 2" % (fmt, " " + " ".join(shape) if shape else "")
        got = dict(got, losses=first["losses"] + got["losses"])
        if exact:
            bitwise(what, ref, got)
            same_files(latest(sub + "/b"), latest(sub + "/ref"), what)
        else:
            close(what, ref, got, 1e-4)
        opt = read_safetensors(latest(sub + "/ck") + "/optimizer.safetensors")
        for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
                     "model.layers.0.self_attn.q_proj.weight"):
            want = "U8" if fmt == "int8" and (exact or "q_proj" in name) else \
                "F32" if fmt == "int8" else "BF16"
            have = opt[name + ".exp_avg"][0]
            check(have == want and (name + ".exp_avg.absmax" in opt) == (want == "U8"),
                  "%s: %s's moments are %s, want %s" % (what, name, have, want))
        if fmt == "int8":
            got4 = train(4, flags[:-2] + tp(4) + ["--steps", "3", "--resume", sub + "/ck"],
                         sub + "/s")
            if got4 is not None:
                close(what[:-1] + "4", ref, dict(got4, losses=first["losses"] + got4["losses"]),
                      1e-4)


def init_weights(d):
    """--init-weights of a T = 1 checkpoint's weights: T 2 within the bound of T 1."""
    src = train(1, ["--steps", "1", "--save", d + "/src"], d + "/s")
    if src is None:
        return
    init = ["--init-weights", latest(d + "/src") + "/model.safetensors", "--steps", "2"]
    close("--init-weights at T 2", train(1, init, d + "/s"), train(2, init + tp(2), d + "/s"))


def refusals(d, grid_ckpt):
    """A corrupted shard and a shard swapped for another are refused by name at T 4."""
    if grid_ckpt is None:
        return
    import shutil
    for what, spoil in (("a flipped bit", "flip"), ("a shard swapped for another", "swap")):
        bad = d + "/bad-" + spoil
        shutil.copytree(os.path.dirname(grid_ckpt), bad)
        step = os.path.join(bad, os.path.basename(grid_ckpt))
        name = "model-00002-of-00004.safetensors"
        if spoil == "flip":
            with open(os.path.join(step, name), "r+b") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                f.seek(8 + n + 100)
                b = f.read(1)
                f.seek(8 + n + 100)
                f.write(bytes([b[0] ^ 1]))
        else:
            shutil.copy(os.path.join(step, "model-00003-of-00004.safetensors"),
                        os.path.join(step, name))
        cmd = command(4, tp(4) + ["--grad-accum", "4", "--steps", "4", "--resume", bad],
                      d + "/s")
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
        check(p.returncode != 0 and name in p.stderr,
              "%s: exit %d, want %s named in\n%s" % (what, p.returncode, name, p.stderr[-2000:]))


def writer_fails(d):
    """Rank 0 writes its group's shard; with its files limited to 1 MiB (SIGXFSZ ignored:
    EFBIG) its write fails, rank 1 (which only gives its parts) fails too naming it, no
    rank waits, and latest keeps step 1."""
    flags = ["--offload-optimizer", "cpu", "--grad-accum", "2"] + tp(2)
    if train(2, flags + ["--steps", "1", "--save", d + "/ck"], d + "/s") is None:
        return
    args = TINY + ["--nvme-path", d + "/s", "--steps", "2", "--resume", d + "/ck", "--save",
                   d + "/ck"] + flags
    shell = "ulimit -f 1024; trap '' XFSZ; exec \"$@\""
    cmd = MPI + ["-np", "1", "sh", "-c", shell, "sh", EXE] + args + [":", "-np", "1", EXE] + args
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    check(p.returncode != 0 and "[rank 1]" in p.stderr and "failed on rank 0" in p.stderr,
          "the writer's save failing: exit %d, want rank 1 to name rank 0 in\n%s" %
          (p.returncode, p.stderr[-2000:]))
    check(latest(d + "/ck").endswith("step-00000001"), "latest moved to %s" % latest(d + "/ck"))


with tempfile.TemporaryDirectory() as tmp:
    layout_of_t1(tmp + "/layout")
    across_t(tmp + "/t2", "T 2", ["--grad-accum", "2"] + tp(2), 2,
             [(1, ["--grad-accum", "2"]), (4, ["--grad-accum", "2"] + tp(4))])
    across_t(tmp + "/t1", "T 1", ["--grad-accum", "2"], 1, [(2, ["--grad-accum", "2"] + tp(2))])
    grid = across_t(tmp + "/grid", "2 stages x T 2 x D 2, ZeRO 3",
                    ["--grad-accum", "2", "--pipeline-stages", "2", "--zero-stage", "3"] + tp(2), 8,
                    [(1, ["--grad-accum", "4"]), (4, ["--grad-accum", "4"] + tp(4))])
    state_formats(tmp + "/formats")
    init_weights(tmp + "/init")
    refusals(tmp, grid)
    writer_fails(tmp + "/fail")
finish("test_train_tp_ckpt")
