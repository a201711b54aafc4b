#!/usr/bin/env python3
"""zo-train's checkpoints across ranks (ZeRO) on the cpu device, under mpirun.

Each rank writes its own chunks' tensors as shards under Hugging Face names
with model.safetensors.index.json (and the optimizer's moments with their own
index); a checkpoint resumes at another world size, each rank reading what it
owns there. Against one uninterrupted run with the same global batch (one rank
with --grad-accum 4 or 2 over the same micro-batches):
  - 4 ranks -> 1 rank, 1 rank -> 2 ranks and 2 ranks -> 1 rank (stages 2, 1
    and 3): losses, validation loss and the
    final master weights bitwise equal (N ranks with --grad-accum 1 reduce in
    the order one rank with --grad-accum N accumulates);
  - 1 rank x --grad-accum 4, 2 ranks x 2 and 4 ranks x 1 (stages 1, 2, 3;
    states in RAM and on NVMe; sync, overlap with clipping, dpu): losses,
    validation loss and --weights-digest bitwise equal, the global reduction
    order (zo/engine.h) summing in the step's micro-batch order;
  - 4 ranks -> 2 ranks -> 1 rank, the 2-rank part with --grad-accum 2:
    bitwise in the global order; in the rank order (zoffload.reduce_order
    "rank") each rank sums its two micro-batches before the ranks' sums are
    added, (g0+g1)+(g2+g3) against ((g0+g1)+g2)+g3, so there the losses are
    compared within 1e-4; a --reduce-order differing on one rank is refused
    naming it;
  - the data position and the training state carry over (step, schedule);
  - --init-weights and --hf-model across ranks equal one rank's;
  - a save that fails on one rank fails on every rank and leaves the previous
    checkpoint as `latest`.

usage: test_train_zero_ckpt.py MPIEXEC ZO_TRAIN
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from mpi_test_util import ENV, check, failures, finish, latest, mpi, read_safetensors

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
MPI = mpi(MPIEXEC)
TINY = ["--micro-batch", "2", "--seq", "32", "--val-batches", "2", "--offload-param", "cpu",
        "--json"]


def train(ranks, args, swap):
    os.makedirs(swap, exist_ok=True)
    cmd = [EXE] + TINY + ["--nvme-path", swap] + args
    if ranks > 1:
        cmd = MPI + ["-np", str(ranks)] + cmd
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        failures.append("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
        return None
    return json.loads(p.stdout)


def read_set(d, base):
    """Every tensor of d's base.safetensors, or of the shards its index names."""
    index = os.path.join(d, base + ".safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, base + ".safetensors"))
    with open(index) as f:
        wmap = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wmap.values())):
        for name, t in read_safetensors(os.path.join(d, shard)).items():
            check(wmap.get(name) == shard, "%s: %s is in %s, the index says %s" %
                  (index, name, shard, wmap.get(name)))
            out[name] = t
    check(set(out) == set(wmap), "%s: the shards hold %d tensors, the index names %d" %
          (index, len(out), len(wmap)))
    return out


def same_weights(ckpt_a, ckpt_b, what):
    a, b = read_set(ckpt_a, "model"), read_set(ckpt_b, "model")
    check(set(a) == set(b), "%s: tensor names differ" % what)
    diff = [n for n in a if n in b and a[n] != b[n]]
    check(not diff, "%s: %d master weights differ bitwise, first %s" %
          (what, len(diff), diff[:1]))
    oa, ob = read_set(ckpt_a, "optimizer"), read_set(ckpt_b, "optimizer")
    diff = [n for n in oa if n in ob and oa[n] != ob[n]]
    check(set(oa) == set(ob) and not diff, "%s: %d optimizer tensors differ" % (what, len(diff)))


def check_layout(ckpt, ranks, fmt):
    """Shards as transformers writes them, the optimizer's manifest, the state."""
    names = sorted(os.listdir(ckpt))
    for base in ("model", "optimizer"):
        shards = ["%s-%05d-of-%05d.safetensors" % (base, r + 1, ranks) for r in range(ranks)]
        check(all(s in names for s in shards), "%s: %s shards missing: %s" % (ckpt, base, names))
        with open(os.path.join(ckpt, base + ".safetensors.index.json")) as f:
            index = json.load(f)
        total = sum(len(t[2]) for t in read_set(ckpt, base).values())
        check(index["metadata"]["total_size"] == total,
              "%s: %s index total_size %r, the tensors' bytes %d" %
              (ckpt, base, index["metadata"]["total_size"], total))
        check(sorted(set(index["weight_map"].values())) == shards,
              "%s: %s index names %r" % (ckpt, base, sorted(set(index["weight_map"].values()))))
    with open(os.path.join(ckpt, "optimizer.safetensors.index.json")) as f:
        meta = json.load(f)["metadata"]
    check(meta.get("optimizer_state_dtype") == fmt and meta.get("world_size") == ranks,
          "%s: the optimizer's manifest says %r" % (ckpt, meta))
    model = read_set(ckpt, "model")
    check("model.embed_tokens.weight" in model and "lm_head.weight" in model and
          all(t[0] == "F32" for t in model.values()), "%s: not the fp32 model by HF names" % ckpt)
    if fmt == "int8":
        opt = read_set(ckpt, "optimizer")
        coded = [n[:-len(".absmax")] for n in opt if n.endswith(".exp_avg.absmax")]
        check(coded and all(opt[n][0] == "U8" for n in coded),
              "%s: int8 moments are not u8 codes with absmax" % ckpt)
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        state = json.load(f)
    check(state["batch"]["world_size"] == ranks, "%s: batch %r" % (ckpt, state["batch"]))
    check(not any(n.endswith(".tmp") for n in os.listdir(os.path.dirname(ckpt))),
          "%s: a .tmp left beside it" % ckpt)


def bitwise_reshard(d, first, second, ga, opts, what):
    """first ranks for 2 steps, then second ranks for 2 more, against one rank
    with --grad-accum ga for 4; each part runs ga / ranks micro-batches a rank."""
    ref = train(1, opts + ["--steps", "4", "--grad-accum", str(ga), "--save", d + "/ref"],
                d + "/s-ref")
    a = train(first, opts + ["--steps", "2", "--grad-accum", str(ga // first), "--save",
                             d + "/ck"], d + "/s-a")
    if a is not None and first > 1:
        check_layout(latest(d + "/ck"), first, opts[opts.index("--state-dtype") + 1]
                     if "--state-dtype" in opts else "fp32")
    b = train(second, opts + ["--steps", "4", "--grad-accum", str(ga // second), "--resume",
                              d + "/ck", "--save", d + "/ck"], d + "/s-b")
    if ref is None or a is None or b is None:
        return
    check(a["losses"] + b["losses"] == ref["losses"],
          "%s: losses %r + %r, uninterrupted %r" % (what, a["losses"], b["losses"], ref["losses"]))
    check(b["val_loss"] == ref["val_loss"],
          "%s: val_loss %r, uninterrupted %r" % (what, b["val_loss"], ref["val_loss"]))
    same_weights(latest(d + "/ck"), latest(d + "/ref"), what)
    # DIR/hf-model as the last part's ranks wrote it (one shard a rank, with
    # the index and config.json) holds the uninterrupted run's bf16 weights
    mine, theirs = read_set(d + "/ck/hf-model", "model"), read_set(d + "/ref/hf-model", "model")
    check(mine == theirs and os.path.exists(d + "/ck/hf-model/config.json"),
          "%s: hf-model differs from the uninterrupted run's (%d vs %d tensors)" %
          (what, len(mine), len(theirs)))
    if second > 1:
        check(os.path.exists(d + "/ck/hf-model/model.safetensors.index.json"),
              "%s: hf-model of %d ranks has no index" % (what, second))


with tempfile.TemporaryDirectory() as d:
    bitwise_reshard(d, 4, 1, 4, ["--offload-optimizer", "nvme", "--state-dtype", "int8"],
                    "4 ranks (stage 2, int8 states on NVMe) -> 1 rank")
with tempfile.TemporaryDirectory() as d:
    bitwise_reshard(d, 1, 2, 2, ["--offload-optimizer", "cpu", "--zero-stage", "1"],
                    "1 rank -> 2 ranks (stage 1, states in RAM)")
with tempfile.TemporaryDirectory() as d:
    bitwise_reshard(d, 2, 1, 2, ["--offload-optimizer", "cpu", "--zero-stage", "3",
                                 "--optimizer-mode", "overlap"],
                    "2 ranks (stage 3, overlap) -> 1 rank")

def global_batch_of_4(d, opts, what):
    """1 rank x --grad-accum 4, 2 ranks x 2 and 4 ranks x 1: the global
    reduction order sums every chunk's gradients in the step's micro-batch
    order whatever the split, so all three are bitwise equal."""
    runs = [train(ranks, opts + ["--steps", "3", "--grad-accum", str(4 // ranks),
                                 "--weights-digest"], "%s/g-%d" % (d, ranks))
            for ranks in (1, 2, 4)]
    if None in runs:
        return
    one = runs[0]
    for ranks, r in zip((2, 4), runs[1:]):
        w = "%s, %d ranks x %d" % (what, ranks, 4 // ranks)
        check(r["losses"] == one["losses"] and r["val_loss"] == one["val_loss"],
              "%s: losses %r val %r, one rank x 4 %r val %r" %
              (w, r["losses"], r["val_loss"], one["losses"], one["val_loss"]))
        check(r["weights_digest"] == one["weights_digest"],
              "%s: weights digest %s, one rank x 4 %s" %
              (w, r["weights_digest"], one["weights_digest"]))
        check(r["config"]["reduce_order"] == "global", "%s: config %r" % (w, r["config"]))


with tempfile.TemporaryDirectory() as d:
    global_batch_of_4(d, ["--offload-optimizer", "cpu", "--zero-stage", "2"],
                      "stage 2, states in RAM")
with tempfile.TemporaryDirectory() as d:
    global_batch_of_4(d, ["--offload-optimizer", "nvme", "--zero-stage", "3",
                          "--optimizer-mode", "overlap", "--max-grad-norm", "0.5"],
                      "stage 3, states on NVMe, overlap, clipping")
with tempfile.TemporaryDirectory() as d:
    global_batch_of_4(d, ["--offload-optimizer", "cpu", "--zero-stage", "1",
                          "--optimizer-mode", "dpu"], "stage 1, dpu")


def resume_4_2_1(d, order):
    """4 -> 2 -> 1 ranks, 2 steps each, the global batch 4 micro-batches
    throughout (the 2-rank part with --grad-accum 2), against one rank with
    --grad-accum 4: bitwise in the global order; in the rank order each rank
    of the 2-rank part sums its two micro-batches before the ranks' sums are
    added, (g0+g1)+(g2+g3) against ((g0+g1)+g2)+g3, equal within rounding."""
    # bf16: a config without a precision trains in fp32, where weights near zero (~1e-8) make
    # the element-wise relative bound below ill-conditioned (measured: 1.6e-8 relative in norm,
    # 0.034 on one such element); a learning rate that changes at every step
    with open(d + "/ds.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                   "zoffload": {"reduce_order": order},
                   "scheduler": {"type": "WarmupLR", "params": {
                       "warmup_min_lr": 5e-4, "warmup_max_lr": 2e-3, "warmup_num_steps": 8}}}, f)
    opts = ["--offload-optimizer", "cpu", "--config", d + "/ds.json"]
    ref = train(1, opts + ["--steps", "6", "--grad-accum", "4", "--save", d + "/ref"],
                d + "/s-ref")
    parts = []
    for ranks, upto in ((4, 2), (2, 4), (1, 6)):
        extra = ["--resume", d + "/ck"] if parts else []
        out = train(ranks, opts + extra + ["--steps", str(upto), "--grad-accum", str(4 // ranks),
                                           "--save", d + "/ck"], d + "/s-%d" % ranks)
        parts.append(out)
    if ref is None or None in parts:
        return
    got = parts[0]["losses"] + parts[1]["losses"] + parts[2]["losses"]
    what = "4 -> 2 -> 1 ranks, %s order" % order
    check(parts[1]["config"]["reduce_order"] == order, "%s: the 2-rank part says %r" %
          (what, parts[1]["config"]))
    check(got[:2] == ref["losses"][:2], "%s: 4 ranks' losses %r, one rank %r" %
          (what, got[:2], ref["losses"][:2]))
    check([p["lrs"] for p in parts] == [ref["lrs"][0:2], ref["lrs"][2:4], ref["lrs"][4:6]]
          and len(set(ref["lrs"])) >= 4,
          "%s: learning rates %r, uninterrupted %r" % (what, [p["lrs"] for p in parts],
                                                      ref["lrs"]))
    a, b = read_set(latest(d + "/ck"), "model"), read_set(latest(d + "/ref"), "model")
    worst = max(max(abs(x - y) / max(abs(y), 1e-30) for x, y in
                    zip(struct.unpack("<%df" % (len(a[n][2]) // 4), a[n][2]),
                        struct.unpack("<%df" % (len(b[n][2]) // 4), b[n][2])))
                for n in b)
    print("%s: losses %r, uninterrupted %r; %d of %d master tensors differ bitwise, relative "
          "%.3g at most" % (what, got, ref["losses"], sum(a[n] != b[n] for n in b), len(b), worst))
    if order == "global":
        check(got == ref["losses"], "%s: losses %r, uninterrupted %r" % (what, got,
                                                                        ref["losses"]))
        check(parts[2]["val_loss"] == ref["val_loss"], "%s: val_loss %r, uninterrupted %r" %
              (what, parts[2]["val_loss"], ref["val_loss"]))
        same_weights(latest(d + "/ck"), latest(d + "/ref"), what)
    else:
        close = all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(got, ref["losses"]))
        check(len(got) == 6 and close, "%s: losses %r, uninterrupted %r" % (what, got,
                                                                           ref["losses"]))
        check(abs(parts[2]["val_loss"] - ref["val_loss"]) <= 1e-4 * ref["val_loss"],
              "%s: val_loss %r, uninterrupted %r" % (what, parts[2]["val_loss"],
                                                      ref["val_loss"]))
        check(worst <= 1e-3, "%s: the master weights differ by %g relative" % (what, worst))
    # another global batch is another run: refused, naming it
    cmd = MPI + ["-np", "2", EXE] + TINY + opts + ["--nvme-path", d + "/s-x", "--steps", "8",
                                                  "--resume", d + "/ck"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    check(p.returncode != 0 and "--grad-accum x ranks 4 (4 x 1), now 2 (1 x 2)" in p.stderr,
          "resuming with half the global batch: exit %d\n%s" % (p.returncode, p.stderr[-2000:]))
    with open(os.path.join(latest(d + "/ck"), "trainer_state.json")) as f:
        state = json.load(f)
    check(state["step"] == 6 and state["batch"]["world_size"] == 1,
          "%s: the last checkpoint says step %r, batch %r" % (what, state["step"],
                                                              state["batch"]))


for order in ("global", "rank"):
    with tempfile.TemporaryDirectory() as d:
        resume_4_2_1(d, order)

# the order differing on one rank is refused by the ranks' config check, naming it
with tempfile.TemporaryDirectory() as d:
    base = [EXE] + TINY + ["--nvme-path", d, "--grad-accum", "2", "--steps", "1"]
    p = subprocess.run(MPI + ["-np", "1"] + base + [":", "-np", "1"] + base +
                       ["--reduce-order", "rank"], env=ENV, capture_output=True, text=True,
                       timeout=300)
    check(p.returncode != 0 and "--reduce-order" in p.stderr,
          "--reduce-order rank on rank 1 only: exit %d\n%s" % (p.returncode, p.stderr[-2000:]))

# --init-weights and --hf-model across ranks: each rank sets its own tensors
with tempfile.TemporaryDirectory() as d:
    opts = ["--offload-optimizer", "cpu", "--steps", "2"]
    src = train(1, opts + ["--save", d + "/src"], d + "/s0")
    if src is not None:
        init = ["--init-weights", latest(d + "/src") + "/model.safetensors"]
        one = train(1, opts + init + ["--grad-accum", "2"], d + "/s1")
        two = train(2, opts + init, d + "/s2")
        check(one is not None and two is not None and one["losses"] == two["losses"],
              "--init-weights: 2 ranks' losses %r, one rank's %r" %
              (two and two["losses"], one and one["losses"]))
        hf = ["--hf-model", d + "/src/hf-model"]
        one = train(1, opts + hf + ["--grad-accum", "2"], d + "/s3")
        two = train(2, opts + hf, d + "/s4")
        check(one is not None and two is not None and one["losses"] == two["losses"],
              "--hf-model: 2 ranks' losses %r, one rank's %r" %
              (two and two["losses"], one and one["losses"]))

# A save failing on one rank fails on every rank, and `latest` keeps the last
# good checkpoint: rank 1 runs under a file-size limit below its shard's size,
# (a) with SIGXFSZ ignored, so its write fails with EFBIG and the ranks agree
# to fail naming it; (b) with SIGXFSZ's default action, so it dies in the middle
# of writing its shard (a crash mid-save; mpirun ends the others).
def limited_save(d, trap):
    args = TINY + ["--nvme-path", d + "/s", "--steps", "2", "--resume", d + "/ck", "--save",
                   d + "/ck", "--offload-optimizer", "cpu"]
    shell = "ulimit -f 1024; %s exec \"$@\"" % ("trap '' XFSZ;" if trap else "")
    cmd = MPI + ["-np", "1", EXE] + args + [":", "-np", "1", "sh", "-c", shell, "sh", EXE] + args
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


for trap in (True, False):
    what = "rank 1's shard write %s" % ("failing (EFBIG)" if trap else "killed (SIGXFSZ)")
    with tempfile.TemporaryDirectory() as d:
        good = train(2, ["--offload-optimizer", "cpu", "--steps", "1", "--save", d + "/ck"],
                     d + "/s")
        if good is None:
            continue
        p = limited_save(d, trap)
        check(p.returncode != 0, "%s: exit 0" % what)
        if trap:
            check("[rank 0]" in p.stderr and "failed on rank 1" in p.stderr,
                  "%s: rank 0 does not name rank 1:\n%s" % (what, p.stderr[-2000:]))
        check(latest(d + "/ck").endswith("step-00000001"),
              "%s: latest moved to %s" % (what, latest(d + "/ck")))
        again = train(1, ["--offload-optimizer", "cpu", "--steps", "2", "--grad-accum", "2",
                          "--resume", d + "/ck", "--save", d + "/ck"], d + "/s1")
        check(again is not None and again["losses"] == [] or again is not None,
              "%s: the checkpoint before it does not load" % what)
        if again is not None:
            check(latest(d + "/ck").endswith("step-00000002") and
                  not any(n.endswith(".tmp") for n in os.listdir(d + "/ck")),
                  "%s: the next save did not clear the half-written one" % what)

finish("test_train_zero_ckpt")
