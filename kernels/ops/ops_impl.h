/* The compute-op backend table (not installed). The front end (ops.c)
 * validates arguments and operand ranges, then hands each backend one
 * argument struct per op; the cpu backend copies it into a stream task, the
 * cuda backend launches kernels with it. Structs hold plain values so a
 * backend may copy them. Attention is composed in the front end from gemm and
 * the causal softmax, so both backends share its schedule. */
#ifndef ZO_OPS_IMPL_H
#define ZO_OPS_IMPL_H

#include <math.h>

#include "zo/device.h"
#include "zo/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where an op runs: the stream, its native handle (cudaStream_t on cuda) and
 * the stream's ops context (backend-specific, created lazily). */
typedef struct zo_ops_exec {
    zo_stream_t s;
    void *native;
    void *ctx;
} zo_ops_exec;

typedef struct zo_embed_args {
    void *out;      /* fwd: out, bwd: dtable */
    const void *in; /* fwd: table, bwd: dout */
    const int32_t *tokens;
    size_t n_tokens;
    int dim, vocab;
    zo_dtype dt, out_dt; /* bwd: out_dt is dtable's dtype */
    int v0, part;        /* the table's rows: ids v0 .. v0 + part - 1 (others: zero, skipped) */
} zo_embed_args;

typedef struct zo_rmsnorm_args {
    void *y_or_dx;
    void *dw;
    float *rstd;
    const void *x, *w, *dy;
    size_t rows;
    int dim;
    float eps;
    int accumulate_dx;
    zo_dtype dt, dw_dt;
} zo_rmsnorm_args;

typedef struct zo_rope_table_args {
    float *table;
    int seq, head_dim, pos0;
    float theta;
    zo_rope_scaling sc; /* type NONE: unscaled */
} zo_rope_table_args;

/* Pair i's frequency, scaled (zo_op_rope_table_scaled); shared by the cpu
 * and cuda kernels so both compute the same doubles. */
#ifdef __CUDACC__
#define ZO_HOST_DEVICE __host__ __device__
#else
#define ZO_HOST_DEVICE
#endif
static inline ZO_HOST_DEVICE double zo_rope_llama3(const zo_rope_scaling *sc, double f)
{
    const double pi = 3.14159265358979323846;
    double w = 2.0 * pi / f, old = sc->original_max_pos;
    double lo = old / sc->low_freq_factor, hi = old / sc->high_freq_factor;
    if (w < hi)
        return f;
    if (w > lo)
        return f / sc->factor;
    double t = (old / w - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
    return (1.0 - t) * f / sc->factor + t * f;
}

/* YaRN's correction dimension for r rotations over the pretraining length. */
static inline ZO_HOST_DEVICE double zo_rope_yarn_dim(const zo_rope_table_args *a, double r)
{
    const double pi = 3.14159265358979323846;
    return a->head_dim * log(a->sc.original_max_pos / (r * 2.0 * pi)) /
           (2.0 * log((double)a->theta));
}

static inline ZO_HOST_DEVICE double zo_rope_yarn(const zo_rope_table_args *a, double f, int i)
{
    double lo = zo_rope_yarn_dim(a, a->sc.beta_fast), hi = zo_rope_yarn_dim(a, a->sc.beta_slow);
    if (!a->sc.no_truncate)
        lo = floor(lo), hi = ceil(hi);
    lo = lo > 0.0 ? lo : 0.0;
    hi = hi < a->head_dim - 1 ? hi : a->head_dim - 1;
    if (lo == hi)
        hi += 0.001; /* transformers' guard against a zero-width ramp */
    double r = (i - lo) / (hi - lo);
    r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
    return r * f / a->sc.factor + (1.0 - r) * f;
}

/* Dynamic NTK: theta grows with the table's length past max_position_embeddings. */
static inline ZO_HOST_DEVICE double zo_rope_dynamic_theta(const zo_rope_table_args *a)
{
    double n = (double)a->pos0 + a->seq, max = a->sc.original_max_pos;
    n = n > max ? n : max;
    double k = a->sc.factor;
    return a->theta * pow(k * n / max - (k - 1.0), (double)a->head_dim / (a->head_dim - 2));
}

static inline ZO_HOST_DEVICE double zo_rope_freq(const zo_rope_table_args *a, int i)
{
    double theta = a->sc.type == ZO_ROPE_SCALING_DYNAMIC ? zo_rope_dynamic_theta(a) : a->theta;
    double f = pow(theta, -2.0 * i / a->head_dim);
    switch (a->sc.type) {
    case ZO_ROPE_SCALING_LINEAR: return f / a->sc.factor;
    case ZO_ROPE_SCALING_LLAMA3: return zo_rope_llama3(&a->sc, f);
    case ZO_ROPE_SCALING_YARN: return zo_rope_yarn(a, f, i);
    default: return f;
    }
}

/* What cos and sin are multiplied by: YaRN's attention factor, else 1. */
static inline ZO_HOST_DEVICE double zo_rope_magnitude(const zo_rope_table_args *a)
{
    return a->sc.type == ZO_ROPE_SCALING_YARN ? a->sc.attention_factor : 1.0;
}

/* repeat_kv: x is rows x kv_heads x head_dim, out rows x kv_heads*group x head_dim. */
typedef struct zo_repeat_kv_args {
    void *out;      /* fwd: out, bwd: dx */
    const void *in; /* fwd: x, bwd: dout */
    size_t rows;
    int kv_heads, group, head_dim;
    int bwd;
    zo_dtype dt;
} zo_repeat_kv_args;

/* bias: fwd y += bias per row; bwd dbias += column sums of dy. */
typedef struct zo_bias_args {
    void *out;      /* fwd: y, bwd: dbias */
    const void *in; /* fwd: bias, bwd: dy */
    size_t rows;
    int cols;
    int bwd;
    zo_dtype dt, out_dt; /* bwd: out_dt is dbias's dtype */
} zo_bias_args;

typedef struct zo_rope_args {
    void *out;
    const void *in;
    const float *table;
    int batch, seq, heads, head_dim;
    int inverse; /* 1: backward (rotate by -angle) */
    zo_dtype dt;
} zo_rope_args;

typedef struct zo_softmax_args {
    void *out;
    const void *in; /* fwd: scores x, bwd: dp */
    const void *p;  /* bwd only */
    size_t n_mats;
    int seq;
    zo_dtype dt;
} zo_softmax_args;

typedef struct zo_swiglu_args {
    void *out, *dup; /* fwd: out; bwd: out = dgate, dup */
    const void *gate, *up, *dout;
    size_t n;
    zo_dtype dt;
} zo_swiglu_args;

typedef struct zo_xent_args {
    float *loss, *row_loss;
    void *dlogits;
    const void *logits;
    const int32_t *targets;
    size_t rows;
    int vocab;
    float grad_scale;
    zo_dtype dt;
    /* A chunk of a longer batch (zo_op_cross_entropy_chunk): these rows start
     * at row r0 of total; dlogits scale by grad_scale / total and loss (NULL:
     * not this call) is the mean of row_loss[-r0 .. total - r0). r0 0 and total
     * rows: the whole batch. */
    size_t r0, total;
} zo_xent_args;

/* The vocabulary-parallel cross-entropy (zo_op_cross_entropy_part_stats and
 * zo_op_cross_entropy_part): logits hold ids v0 .. v0 + part - 1 of vocab.
 * stats pass: stats (rows x 3); combine pass: all_stats (parts x rows x 3)
 * to row_loss, loss, dlogits as zo_xent_args. */
typedef struct zo_xent_part_args {
    float *stats;
    const float *all_stats;
    int parts;
    float *loss, *row_loss;
    void *dlogits;
    const void *logits;
    const int32_t *targets;
    size_t rows;
    int vocab, v0, part;
    float grad_scale;
    zo_dtype dt;
    size_t r0, total;
} zo_xent_part_args;

typedef enum { ZO_EW_ADD, ZO_EW_CAST, ZO_EW_SCALE, ZO_EW_AXPY } zo_ew_kind;

/* The elementwise family: add (y = a + b), cast (y = a), scale (y *= alpha),
 * axpy (y += alpha * a). */
typedef struct zo_ew_args {
    zo_ew_kind kind;
    void *y;
    const void *a, *b;
    float alpha;
    size_t n;
    zo_dtype y_dt, a_dt;
} zo_ew_args;

typedef struct zo_sumsq_args {
    float *out;
    const void *x;
    size_t n;
    zo_dtype dt;
    int accumulate;
} zo_sumsq_args;

/* The fused attention op (zo_op_flash_attention_fwd/bwd), validated. fwd
 * writes out (o) and lse; bwd writes dq (o), dk, dv and delta. */
typedef struct zo_flash_args {
    zo_flash_attn_desc d; /* scale resolved (> 0) */
    void *o, *dk, *dv;
    float *lse, *delta;
    const void *q, *k, *v, *out, *dout;
} zo_flash_args;

/* The tile of the fused attention: the mask's block, else 64 rows. */
static inline int zo_flash_tile(const zo_flash_attn_desc *d)
{
    return d->block_mask ? d->mask_block : 64;
}

/* Bumped when a slot is added, removed or changes meaning. */
#define ZO_OPS_BACKEND_VERSION 3u

/* Capability flags (zo_ops_backend.caps). */
enum {
    ZO_OPS_CAP_DETERMINISTIC = 1u << 0, /* the same inputs give the same bits, run after run */
};

/* Every slot is required. */
typedef struct zo_ops_backend {
    const char *name; /* the device backend whose streams it runs on */
    unsigned version; /* ZO_OPS_BACKEND_VERSION */
    unsigned caps;    /* ZO_OPS_CAP_* */
    /* Create the stream's context (called once per stream, on first use). */
    zo_status (*ctx_create)(zo_stream_t s, void **out);
    zo_status (*gemm)(const zo_ops_exec *x, const zo_gemm_desc *g);
    zo_status (*embedding_fwd)(const zo_ops_exec *x, const zo_embed_args *a);
    zo_status (*embedding_bwd)(const zo_ops_exec *x, const zo_embed_args *a);
    zo_status (*rmsnorm_fwd)(const zo_ops_exec *x, const zo_rmsnorm_args *a);
    zo_status (*rmsnorm_bwd)(const zo_ops_exec *x, const zo_rmsnorm_args *a);
    zo_status (*rope_table)(const zo_ops_exec *x, const zo_rope_table_args *a);
    zo_status (*rope)(const zo_ops_exec *x, const zo_rope_args *a);
    zo_status (*softmax_fwd)(const zo_ops_exec *x, const zo_softmax_args *a);
    zo_status (*softmax_bwd)(const zo_ops_exec *x, const zo_softmax_args *a);
    zo_status (*swiglu_fwd)(const zo_ops_exec *x, const zo_swiglu_args *a);
    zo_status (*swiglu_bwd)(const zo_ops_exec *x, const zo_swiglu_args *a);
    zo_status (*cross_entropy)(const zo_ops_exec *x, const zo_xent_args *a);
    zo_status (*xent_part_stats)(const zo_ops_exec *x, const zo_xent_part_args *a);
    zo_status (*xent_part)(const zo_ops_exec *x, const zo_xent_part_args *a);
    zo_status (*elementwise)(const zo_ops_exec *x, const zo_ew_args *a);
    zo_status (*sumsq)(const zo_ops_exec *x, const zo_sumsq_args *a);
    zo_status (*repeat_kv)(const zo_ops_exec *x, const zo_repeat_kv_args *a);
    zo_status (*bias)(const zo_ops_exec *x, const zo_bias_args *a);
    zo_status (*flash_fwd)(const zo_ops_exec *x, const zo_flash_args *a);
    zo_status (*flash_bwd)(const zo_ops_exec *x, const zo_flash_args *a);
} zo_ops_backend;

extern const zo_ops_backend zo_ops_cpu;
#ifdef ZO_HAVE_CUDA
extern const zo_ops_backend zo_ops_cuda;
#endif

/* ---- the registry (ops_backends.c) ---- */

/* The ops tables this build has, one per device backend; returns the count. */
size_t zo_ops_backends(const zo_ops_backend *const **out);
/* ZO_OK when o is of this version and fills every slot. */
zo_status zo_ops_backend_check(const zo_ops_backend *o);
/* The checked ops table for streams of the device backend named device_backend. */
zo_status zo_ops_backend_for(const char *device_backend, const zo_ops_backend **out);

#ifdef __cplusplus
}
#endif
#endif
