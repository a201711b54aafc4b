/* zoffload: the compute ops of a LLaMA-style decoder (forward and backward).
 *
 * Every op runs on a stream of a device and is asynchronous in stream order,
 * like a CUDA kernel launch: the call validates its arguments, queues the work
 * and returns; a failure found while the work runs is kept as the stream's
 * asynchronous error and reported by the next wait. Pointers are device
 * pointers inside live allocations of the stream's device (zo_device_malloc);
 * the call checks every operand range and fails with ZO_ERR_INVALID_ARG,
 * naming the operand, when one is not.
 *
 * The same table of ops exists for both backends: on the cpu device each op
 * runs on the stream's worker thread in plain C (GEMM through OpenBLAS sgemm on
 * fp32 copies of 16-bit operands), and is bitwise repeatable run to run; on
 * cuda the ops are kernels on the stream and GEMMs go through cuBLAS
 * (cublasGemmEx, fp32 accumulation). The cpu implementation is the reference
 * the cuda one is tested against.
 *
 * Layouts are row-major and contiguous unless a leading dimension says
 * otherwise. Precision: tensors are fp32, bf16 or fp16 (zo_dtype); every op
 * loads them into fp32, computes in fp32 (norm statistics, softmax and loss
 * included) and rounds its outputs to nearest even. Saved statistics (RMSNorm
 * rstd), the RoPE table, losses and sums of squares are fp32.
 *
 * Element counts are size_t; matrix dimensions are int (as in BLAS). */
#ifndef ZO_OPS_H
#define ZO_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/device.h"
#include "zo/dtype.h"
#include "zo/half.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host conversions between fp32 and bf16/fp16 (round to nearest even, NaN
 * kept, overflow to infinity, fp16 subnormals kept): zo_f32_to_bf16,
 * zo_bf16_to_f32, zo_f32_to_f16 and zo_f16_to_f32 from zo/half.h, the one
 * definition the optimizer, the engine and the kernels share. */

/* ---- GEMM ----
 * For each of `batch` problems p:
 *   C_p = alpha * op(A_p) @ op(B_p) + beta * C_p        (row-major)
 * C_p is m x n at c + p*stride_c with row stride ldc. op(A) is m x k: A is
 * stored m x k (lda >= k) or, with trans_a, k x m (lda >= m); op(B) is k x n:
 * B is stored k x n (ldb >= n) or, with trans_b, n x k (ldb >= k).
 * a_type must equal b_type; c_type is fp32 or a_type. Products accumulate in
 * fp32. beta == 0 means C is not read (NaN in C does not propagate). */
typedef struct zo_gemm_desc {
    size_t struct_size; /* sizeof(zo_gemm_desc) */
    int trans_a, trans_b;
    int m, n, k;
    int batch; /* >= 1 */
    float alpha, beta;
    const void *a;
    zo_dtype a_type;
    int64_t lda, stride_a;
    const void *b;
    zo_dtype b_type;
    int64_t ldb, stride_b;
    void *c;
    zo_dtype c_type;
    int64_t ldc, stride_c;
} zo_gemm_desc;

#define ZO_GEMM_DESC_INIT                                                                          \
    {                                                                                              \
        .struct_size = sizeof(zo_gemm_desc), .batch = 1, .alpha = 1.0f, .a_type = ZO_DTYPE_F32,    \
        .b_type = ZO_DTYPE_F32, .c_type = ZO_DTYPE_F32                                             \
    }

ZO_API zo_status zo_op_gemm(zo_stream_t s, const zo_gemm_desc *g);

/* ---- token embedding ----
 * out[t, :] = table[tokens[t], :]      out: n_tokens x dim, table: vocab x dim (dt)
 * dtable[tokens[t], :] += dout[t, :]   accumulated in token order (deterministic
 *                                      on both backends); dtable has its own dtype.
 * A token outside [0, vocab) is an asynchronous ZO_ERR_INVALID_ARG on cpu; on
 * cuda its output row is NaN and its gradient is dropped. */
ZO_API zo_status zo_op_embedding_fwd(zo_stream_t s, void *out, const void *table,
                                     const int32_t *tokens, size_t n_tokens, int dim, int vocab,
                                     zo_dtype dt);
ZO_API zo_status zo_op_embedding_bwd(zo_stream_t s, void *dtable, zo_dtype dtable_dt,
                                     const void *dout, const int32_t *tokens, size_t n_tokens,
                                     int dim, int vocab, zo_dtype dt);
/* The vocabulary-parallel embedding (Megatron-LM's VocabParallelEmbedding):
 * table holds rows v0 .. v0 + part - 1 of a vocab x dim matrix. A token in
 * that range gives its row, any other token a zero row, so the sum of the T
 * parts' outputs over a tensor-parallel group is the whole lookup, bit for
 * bit. The backward adds dout to the rows this part holds and skips the rest.
 * Tokens are still checked against [0, vocab). v0 0 and part vocab: the ops
 * above. */
ZO_API zo_status zo_op_embedding_part_fwd(zo_stream_t s, void *out, const void *table,
                                          const int32_t *tokens, size_t n_tokens, int dim,
                                          int vocab, int v0, int part, zo_dtype dt);
ZO_API zo_status zo_op_embedding_part_bwd(zo_stream_t s, void *dtable, zo_dtype dtable_dt,
                                          const void *dout, const int32_t *tokens, size_t n_tokens,
                                          int dim, int vocab, int v0, int part, zo_dtype dt);

/* ---- RMSNorm ----
 * rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps);  y[r,j] = x[r,j] * rstd[r] * w[j]
 * Backward: dx = rstd * (dy*w - xhat * mean_j(dy*w*xhat)), xhat = x*rstd;
 * written (accumulate_dx = 0) or added to dx (1). dw[j] += sum_r dy[r,j]*xhat[r,j],
 * summed over rows in fp32 then added once (dw has its own dtype; NULL skips it). */
ZO_API zo_status zo_op_rmsnorm_fwd(zo_stream_t s, void *y, float *rstd, const void *x,
                                   const void *w, size_t rows, int dim, float eps, zo_dtype dt);
ZO_API zo_status zo_op_rmsnorm_bwd(zo_stream_t s, void *dx, void *dw, zo_dtype dw_dt,
                                   const void *dy, const void *x, const void *w, const float *rstd,
                                   size_t rows, int dim, int accumulate_dx, zo_dtype dt);

/* ---- rotary position embedding (LLaMA, rotate-half pairing as in HF) ----
 * table (fp32, seq x head_dim/2 x {cos, sin}) for positions pos0..pos0+seq-1:
 *   angle(p, i) = p * theta^(-2i/head_dim), computed in double.
 * x is batch x seq x heads x head_dim (the q or k projection). For i < h = head_dim/2:
 *   y[i] = x[i]*cos - x[i+h]*sin,  y[i+h] = x[i+h]*cos + x[i]*sin
 * rope_bwd applies the inverse rotation to the gradient. out may equal in. */
ZO_API zo_status zo_op_rope_table(zo_stream_t s, float *table, int seq, int head_dim, float theta,
                                  int pos0);

/* RoPE frequency scaling (Hugging Face's rope_scaling). For pair i the
 * frequency f = theta^(-2i/head_dim) becomes, in double:
 *   LINEAR: f / factor
 *   LLAMA3: with wavelength w = 2 pi / f, lo = original_max_pos / low_freq_factor,
 *           hi = original_max_pos / high_freq_factor:
 *           w < hi: f;  w > lo: f / factor;  otherwise, with
 *           a = (original_max_pos / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
 *           (1 - a) f / factor + a f
 *   YARN:   with d(r) = head_dim ln(original_max_pos / (2 pi r)) / (2 ln theta),
 *           lo = max(floor(d(beta_fast)), 0), hi = min(ceil(d(beta_slow)), head_dim - 1)
 *           (no rounding with no_truncate; hi = lo + 0.001 where equal) and the
 *           ramp r = clamp((i - lo) / (hi - lo), 0, 1): r f / factor + (1 - r) f;
 *           cos and sin are multiplied by attention_factor
 *   DYNAMIC: the table's length n = max(pos0 + seq, original_max_pos) (here
 *           max_position_embeddings) makes theta
 *           theta (factor n / original_max_pos - factor + 1)^(head_dim / (head_dim - 2))
 * (as transformers' _compute_llama3_parameters, _compute_yarn_parameters and
 * _compute_dynamic_ntk_parameters with dynamic_rope_update). NONE is zo_op_rope_table. */
typedef enum {
    ZO_ROPE_SCALING_NONE = 0,
    ZO_ROPE_SCALING_LINEAR,
    ZO_ROPE_SCALING_LLAMA3,
    ZO_ROPE_SCALING_YARN,
    ZO_ROPE_SCALING_DYNAMIC
} zo_rope_scaling_type;
typedef struct zo_rope_scaling {
    zo_rope_scaling_type type;
    float factor;               /* > 0 (LINEAR, LLAMA3, YARN, DYNAMIC) */
    float low_freq_factor;      /* LLAMA3: > 0 */
    float high_freq_factor;     /* LLAMA3: > low_freq_factor */
    int original_max_pos;       /* LLAMA3, YARN: > 0, the pretraining length; DYNAMIC: the
                                   max_position_embeddings beyond which theta grows */
    float beta_fast, beta_slow; /* YARN: the ramp's rotation bounds (32, 1), > 0 */
    float attention_factor;     /* YARN: > 0, 0.1 ln(factor) + 1 by default */
    int no_truncate;            /* YARN: 1 keeps the ramp's bounds unrounded */
} zo_rope_scaling;
/* zo_op_rope_table with the frequencies scaled by sc (NULL: none). */
ZO_API zo_status zo_op_rope_table_scaled(zo_stream_t s, float *table, int seq, int head_dim,
                                         float theta, int pos0, const zo_rope_scaling *sc);
ZO_API zo_status zo_op_rope_fwd(zo_stream_t s, void *out, const void *in, const float *table,
                                int batch, int seq, int heads, int head_dim, zo_dtype dt);
ZO_API zo_status zo_op_rope_bwd(zo_stream_t s, void *din, const void *dout, const float *table,
                                int batch, int seq, int heads, int head_dim, zo_dtype dt);

/* ---- causal softmax over n_mats square seq x seq matrices (row t keeps
 * columns 0..t; the rest become 0) ----
 * bwd: dx = p * (dp - sum_j p_j dp_j). Either may run in place. */
ZO_API zo_status zo_op_causal_softmax_fwd(zo_stream_t s, void *p, const void *x, size_t n_mats,
                                          int seq, zo_dtype dt);
ZO_API zo_status zo_op_causal_softmax_bwd(zo_stream_t s, void *dx, const void *dp, const void *p,
                                          size_t n_mats, int seq, zo_dtype dt);

/* ---- causal multi-head attention ----
 * q, k, v, out: batch x seq x heads x head_dim. att: batch x heads x seq x seq,
 * the probabilities, kept for the backward. Composed of strided batched GEMMs
 * (scores scaled by 1/sqrt(head_dim), fp32 accumulation, rounded to dt) and
 * the causal softmax above. The backward needs a second seq x seq workspace
 * datt (same size as att) and writes dq, dk, dv. */
ZO_API zo_status zo_op_attention_fwd(zo_stream_t s, void *out, void *att, const void *q,
                                     const void *k, const void *v, int batch, int seq, int heads,
                                     int head_dim, zo_dtype dt);
ZO_API zo_status zo_op_attention_bwd(zo_stream_t s, void *dq, void *dk, void *dv, void *datt,
                                     const void *dout, const void *att, const void *q,
                                     const void *k, const void *v, int batch, int seq, int heads,
                                     int head_dim, zo_dtype dt);

/* ---- fused attention (FlashAttention-2): nothing seq x seq anywhere ----
 * q, dq, out, dout: batch x seq x heads x head_dim; k, v, dk, dv: batch x seq x
 * kv_heads x head_dim, query head h reading key/value head h / (heads /
 * kv_heads) in place (grouped-query attention without repeat_kv's copy).
 * Query i attends key j when every rule the descriptor sets allows it:
 *   causal:      j <= i
 *   window > 0:  i - j < window (Mistral's and Qwen2's sliding_window, exact)
 *   block_mask:  block_mask[(i / mask_block) * nb + j / mask_block] != 0, with
 *                nb = ceil(seq / mask_block) (zo_attn_layout_build makes one)
 * A query that attends no key gets out = 0 and lse = -inf.
 * Forward: queries and keys go in tiles (mask_block with a mask, else 64);
 * each query tile keeps a running max and sum in fp32 over its key tiles and
 * rescales its fp32 accumulator; out is rounded once and lse[b, h, i] (fp32,
 * batch x heads x seq) = log sum_j exp(scale q_i . k_j) is saved. A tile
 * pair the rules disallow entirely is skipped, not computed and zeroed, so
 * work falls with the layout's density.
 * Backward: the probabilities are recomputed tile by tile from lse, and
 * delta[b, h, i] (fp32 workspace, batch x heads x seq, overwritten) is
 * sum_j p_ij dp_ij with dp_ij = dout_i . v_j, which is dout_i . out_i in
 * exact arithmetic. The cpu op sums it in fp32 from the same probabilities
 * its ds = p (dp - delta) uses, so each row's ds sums to zero to fp32's
 * precision in every dtype; FlashAttention-2's dout . out from the output
 * rounded to bf16 does not when the values share a large component (a v
 * bias), and a component every key shares (a k bias) turns that into a dq
 * error. (The cuda op sums it the same way, in a pass before dq.) It is
 * deterministic without atomics: dq and delta of a query tile are summed by one task over
 * key tiles in ascending order; then dk and dv of a key tile by one task
 * over the group's query heads in ascending order and, within each, over
 * query tiles in ascending order (the scores are recomputed for each pass).
 * dq, dk, dv are written, not added. They may overwrite inputs the backward
 * no longer needs: dq may be out (neither op reads out), dk may be k and dv may
 * be v (each key row's gradients are written after every read of that row's
 * k and v); any other overlap is undefined. The results are the same bits
 * either way. Scores, probabilities and accumulators stay in fp32 (the
 * materialized op rounds scores and probabilities to dt). */
typedef struct zo_flash_attn_desc {
    size_t struct_size;                        /* sizeof(zo_flash_attn_desc) */
    int batch, seq, heads, kv_heads, head_dim; /* heads a multiple of kv_heads */
    int causal;                                /* 1: j <= i */
    int window;                                /* > 0: i - j < window; 0: none */
    float scale;                               /* 0: 1 / sqrt(head_dim) */
    const uint8_t *block_mask;                 /* device bytes, nb x nb; NULL: none */
    int mask_block;                            /* with block_mask: 16..512, a multiple of 16 */
    zo_dtype dt;
} zo_flash_attn_desc;

#define ZO_FLASH_ATTN_DESC_INIT                                                                    \
    {                                                                                              \
        .struct_size = sizeof(zo_flash_attn_desc), .causal = 1, .dt = ZO_DTYPE_F32                 \
    }

ZO_API zo_status zo_op_flash_attention_fwd(zo_stream_t s, const zo_flash_attn_desc *d, void *out,
                                           float *lse, const void *q, const void *k, const void *v);
ZO_API zo_status zo_op_flash_attention_bwd(zo_stream_t s, const zo_flash_attn_desc *d, void *dq,
                                           void *dk, void *dv, float *delta, const void *dout,
                                           const void *out, const float *lse, const void *q,
                                           const void *k, const void *v);

/* ---- block-sparse attention layouts (host) ----
 * A layout fills the block mask of zo_flash_attn_desc: nb x nb bytes for
 * nb = ceil(seq / block), 1 where query block r may attend key block c.
 *   DENSE:          every block (with causal, the lower triangle is what runs)
 *   SLIDING_WINDOW: r - window_blocks < c <= r + (causal ? 0 : window_blocks - 1)
 *   FIXED:          DeepSpeed's fixed layout: local stripes of window_blocks
 *                   blocks (c in r's stripe) plus the last global_blocks
 *                   blocks of every stripe as summary columns all rows read
 *   BIGBIRD:        window_blocks around the diagonal (|r - c| < window_blocks
 *                   on both sides, halved), the first global_blocks rows and
 *                   columns, and random_blocks random columns per row drawn
 *                   from seed (the same seed, the same mask)
 * Causal layouts keep only c <= r. */
typedef enum {
    ZO_ATTN_LAYOUT_DENSE = 0,
    ZO_ATTN_LAYOUT_SLIDING_WINDOW,
    ZO_ATTN_LAYOUT_FIXED,
    ZO_ATTN_LAYOUT_BIGBIRD
} zo_attn_layout_kind;

typedef struct zo_attn_layout {
    size_t struct_size; /* sizeof(zo_attn_layout) */
    zo_attn_layout_kind kind;
    int block;         /* tokens per block: 16..512, a multiple of 16 */
    int causal;        /* 1: keep c <= r */
    int window_blocks; /* SLIDING_WINDOW, BIGBIRD: >= 1; FIXED: the stripe, >= 1 */
    int global_blocks; /* FIXED: 1..window_blocks; BIGBIRD: >= 0 */
    int random_blocks; /* BIGBIRD: >= 0 */
    uint64_t seed;     /* BIGBIRD */
} zo_attn_layout;

#define ZO_ATTN_LAYOUT_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(zo_attn_layout), .block = 64, .causal = 1, .window_blocks = 1        \
    }

/* nb = ceil(seq / l->block) in *n_blocks; with mask != NULL fills mask (cap
 * bytes, at least nb * nb). *density (may be NULL) is the fraction of the
 * blocks a causal or full sweep runs: kept blocks / (causal ? nb (nb + 1) / 2
 * : nb^2). */
ZO_API zo_status zo_attn_layout_build(const zo_attn_layout *l, int seq, uint8_t *mask, size_t cap,
                                      int *n_blocks, double *density);

/* ---- grouped-query attention: key/value heads shared by query heads ----
 * x is rows x kv_heads x head_dim; out is rows x (kv_heads * group) x head_dim
 * with query head h reading key/value head h / group (as transformers'
 * repeat_kv). fwd: out[r, h, :] = x[r, h / group, :].
 * bwd: dx[r, k, :] = sum over j = 0..group-1 of dout[r, k*group + j, :],
 * summed in fp32 in ascending j and rounded once (written, not added). */
ZO_API zo_status zo_op_repeat_kv_fwd(zo_stream_t s, void *out, const void *x, size_t rows,
                                     int kv_heads, int group, int head_dim, zo_dtype dt);
ZO_API zo_status zo_op_repeat_kv_bwd(zo_stream_t s, void *dx, const void *dout, size_t rows,
                                     int kv_heads, int group, int head_dim, zo_dtype dt);

/* ---- a bias over the rows of a rows x cols matrix (Qwen2's q/k/v biases) ----
 * fwd: y[r, c] += bias[c].
 * bwd: dbias[c] += sum_r dy[r, c], summed over rows in ascending order in fp32
 * then added once (dbias has its own dtype), as RMSNorm's dw. */
ZO_API zo_status zo_op_bias_fwd(zo_stream_t s, void *y, const void *bias, size_t rows, int cols,
                                zo_dtype dt);
ZO_API zo_status zo_op_bias_bwd(zo_stream_t s, void *dbias, zo_dtype dbias_dt, const void *dy,
                                size_t rows, int cols, zo_dtype dt);

/* ---- SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) ----
 * bwd: dgate = dout * up * silu'(gate), dup = dout * silu(gate); dgate may
 * equal gate and dup may equal up (elementwise in place). */
ZO_API zo_status zo_op_swiglu_fwd(zo_stream_t s, void *out, const void *gate, const void *up,
                                  size_t n, zo_dtype dt);
ZO_API zo_status zo_op_swiglu_bwd(zo_stream_t s, void *dgate, void *dup, const void *dout,
                                  const void *gate, const void *up, size_t n, zo_dtype dt);

/* ---- cross-entropy over the vocabulary, fused with its softmax ----
 * row_loss[r] = logsumexp(logits[r,:]) - logits[r, targets[r]]   (fp32, rows)
 * *loss = mean_r row_loss[r]                                      (fp32 device scalar)
 * dlogits (NULL: forward only) = grad_scale / rows * (softmax(logits[r,:]) - onehot);
 * it may equal logits. A target outside [0, vocab) is an asynchronous
 * ZO_ERR_INVALID_ARG on cpu and a NaN row loss on cuda. */
ZO_API zo_status zo_op_cross_entropy(zo_stream_t s, float *loss, float *row_loss, void *dlogits,
                                     const void *logits, const int32_t *targets, size_t rows,
                                     int vocab, float grad_scale, zo_dtype dt);
/* The same for rows r0 .. r0 + rows - 1 of a batch of total rows, so that the
 * logits of a long sequence are made and consumed a chunk at a time (never
 * total x vocab): row_loss, dlogits, logits and targets point at the chunk's
 * first row; dlogits = grad_scale / total * (softmax - onehot); loss, when
 * not NULL (give it with the last chunk), the mean of the batch's row_loss
 * (from row_loss - r0), in row order. Row for row the bits of zo_op_cross_entropy
 * over the whole batch, loss included. */
ZO_API zo_status zo_op_cross_entropy_chunk(zo_stream_t s, float *loss, float *row_loss,
                                           void *dlogits, const void *logits,
                                           const int32_t *targets, size_t rows, int vocab,
                                           float grad_scale, zo_dtype dt, size_t r0, size_t total);
/* The vocabulary-parallel cross-entropy (Megatron-LM's): each of `parts`
 * ranks holds the logits of vocabulary ids v0 .. v0 + part - 1 of every row
 * (rows x part), so no rank makes a row's whole vocabulary. Two steps:
 * stats (fp32, rows x 3) = per row {m: the part's max, e: sum of exp(l - m)
 * over the part, t: the target's logit when this part holds it, else 0};
 * the caller all-gathers the parts' stats in rank order into all_stats
 * (parts x rows x 3) and zo_op_cross_entropy_part combines them, in rank
 * order, to lse = M + log(sum_p e_p exp(m_p - M)), M = max_p m_p, and
 * row_loss = lse - sum_p t_p (the same bits on every rank), then writes
 * dlogits (NULL: forward only; it may equal logits) = grad_scale / total *
 * (exp(l - lse) - onehot) over the part's ids, and loss as
 * zo_op_cross_entropy_chunk does (rows from r0 of total). Targets are
 * checked against [0, vocab). */
#define ZO_XENT_STATS 3 /* stats floats per row: max, sum of exps about it, target logit */
ZO_API zo_status zo_op_cross_entropy_part_stats(zo_stream_t s, float *stats, const void *logits,
                                                const int32_t *targets, size_t rows, int vocab,
                                                int v0, int part, zo_dtype dt);
ZO_API zo_status zo_op_cross_entropy_part(zo_stream_t s, float *loss, float *row_loss,
                                          void *dlogits, const void *logits, const float *all_stats,
                                          int parts, const int32_t *targets, size_t rows, int vocab,
                                          int v0, int part, float grad_scale, zo_dtype dt,
                                          size_t r0, size_t total);

/* ---- elementwise and reductions ---- */
/* y = a + b (y may equal a or b). */
ZO_API zo_status zo_op_add(zo_stream_t s, void *y, const void *a, const void *b, size_t n,
                           zo_dtype dt);
/* dst = src converted; dst and src must not overlap unless dst == src with equal dtypes. */
ZO_API zo_status zo_op_cast(zo_stream_t s, void *dst, zo_dtype dst_dt, const void *src,
                            zo_dtype src_dt, size_t n);
/* x *= alpha */
ZO_API zo_status zo_op_scale(zo_stream_t s, void *x, float alpha, size_t n, zo_dtype dt);
/* y += alpha * x (y and x may have different dtypes, e.g. fp32 += bf16). */
ZO_API zo_status zo_op_axpy(zo_stream_t s, void *y, zo_dtype y_dt, float alpha, const void *x,
                            zo_dtype x_dt, size_t n);
/* *out = (accumulate ? *out : 0) + sum x^2 (fp32 device scalar; an inf or NaN
 * in x makes it inf or NaN, which is how overflow is detected). Deterministic
 * on both backends. */
ZO_API zo_status zo_op_sumsq(zo_stream_t s, float *out, const void *x, size_t n, zo_dtype dt,
                             int accumulate);

#ifdef __cplusplus
}
#endif
#endif
