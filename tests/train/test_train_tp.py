#!/usr/bin/env python3
"""zo-train's tensor parallelism (--tensor-parallel T) on the cpu device, under mpirun.

T = 2 and 4 against one rank (T = 1) at the same batch: in fp32 every step's loss
and the validation loss agree within 2e-5 relative. Not bitwise: o_proj and
down_proj sum T partial products over the group (an exact chain in rank order,
but a different order than one rank's GEMM sums over the whole inner dimension),
the q/k/v and gate/up input gradients likewise, so each differs from one rank's
by fp32 round-off (about 1e-7 relative a value), which three Adam steps carry
into the losses (1e-7 to 1e-6 relative measured). bf16 runs agree within 2e-3
relative (bf16's own step is 3.9e-3). The first step's loss, before any update,
is a forward only. The embedding and the head are split over the vocabulary
(a masked lookup summed over the group; a cross-entropy combined from the ranks'
maxima, sums of exps and target logits): with a vocabulary-sized model a rank's
device high-water mark is 1/T of one rank's. For a fixed T every placement and optimizer mode gives the
same bits (the all-reduces are exact chains: no order depends on timing), and
every tier's per-rank peak (device, pinned, host, NVMe) is 1/T of one rank's.
Pipeline stages and data-parallel ranks combine with T: 2 stages x T 2 (4
ranks) and 2 x 2 x 2 (8 ranks) against T 2 alone at the same global batch.
--hf-model loads and splits (grouped-query attention with 2 key/value heads at
T = 2, and with fewer key/value heads than T, shared; Llama's attention_bias; a tied
head). What cannot split is refused by name: ranks not a multiple of S x T, heads
not dividing by T, and key/value heads neither a multiple of T nor dividing it
(test_train_tp_ckpt.py tests checkpoints across T, test_train_tp_fp16.py fp16). --weights-digest gathers whole tensors: one
digest for one model's weights at every T and grid.

usage: test_train_tp.py MPIEXEC ZO_TRAIN
"""
import json
import os
import sys
import tempfile

from mpi_test_util import bitwise, check, failures, finish, llama_dir, refusals, runner

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
TINY = ["--steps", "3", "--micro-batch", "2", "--seq", "32", "--val-batches", "2", "--json"]
FP32_REL, BF16_REL = 2e-5, 2e-3
run, train = runner(MPIEXEC, EXE, TINY)


def close(what, ref, got, rel):
    if ref is None or got is None:
        return
    pairs = list(zip(ref["losses"], got["losses"])) + [(ref["val_loss"], got["val_loss"])]
    check(len(ref["losses"]) == len(got["losses"]), "%s: %d losses" % (what, len(got["losses"])))
    for a, b in pairs:
        check(abs(a - b) <= rel * abs(a), "%s: loss %r, T = 1 %r (bound %g relative)" %
              (what, b, a, rel))


def against_one_rank(d):
    for dt, rel in (("fp32", FP32_REL), ("bf16", BF16_REL)):
        # the update in end_step on one rank too: with a model-parallel group the engine does
        # not run it behind the forward (two sets of gradient buffers), so the bytes compare
        flags = ["--grad-accum", "2", "--dtype", dt, "--update-behind", "off"]
        one = train(1, flags, d + "/one-" + dt)
        for T in (2, 4):
            got = train(T, flags + ["--tensor-parallel", str(T)], d + "/t%d-%s" % (T, dt))
            close("T %d %s" % (T, dt), one, got, rel)
            if got is not None:
                check(got["config"]["tensor_parallel"] == T, "T %d: config %r" % (T, got["config"]))
            if dt == "fp32" and got is not None and one is not None:
                for tier in ("device", "pinned", "host", "nvme"):
                    a, b = one["peak_bytes"][tier], got["peak_bytes"][tier]
                    check(b * T == a, "T %d: peak %s bytes %d per rank, one rank's %d / %d = %g" %
                          (T, tier, b, a, T, a / T))
                check(one["losses"][0] == got["losses"][0] or
                      abs(one["losses"][0] - got["losses"][0]) <= 1e-6 * one["losses"][0],
                      "T %d: the first forward %r vs %r" % (T, got["losses"][0], one["losses"][0]))


def vocab_split(d):
    """The embedding and the head split over the vocabulary: with a model whose bytes
    are nearly all vocabulary (16384 ids of 64 dimensions), a rank's device high-water
    mark and its activation bytes (the head's logits, the embedding's gradient
    accumulator) are 1/T of one rank's, within the replicated activations and the
    norms' gathers (measured: 1.003x and 1.022x at T = 2, 1.008x and 1.065x at T = 4).
    A whole-vocabulary copy on a rank (the table gathered, or full logits) fails it."""
    flags = ["--dtype", "fp32", "--vocab", "16384", "--dim", "64", "--heads", "4", "--ffn",
             "128", "--layers", "2", "--steps", "2"]
    one = train(1, flags, d + "/v1")
    for T in (2, 4):
        got = train(T, flags + ["--tensor-parallel", str(T)], d + "/v%d" % T)
        close("vocabulary-sized model, T %d" % T, one, got, FP32_REL)
        if one is None or got is None:
            continue
        for key, bound in (("high_water", 1.02), ("activation_bytes", 1.1)):
            a, b = one["device"][key], got["device"][key]
            check(b * T <= bound * a, "T %d: device %s %d per rank, one rank's %d / %d = %g "
                  "(bound %gx)" % (T, key, b, a, T, a / T, bound))


def digests(d):
    """--weights-digest hashes whole tensors, each gathered from its group's parts and
    merged (row-parallel columns, shared key/value heads, the vocabulary's rows, the
    norms' parts): before any step, the weights of one --hf-model (a key/value head
    with biases shared by the ranks) have one digest at T = 1, 2 and 4, and on the
    grids T 2 x D 2, 2 stages x T 2 and 2 x 2 x 2."""
    m = ["--hf-model", llama_dir(d + "/hf-1-1", 1, True), "--steps", "0", "--grad-accum", "4",
         "--weights-digest", "--dtype", "fp32"]
    one = train(1, m, d + "/d1")
    for ranks, extra in ((2, ["--tensor-parallel", "2"]), (4, ["--tensor-parallel", "4"]),
                         (4, ["--tensor-parallel", "2"]),
                         (4, ["--tensor-parallel", "2", "--pipeline-stages", "2"]),
                         (8, ["--tensor-parallel", "2", "--pipeline-stages", "2"])):
        got = train(ranks, m + extra, d + "/d%d" % ranks)
        if one is not None and got is not None:
            check(got.get("weights_digest") == one.get("weights_digest"),
                  "%d ranks %s: weights digest %r, T = 1 %r" %
                  (ranks, " ".join(extra), got.get("weights_digest"), one.get("weights_digest")))


def placements(d):
    """T = 2: the optimizer states on NVMe (default), in host memory, the parameters on the
    device, the overlap mode and the block inputs in host memory (--act-home host): the same
    bits; dpu the same across placements. T from a DeepSpeed config's
    tensor_parallel.autotp_size (and its inference name tp_size) is --tensor-parallel's run."""
    base = ["--grad-accum", "2", "--dtype", "fp32", "--tensor-parallel", "2", "--weights-digest"]
    ref = train(2, base, d + "/p0")
    check(ref is None or len(ref.get("weights_digest", "")) == 16, "T 2: a weights digest")
    for i, extra in enumerate((["--offload-optimizer", "cpu"],
                               ["--offload-optimizer", "cpu", "--offload-param", "none"],
                               ["--optimizer-mode", "overlap"], ["--act-home", "host"])):
        bitwise("T 2 " + " ".join(extra), ref, train(2, base + extra, d + "/p%d" % (i + 1)))
    # a config brings DeepSpeed's defaults (no clipping): against the flag with an empty one
    plain = os.path.join(d, "tp-none.json")
    with open(plain, "w") as f:
        json.dump({}, f)
    flag = train(2, base + ["--config", plain], d + "/pc")
    for i, key in enumerate(("autotp_size", "tp_size")):
        cfg = os.path.join(d, "tp-%s.json" % key)
        with open(cfg, "w") as f:
            json.dump({"tensor_parallel": {key: 2}}, f)
        bitwise("T 2 from the config's tensor_parallel.%s" % key, flag,
                train(2, base[:4] + base[6:] + ["--config", cfg], d + "/pc%d" % i))
    # dpu applies each update a step late (not sync's losses): itself across placements
    dpu = base + ["--optimizer-mode", "dpu"]
    bitwise("T 2 dpu, states in host memory", train(2, dpu, d + "/p5"),
            train(2, dpu + ["--offload-optimizer", "cpu"], d + "/p6"))


def grids(d):
    """S x D x T against T alone at the same global batch (D ranks with grad-accum k
    are one rank with grad-accum D k, bitwise, as the ZeRO tests show)."""
    base = ["--dtype", "fp32", "--tensor-parallel", "2"]
    ref = train(2, base + ["--grad-accum", "4"], d + "/g0")
    close("2 stages x T 2", ref,
          train(4, base + ["--grad-accum", "4", "--pipeline-stages", "2"], d + "/g1"), FP32_REL)
    close("T 2 x D 2", ref, train(4, base + ["--grad-accum", "2"], d + "/g2"), FP32_REL)
    close("2 x 2 x 2", ref,
          train(8, base + ["--grad-accum", "2", "--pipeline-stages", "2"], d + "/g3"), FP32_REL)


def hf_models(d):
    """--hf-model split over T: grouped-query attention (2 key/value heads of 4) and
    Llama's attention_bias (o_proj's bias added once, after the sum) within the fp32
    bound of T = 1; fewer key/value heads than ranks (2 over 4 ranks, and one head with
    its biases over 2 and 4), each shared by the ranks whose query heads use it, within
    the same bound (measured about 1e-7; without the sum of the sharing ranks' gradients
    the step-2 loss moves by 4e-4), with every tier 1/T per rank; 3 key/value heads of
    12 over 4 ranks (a rank's query heads would use two) refused by name."""
    flags = ["--grad-accum", "2", "--dtype", "fp32"]
    for kv, bias in ((2, False), (4, True)):
        m = ["--hf-model", llama_dir(d + "/hf-%d-%d" % (kv, bias), kv, bias)]  # hf-2-0, hf-4-1
        one = train(1, flags + m, d + "/h1")
        close("--hf-model %d kv heads%s, T 2" % (kv, " with biases" if bias else ""), one,
              train(2, flags + m + ["--tensor-parallel", "2"], d + "/h2"), FP32_REL)
    # tied: the head is the embedding, split over the vocabulary the same way
    m = ["--hf-model", llama_dir(d + "/hf-tied", 4, False, tied=True)]
    close("--hf-model tied, T 2", train(1, flags + m, d + "/h1"),
          train(2, flags + m + ["--tensor-parallel", "2"], d + "/h2"), FP32_REL)
    for kv, bias in ((2, False), (1, True)):  # hf-2-0 above, hf-1-1
        m = ["--hf-model", llama_dir(d + "/hf-%d-%d" % (kv, bias), kv, bias)]
        one = train(1, flags + m, d + "/h1")
        for T in ((4,) if kv == 2 else (2, 4)):
            got = train(T, flags + m + ["--tensor-parallel", str(T)], d + "/h%d" % T)
            close("--hf-model %d kv heads%s, T %d" % (kv, " with biases" if bias else "", T), one,
                  got, FP32_REL)
            if one is not None and got is not None:
                for tier in ("device", "nvme"):
                    a, b = one["peak_bytes"][tier], got["peak_bytes"][tier]
                    check(b * T == a, "%d kv heads, T %d: peak %s bytes %d per rank, one rank's "
                          "%d" % (kv, T, tier, b, a))
    m = ["--hf-model", llama_dir(d + "/hf-3-of-12", 3, False, heads=12)]
    cmd, rc, out, err = run(4, flags + m + ["--tensor-parallel", "4"], d + "/h4")
    check(rc != 0 and "3 key/value heads" in err and "3 must divide 4" in err,
          "%s: exit %d, want the key/value heads named in\n%s" % (" ".join(cmd), rc, err[-1500:]))


def refused(d):
    cases = ((3, ["--tensor-parallel", "2"], "needs a multiple of 2 ranks"),
             (3, ["--tensor-parallel", "3"], "4 is not a multiple of 3"))
    refusals(run, cases, d + "/r")


with tempfile.TemporaryDirectory() as tmp:
    against_one_rank(tmp)
    vocab_split(tmp)
    placements(tmp)
    grids(tmp)
    hf_models(tmp)
    digests(tmp)
    refused(tmp)
finish("test_train_tp")
