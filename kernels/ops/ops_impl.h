/* The compute-op backend table (not installed). The front end (ops.c)
 * validates arguments and operand ranges, then hands each backend one
 * argument struct per op; the cpu backend copies it into a stream task, the
 * cuda backend launches kernels with it. Structs hold plain values so a
 * backend may copy them. Attention is composed in the front end from gemm and
 * the causal softmax, so both backends share its schedule. */
#ifndef ZO_OPS_IMPL_H
#define ZO_OPS_IMPL_H

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
} zo_rope_table_args;

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
} zo_xent_args;

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

typedef struct zo_ops_backend {
    const char *name;
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
    zo_status (*elementwise)(const zo_ops_exec *x, const zo_ew_args *a);
    zo_status (*sumsq)(const zo_ops_exec *x, const zo_sumsq_args *a);
} zo_ops_backend;

extern const zo_ops_backend zo_ops_cpu;
#ifdef ZO_HAVE_CUDA
extern const zo_ops_backend zo_ops_cuda;
#endif

#ifdef __cplusplus
}
#endif
#endif
