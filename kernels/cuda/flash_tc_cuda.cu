// The fused attention on tensor cores (sm_80+): FlashAttention-2's algorithm
// with WMMA 16x16x16 products (bf16 or fp16 inputs, fp32 accumulators).
//
// Which kernel takes what (zo_cuda_flash_tc_takes): this file takes bf16 and
// fp16 with head_dim 64, 80, 96 or 128 on a device of compute capability
// 8.0 or above whose opt-in shared memory holds the tiles, with every
// operand 16-byte aligned; flash_cuda.cu's scalar kernel takes the rest
// (fp32, other head dims, older devices), and everything when the
// environment sets ZO_CUDA_FLASH_SCALAR=1 (test_ops_cuda checks one against
// the other).
//
// Geometry: a block of 4 warps owns a 64-row tile (query rows in the forward
// and the dq pass, key rows in the dk/dv pass), each warp 16 of its rows; the
// other side goes through shared memory 64 rows at a time in ascending order.
// Tile pairs the causal rule, the window or the block mask disallow wholly
// are skipped (whatever the mask's block, 16..512, the 64 x 64 pair is
// skipped when none of the mask blocks it covers is set); partial pairs test
// each element with the op's rule.
//
// Forward: S = Q K^T on tensor cores, the online softmax in fp32 (a lane owns
// half of one row: a row's max and sum are its two lanes' combined with one
// shuffle, the same bits whichever lane), P rounded to the input dtype for
// P V, the output accumulator in fp32 rescaled per row; out rounded once, lse
// saved. Backward: P recomputed from lse per tile pair, dP = dO V^T, dS = P
// (dP - delta) in fp32, rounded to the input dtype for the products; dq by
// query tiles over key tiles ascending, dk and dv by key tiles over the
// group's query heads ascending and then query tiles ascending (the order of
// zo/ops.h and the cpu kernel), summed in WMMA accumulators, so no atomics and
// the same bits run to run. GQA reads each key/value head in place.
//
// Against the cpu device: the products' inner order differs and P and dS are
// rounded to bf16/fp16 before their products (the cpu keeps them in fp32), so
// results agree within the dtype's rounding, not bitwise (test_ops_cuda's
// flash test states the bound).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "ops_cuda.h"
#include "zo_cuda_check.h"
#include "zo_cuda_elem.cuh"

#define SUBSYS "ops"

namespace
{

using namespace nvcuda;

constexpr int kTile = 64;          // rows of a block's tile and of the other side's tile
constexpr int kWarps = kTile / 16; // a warp owns 16 rows
constexpr int kThreads = kWarps * 32;
constexpr int kLS = kTile + 4; // fp32 score rows (floats; padded against bank conflicts)
constexpr int kLP = kTile + 8; // rounded probability rows (elements)

enum { kSkip = 0, kFull, kPartial }; // zo_cuda_flash_rules' 0, 1, 2

struct tgeom {
    int B, T, H, KV, D, G;
    int bt, nb; // the op's tile (the mask block with a mask) and mask blocks per side
};

template <typename E> __device__ __forceinline__ E to_e(float x);
template <> __device__ __forceinline__ __half to_e<__half>(float x)
{
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 to_e<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

// Whether query rows i0.. attend key rows j0.. (64 each, clipped to seq).
__device__ int pair_state(const zo_flash_args &a, const tgeom &g, int i0, int j0)
{
    const int i1 = min(i0 + kTile, g.T), j1 = min(j0 + kTile, g.T);
    const int rules = zo_cuda_flash_rules(a.d.causal, a.d.window, i0, i1, j0, j1);
    if (rules == kSkip)
        return kSkip;
    int full = rules == kFull;
    if (a.d.block_mask) {
        int any = 0, all = 1;
        for (int rb = i0 / g.bt; rb <= (i1 - 1) / g.bt; rb++)
            for (int cb = j0 / g.bt; cb <= (j1 - 1) / g.bt; cb++) {
                const int on = a.d.block_mask[(size_t)rb * g.nb + cb] != 0;
                any |= on;
                all &= on;
            }
        if (!any)
            return kSkip;
        full &= all;
    }
    return full ? kFull : kPartial;
}

// Whether query i attends key j (both may lie past seq in a clipped tile).
__device__ __forceinline__ bool pair_ok(const zo_flash_args &a, const tgeom &g, int state, int i,
                                        int j)
{
    if (i >= g.T || j >= g.T)
        return false;
    if (state == kFull)
        return true;
    return (!a.d.causal || j <= i) && (a.d.window <= 0 || i - j < a.d.window) &&
           (!a.d.block_mask || a.d.block_mask[(size_t)(i / g.bt) * g.nb + j / g.bt]);
}

// Rows r0..r0+63 of head h of a (batch, seq, heads, D) tensor into shared
// memory (row stride ld), rows past seq zero. 16-byte vectors: D % 8 == 0
// and the tensor 16-byte aligned (zo_cuda_flash_tc_takes checks).
template <typename E>
__device__ void load_tile(E *sm, int ld, const void *src, const tgeom &g, int b, int heads, int h,
                          int r0)
{
    const int vpr = g.D / 8;
    const E *p = (const E *)src;
    for (int idx = threadIdx.x; idx < kTile * vpr; idx += kThreads) {
        const int r = idx / vpr, c = idx % vpr, t = r0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (t < g.T)
            v = *(const uint4 *)(p + (((size_t)b * g.T + t) * heads + h) * g.D + c * 8);
        *(uint4 *)(sm + r * ld + c * 8) = v;
    }
}

template <typename E> using frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <typename E>
using frag_bt = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
template <typename E> using frag_b = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
using frag_c = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out (16 x 64 fp32, ld kLS) = A (16 x D, the warp's rows) B^T, B 64 x D:
// the scores of a warp's 16 rows against a tile's 64 rows. Each A fragment
// is loaded once for the four column blocks; every sum runs over k
// ascending.
template <typename E, int ND>
__device__ __forceinline__ void rows_by_tile_t(float *out, const E *A, const E *Bm, int ld)
{
    frag_a<E> fa;
    frag_bt<E> fb;
    frag_c fc[kTile / 16];
#pragma unroll
    for (int n = 0; n < kTile / 16; n++)
        wmma::fill_fragment(fc[n], 0.0f);
#pragma unroll
    for (int k = 0; k < ND; k++) {
        wmma::load_matrix_sync(fa, A + k * 16, ld);
#pragma unroll
        for (int n = 0; n < kTile / 16; n++) {
            wmma::load_matrix_sync(fb, Bm + n * 16 * ld + k * 16, ld);
            wmma::mma_sync(fc[n], fa, fb, fc[n]);
        }
    }
#pragma unroll
    for (int n = 0; n < kTile / 16; n++)
        wmma::store_matrix_sync(out + n * 16, fc[n], kLS, wmma::mem_row_major);
}

// acc[n] += P (16 x 64, ld kLP) Bm (64 x D, ld): a warp's product of its
// probabilities (or score gradients) with a tile.
template <typename E, int ND>
__device__ __forceinline__ void acc_tile(frag_c *acc, const E *P, const E *Bm, int ld)
{
    frag_a<E> fa;
    frag_b<E> fb;
#pragma unroll
    for (int k = 0; k < kTile / 16; k++) {
        wmma::load_matrix_sync(fa, P + k * 16, kLP);
#pragma unroll
        for (int n = 0; n < ND; n++) {
            wmma::load_matrix_sync(fb, Bm + k * 16 * ld + n * 16, ld);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// Rows of acc (16 x D) times mul into rows row0.. of head h of a (batch,
// seq, heads, D) tensor, through scratch (16 x 16 fp32, ld kLS); rows past
// seq are not written.
template <typename E, int ND>
__device__ void store_acc(void *dst, const frag_c *acc, float *scratch, float mul, const tgeom &g,
                          int b, int heads, int h, int row0)
{
    const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 8, t = row0 + r;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        wmma::store_matrix_sync(scratch, acc[n], kLS, wmma::mem_row_major);
        __syncwarp();
        if (t < g.T) {
            E *p = (E *)dst + (((size_t)b * g.T + t) * heads + h) * g.D + n * 16 + c0;
            for (int c = 0; c < 8; c++)
                p[c] = to_e<E>(scratch[r * kLS + c0 + c] * mul);
        }
        __syncwarp();
    }
}

template <int ND> __host__ __device__ constexpr int ld_of()
{
    return ND * 16 + 8; // padded row of a shared tile (elements)
}

// The query tile of a forward or dq block: the last first, since under the
// causal rule later query tiles have the most key tiles and starting them
// first keeps the last wave short.
__device__ __forceinline__ int heavy_first()
{
    return (int)(gridDim.x - 1 - blockIdx.x);
}

// ---- forward: a block per (query tile, head, batch element) ----

template <typename E, int ND> constexpr size_t fwd_smem()
{
    return (size_t)3 * kTile * ld_of<ND>() * sizeof(E) + (size_t)kWarps * 16 * kLS * sizeof(float) +
           (size_t)kWarps * 16 * kLP * sizeof(E) +
           (size_t)kWarps * 16 * (ND * 16 + 4) * sizeof(float);
}

template <typename E, int ND>
__global__ void __launch_bounds__(kThreads) fwd_tc(zo_flash_args a, tgeom g)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int D = ND * 16, LD = ld_of<ND>(), LO = D + 4;
    extern __shared__ __align__(128) unsigned char smem[];
    E *sq = (E *)smem, *sk = sq + kTile * LD, *sv = sk + kTile * LD;
    float *ss = (float *)(sv + kTile * LD);
    E *sp = (E *)(ss + kWarps * 16 * kLS);
    float *so = (float *)(sp + kWarps * 16 * kLP);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.G, i0 = heavy_first() * kTile;
    float *sw = ss + warp * 16 * kLS, *ow = so + warp * 16 * LO;
    E *pw = sp + warp * 16 * kLP;
    // a lane owns half of one of its warp's rows
    const int r = lane >> 1, half = lane & 1, i = i0 + warp * 16 + r;
    float *srow = sw + r * kLS + half * (kTile / 2), *orow = ow + r * LO + half * (D / 2);
    E *prow = pw + r * kLP + half * (kTile / 2);
    load_tile<E>(sq, LD, a.q, g, b, g.H, h, i0);
    for (int e = 0; e < D / 2; e++)
        orow[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int nkt = (g.T + kTile - 1) / kTile;
    for (int kt = 0; kt < nkt; kt++) {
        const int state = pair_state(a, g, i0, kt * kTile);
        if (state == kSkip)
            continue;
        __syncthreads(); // every warp is done with the previous tile
        load_tile<E>(sk, LD, a.k, g, b, g.KV, kvh, kt * kTile);
        load_tile<E>(sv, LD, a.v, g, b, g.KV, kvh, kt * kTile);
        __syncthreads();
        rows_by_tile_t<E, ND>(sw, sq + warp * 16 * LD, sk, LD);
        __syncwarp();
        const int j0 = kt * kTile + half * (kTile / 2);
        float mx = -INFINITY;
        for (int c = 0; c < kTile / 2; c++) {
            const float s = pair_ok(a, g, state, i, j0 + c) ? srow[c] * a.d.scale : -INFINITY;
            srow[c] = s;
            mx = fmaxf(mx, s);
        }
        const float mn = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
        float alpha = 1.0f, sum = 0.0f;
        if (mn == -INFINITY) { // nothing allowed yet: the row stays empty
            for (int c = 0; c < kTile / 2; c++)
                prow[c] = to_e<E>(0.0f);
        } else {
            alpha = m == -INFINITY ? 0.0f : expf(m - mn);
            for (int c = 0; c < kTile / 2; c++) {
                const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - mn);
                prow[c] = to_e<E>(p);
                sum += p;
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1); // a + b == b + a: both lanes agree
        l = l * alpha + sum;
        m = mn;
        for (int e = 0; e < D / 2; e++)
            orow[e] *= alpha;
        __syncwarp();
        frag_c acc[ND];
#pragma unroll
        for (int n = 0; n < ND; n++)
            wmma::load_matrix_sync(acc[n], ow + n * 16, LO, wmma::mem_row_major);
        acc_tile<E, ND>(acc, pw, sv, LD);
#pragma unroll
        for (int n = 0; n < ND; n++)
            wmma::store_matrix_sync(ow + n * 16, acc[n], LO, wmma::mem_row_major);
        __syncwarp();
    }
    if (i < g.T) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        E *dst = (E *)a.o + (((size_t)b * g.T + i) * g.H + h) * D + half * (D / 2);
        for (int e = 0; e < D / 2; e++)
            dst[e] = to_e<E>(orow[e] * inv);
        if (!half)
            a.lse[((size_t)b * g.H + h) * g.T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
#endif
}

// ---- backward ----

// A lane's half row of P and of dS for one tile pair: sw holds the scores
// (unscaled), dw dP; p = exp(scale s - lse) where allowed, ds = p (dp -
// delta); both rounded into their rows for the products. i and j0 say
// which query and keys the lane's elements are: (i, j0 + c) in the dq pass,
// (i0 + c, j) in the dk/dv pass (qstep 1, jstep 0).
template <typename E>
__device__ __forceinline__ void probs_half_row(const zo_flash_args &a, const tgeom &g, int state,
                                               const float *srow, const float *drow, E *prow,
                                               E *dsrow, int i, int j, int qstep, int jstep,
                                               const float *lse, const float *delta, int lstep)
{
    for (int c = 0; c < kTile / 2; c++) {
        const float ls = lse[c * lstep];
        float p = 0.0f;
        if (ls != -INFINITY && pair_ok(a, g, state, i + c * qstep, j + c * jstep))
            p = expf(srow[c] * a.d.scale - ls);
        if (prow)
            prow[c] = to_e<E>(p);
        dsrow[c] = to_e<E>(p * (drow[c] - delta[c * lstep]));
    }
}

template <typename E, int ND> constexpr size_t bwd_smem()
{
    return (size_t)4 * kTile * ld_of<ND>() * sizeof(E) +
           (size_t)2 * kWarps * 16 * kLS * sizeof(float) +
           (size_t)2 * kWarps * 16 * kLP * sizeof(E) + (size_t)2 * kTile * sizeof(float);
}

// dq: a block per (query tile, head, batch element), over key tiles ascending.
template <typename E, int ND>
__global__ void __launch_bounds__(kThreads) dq_tc(zo_flash_args a, tgeom g)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int LD = ld_of<ND>();
    extern __shared__ __align__(128) unsigned char smem[];
    E *sq = (E *)smem, *sdo = sq + kTile * LD, *sk = sdo + kTile * LD, *sv = sk + kTile * LD;
    float *ss = (float *)(sv + kTile * LD), *sd = ss + kWarps * 16 * kLS;
    E *sds = (E *)(sd + kWarps * 16 * kLS);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.G, i0 = heavy_first() * kTile;
    float *sw = ss + warp * 16 * kLS, *dw = sd + warp * 16 * kLS;
    E *dsw = sds + warp * 16 * kLP;
    const int r = lane >> 1, half = lane & 1, i = i0 + warp * 16 + r;
    const size_t row = ((size_t)b * g.H + h) * g.T + i;
    const float lse = i < g.T ? a.lse[row] : -INFINITY, delta = i < g.T ? a.delta[row] : 0.0f;
    load_tile<E>(sq, LD, a.q, g, b, g.H, h, i0);
    load_tile<E>(sdo, LD, a.dout, g, b, g.H, h, i0);
    frag_c acc[ND];
#pragma unroll
    for (int n = 0; n < ND; n++)
        wmma::fill_fragment(acc[n], 0.0f);
    const int nkt = (g.T + kTile - 1) / kTile;
    for (int kt = 0; kt < nkt; kt++) {
        const int state = pair_state(a, g, i0, kt * kTile);
        if (state == kSkip)
            continue;
        __syncthreads();
        load_tile<E>(sk, LD, a.k, g, b, g.KV, kvh, kt * kTile);
        load_tile<E>(sv, LD, a.v, g, b, g.KV, kvh, kt * kTile);
        __syncthreads();
        rows_by_tile_t<E, ND>(sw, sq + warp * 16 * LD, sk, LD);  // S = Q K^T
        rows_by_tile_t<E, ND>(dw, sdo + warp * 16 * LD, sv, LD); // dP = dO V^T
        __syncwarp();
        const int o = r * kLS + half * (kTile / 2);
        probs_half_row<E>(a, g, state, sw + o, dw + o, (E *)0, dsw + r * kLP + half * (kTile / 2),
                          i, kt * kTile + half * (kTile / 2), 0, 1, &lse, &delta, 0);
        __syncwarp();
        acc_tile<E, ND>(acc, dsw, sk, LD); // dq += dS K
    }
    store_acc<E, ND>(a.o, acc, sw, a.d.scale, g, b, g.H, h, i0 + warp * 16);
#endif
}

// dk, dv: a block per (key tile, key/value head, batch element), over the
// group's query heads ascending, each over its query tiles ascending.
template <typename E, int ND>
__global__ void __launch_bounds__(kThreads) dkdv_tc(zo_flash_args a, tgeom g)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int LD = ld_of<ND>();
    extern __shared__ __align__(128) unsigned char smem[];
    E *sk = (E *)smem, *sv = sk + kTile * LD, *sq = sv + kTile * LD, *sdo = sq + kTile * LD;
    float *ss = (float *)(sdo + kTile * LD), *sd = ss + kWarps * 16 * kLS;
    E *sp = (E *)(sd + kWarps * 16 * kLS), *sds = sp + kWarps * 16 * kLP;
    float *slse = (float *)(sds + kWarps * 16 * kLP), *sdelta = slse + kTile;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = blockIdx.y, b = blockIdx.z, j0 = blockIdx.x * kTile;
    float *sw = ss + warp * 16 * kLS, *dw = sd + warp * 16 * kLS;
    E *pw = sp + warp * 16 * kLP, *dsw = sds + warp * 16 * kLP;
    const int r = lane >> 1, half = lane & 1, j = j0 + warp * 16 + r, c0 = half * (kTile / 2);
    load_tile<E>(sk, LD, a.k, g, b, g.KV, kvh, j0);
    load_tile<E>(sv, LD, a.v, g, b, g.KV, kvh, j0);
    frag_c dk[ND], dv[ND];
#pragma unroll
    for (int n = 0; n < ND; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    const int nqt = (g.T + kTile - 1) / kTile;
    for (int h = kvh * g.G; h < (kvh + 1) * g.G; h++)
        for (int qt = 0; qt < nqt; qt++) {
            const int i0 = qt * kTile, state = pair_state(a, g, i0, j0);
            if (state == kSkip)
                continue;
            __syncthreads();
            load_tile<E>(sq, LD, a.q, g, b, g.H, h, i0);
            load_tile<E>(sdo, LD, a.dout, g, b, g.H, h, i0);
            if (threadIdx.x < kTile) {
                const int t = i0 + threadIdx.x;
                const size_t row = ((size_t)b * g.H + h) * g.T + t;
                slse[threadIdx.x] = t < g.T ? a.lse[row] : -INFINITY;
                sdelta[threadIdx.x] = t < g.T ? a.delta[row] : 0.0f;
            }
            __syncthreads();
            rows_by_tile_t<E, ND>(sw, sk + warp * 16 * LD, sq, LD);  // S^T = K Q^T
            rows_by_tile_t<E, ND>(dw, sv + warp * 16 * LD, sdo, LD); // dP^T = V dO^T
            __syncwarp();
            const int o = r * kLS + c0;
            probs_half_row<E>(a, g, state, sw + o, dw + o, pw + r * kLP + c0, dsw + r * kLP + c0,
                              i0 + c0, j, 1, 0, slse + c0, sdelta + c0, 1);
            __syncwarp();
            acc_tile<E, ND>(dv, pw, sdo, LD); // dv += P^T dO
            acc_tile<E, ND>(dk, dsw, sq, LD); // dk += dS^T Q
        }
    // every read of this tile's k and v is done: dk, dv may overwrite them
    store_acc<E, ND>(a.dk, dk, sw, a.d.scale, g, b, g.KV, kvh, j0 + warp * 16);
    store_acc<E, ND>(a.dv, dv, sw, 1.0f, g, b, g.KV, kvh, j0 + warp * 16);
#endif
}

tgeom geom_of(const zo_flash_args *a)
{
    tgeom g;
    g.B = a->d.batch, g.T = a->d.seq, g.H = a->d.heads, g.KV = a->d.kv_heads;
    g.D = a->d.head_dim, g.G = g.H / g.KV, g.bt = zo_flash_tile(&a->d);
    g.nb = (g.T + g.bt - 1) / g.bt;
    return g;
}

template <typename K>
zo_status launch(K kernel, size_t smem, unsigned x, unsigned y, unsigned z, cudaStream_t st,
                 const zo_flash_args &a, const tgeom &g)
{
    ZO_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<dim3(x, y, z), kThreads, smem, st>>>(a, g);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

template <typename E, int ND> zo_status run(const zo_flash_args *a, cudaStream_t st, int bwd)
{
    const tgeom g = geom_of(a);
    const unsigned nt = (unsigned)((g.T + kTile - 1) / kTile);
    if (!bwd)
        return launch(fwd_tc<E, ND>, fwd_smem<E, ND>(), nt, g.H, g.B, st, *a, g);
    // dq first: it reads every key tile's k and v, which dk and dv may
    // overwrite in place (zo/ops.h's aliasing rules)
    ZO_TRY(launch(dq_tc<E, ND>, bwd_smem<E, ND>(), nt, g.H, g.B, st, *a, g));
    return launch(dkdv_tc<E, ND>, bwd_smem<E, ND>(), nt, g.KV, g.B, st, *a, g);
}

template <typename E> zo_status run_d(const zo_flash_args *a, cudaStream_t st, int bwd)
{
    switch (a->d.head_dim) {
    case 64: return run<E, 4>(a, st, bwd);
    case 80: return run<E, 5>(a, st, bwd);
    case 96: return run<E, 6>(a, st, bwd);
    default: return run<E, 8>(a, st, bwd);
    }
}

bool aligned16(const void *p)
{
    return !p || ((uintptr_t)p & 15u) == 0;
}

} // namespace

int zo_cuda_flash_tc_takes(const zo_flash_args *a, int bwd)
{
    const int dt = a->d.dt, D = a->d.head_dim;
    if (zo_env_bool("ZO_CUDA_FLASH_SCALAR", 0)) // the scalar kernel, to check against it
        return 0;
    if (dt != ZO_DTYPE_BF16 && dt != ZO_DTYPE_F16)
        return 0;
    if (D != 64 && D != 80 && D != 96 && D != 128)
        return 0;
    if (a->d.heads > 65535 || a->d.kv_heads > 65535 || a->d.batch > 65535)
        return 0;
    const void *ptrs[] = {a->o, a->q, a->k, a->v, a->dk, a->dv, a->out, a->dout};
    for (size_t n = 0; n < sizeof ptrs / sizeof ptrs[0]; n++)
        if (!aligned16(ptrs[n]))
            return 0;
    int dev, major, optin;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        (void)cudaGetLastError(); // the scalar kernel will report the device's state
        return 0;
    }
    const size_t need = bwd ? bwd_smem<__half, 8>() : fwd_smem<__half, 8>();
    return major >= 8 && (size_t)optin >= need;
}

zo_status zo_cuda_flash_tc_fwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    cudaStream_t st = (cudaStream_t)x->native;
    return a->d.dt == ZO_DTYPE_BF16 ? run_d<__nv_bfloat16>(a, st, 0) : run_d<__half>(a, st, 0);
}

zo_status zo_cuda_flash_tc_bwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    cudaStream_t st = (cudaStream_t)x->native;
    return a->d.dt == ZO_DTYPE_BF16 ? run_d<__nv_bfloat16>(a, st, 1) : run_d<__half>(a, st, 1);
}
