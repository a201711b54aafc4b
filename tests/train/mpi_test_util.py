"""What zo-train's multi-rank tests share: mpirun's environment and flags
(root allowed, oversubscribed, unbound, as CI runs them), failures
collected by check() and reported by finish(), and small Llama models
written without torch (llama_dir).
"""
import array
import json
import os
import random
import struct
import subprocess
import sys

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def mpi(mpiexec):
    """mpirun's command line before -np."""
    return [mpiexec, "--oversubscribe", "--bind-to", "none"]


def check(cond, what):
    if not cond:
        failures.append(what)


def finish(name):
    """Prints the failures and exits 1 if there were any."""
    for f in failures:
        print("FAIL:", f)
    print("%s: %d failure(s)" % (name, len(failures)))
    sys.exit(1 if failures else 0)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes)"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in head.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], v["shape"], data[a:b])
    return out


def latest(d):
    """The checkpoint directory d/latest names."""
    with open(os.path.join(d, "latest")) as f:
        return os.path.join(d, f.read().strip())


def runner(mpiexec, exe, base):
    """run(ranks, extra, swap) -> (cmd, rc, stdout, stderr) and train(ranks, extra, d) ->
    zo-train's --json output (None, with the failure recorded, when it fails): exe with
    the flags base + --nvme-path swap + extra, under mpirun when ranks > 1."""
    launcher = mpi(mpiexec)

    def run(ranks, extra, swap):
        os.makedirs(swap, exist_ok=True)
        cmd = [exe] + base + ["--nvme-path", swap] + extra
        cmd = launcher + ["-np", str(ranks)] + cmd if ranks > 1 else cmd
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
        return cmd, p.returncode, p.stdout, p.stderr

    def train(ranks, extra, d):
        cmd, rc, out, err = run(ranks, extra, d)
        if rc != 0:
            failures.append("%s: exit %d\n%s" % (" ".join(cmd), rc, err[-2000:]))
            return None
        return json.loads(out)

    return run, train


def bitwise(what, ref, got):
    """The losses, validation loss and weights digest of two runs are the same bits."""
    if ref is None or got is None:
        return
    for key in ("losses", "val_loss", "weights_digest"):
        check(ref.get(key) == got.get(key),
              "%s: %s %r, reference %r" % (what, key, got.get(key), ref.get(key)))


def refusals(run, cases, swap):
    """Each (ranks, extra flags, wanted text) of cases exits nonzero with the text on
    stderr; run is runner()'s."""
    for ranks, extra, want in cases:
        cmd, rc, out, err = run(ranks, extra, swap)
        check(rc != 0 and want in err, "%s: exit %d, want '%s' in\n%s" %
              (" ".join(cmd), rc, want, err[-1500:]))


def llama_dir(d, kv_heads, attention_bias, tied=False, heads=4):
    """A Llama model directory (config.json, model.safetensors in fp32) with kv_heads
    key/value heads of `heads` query heads of 32 dimensions and random weights, written
    here without torch; tied: the head is the embedding (no lm_head.weight)."""
    dim, vocab, layers = 32 * heads, 256, 2
    ffn, kvd = 2 * dim, 32 * kv_heads
    rnd = random.Random(kv_heads * 2 + attention_bias)
    shapes = [("model.embed_tokens.weight", [vocab, dim])]
    for l in range(layers):
        p = "model.layers.%d." % l
        shapes += [(p + "input_layernorm.weight", [dim]),
                   (p + "self_attn.q_proj.weight", [dim, dim]),
                   (p + "self_attn.k_proj.weight", [kvd, dim]),
                   (p + "self_attn.v_proj.weight", [kvd, dim]),
                   (p + "self_attn.o_proj.weight", [dim, dim]),
                   (p + "post_attention_layernorm.weight", [dim]),
                   (p + "mlp.gate_proj.weight", [ffn, dim]),
                   (p + "mlp.up_proj.weight", [ffn, dim]),
                   (p + "mlp.down_proj.weight", [dim, ffn])]
        if attention_bias:
            shapes += [(p + "self_attn.%s_proj.bias" % k, [n]) for k, n in
                       (("q", dim), ("k", kvd), ("v", kvd), ("o", dim))]
    shapes += [("model.norm.weight", [dim])] + ([] if tied else [("lm_head.weight", [vocab, dim])])
    header, blobs, off = {}, [], 0
    for name, shape in shapes:
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        norm = name.endswith("layernorm.weight") or name == "model.norm.weight"
        vals = array.array("f", [1.0 + rnd.gauss(0, 0.1) if norm else rnd.gauss(0, 0.05)
                                 for _ in range(n)])
        blob = vals.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    os.makedirs(d, exist_ok=True)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(d + "/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    with open(d + "/config.json", "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": dim, "intermediate_size": ffn, "num_hidden_layers": layers,
                   "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                   "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "hidden_act": "silu", "tie_word_embeddings": tied,
                   "attention_bias": attention_bias, "torch_dtype": "float32"}, f)
    return d


def read_set(d, base):
    index = os.path.join(d, base + ".safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, base + ".safetensors"))
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for s in shards:
        out.update(read_safetensors(os.path.join(d, s)))
    return out
