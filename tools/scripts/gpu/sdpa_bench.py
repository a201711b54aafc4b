"""PyTorch's peer of `zo-bench attention --device cuda`: causal scaled_dot_product_attention (FlashAttention's
kernel where PyTorch picks it) forward plus backward on the same shape, the median of --reps timed runs after a
warm-up. Prints one JSON object; the attention FLOPs counted as zo-bench counts none, so both sides report seconds."""
import argparse, json, time
import torch
import torch.nn.functional as F

a = argparse.ArgumentParser()
for k, v in dict(seq=4096, batch=1, heads=8, kv_heads=0, head_dim=64, reps=5).items():
    a.add_argument("--" + k.replace("_", "-"), type=int, default=v)
a = a.parse_args()
kv = a.kv_heads or a.heads
g = torch.Generator(device="cuda").manual_seed(1)
q = torch.rand(a.batch, a.heads, a.seq, a.head_dim, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
k = torch.rand(a.batch, kv, a.seq, a.head_dim, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
v = torch.rand_like(k) * 2 - 1
do = torch.rand_like(q) * 2 - 1
for t in (q, k, v):
    t.requires_grad_(True)


def once():
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != a.heads)
    out.backward(do)


once()
times = []
for _ in range(a.reps):
    torch.cuda.synchronize(); t = time.perf_counter()
    once()
    torch.cuda.synchronize(); times.append(time.perf_counter() - t)
s = sorted(times)[len(times) // 2]
# causal fwd+bwd: 2 (QK, PV) fwd + 5 bwd matmuls of seq^2/2 x head_dim each, 2 FLOPs per MAC
flops = 7 * 2 * a.batch * a.heads * a.seq * a.seq / 2 * a.head_dim
print(json.dumps(dict(bench="sdpa", seq=a.seq, batch=a.batch, heads=a.heads, kv_heads=kv, head_dim=a.head_dim,
                      seconds=s, tflops=flops / s / 1e12, torch=torch.__version__)))
