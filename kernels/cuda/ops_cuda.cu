// The compute ops' kernels on the cuda backend (GEMM is in ops_cuda.c, on
// cuBLAS). Tensors are loaded to fp32 and stored rounded to nearest even, as
// on the cpu backend; the dtype is a run-time argument (uniform across a
// launch, so the branch costs nothing next to memory traffic).
//
// Determinism: no atomics. Reductions run in a fixed tree within one block;
// gradients summed over rows or tokens (RMSNorm dw, embedding dtable) are
// summed by one thread per column in row order; losses and sums of squares are
// reduced over a fixed number of partials in a second, single-block kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "ops_cuda.h"
#include "zo_cuda_check.h"
#include "zo_cuda_elem.cuh"

#define SUBSYS "ops"

namespace
{

constexpr unsigned kBlock = 256;

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce over the block (blockDim.x a multiple of 32); every thread gets the
// result. The leading barrier lets callers reduce several times in a row.
template <bool kMax> __device__ float block_reduce(float v)
{
    __shared__ float sh[32];
    v = kMax ? warp_max(v) : zo_cuda_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? sh[lane] : (kMax ? -INFINITY : 0.0f);
        w = kMax ? warp_max(w) : zo_cuda_warp_sum(w);
        if (lane == 0)
            sh[0] = w;
    }
    __syncthreads();
    return sh[0];
}

unsigned grid_for(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g > 65535u * 16u ? 65535u * 16u : (g ? g : 1));
}

cudaStream_t stream_of(const zo_ops_exec *x)
{
    return (cudaStream_t)x->native;
}

// ---- embedding ----

__global__ void embed_fwd_kernel(zo_embed_args a)
{
    const size_t t = blockIdx.x;
    const int tok = a.tokens[t], id = tok - a.v0; // the row in this part, if it holds the token
    const bool ok = tok >= 0 && tok < a.vocab, held = id >= 0 && id < a.part;
    for (int j = threadIdx.x; j < a.dim; j += blockDim.x)
        zo_cuda_st(a.out, a.dt, t * a.dim + j,
                   !ok    ? NAN
                   : held ? zo_cuda_ld(a.in, a.dt, (size_t)id * a.dim + j)
                          : 0.0f);
}

// One thread per column, tokens in order: the same sums in the same order as
// the cpu backend, without atomics.
__global__ void embed_bwd_kernel(zo_embed_args a)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= a.dim)
        return;
    for (size_t t = 0; t < a.n_tokens; t++) {
        const int tok = a.tokens[t], id = tok - a.v0;
        if (tok < 0 || tok >= a.vocab || id < 0 || id >= a.part)
            continue;
        const size_t o = (size_t)id * a.dim + j;
        zo_cuda_st(a.out, a.out_dt, o,
                   zo_cuda_ld(a.out, a.out_dt, o) + zo_cuda_ld(a.in, a.dt, t * a.dim + j));
    }
}

// ---- RMSNorm ----

__global__ void rms_fwd_kernel(zo_rmsnorm_args a)
{
    const size_t r = blockIdx.x, off = r * a.dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < a.dim; j += blockDim.x) {
        float v = zo_cuda_ld(a.x, a.dt, off + j);
        ss += v * v;
    }
    ss = block_reduce<false>(ss);
    const float rs = 1.0f / sqrtf(ss / (float)a.dim + a.eps);
    if (threadIdx.x == 0)
        a.rstd[r] = rs;
    for (int j = threadIdx.x; j < a.dim; j += blockDim.x)
        zo_cuda_st(a.y_or_dx, a.dt, off + j,
                   zo_cuda_ld(a.x, a.dt, off + j) * rs * zo_cuda_ld(a.w, a.dt, j));
}

__global__ void rms_bwd_dx_kernel(zo_rmsnorm_args a)
{
    const size_t r = blockIdx.x, off = r * a.dim;
    const float rs = a.rstd[r];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < a.dim; j += blockDim.x)
        dot += zo_cuda_ld(a.dy, a.dt, off + j) * zo_cuda_ld(a.w, a.dt, j) *
               (zo_cuda_ld(a.x, a.dt, off + j) * rs);
    const float mean = block_reduce<false>(dot) / (float)a.dim;
    for (int j = threadIdx.x; j < a.dim; j += blockDim.x) {
        float xhat = zo_cuda_ld(a.x, a.dt, off + j) * rs;
        float g = zo_cuda_ld(a.dy, a.dt, off + j) * zo_cuda_ld(a.w, a.dt, j);
        float dx = rs * (g - xhat * mean);
        if (a.accumulate_dx)
            dx += zo_cuda_ld(a.y_or_dx, a.dt, off + j);
        zo_cuda_st(a.y_or_dx, a.dt, off + j, dx);
    }
}

__global__ void rms_bwd_dw_kernel(zo_rmsnorm_args a)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= a.dim)
        return;
    float acc = 0.0f;
    for (size_t r = 0; r < a.rows; r++)
        acc += zo_cuda_ld(a.dy, a.dt, r * a.dim + j) *
               (zo_cuda_ld(a.x, a.dt, r * a.dim + j) * a.rstd[r]);
    zo_cuda_st(a.dw, a.dw_dt, j, zo_cuda_ld(a.dw, a.dw_dt, j) + acc);
}

// ---- grouped-query attention's key/value heads: one thread per element of
// the kv tensor; the backward sums its group in ascending order in fp32 ----

__global__ void repeat_kv_kernel(zo_repeat_kv_args a)
{
    const size_t D = (size_t)a.head_dim, G = (size_t)a.group;
    const size_t total = a.rows * (size_t)a.kv_heads * D;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx % D, rk = idx / D, big0 = rk * G * D + i;
        if (!a.bwd) {
            const float v = zo_cuda_ld(a.in, a.dt, idx);
            for (size_t j = 0; j < G; j++)
                zo_cuda_st(a.out, a.dt, big0 + j * D, v);
            continue;
        }
        float sum = 0.0f;
        for (size_t j = 0; j < G; j++)
            sum += zo_cuda_ld(a.in, a.dt, big0 + j * D);
        zo_cuda_st(a.out, a.dt, idx, sum);
    }
}

// ---- bias: the forward per element; the backward one thread per column in
// row order, as RMSNorm's dw ----

__global__ void bias_fwd_kernel(zo_bias_args a)
{
    const size_t total = a.rows * (size_t)a.cols;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x)
        zo_cuda_st(a.out, a.dt, idx,
                   zo_cuda_ld(a.out, a.dt, idx) + zo_cuda_ld(a.in, a.dt, idx % (size_t)a.cols));
}

__global__ void bias_bwd_kernel(zo_bias_args a)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.cols)
        return;
    float sum = 0.0f;
    for (size_t r = 0; r < a.rows; r++)
        sum += zo_cuda_ld(a.in, a.dt, r * a.cols + c);
    zo_cuda_st(a.out, a.out_dt, c, zo_cuda_ld(a.out, a.out_dt, c) + sum);
}

// ---- RoPE ----

__global__ void rope_table_kernel(zo_rope_table_args a)
{
    const int half = a.head_dim / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)a.seq * half)
        return;
    const int p = (int)(idx / half), i = (int)(idx % half);
    const double ang = (double)(a.pos0 + p) * zo_rope_freq(&a, i), m = zo_rope_magnitude(&a);
    a.table[idx * 2] = (float)(m * cos(ang));
    a.table[idx * 2 + 1] = (float)(m * sin(ang));
}

__global__ void rope_kernel(zo_rope_args a)
{
    const size_t half = (size_t)a.head_dim / 2;
    const size_t total = (size_t)a.batch * a.seq * a.heads * half;
    const float sgn = a.inverse ? -1.0f : 1.0f;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx % half, row = idx / half; // row = (b*seq + t)*heads + h
        const size_t t = (row / a.heads) % a.seq, base = row * a.head_dim;
        const float c = a.table[(t * half + i) * 2], sn = sgn * a.table[(t * half + i) * 2 + 1];
        const float x1 = zo_cuda_ld(a.in, a.dt, base + i),
                    x2 = zo_cuda_ld(a.in, a.dt, base + i + half);
        zo_cuda_st(a.out, a.dt, base + i, x1 * c - x2 * sn);
        zo_cuda_st(a.out, a.dt, base + i + half, x2 * c + x1 * sn);
    }
}

// ---- causal softmax: one block per row ----

__global__ void softmax_fwd_kernel(zo_softmax_args a)
{
    const size_t r = blockIdx.x, T = (size_t)a.seq, off = r * T, t = r % T;
    float mx = -INFINITY;
    for (size_t j = threadIdx.x; j <= t; j += blockDim.x)
        mx = fmaxf(mx, zo_cuda_ld(a.in, a.dt, off + j));
    mx = block_reduce<true>(mx);
    float sum = 0.0f;
    for (size_t j = threadIdx.x; j <= t; j += blockDim.x)
        sum += expf(zo_cuda_ld(a.in, a.dt, off + j) - mx);
    const float inv = 1.0f / block_reduce<false>(sum);
    for (size_t j = threadIdx.x; j < T; j += blockDim.x)
        zo_cuda_st(a.out, a.dt, off + j,
                   j <= t ? expf(zo_cuda_ld(a.in, a.dt, off + j) - mx) * inv : 0.0f);
}

__global__ void softmax_bwd_kernel(zo_softmax_args a)
{
    const size_t r = blockIdx.x, T = (size_t)a.seq, off = r * T, t = r % T;
    float dot = 0.0f;
    for (size_t j = threadIdx.x; j <= t; j += blockDim.x)
        dot += zo_cuda_ld(a.p, a.dt, off + j) * zo_cuda_ld(a.in, a.dt, off + j);
    dot = block_reduce<false>(dot);
    for (size_t j = threadIdx.x; j < T; j += blockDim.x)
        zo_cuda_st(a.out, a.dt, off + j,
                   j <= t ? zo_cuda_ld(a.p, a.dt, off + j) * (zo_cuda_ld(a.in, a.dt, off + j) - dot)
                          : 0.0f);
}

// ---- SwiGLU ----

__global__ void swiglu_fwd_kernel(zo_swiglu_args a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = zo_cuda_ld(a.gate, a.dt, i), sig = 1.0f / (1.0f + expf(-g));
        zo_cuda_st(a.out, a.dt, i, g * sig * zo_cuda_ld(a.up, a.dt, i));
    }
}

__global__ void swiglu_bwd_kernel(zo_swiglu_args a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = zo_cuda_ld(a.gate, a.dt, i), u = zo_cuda_ld(a.up, a.dt, i),
                    d = zo_cuda_ld(a.dout, a.dt, i);
        const float sig = 1.0f / (1.0f + expf(-g)), dsilu = sig * (1.0f + g * (1.0f - sig));
        zo_cuda_st(a.out, a.dt, i, d * u * dsilu);
        zo_cuda_st(a.dup, a.dt, i, d * g * sig);
    }
}

// ---- cross-entropy: one block per row, then a single-block mean ----

// A row's max (to *mx) and its sum of exp(l - max), reduced over the block.
__device__ float row_sumexp(const void *logits, zo_dtype dt, size_t off, size_t V, float *mx)
{
    float m = -INFINITY;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, zo_cuda_ld(logits, dt, off + j));
    m = block_reduce<true>(m);
    float sum = 0.0f;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x)
        sum += expf(zo_cuda_ld(logits, dt, off + j) - m);
    *mx = m;
    return block_reduce<false>(sum);
}

__global__ void xent_rows_kernel(zo_xent_args a)
{
    const size_t r = blockIdx.x, V = (size_t)a.vocab, off = r * V;
    const int tgt = a.targets[r];
    const bool ok = tgt >= 0 && tgt < a.vocab;
    // The sum first, in its own statement: in "mx + logf(row_sumexp(.., &mx))"
    // the read of mx is unsequenced with the call that sets it (nvcc read it first).
    float mx;
    const float sum = row_sumexp(a.logits, a.dt, off, V, &mx);
    const float lse = mx + logf(sum);
    // block_reduce ends with a barrier, so every thread has read its logits
    // before anyone overwrites them (dlogits may equal logits); the target's
    // logit is read by thread 0 before the barrier below.
    if (threadIdx.x == 0)
        a.row_loss[r] = ok ? lse - zo_cuda_ld(a.logits, a.dt, off + tgt) : NAN;
    __syncthreads();
    if (!a.dlogits)
        return;
    const float scale = a.grad_scale / (float)a.total;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = expf(zo_cuda_ld(a.logits, a.dt, off + j) - lse);
        zo_cuda_st(a.dlogits, a.dt, off + j,
                   ok ? scale * (p - (j == (size_t)tgt ? 1.0f : 0.0f)) : 0.0f);
    }
}

// ---- the vocabulary-parallel cross-entropy: one block per row ----

__global__ void xent_part_stats_kernel(zo_xent_part_args a)
{
    const size_t r = blockIdx.x, V = (size_t)a.part, off = r * V;
    const int tgt = a.targets[r], id = tgt - a.v0;
    float mx;
    const float sum = row_sumexp(a.logits, a.dt, off, V, &mx);
    if (threadIdx.x == 0) {
        float *st = a.stats + r * ZO_XENT_STATS;
        const bool ok = tgt >= 0 && tgt < a.vocab, held = id >= 0 && id < a.part;
        st[0] = mx;
        st[1] = sum;
        st[2] = !ok ? NAN : held ? zo_cuda_ld(a.logits, a.dt, off + id) : 0.0f;
    }
}

// Every thread combines the parts' stats in part order (a few floats), so
// the lse is the same on every rank of the group and needs no broadcast.
__global__ void xent_part_kernel(zo_xent_part_args a)
{
    const size_t r = blockIdx.x, V = (size_t)a.part, off = r * V;
    const size_t stride = a.rows * ZO_XENT_STATS;
    const float *st = a.all_stats + r * ZO_XENT_STATS;
    float mx = -INFINITY, t = 0.0f, sum = 0.0f;
    for (int p = 0; p < a.parts; p++)
        mx = fmaxf(mx, st[p * stride]);
    for (int p = 0; p < a.parts; p++) {
        sum += st[p * stride + 1] * expf(st[p * stride] - mx);
        t += st[p * stride + 2];
    }
    const float lse = mx + logf(sum);
    if (threadIdx.x == 0)
        a.row_loss[r] = lse - t;
    if (!a.dlogits)
        return;
    const int tgt = a.targets[r], id = tgt - a.v0;
    const bool ok = tgt >= 0 && tgt < a.vocab;
    const float scale = a.grad_scale / (float)a.total;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = expf(zo_cuda_ld(a.logits, a.dt, off + j) - lse);
        zo_cuda_st(a.dlogits, a.dt, off + j,
                   ok ? scale * (p - ((int)j == id ? 1.0f : 0.0f)) : 0.0f);
    }
}

__global__ void mean_kernel(float *out, const float *v, size_t n)
{
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += v[i];
    s = block_reduce<false>(s);
    if (threadIdx.x == 0)
        *out = s / (float)n;
}

// ---- elementwise and sum of squares ----

__global__ void ew_kernel(zo_ew_args a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v;
        switch (a.kind) {
        case ZO_EW_ADD: v = zo_cuda_ld(a.a, a.a_dt, i) + zo_cuda_ld(a.b, a.a_dt, i); break;
        case ZO_EW_CAST: v = zo_cuda_ld(a.a, a.a_dt, i); break;
        case ZO_EW_SCALE: v = zo_cuda_ld(a.y, a.y_dt, i) * a.alpha; break;
        default: v = zo_cuda_ld(a.y, a.y_dt, i) + a.alpha * zo_cuda_ld(a.a, a.a_dt, i); break;
        }
        zo_cuda_st(a.y, a.y_dt, i, v);
    }
}

__global__ void sumsq_partials_kernel(float *partials, zo_sumsq_args a)
{
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = zo_cuda_ld(a.x, a.dt, i);
        s += v * v;
    }
    s = block_reduce<false>(s);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(float *out, const float *partials, unsigned n, int accumulate)
{
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
        s += partials[i];
    s = block_reduce<false>(s);
    if (threadIdx.x == 0)
        *out = (accumulate ? *out : 0.0f) + s;
}

// The batch's mean row loss after its last chunk (loss NULL: not this chunk).
zo_status launch_mean(const zo_ops_exec *x, float *loss, const float *row_loss, size_t r0,
                      size_t total)
{
    if (!loss)
        return ZO_OK;
    mean_kernel<<<1, 1024, 0, stream_of(x)>>>(loss, row_loss - r0, total);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

} // namespace

extern "C" {

zo_status zo_cuda_op_embedding_fwd(const zo_ops_exec *x, const zo_embed_args *a)
{
    embed_fwd_kernel<<<(unsigned)a->n_tokens, kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_embedding_bwd(const zo_ops_exec *x, const zo_embed_args *a)
{
    embed_bwd_kernel<<<grid_for((size_t)a->dim, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_rmsnorm_fwd(const zo_ops_exec *x, const zo_rmsnorm_args *a)
{
    rms_fwd_kernel<<<(unsigned)a->rows, kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_rmsnorm_bwd(const zo_ops_exec *x, const zo_rmsnorm_args *a)
{
    // dw first: it reads dy and x, and dx may be written over either.
    if (a->dw) {
        rms_bwd_dw_kernel<<<grid_for((size_t)a->dim, kBlock), kBlock, 0, stream_of(x)>>>(*a);
        ZO_CUDA_CHECK_LAUNCH();
    }
    rms_bwd_dx_kernel<<<(unsigned)a->rows, kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_rope_table(const zo_ops_exec *x, const zo_rope_table_args *a)
{
    const size_t n = (size_t)a->seq * (a->head_dim / 2);
    rope_table_kernel<<<(unsigned)((n + kBlock - 1) / kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_rope(const zo_ops_exec *x, const zo_rope_args *a)
{
    const size_t n = (size_t)a->batch * a->seq * a->heads * (a->head_dim / 2);
    rope_kernel<<<grid_for(n, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_softmax_fwd(const zo_ops_exec *x, const zo_softmax_args *a)
{
    softmax_fwd_kernel<<<(unsigned)(a->n_mats * a->seq), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_softmax_bwd(const zo_ops_exec *x, const zo_softmax_args *a)
{
    softmax_bwd_kernel<<<(unsigned)(a->n_mats * a->seq), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_swiglu_fwd(const zo_ops_exec *x, const zo_swiglu_args *a)
{
    swiglu_fwd_kernel<<<grid_for(a->n, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_swiglu_bwd(const zo_ops_exec *x, const zo_swiglu_args *a)
{
    swiglu_bwd_kernel<<<grid_for(a->n, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_cross_entropy(const zo_ops_exec *x, const zo_xent_args *a)
{
    xent_rows_kernel<<<(unsigned)a->rows, 512, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return launch_mean(x, a->loss, a->row_loss, a->r0, a->total);
}

zo_status zo_cuda_op_xent_part_stats(const zo_ops_exec *x, const zo_xent_part_args *a)
{
    xent_part_stats_kernel<<<(unsigned)a->rows, 512, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_xent_part(const zo_ops_exec *x, const zo_xent_part_args *a)
{
    xent_part_kernel<<<(unsigned)a->rows, 512, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return launch_mean(x, a->loss, a->row_loss, a->r0, a->total);
}

zo_status zo_cuda_op_repeat_kv(const zo_ops_exec *x, const zo_repeat_kv_args *a)
{
    const size_t n = a->rows * (size_t)a->kv_heads * a->head_dim;
    repeat_kv_kernel<<<grid_for(n, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_bias(const zo_ops_exec *x, const zo_bias_args *a)
{
    if (a->bwd)
        bias_bwd_kernel<<<grid_for((size_t)a->cols, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    else
        bias_fwd_kernel<<<grid_for(a->rows * (size_t)a->cols, kBlock), kBlock, 0, stream_of(x)>>>(
            *a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_elementwise(const zo_ops_exec *x, const zo_ew_args *a)
{
    ew_kernel<<<grid_for(a->n, kBlock), kBlock, 0, stream_of(x)>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_sumsq(void *stream, float *partials, const zo_sumsq_args *a)
{
    // The number of partials depends only on n, so the sum is the same run to run.
    size_t g = (a->n + kBlock * 8 - 1) / (kBlock * 8);
    const unsigned blocks =
        (unsigned)(g > ZO_CUDA_SUMSQ_PARTIALS ? ZO_CUDA_SUMSQ_PARTIALS : (g ? g : 1));
    sumsq_partials_kernel<<<blocks, kBlock, 0, (cudaStream_t)stream>>>(partials, *a);
    ZO_CUDA_CHECK_LAUNCH();
    sumsq_final_kernel<<<1, 1024, 0, (cudaStream_t)stream>>>(a->out, partials, blocks,
                                                             a->accumulate);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

} // extern "C"
