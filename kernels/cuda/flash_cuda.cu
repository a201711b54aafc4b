// The fused attention op on the cuda backend (zo_op_flash_attention_fwd/bwd
// in zo/ops.h). bf16 and fp16 with head_dim 64/80/96/128 on sm_80+ go to the
// tensor-core kernels (flash_tc_cuda.cu, zo_cuda_flash_tc_takes); this file's
// scalar kernel takes the rest: fp32, other head dims, older devices.
//
// The scalar kernel: one warp owns one row, a query row in the forward and the
// dq pass, a key row in the dk/dv pass. Its lanes hold the row's head_dim
// elements (up to 16 each), dot products are warp reductions in a fixed tree,
// and the keys (or queries) are visited tile by tile in ascending order, tiles
// the mask disallows skipped whole, exactly as the cpu reference visits them.
// So the result is the same bits run to run, with no atomics: dk and dv of a
// key row are summed by its own warp over the group's query heads ascending,
// then queries ascending. The order of the sums within a tile differs from the
// cpu kernel's sgemm, so cuda and cpu agree within fp32 rounding, not bitwise.
// The scores, probabilities and accumulators are fp32; outputs are rounded
// once. Memory: O(seq) per head (lse and delta), nothing seq x seq.
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

constexpr int kWarps = 4;    // rows per block
constexpr int kPerLane = 16; // head_dim <= 512 = 32 lanes x 16

// A row of head_dim elements spread over the lanes: element lane + 32 e.
struct lane_row {
    float x[kPerLane];
};

__device__ __forceinline__ void row_load(lane_row &r, const void *p, int dt, size_t base, int D)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < kPerLane; e++) {
        const int d = lane + 32 * e;
        r.x[e] = d < D ? zo_cuda_ld(p, dt, base + d) : 0.0f;
    }
}

__device__ __forceinline__ void row_store(const lane_row &r, void *p, int dt, size_t base, int D,
                                          float mul)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < kPerLane; e++) {
        const int d = lane + 32 * e;
        if (d < D)
            zo_cuda_st(p, dt, base + d, r.x[e] * mul);
    }
}

__device__ __forceinline__ float row_dot(const lane_row &r, const void *p, int dt, size_t base,
                                         int D)
{
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; e++) {
        const int d = lane + 32 * e;
        if (d < D)
            s += r.x[e] * zo_cuda_ld(p, dt, base + d);
    }
    return zo_cuda_warp_sum(s);
}

__device__ __forceinline__ void row_axpy(lane_row &r, float a, const void *p, int dt, size_t base,
                                         int D)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < kPerLane; e++) {
        const int d = lane + 32 * e;
        if (d < D)
            r.x[e] += a * zo_cuda_ld(p, dt, base + d);
    }
}

__device__ __forceinline__ void row_zero(lane_row &r)
{
#pragma unroll
    for (int e = 0; e < kPerLane; e++)
        r.x[e] = 0.0f;
}

// The geometry, as the cpu kernel's (flash_cpu.c).
struct fgeom {
    int B, T, H, KV, D, G, bt, nt;
};

__device__ __forceinline__ size_t q_at(const fgeom &g, int b, int t, int h)
{
    return (((size_t)b * g.T + t) * g.H + h) * g.D;
}

__device__ __forceinline__ size_t k_at(const fgeom &g, int b, int t, int kvh)
{
    return (((size_t)b * g.T + t) * g.KV + kvh) * g.D;
}

enum { kSkip = 0, kFull, kPartial }; // zo_cuda_flash_rules' 0, 1, 2

__device__ int tile_state(const zo_flash_args &a, const fgeom &g, int qt, int kt)
{
    const int i0 = qt * g.bt, i1 = min(i0 + g.bt, g.T), j0 = kt * g.bt, j1 = min(j0 + g.bt, g.T);
    if (a.d.block_mask && !a.d.block_mask[(size_t)qt * g.nt + kt])
        return kSkip;
    return zo_cuda_flash_rules(a.d.causal, a.d.window, i0, i1, j0, j1);
}

__device__ __forceinline__ bool pair_allowed(const zo_flash_args &a, int i, int j)
{
    return (!a.d.causal || j <= i) && (a.d.window <= 0 || i - j < a.d.window);
}

// The warp's row: rows are numbered (b, head, t) with t fastest, so
// neighbouring warps read the same keys.
__device__ __forceinline__ bool warp_row(size_t n_rows, int T, int heads, int &b, int &h, int &t)
{
    const size_t r = (size_t)blockIdx.x * kWarps + threadIdx.x / 32;
    if (r >= n_rows)
        return false;
    t = (int)(r % (size_t)T);
    h = (int)(r / (size_t)T % (size_t)heads);
    b = (int)(r / ((size_t)T * heads));
    return true;
}

// Calls f(j, s) for each key j query row i of head h may see (the tiles the
// causal rule, window or block mask leave, then the pairs within), in
// ascending order: s = scale q . k_j in fp32.
template <typename F>
__device__ __forceinline__ void for_each_score(const zo_flash_args &a, const fgeom &g, int b, int h,
                                               int i, const lane_row &q, F f)
{
    const int dt = a.d.dt, kvh = h / g.G, qt = i / g.bt;
    for (int kt = 0; kt < g.nt; kt++) {
        const int state = tile_state(a, g, qt, kt);
        if (state == kSkip)
            continue;
        for (int j = kt * g.bt; j < min((kt + 1) * g.bt, g.T); j++) {
            if (state == kPartial && !pair_allowed(a, i, j))
                continue;
            f(j, a.d.scale * row_dot(q, a.k, dt, k_at(g, b, j, kvh), g.D));
        }
    }
}

__global__ void flash_fwd_kernel(zo_flash_args a, fgeom g)
{
    int b, h, i;
    if (!warp_row((size_t)g.B * g.H * g.T, g.T, g.H, b, h, i))
        return;
    const int dt = a.d.dt, kvh = h / g.G;
    lane_row q, acc;
    row_load(q, a.q, dt, q_at(g, b, i, h), g.D);
    row_zero(acc);
    float m = -INFINITY, l = 0.0f;
    for_each_score(a, g, b, h, i, q, [&](int j, float s) {
        if (s > m) { // a new maximum: rescale what was summed so far
            const float alpha = m == -INFINITY ? 0.0f : expf(m - s);
            l *= alpha;
#pragma unroll
            for (int e = 0; e < kPerLane; e++)
                acc.x[e] *= alpha;
            m = s;
        }
        const float p = expf(s - m);
        l += p;
        row_axpy(acc, p, a.v, dt, k_at(g, b, j, kvh), g.D);
    });
    row_store(acc, a.o, dt, q_at(g, b, i, h), g.D, l > 0.0f ? 1.0f / l : 0.0f);
    if ((threadIdx.x & 31) == 0)
        a.lse[((size_t)b * g.H + h) * g.T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// Calls f(j, p, dp) for each key j query row i of head h may see, in
// ascending order: p = exp(s - lse) in fp32 and dp = dout . v_j; none for a
// row that sees no key (lse -inf).
template <typename F>
__device__ __forceinline__ void for_each_key(const zo_flash_args &a, const fgeom &g, int b, int h,
                                             int i, const lane_row &q, const lane_row &dout,
                                             float lse, F f)
{
    if (lse == -INFINITY)
        return;
    const int dt = a.d.dt, kvh = h / g.G;
    for_each_score(a, g, b, h, i, q, [&](int j, float s) {
        f(j, expf(s - lse), row_dot(dout, a.v, dt, k_at(g, b, j, kvh), g.D));
    });
}

// delta = sum_j p_j dp_j over the row's allowed keys, from the fp32
// probabilities (as the cpu op): dot(dout, out) reads the output rounded to
// the dtype, and in bf16 a value component every key shares (a v bias) then
// leaves a row's dS not summing to zero, which a k bias carries into dq. Both
// the scalar and the tensor-core backward read this delta.
__global__ void flash_delta_kernel(zo_flash_args a, fgeom g)
{
    int b, h, i;
    if (!warp_row((size_t)g.B * g.H * g.T, g.T, g.H, b, h, i))
        return;
    const size_t row = ((size_t)b * g.H + h) * g.T + i;
    lane_row q, dout;
    row_load(q, a.q, a.d.dt, q_at(g, b, i, h), g.D);
    row_load(dout, a.dout, a.d.dt, q_at(g, b, i, h), g.D);
    float sum = 0.0f;
    for_each_key(a, g, b, h, i, q, dout, a.lse[row],
                 [&](int, float p, float dp) { sum += p * dp; });
    if ((threadIdx.x & 31) == 0)
        a.delta[row] = sum;
}

__global__ void flash_dq_kernel(zo_flash_args a, fgeom g)
{
    int b, h, i;
    if (!warp_row((size_t)g.B * g.H * g.T, g.T, g.H, b, h, i))
        return;
    const int dt = a.d.dt, kvh = h / g.G;
    const size_t row = ((size_t)b * g.H + h) * g.T + i;
    const float delta = a.delta[row];
    lane_row q, dout, dq;
    row_load(q, a.q, dt, q_at(g, b, i, h), g.D);
    row_load(dout, a.dout, dt, q_at(g, b, i, h), g.D);
    row_zero(dq);
    for_each_key(a, g, b, h, i, q, dout, a.lse[row], [&](int j, float p, float dp) {
        row_axpy(dq, a.d.scale * p * (dp - delta), a.k, dt, k_at(g, b, j, kvh), g.D);
    });
    row_store(dq, a.o, dt, q_at(g, b, i, h), g.D, 1.0f);
}

__global__ void flash_dkdv_kernel(zo_flash_args a, fgeom g)
{
    int b, kvh, j;
    if (!warp_row((size_t)g.B * g.KV * g.T, g.T, g.KV, b, kvh, j))
        return;
    const int dt = a.d.dt, kt = j / g.bt;
    lane_row k, v, dk, dv;
    row_load(k, a.k, dt, k_at(g, b, j, kvh), g.D);
    row_load(v, a.v, dt, k_at(g, b, j, kvh), g.D);
    row_zero(dk);
    row_zero(dv);
    for (int h = kvh * g.G; h < (kvh + 1) * g.G; h++)
        for (int qt = 0; qt < g.nt; qt++) {
            const int state = tile_state(a, g, qt, kt);
            if (state == kSkip)
                continue;
            for (int i = qt * g.bt; i < min((qt + 1) * g.bt, g.T); i++) {
                const size_t row = ((size_t)b * g.H + h) * g.T + i;
                const float lse = a.lse[row];
                if ((state == kPartial && !pair_allowed(a, i, j)) || lse == -INFINITY)
                    continue;
                const float s = a.d.scale * row_dot(k, a.q, dt, q_at(g, b, i, h), g.D);
                const float p = expf(s - lse);
                const float dp = row_dot(v, a.dout, dt, q_at(g, b, i, h), g.D);
                row_axpy(dv, p, a.dout, dt, q_at(g, b, i, h), g.D);
                row_axpy(dk, a.d.scale * p * (dp - a.delta[row]), a.q, dt, q_at(g, b, i, h), g.D);
            }
        }
    row_store(dk, a.dk, dt, k_at(g, b, j, kvh), g.D, 1.0f);
    row_store(dv, a.dv, dt, k_at(g, b, j, kvh), g.D, 1.0f);
}

fgeom geom_of(const zo_flash_args *a)
{
    fgeom g;
    g.B = a->d.batch, g.T = a->d.seq, g.H = a->d.heads, g.KV = a->d.kv_heads;
    g.D = a->d.head_dim, g.G = g.H / g.KV, g.bt = zo_flash_tile(&a->d);
    g.nt = (g.T + g.bt - 1) / g.bt;
    return g;
}

unsigned blocks_for(size_t rows)
{
    return (unsigned)((rows + kWarps - 1) / kWarps);
}

} // namespace

zo_status zo_cuda_op_flash_fwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    const fgeom g = geom_of(a);
    if (zo_cuda_flash_tc_takes(a, 0))
        return zo_cuda_flash_tc_fwd(x, a);
    cudaStream_t st = (cudaStream_t)x->native;
    flash_fwd_kernel<<<blocks_for((size_t)g.B * g.H * g.T), kWarps * 32, 0, st>>>(*a, g);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

zo_status zo_cuda_op_flash_bwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    const fgeom g = geom_of(a);
    cudaStream_t st = (cudaStream_t)x->native;
    const unsigned qb = blocks_for((size_t)g.B * g.H * g.T);
    flash_delta_kernel<<<qb, kWarps * 32, 0, st>>>(*a, g);
    ZO_CUDA_CHECK_LAUNCH();
    if (zo_cuda_flash_tc_takes(a, 1))
        return zo_cuda_flash_tc_bwd(x, a);
    // dq first: it reads every key row's k and v, which dk and dv may
    // overwrite in place; a dkdv warp reads only its own key row's, into
    // registers, before it writes that row (zo/ops.h's aliasing rules)
    flash_dq_kernel<<<qb, kWarps * 32, 0, st>>>(*a, g);
    ZO_CUDA_CHECK_LAUNCH();
    flash_dkdv_kernel<<<blocks_for((size_t)g.B * g.KV * g.T), kWarps * 32, 0, st>>>(*a, g);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}
