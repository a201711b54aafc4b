/* zoffload: CPU optimizers. A fused one-pass Adam/AdamW step over flat
 * buffers (16- or 32-bit gradients in, fp32 master weights and Adam moments
 * updated in place, the 16-bit weight copy written for the GPU), a read-only
 * gradient pass (sum of squares and an inf/NaN flag), a worker pool bound to
 * chosen cores that runs both asynchronously, and DeepSpeed's dynamic loss
 * scaler. The optimizer knows only buffers, never chunks or tensors. */
#ifndef ZO_OPTIM_H
#define ZO_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/cpu.h"
#include "zo/device.h"
#include "zo/dtype.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hyper-parameters of one Adam step over one parameter group. */
typedef struct zo_adam_params {
    size_t struct_size;
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    int64_t step;        /* this update's 1-based step count (bias correction uses it) */
    int adamw;           /* 1: decoupled decay (AdamW); 0: L2 decay added to the gradient (Adam) */
    int bias_correction; /* 1: divide the moments by 1 - beta^step */
    float
        grad_scale; /* gradients are multiplied by this: 1/loss_scale times the clip coefficient */
    int simd_level; /* -1: zo_cpu_simd_level(); else a zo_simd_level this CPU supports (tests) */
} zo_adam_params;

#define ZO_ADAM_PARAMS_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(zo_adam_params), .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,        \
        .eps = 1e-8f, .step = 1, .adamw = 1, .bias_correction = 1, .grad_scale = 1.0f,             \
        .simd_level = -1                                                                           \
    }

/* The buffers of one step: n elements each. master, m and v are updated in
 * place; out receives the updated weights rounded to 16 bits, or as they are
 * (F32: fp32 parameters, the master's bits), or nothing.
 * With state_type I8, m and v hold one 8-bit code per element and
 * m_absmax, v_absmax one fp32 scale per ZO_ADAM_Q8_BLOCK elements (below). */
typedef struct zo_adam_buffers {
    size_t struct_size;
    size_t n;
    const void *grad;
    zo_dtype grad_type; /* F32, F16 or BF16 */
    float *master;
    void *m;
    void *v;
    zo_dtype state_type; /* F32 (default); BF16 to halve the moments' memory and traffic; I8
                            for 8-bit blockwise moments (a quarter) */
    void *out;
    zo_dtype out_type; /* BF16, F16, F32, or NONE (out must then be NULL) */
    float *m_absmax;   /* I8 only: zo_adam_q8_blocks(n) scales each, updated in place */
    float *v_absmax;
} zo_adam_buffers;

#define ZO_ADAM_BUFFERS_INIT                                                                       \
    {                                                                                              \
        .struct_size = sizeof(zo_adam_buffers), .grad_type = ZO_DTYPE_F32,                         \
        .state_type = ZO_DTYPE_F32, .out_type = ZO_DTYPE_NONE                                      \
    }

/* ---- 8-bit blockwise moments (state_type ZO_DTYPE_I8) ----
 * As bitsandbytes' 8-bit Adam (Dettmers et al., "8-bit Optimizers via
 * Block-wise Quantization"): each block of ZO_ADAM_Q8_BLOCK elements stores
 * its largest magnitude (absmax, fp32) and per element the index of the
 * nearest value of x / absmax in a 256-entry dynamic map (a decimal exponent
 * 1e-6 .. 1 and a linear fraction whose resolution grows with the exponent).
 * m uses the signed map, v the unsigned one. A zero scale decodes every
 * code to zero, so zeroed memory is a zero state (code 0 is zero in both
 * maps too). A block's absmax below FLT_MIN (all values subnormal or zero)
 * is stored as 0: such moments are below anything Adam's eps lets through.
 * The kernels find the nearest code arithmetically (the map's decades and
 * 16-entry tables in registers), not by searching 256 values. Otherwise as
 * bitsandbytes' kOptimizerStatic8bit2StateBlockwise (no percentile clipping
 * or max_unorm: its Adam8bit defaults), except one step: it moves a negative
 * m whose nearest code is zero to the smallest negative code; here it stays
 * the nearest, zero, as a positive one does in both.
 *
 * The block is 256 elements, bitsandbytes' GPU choice rather than its 2048 on
 * CPU: an outlier then costs the resolution of 256 neighbours, not 2048 (the
 * paper's stability argument for small blocks), the scales add 8 bytes per
 * 256 parameters (0.03 B/param), and a block's fp32 moments (2 KiB) stay in
 * L1 between the update and the requantization. Element ranges given to the
 * kernels start on a block (the pool's tiles are rounded up to blocks). */
#define ZO_ADAM_Q8_BLOCK ((size_t)256)

/* Tensors of fewer elements keep fp32 moments in the I8 format, as
 * bitsandbytes' min_8bit_size (4096) does: norms and biases are few
 * parameters whose moments quantize worst (one block holds the whole tensor,
 * its outliers set every neighbour's resolution), and fp32 costs them little.
 * The engine lays such a tensor's fp32 m and v out in its moments' code
 * bytes: it reserves zo_adam_q8_small_room(numel) elements for it, four
 * code bytes per element, so every tier, stage and extent keeps the I8
 * layout (zo_engine_tensor_state_dtype names the tensor's format). */
#define ZO_ADAM_Q8_MIN_NUMEL ((size_t)4096)

static inline int zo_adam_q8_small(size_t numel)
{
    return numel < ZO_ADAM_Q8_MIN_NUMEL;
}

/* Elements a tensor with fp32 moments (a small one, or one the engine keeps
 * in fp32: zo_engine_keep_f32_states) takes in an I8 chunk: room for 4 code
 * bytes an element, whole blocks. */
static inline size_t zo_adam_q8_small_room(size_t numel)
{
    return (4 * numel + ZO_ADAM_Q8_BLOCK - 1) / ZO_ADAM_Q8_BLOCK * ZO_ADAM_Q8_BLOCK;
}

static inline size_t zo_adam_q8_blocks(size_t n)
{
    return (n + ZO_ADAM_Q8_BLOCK - 1) / ZO_ADAM_Q8_BLOCK;
}

/* The value of each of the 256 codes of a map (is_signed: m's, else v's).
 * Codes follow the map's structure, not its order: unsigned 0 is zero, 1
 * is one, decade i (10^(i-6) x [0.1, 1]) fills [2^(i+1), 2^(i+2)); signed
 * has the sign in bit 7, zero at 0, one at 128 (there is no -1), and
 * decade i at low 7 bits in [2^i, 2^(i+1)). */
ZO_API const float *zo_adam_q8_map(int is_signed);

/* x[0..n) -> codes and one absmax per block, exactly as the kernels store a
 * moment; and back (codes times absmax). For checkpoints that convert
 * between formats and for tests. */
ZO_API zo_status zo_adam_q8_quantize(const float *x, size_t n, int is_signed, uint8_t *codes,
                                     float *absmax);
ZO_API zo_status zo_adam_q8_dequantize(const uint8_t *codes, const float *absmax, size_t n,
                                       int is_signed, float *x);

/* Bytes of one moment of n elements in a state format (F32, BF16, or I8:
 * the n codes, padded to 4 bytes, then the block scales); 0 for another
 * type. zo_adam_q8_scales finds the scales of such an I8 moment. */
ZO_API size_t zo_adam_moment_bytes(zo_dtype state_type, size_t n);

static inline float *zo_adam_q8_scales(void *moment, size_t n)
{
    return (float *)((char *)moment + ((n + 3) & ~(size_t)3));
}

/* ---- Adam's moment formats, one table ----
 * Each format zo_engine_config.state_dtype can name, with what the engine,
 * the planner, the tools and checkpoints need of it; they ask the table
 * rather than branch on a dtype. A format's fused update, per ISA, is the
 * kernels' (zo_adam_step); its codec here is the scalar one, for
 * checkpoints and conversions. */
typedef struct zo_state_format {
    const char *name;    /* its spelling on command lines and in JSON: "fp32", "bf16", "int8" */
    zo_dtype dtype;      /* zo_engine_config.state_dtype's value for it */
    zo_dtype code_dtype; /* a moment's elements as checkpointed (int8's: U8 codes) */
    unsigned code_bits;  /* bits of one element's code in memory */
    size_t block;        /* elements per fp32 scale, stored after a moment's codes (0: none) */
    size_t min_numel;    /* tensors of fewer elements keep fp32 moments (0: none do) */
    int fused;           /* the kernels update it in place, per ISA; else zo_adam_step goes
                            block by block through its codec and the fp32 kernel */
    const char *summary; /* one line for usage texts and plans */
    /* Bytes of one moment of n elements: its codes, then its scales. */
    size_t (*moment_bytes)(size_t n);
    /* n fp32 values to codes (and scales: one per block, NULL without), and back. */
    zo_status (*encode)(const float *x, size_t n, int is_signed, void *codes, float *scales);
    zo_status (*decode)(const void *codes, const float *scales, size_t n, int is_signed, float *x);
} zo_state_format;

/* The format of a state dtype, of a name, the i-th (NULL past the last or for no format). */
ZO_API const zo_state_format *zo_state_format_of(zo_dtype dtype);
ZO_API const zo_state_format *zo_state_format_named(const char *name);
ZO_API const zo_state_format *zo_state_format_at(size_t i);
/* Every format's name, sep between them, into buf (snprintf's contract: the
 * length it needs is returned). */
ZO_API size_t zo_state_format_names(char *buf, size_t cap, const char *sep);

/* Bytes of the codes of n elements in format f (a tensor's offset in a
 * moment, for n its first element: tensors start on a block). */
static inline size_t zo_state_format_code_bytes(const zo_state_format *f, size_t n)
{
    return (n * f->code_bits + 7) / 8;
}

/* The scales of a moment of n elements in format f (NULL when it has none). */
static inline float *zo_state_format_scales(const zo_state_format *f, void *moment, size_t n)
{
    size_t codes = zo_state_format_code_bytes(f, n);
    return f->block ? (float *)((char *)moment + ((codes + 3) & ~(size_t)3)) : NULL;
}

/* Elements a tensor keeping fp32 moments takes in a chunk of format f (its
 * fp32 m and v laid out in the code bytes: whole blocks). */
static inline size_t zo_state_format_f32_room(const zo_state_format *f, size_t numel)
{
    size_t per = 32 / f->code_bits, b = f->block ? f->block : 1;
    return (per * numel + b - 1) / b * b;
}

/* A tensor of numel elements keeps fp32 moments in format f: below its
 * min_numel, or asked to (keep) where the format has that rule. */
static inline int zo_state_format_keeps_f32(const zo_state_format *f, size_t numel, int keep)
{
    return f && f->min_numel && (numel < f->min_numel || keep);
}

/* One fused pass on the calling thread. Per element, in fp32:
 *   g = grad * grad_scale (+ weight_decay * w in Adam/L2 mode)
 *   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
 *   w = w (1 - lr wd, AdamW only) - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
 * Every variant performs the same fp32 operations in the same order, so all
 * variants give bit-identical results (except the AVX512_BF16 variant's 16-bit
 * outputs for fp32-subnormal values, which its instruction flushes to zero).
 * With I8 states each block is decoded, updated (master and out from the
 * fp32 moments), and its moments requantized with their new absmax. */
ZO_API zo_status zo_adam_step(const zo_adam_params *p, const zo_adam_buffers *b);

/* zo_adam_step as a device op: the same update, queued on stream s in stream
 * order like any compute op (zo/ops.h), over buffers in device memory. Every
 * buffer of b (grad, master, m, v, the I8 scales, out) must lie inside a live
 * allocation of the stream's device; p and b are checked as zo_adam_step
 * checks them, and copied, before the call returns. On the cpu device the
 * stream's worker runs zo_adam_step itself (p->simd_level chooses its variant);
 * on cuda a kernel performs zo_adam_step's fp32 operations in its order with
 * correctly rounded intrinsics and no contraction, so both give the same bits
 * (fp32 and bf16 moments; 8-bit moments are refused on cuda with
 * ZO_ERR_UNSUPPORTED). A failure while it runs is the stream's async error. */
ZO_API zo_status zo_op_adam(zo_stream_t s, const zo_adam_params *p, const zo_adam_buffers *b);

/* The same bytes as zo_adam_step over b (every read and write, same types,
 * same store kind) with no arithmetic: the memory roofline of the step, for
 * benchmarks and the planner. Overwrites out with bits taken from grad;
 * master, m and v keep their values. */
ZO_API zo_status zo_adam_roofline(const zo_adam_buffers *b, int simd_level);

/* Read-only pass over gradients. */
typedef struct zo_grad_stats {
    double sum_sq; /* sum of squares of the values as stored (unscaled), accumulated in double */
    int nonfinite; /* 1 if any value is inf or NaN */
} zo_grad_stats;

ZO_API zo_status zo_grad_stats_compute(const void *grad, zo_dtype type, size_t n, int simd_level,
                                       zo_grad_stats *out);

/* DeepSpeed's gradient unscale-and-clip factor: with total_norm the norm of
 * the loss-scaled gradients, returns the factor to multiply them by
 * (1/loss_scale, lowered when max_norm > 0 and the true norm exceeds it). */
ZO_API float zo_grad_scale_factor(double total_norm, float loss_scale, float max_norm);

/* ---- worker pool ---- */

typedef struct zo_optim_pool *zo_optim_pool_t;

/* One worker's share of one job, for timelines: reported once the worker
 * moves on (to another job, or to waiting). */
typedef struct zo_optim_trace_span {
    int worker;            /* 0 .. nthreads-1 */
    const char *job;       /* "adam", "grad stats" or "roofline" (static strings) */
    uint64_t seq;          /* the job's number, in the order jobs were enqueued (from 0) */
    uint64_t t0_ns, t1_ns; /* CLOCK_MONOTONIC: its first tile started, its last tile ended */
    size_t elems;          /* elements of the job it processed */
} zo_optim_trace_span;

/* Called on the worker's thread, without the pool's lock; must be thread-safe. */
typedef void (*zo_optim_trace_fn)(void *ctx, const zo_optim_trace_span *span);

typedef struct zo_optim_pool_config {
    size_t struct_size;
    int nthreads;     /* worker threads, >= 1 */
    const int *cores; /* optional core ids to bind to (e.g. the GPU's NUMA node); NULL: the
                         process's CPUs */
    int ncores;
    size_t tile_elems;       /* the unit jobs are split and stolen in, a multiple of 64; 0: 16384
                                (ZO_OPTIM_TILE) */
    zo_optim_trace_fn trace; /* optional: each worker's span of each job */
    void *trace_ctx;
} zo_optim_pool_config;

#define ZO_OPTIM_POOL_CONFIG_INIT                                                                  \
    {                                                                                              \
        .struct_size = sizeof(zo_optim_pool_config), .nthreads = 1                                 \
    }

/* Workers bound to cores[i % ncores] when there are at most as many workers
 * as cores, else each to the whole set; cores must lie in the process's CPU
 * set. Without cores, workers may run on all the process's CPUs, whatever
 * the creating thread's own mask. Each worker takes its own contiguous span
 * of a job front to back, and the back half of another's when it is done. */
ZO_API zo_status zo_optim_pool_init(zo_optim_pool_t *out, const zo_optim_pool_config *cfg);
/* Runs every queued job to completion, then stops the workers. */
ZO_API void zo_optim_pool_free(zo_optim_pool_t pool);
ZO_API int zo_optim_pool_nthreads(zo_optim_pool_t pool);
ZO_API size_t zo_optim_pool_tile_elems(zo_optim_pool_t pool);

/* An enqueued job. Jobs run one after another in the order they were
 * enqueued (all threads on one job's tiles), so a job may use what the job
 * before it wrote. */
typedef struct zo_optim_job *zo_optim_job_t;

/* Asynchronous versions. The buffers must stay valid until the job is
 * waited on; params and buffers structs are copied. Results do not depend
 * on the number of threads, the tile size or timing, bit for bit: gradient
 * sums are taken per 16384 elements and combined in element order. */
ZO_API zo_status zo_optim_pool_adam_enqueue(zo_optim_pool_t pool, const zo_adam_params *p,
                                            const zo_adam_buffers *b, zo_optim_job_t *job);
ZO_API zo_status zo_optim_pool_grad_stats_enqueue(zo_optim_pool_t pool, const void *grad,
                                                  zo_dtype type, size_t n, int simd_level,
                                                  zo_optim_job_t *job);
ZO_API zo_status zo_optim_pool_roofline_enqueue(zo_optim_pool_t pool, const zo_adam_buffers *b,
                                                int simd_level, zo_optim_job_t *job);
/* ZO_OK when done, ZO_NOT_READY while it runs. */
ZO_API zo_status zo_optim_job_poll(zo_optim_job_t job);
/* Blocks until the job is done, stores grad statistics in stats (may be NULL;
 * zero for other jobs) and releases the handle. */
ZO_API zo_status zo_optim_job_wait(zo_optim_job_t job, zo_grad_stats *stats);

/* Synchronous conveniences: enqueue and wait. */
ZO_API zo_status zo_optim_pool_adam_step(zo_optim_pool_t pool, const zo_adam_params *p,
                                         const zo_adam_buffers *b);
ZO_API zo_status zo_optim_pool_grad_stats(zo_optim_pool_t pool, const void *grad, zo_dtype type,
                                          size_t n, zo_grad_stats *out);

/* ---- loss scaling (DeepSpeed's fp16 semantics) ---- */

typedef struct zo_loss_scaler_config {
    size_t struct_size;
    double loss_scale;            /* > 0: static scale; 0: dynamic */
    int initial_scale_power;      /* dynamic: start at 2^power (16) */
    int loss_scale_window;        /* clean steps before the scale doubles (1000) */
    int hysteresis;               /* overflows tolerated before the scale halves (2) */
    int consecutive_hysteresis;   /* refill hysteresis on every clean step (0) */
    double min_loss_scale;        /* floor of the scale (1) */
    int raise_error_at_min_scale; /* an overflow at the floor is an error (1) */
} zo_loss_scaler_config;

#define ZO_LOSS_SCALER_CONFIG_INIT                                                                 \
    {                                                                                              \
        .struct_size = sizeof(zo_loss_scaler_config), .initial_scale_power = 16,                   \
        .loss_scale_window = 1000, .hysteresis = 2, .min_loss_scale = 1.0,                         \
        .raise_error_at_min_scale = 1                                                              \
    }

typedef struct zo_loss_scaler {
    double cur_scale;
    int64_t cur_iter;
    int64_t last_overflow_iter;
    int cur_hysteresis;
    int dynamic;
    zo_loss_scaler_config cfg;
} zo_loss_scaler;

ZO_API zo_status zo_loss_scaler_init(zo_loss_scaler *s, const zo_loss_scaler_config *cfg);
/* Record whether this step's gradients overflowed and set the next scale.
 * Returns ZO_ERR_OVERFLOW, leaving the state unchanged, when an overflow
 * occurs with the scale already at min_loss_scale and raise_error_at_min_scale. */
ZO_API zo_status zo_loss_scaler_update(zo_loss_scaler *s, int overflow);
static inline double zo_loss_scaler_scale(const zo_loss_scaler *s)
{
    return s->cur_scale;
}

#ifdef __cplusplus
}
#endif
#endif
