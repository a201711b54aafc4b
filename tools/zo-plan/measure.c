/* zo-plan --measure: short micro-benchmarks of the speeds the time model
 * needs, each best of a few repetitions (the machine may be shared): the
 * copy links of the device, NVMe through the swap store, CPU Adam through
 * the optimizer pool, the device's GEMM rate at the model's shapes. About a
 * second in all on a small machine. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hw.h"
#include "model.h"
#include "plan.h"
#include "tensor.h"
#include "zo/device.h"
#include "zo/half.h"
#include "zo/ops.h"
#include "zo/optim.h"
#include "zo/swap_bench.h"
#include "zo/topo.h"
#include "zo/units.h"
#include "zt_error.h"

#define LINK_BLOCK          (8u << 20)   /* bytes per copy, a chunk's order of magnitude */
#define LINK_BYTES          (128u << 20) /* per repetition and direction */
#define GEMM_CPU_FLOPS      4e9    /* per GEMM on the cpu device, where a big one takes seconds */
#define MODEL_CPU_FLOPS     6e9    /* per micro-batch timed on the cpu device */
#define MODEL_CPU_MAX_FLOPS 1.2e11 /* larger than this, the GEMM rate stands in */
/* Fewer tokens per GEMM run slower (on this build VM a 100M model reached
 * 0.055 TFLOPS at 64 tokens per micro-batch, 0.078 at 256): micro-batches
 * are cut for time only down to this many tokens. */
#define MODEL_MIN_TOKENS 256 /* per micro-batch timed on the cpu device */
#define MODEL_MIN_REPS   3   /* timed micro-batches per model cut, at least */
#define MODEL_MAX_REPS   15  /* and at most, */
#define MODEL_SECONDS    1.0 /* more than three only while they take less than this */

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v[n / 2];
}

static void record(zp_speeds *sp, zp_speed_sources *src, int which, double v)
{
    double *f = zp_speed_field(sp, which);
    if (*f > 0 || !(v > 0))
        return;
    *f = v;
    snprintf(src->what[which], sizeof src->what[which], "measured");
}

static int wanted(zp_speeds *sp, int which)
{
    return !(*zp_speed_field(sp, which) > 0);
}

static zo_status open_device(const zp_hardware *hw, uint64_t budget, zo_device_t *dev,
                             zo_stream_t *s)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = hw->backend;
    dc.mem_budget = strcmp(hw->backend, "cpu") == 0 ? budget : 0;
    ZT_LIB(zo_device_init(dev, &dc));
    zo_status st = zo_stream_create(*dev, s);
    if (st < 0) {
        zo_device_free(*dev);
        *dev = NULL;
        return zt_lib_fail(st, "zo_stream_create");
    }
    return ZO_OK;
}

/* ---- host <-> device ---- */

static zo_status time_copies(zo_stream_t s, void *dptr, void *hptr, int d2h, double *bps)
{
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) { /* the first warms pages and the stream */
        double t0 = zo_now_s();
        for (uint64_t done = 0; done < LINK_BYTES; done += LINK_BLOCK)
            ZT_LIB(d2h ? zo_memcpy_d2h_async(s, hptr, dptr, LINK_BLOCK)
                       : zo_memcpy_h2d_async(s, dptr, hptr, LINK_BLOCK));
        ZT_LIB(zo_stream_synchronize(s));
        double dt = zo_now_s() - t0;
        if (rep > 0 && dt < best)
            best = dt;
    }
    *bps = LINK_BYTES / best;
    return ZO_OK;
}

static zo_status measure_links(const zp_hardware *hw, zp_speeds *sp, zp_speed_sources *src)
{
    zo_device_t dev = NULL;
    zo_stream_t s = NULL;
    void *dptr = NULL, *hptr = NULL;
    ZT_TRY(open_device(hw, 2 * LINK_BLOCK, &dev, &s));
    zo_status st = zo_device_malloc(dev, LINK_BLOCK, &dptr);
    if (st >= 0 && posix_memalign(&hptr, 4096, LINK_BLOCK) != 0)
        st = zt_fail(ZO_ERR_NO_MEMORY, "a %u-byte host buffer", LINK_BLOCK);
    int pinned = 0;
    if (st >= 0) {
        memset(hptr, 1, LINK_BLOCK);
        pinned = zo_device_host_register(dev, hptr, LINK_BLOCK) == ZO_OK;
    }
    double h2d = 0, d2h = 0;
    if (st >= 0)
        st = time_copies(s, dptr, hptr, 0, &h2d);
    if (st >= 0)
        st = time_copies(s, dptr, hptr, 1, &d2h);
    zo_stream_destroy(s);
    if (pinned)
        zo_device_host_unregister(dev, hptr);
    free(hptr);
    zo_device_mfree(dev, dptr);
    zo_device_free(dev);
    ZT_TRY(st);
    record(sp, src, ZP_SPEED_H2D, h2d);
    record(sp, src, ZP_SPEED_D2H, d2h);
    return ZO_OK;
}

static void tell(void (*progress)(const char *), const char *fmt, ...)
{
    if (!progress)
        return;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    progress(what);
}

/* ---- NVMe ----
 * The engine moves optimizer states through NVMe in one pipeline per step
 * (engine_optim.c): a chunk's states (fp32 master, m and v of its used
 * elements, packed), are read two chunks ahead of the update and, once updated,
 * written to the chunk's alternate extent while the next reads run. What a
 * step sees is the rate of that mix at that extent size: reads or writes
 * alone, or 8 MiB requests, were 0.6x-1.4x of it on the disks tried. So
 * the measurement runs the same pipeline (zo_swap_bench, on the engine's
 * schedule) over extents of the job's size (capped), and times plain read
 * and write passes over them with a few extents in flight. */

#define NVME_EXTENT_MAX  (256ull << 20)
#define NVME_PASS_MAX    (768ull << 20) /* per direction and pass, at most */
#define NVME_MIN_EXTENTS 4u
#define NVME_STAGES      3u  /* the engine's ENG_NVME_STAGES */
#define NVME_ROUNDS      3   /* timed update passes, at least */
#define NVME_MAX_ROUNDS  9   /* and at most: more only while rests and passes took under */
#define NVME_SECONDS     1.5 /* this in all (a tiny job's pass takes milliseconds) */

/* The extents one timed pass moves: the job's chunks' packed states in the
 * engine's order (each capped at NVME_EXTENT_MAX), cycled until the pass
 * moves one step's worth, at most NVME_PASS_MAX, and at least
 * NVME_MIN_EXTENTS of them: a pass must start and finish as the step's
 * does, and the rate depends on the sizes (2.25 MiB extents ran at about
 * 1 GB/s here where 234 MiB ones reach 2.5). *lengths is malloc'd. */
static zo_status nvme_pass_lengths(const zp_job *job, uint64_t **lengths, uint32_t *n)
{
    uint64_t *chunk = NULL;
    uint32_t nc = 0;
    ZT_TRY(zp_nvme_chunk_states(job, &chunk, &nc));
    uint64_t step = 0;
    for (uint32_t c = 0; c < nc; c++)
        step += chunk[c] < NVME_EXTENT_MAX ? chunk[c] : NVME_EXTENT_MAX;
    uint64_t want = step < NVME_PASS_MAX ? step : NVME_PASS_MAX, sum = 0;
    uint32_t cap = NVME_MIN_EXTENTS + nc, k = 0;
    *lengths = nc ? malloc(cap * sizeof **lengths) : NULL;
    if (!*lengths) {
        free(chunk);
        return zt_fail(ZO_ERR_NO_MEMORY, "the NVMe benchmark's extent sizes");
    }
    while (k < cap && (sum < want || k < NVME_MIN_EXTENTS)) {
        uint64_t e = chunk[k % nc] < NVME_EXTENT_MAX ? chunk[k % nc] : NVME_EXTENT_MAX;
        (*lengths)[k++] = e;
        sum += e;
    }
    *n = k;
    free(chunk);
    return ZO_OK;
}

static uint64_t largest(const uint64_t *v, uint32_t n)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

#define NVME_REST_MAX 2.0 /* seconds, at most, before each update pass */

/* The step's update follows its forward and backward, during which the
 * optimizer's extents rest: a disk that absorbs bursts (a virtual disk
 * whose host caches writes, an SSD's SLC cache) moves the update faster
 * after that rest than back to back (on this project's VM, 3.5 GB of
 * updates: 2.0-2.2 GB/s back to back, 2.7-2.8 after 2 s of rest). So each
 * timed pass follows a rest as long as the step's compute, capped. */
static double nvme_rest_seconds(const zp_job *job, const zp_speeds *sp)
{
    double rate = sp->model_flops > 0 ? sp->model_flops : sp->flops;
    if (!(rate > 0))
        return 0;
    double tokens = (double)job->grad_accum * job->micro_batch * job->seq;
    return fmin(tokens * zp_device_flops_per_token(job) / rate, NVME_REST_MAX);
}

static void rest(double seconds)
{
    if (!(seconds > 0))
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The writes lay the extents and their alternates out (a step finds both
 * written: freshly allocated blocks write slower); the update pipeline,
 * which the step time leans on, is the median of three passes or more
 * while they are short (the disk's rate swings by 2x within seconds on a
 * shared machine), each after a rest (above). *rounds: how many. */
static zo_status nvme_passes(zo_swap_bench_t b, double rest_s, double *w, double *r,
                             double u[NVME_MAX_ROUNDS], int *rounds)
{
    ZT_TRY(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE, w));
    ZT_TRY(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE_ALTERNATES, NULL));
    ZT_TRY(zo_swap_bench_run(b, ZO_SWAP_BENCH_READ, r));
    double spent = 0;
    for (*rounds = 0; *rounds < NVME_MAX_ROUNDS && (*rounds < NVME_ROUNDS || spent < NVME_SECONDS);
         ++*rounds) {
        rest(rest_s);
        ZT_TRY(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, &u[*rounds]));
        spent += rest_s + u[*rounds];
    }
    return ZO_OK;
}

static zo_status measure_nvme(const char *dir, const zp_job *job, zp_speeds *sp,
                              zp_speed_sources *src, void (*progress)(const char *))
{
    uint64_t *len = NULL;
    uint32_t n = 0;
    ZT_TRY(nvme_pass_lengths(job, &len, &n));
    zo_swap_bench_config c = ZO_SWAP_BENCH_CONFIG_INIT;
    c.path = dir;
    c.name = "zo-plan-measure";
    c.lengths = len;
    c.n_lengths = n;
    c.extent_bytes = (largest(len, n) + 4095) / 4096 * 4096;
    c.stages = NVME_STAGES;
    c.alternates = 1;
    zo_swap_bench_t b = NULL;
    double w = 0, r = 0, u[NVME_MAX_ROUNDS];
    int rounds = 0;
    zo_status st = zo_swap_bench_open(&c, &b);
    if (st < 0) {
        free(len);
        return zt_lib_fail(st, "opening the NVMe benchmark's store");
    }
    double bytes = (double)zo_swap_bench_pass_bytes(b, ZO_SWAP_BENCH_READ);
    tell(progress,
         "measuring NVMe in %s: reads, writes and the update's pipeline, %u extents of the job's "
         "chunk "
         "sizes, %.0f MiB a pass",
         dir, n, bytes / (1 << 20));
    st = nvme_passes(b, nvme_rest_seconds(job, sp), &w, &r, u, &rounds);
    if (st < 0)
        st = zt_lib_fail(st, "the NVMe benchmark");
    zo_swap_bench_close(b);
    free(len);
    ZT_TRY(st);
    record(sp, src, ZP_SPEED_NVME_READ, bytes / r);
    record(sp, src, ZP_SPEED_NVME_WRITE, bytes / w);
    record(sp, src, ZP_SPEED_NVME_UPDATE, 2 * bytes / median(u, rounds));
    return ZO_OK;
}

/* ---- CPU Adam ----
 * What the engine's update runs: zo_optim_pool_adam_step chunk by chunk
 * over the model's states (fp32 master, m and v in the job's format), the
 * gradients as the engine hands them over (16-bit with one micro-batch per
 * step, the fp32 sums otherwise), the new 16-bit weights out, on the pool
 * the engine starts (one worker per core of its node, ZO_OPTIM_THREADS).
 * The buffers hold values (a first pass makes m and v non-zero and faults
 * the pages in) and a pass covers the model's states up to a cap, so a
 * model larger than the caches is timed from memory as its step sees it;
 * the median pass, as for the model's layers, since the machine may be
 * shared. (The engine's "optimizer busy" time is more than this: its
 * update also waits for the NVMe reads and writes of the states homed
 * there, zp_plan.update_seconds.) */

#define ADAM_MAX_PARAMS (16u << 20) /* a pass covers at most this many: 256 MiB of buffers */
#define ADAM_PASSES     3           /* timed, after the first */

/* The engine's pool: the cores of this thread's node it may run on, one
 * worker each unless ZO_OPTIM_THREADS says (engine_finalize.c, start_pool). */
static zo_status open_pool(zo_optim_pool_t *pool)
{
    int node = 0, n = 0, cores[1024];
    zo_optim_pool_config pc = ZO_OPTIM_POOL_CONFIG_INIT;
    if (zo_topo_node_of_thread(&node, NULL) == ZO_OK &&
        zo_topo_node_cpu_list(node, cores, 1024, &n) == ZO_OK && n > 0) {
        pc.cores = cores;
        pc.ncores = n < 1024 ? n : 1024;
    }
    const char *env = getenv("ZO_OPTIM_THREADS");
    pc.nthreads = env && atoi(env) > 0 ? atoi(env) : (n > 0 ? n : 1);
    zo_status st = zo_optim_pool_init(pool, &pc);
    return st < 0 ? zt_lib_fail(st, "zo_optim_pool_init") : ZO_OK;
}

/* Memory as the engine takes it for the states the CPU Adam streams: on
 * 2 MiB pages where the system allows (zo_huge_alloc). */
static void *huge_alloc(size_t bytes)
{
    size_t len = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void *p = aligned_alloc(2u << 20, len ? len : (2u << 20));
    if (p)
        (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

/* One update pass's buffers: n parameters in chunks of `chunk`. */
typedef struct adam_bench {
    size_t n, chunk, moment; /* moment: one chunk's m (or v) bytes in fmt */
    zo_dtype fmt, grad_type, p16;
    float *master;
    char *mv; /* per chunk: m, then v */
    void *grad, *out;
} adam_bench;

static void adam_bench_free(adam_bench *a)
{
    free(a->master);
    free(a->mv);
    free(a->grad);
    free(a->out);
}

static zo_status adam_bench_init(adam_bench *a, const zp_job *job, zo_dtype fmt)
{
    uint64_t cb = job->chunk_bytes ? job->chunk_bytes : zp_default_chunk_bytes(job);
    uint64_t n = zt_shape_n_params(&job->shape);
    memset(a, 0, sizeof *a);
    a->n = (size_t)(n < ADAM_MAX_PARAMS ? n : ADAM_MAX_PARAMS);
    uint64_t ce = cb / zo_dtype_size(job->dtype); /* a chunk's parameters */
    a->chunk = (size_t)(ce < a->n ? ce : a->n);
    a->chunk = a->chunk ? a->chunk : 1;
    a->fmt = fmt;
    a->p16 = job->dtype;
    a->grad_type = job->grad_accum > 1 ? ZO_DTYPE_F32 : job->dtype;
    a->moment = zo_adam_moment_bytes(fmt, a->chunk);
    size_t chunks = (a->n + a->chunk - 1) / a->chunk, ge = zo_dtype_size(a->grad_type);
    a->master = huge_alloc(a->n * sizeof(float));
    a->mv = huge_alloc(chunks * 2 * a->moment);
    a->grad = huge_alloc(a->n * ge);
    a->out = huge_alloc(a->n * zo_dtype_size(a->p16));
    if (!a->master || !a->mv || !a->grad || !a->out) {
        adam_bench_free(a);
        return zt_fail(ZO_ERR_NO_MEMORY, "the Adam benchmark's buffers (%zu parameters)", a->n);
    }
    uint32_t x = 12345;
    for (size_t i = 0; i < a->n; i++) {
        x = x * 1664525u + 1013904223u;
        float r = (float)(x >> 8) * 0x1p-24f - 0.5f; /* [-0.5, 0.5) */
        a->master[i] = 0.02f * r;
        if (a->grad_type == ZO_DTYPE_F32)
            ((float *)a->grad)[i] = 1e-3f * r;
        else
            ((uint16_t *)a->grad)[i] =
                a->grad_type == ZO_DTYPE_F16 ? zo_f32_to_f16(1e-3f * r) : zo_f32_to_bf16(1e-3f * r);
    }
    return ZO_OK;
}

/* One pass over every chunk; seconds. */
static zo_status adam_pass(zo_optim_pool_t pool, adam_bench *a, int64_t step, double *sec)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.step = step;
    double t0 = zo_now_s();
    for (size_t off = 0, c = 0; off < a->n; off += a->chunk, c++) {
        zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
        b.n = a->n - off < a->chunk ? a->n - off : a->chunk;
        b.grad = (char *)a->grad + off * zo_dtype_size(a->grad_type);
        b.grad_type = a->grad_type;
        b.master = a->master + off;
        b.m = a->mv + c * 2 * a->moment;
        b.v = (char *)b.m + a->moment;
        b.state_type = a->fmt;
        if (a->fmt == ZO_DTYPE_I8) {
            b.m_absmax = zo_adam_q8_scales(b.m, a->chunk);
            b.v_absmax = zo_adam_q8_scales(b.v, a->chunk);
        }
        b.out = (char *)a->out + off * zo_dtype_size(a->p16);
        b.out_type = a->p16;
        zo_status st = zo_optim_pool_adam_step(pool, &p, &b);
        if (st < 0)
            return zt_lib_fail(st, "zo_optim_pool_adam_step");
    }
    *sec = zo_now_s() - t0;
    return ZO_OK;
}

/* Parameters per second of the engine's update with moments in fmt: the
 * median of the timed passes. */
static zo_status time_adam(zo_optim_pool_t pool, const zp_job *job, zo_dtype fmt, double *rate)
{
    adam_bench a;
    ZT_TRY(adam_bench_init(&a, job, fmt));
    double sec[1 + ADAM_PASSES];
    zo_status st = ZO_OK;
    for (int i = 0; i < 1 + ADAM_PASSES && st >= 0; i++)
        st = adam_pass(pool, &a, i + 1, &sec[i]);
    adam_bench_free(&a);
    ZT_TRY(st);
    *rate = (double)a.n / median(sec + 1, ADAM_PASSES);
    return ZO_OK;
}

/* fp32's kernel, and the compact formats' so that zp_adam_rate uses their
 * measured rates instead of the ratios. */
static zo_status measure_adam(const zp_job *job, zp_speeds *sp, zp_speed_sources *src)
{
    zo_optim_pool_t pool = NULL;
    ZT_TRY(open_pool(&pool));
    double f32 = 0;
    zo_status st = time_adam(pool, job, ZO_DTYPE_F32, &f32);
    if (st >= 0)
        st = time_adam(pool, job, ZO_DTYPE_BF16, &sp->adam_params_bf16);
    if (st >= 0)
        st = time_adam(pool, job, ZO_DTYPE_I8, &sp->adam_params_i8);
    zo_optim_pool_free(pool);
    ZT_TRY(st);
    record(sp, src, ZP_SPEED_ADAM, f32);
    return ZO_OK;
}

/* ---- device GEMM ---- */

typedef struct gemm_shape {
    int m, n, k;
} gemm_shape;

/* y = x W^T as the model's linear layers run it, in the job's dtype. */
static zo_status time_gemm(zo_stream_t s, void *a, void *b, void *c, gemm_shape g, zo_dtype dt,
                           double *sec)
{
    zo_gemm_desc d = ZO_GEMM_DESC_INIT;
    d.trans_b = 1;
    d.m = g.m, d.n = g.n, d.k = g.k;
    d.a = a, d.a_type = dt, d.lda = g.k;
    d.b = b, d.b_type = dt, d.ldb = g.k;
    d.c = c, d.c_type = dt, d.ldc = g.n;
    *sec = 1e30;
    for (int rep = 0; rep < 4; rep++) { /* the first warms up */
        double t0 = zo_now_s();
        ZT_LIB(zo_op_gemm(s, &d));
        ZT_LIB(zo_stream_synchronize(s));
        if (rep > 0 && zo_now_s() - t0 < *sec)
            *sec = zo_now_s() - t0;
    }
    return ZO_OK;
}

static int cap(int v, int hi)
{
    return v < hi ? v : hi;
}

/* The model's block projections: [tokens x dim] by [dim x dim] and by
 * [ffn x dim]; tokens lowered on the cpu device to keep it short. */
static void gemm_shapes(const zp_job *job, int cpu, gemm_shape out[2])
{
    int d = cap(job->shape.dim, 8192), f = cap(job->shape.ffn_dim, 16384);
    long t = (long)job->micro_batch * job->seq;
    t = t < 8192 ? t : 8192;
    if (cpu)
        while (t > 64 && 2.0 * (double)t * d * f > GEMM_CPU_FLOPS)
            t /= 2;
    out[0] = (gemm_shape){(int)t, d, d};
    out[1] = (gemm_shape){(int)t, f, d};
}

static zo_status measure_gemm(const zp_hardware *hw, const zp_job *job, zp_speeds *sp,
                              zp_speed_sources *src)
{
    gemm_shape sh[2];
    gemm_shapes(job, strcmp(hw->backend, "cpu") == 0, sh);
    zo_dtype dt = job->dtype;
    size_t es = 2;
    uint64_t bytes =
        ((uint64_t)sh[1].m * sh[1].k + (uint64_t)sh[1].n * sh[1].k + (uint64_t)sh[1].m * sh[1].n) *
        es;
    zo_device_t dev = NULL;
    zo_stream_t s = NULL;
    ZT_TRY(open_device(hw, bytes + (1u << 20), &dev, &s));
    void *a = NULL, *b = NULL, *c = NULL;
    zo_status st = zo_device_malloc(dev, (size_t)sh[1].m * sh[1].k * es, &a);
    if (st >= 0)
        st = zo_device_malloc(dev, (size_t)sh[1].n * sh[1].k * es, &b);
    if (st >= 0)
        st = zo_device_malloc(dev, (size_t)sh[1].m * sh[1].n * es, &c);
    if (st < 0)
        st = zt_lib_fail(st, "zo_device_malloc (GEMM benchmark)");
    if (st >= 0 && (st = zo_memset_async(s, a, 0, (size_t)sh[1].m * sh[1].k * es)) < 0)
        st = zt_lib_fail(st, "zo_memset_async");
    if (st >= 0 && (st = zo_memset_async(s, b, 0, (size_t)sh[1].n * sh[1].k * es)) < 0)
        st = zt_lib_fail(st, "zo_memset_async");
    double flops = 0, secs = 0;
    for (int i = 0; i < 2 && st >= 0; i++) {
        double sec;
        st = time_gemm(s, a, b, c, sh[i], dt, &sec);
        flops += 2.0 * sh[i].m * sh[i].n * sh[i].k;
        secs += sec;
    }
    zo_stream_destroy(s);
    zo_device_mfree(dev, a);
    zo_device_mfree(dev, b);
    zo_device_mfree(dev, c);
    zo_device_free(dev);
    ZT_TRY(st);
    record(sp, src, ZP_SPEED_FLOPS, flops / secs);
    return ZO_OK;
}

/* ---- the model's layers ----
 * The rate the model's own layers reach on the device, every op included
 * (norms, RoPE, attention, SwiGLU, the loss, the bf16 conversions), from
 * training micro-batches of the model (see time_model). */

/* Device flops of one micro-batch of mb sequences through the model, the
 * backward's recompute included (as the planner counts them). */
static double micro_flops(const zp_job *job, int layers, int mb)
{
    zt_shape sh = job->shape;
    sh.n_layers = layers;
    zp_job j = *job;
    j.shape = sh;
    return (double)mb * job->seq * zp_device_flops_per_token(&j);
}

/* A model cut to `layers` blocks, ready to train micro-batches of mb
 * sequences on the device. */
typedef struct micro_bench {
    int32_t *tok;
    zt_resident *r;
    zt_model *m;
    zt_param_source src;
} micro_bench;

static void micro_free(micro_bench *b)
{
    zt_model_free(b->m);
    zt_resident_free(b->r);
    free(b->tok);
    memset(b, 0, sizeof *b);
}

static zo_status micro_init(micro_bench *b, zo_device_t dev, zo_stream_t s, const zp_job *job,
                            int layers, int mb)
{
    memset(b, 0, sizeof *b);
    zt_shape sh = job->shape;
    sh.n_layers = layers;
    zo_dtype dt = job->dtype;
    zt_model_config mc = {
        sh, job->seq, mb, 1, dt, job->flash_attention, {0}, 0, job->mlp_chunk_bytes};
    size_t n = (size_t)mb * job->seq;
    b->tok = malloc(2 * n * sizeof *b->tok);
    zo_status st = b->tok ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "the model benchmark's tokens");
    for (size_t i = 0; b->tok && i < 2 * n; i++)
        b->tok[i] = (int32_t)((i * 2654435761u) % (uint32_t)sh.vocab);
    if (st >= 0)
        st = zt_resident_init(&b->r, dev, s, &sh, dt, 1, 0.02f);
    if (st >= 0)
        st = zt_model_init(&b->m, dev, s, &mc);
    if (st >= 0)
        st = zt_model_set_batch(b->m, b->tok, b->tok + n, 1);
    if (st < 0) {
        micro_free(b);
        return st;
    }
    b->src = zt_resident_source(b->r);
    return ZO_OK;
}

/* One training micro-batch, forward to loss and backward; seconds. */
static zo_status micro_run(micro_bench *b, double *sec)
{
    float loss;
    double t0 = zo_now_s();
    zo_status st = zt_model_train_micro(b->m, &b->src, 0, 1.0f);
    if (st >= 0)
        st = zt_model_read_losses(b->m, &loss, 1);
    *sec = zo_now_s() - t0;
    return st;
}

/* Seconds of one micro-batch of the whole model: timed on the whole model,
 * or on cuts of one and three blocks (the embedding and head plus one
 * block, and two more blocks) run in alternation, so that a burst of load
 * on a shared machine lands on both of a pair rather than on one cut's
 * whole series (the whole model's time is the difference's extrapolation,
 * which magnifies that). The median over the pairs (or runs), after a
 * warm-up: what a run of steps sees, where the best of a few is too
 * hopeful. Three at least, more while they take under MODEL_SECONDS in
 * all (a tiny model's take milliseconds). */
static zo_status time_model(zo_device_t dev, zo_stream_t s, const zp_job *job, int mb, int whole,
                            double *sec)
{
    const int L = job->shape.n_layers;
    micro_bench one, three;
    ZT_TRY(micro_init(&one, dev, s, job, whole ? L : 1, mb));
    zo_status st = whole ? ZO_OK : micro_init(&three, dev, s, job, 3, mb);
    if (st < 0) {
        micro_free(&one);
        return st;
    }
    double est[1 + MODEL_MAX_REPS], spent = 0;
    int reps = 0;
    for (; reps < 1 + MODEL_MAX_REPS && st >= 0 &&
           (reps < 1 + MODEL_MIN_REPS || spent < MODEL_SECONDS);
         reps++) {
        double a = 0, b = 0;
        st = micro_run(&one, &a);
        if (st >= 0 && !whole)
            st = micro_run(&three, &b);
        if (whole) {
            est[reps] = a;
        } else {
            double block = b > a ? (b - a) / 2 : b / 3;
            est[reps] = (a > block ? a - block : 0) + block * L;
        }
        if (reps > 0)
            spent += a + b;
    }
    micro_free(&one);
    if (!whole)
        micro_free(&three);
    ZT_TRY(st);
    *sec = median(est + 1, reps - 1);
    return ZO_OK;
}

/* Device bytes of a cut of the model (weights, gradients, activations). */
static uint64_t model_bytes(const zp_job *job, int layers, int mb)
{
    zt_shape cut = job->shape;
    cut.n_layers = layers;
    zt_model_config mc = {
        cut, job->seq, mb, 1, ZO_DTYPE_BF16, job->flash_attention, {0}, 0, job->mlp_chunk_bytes};
    return 4 * zt_shape_n_params(&cut) + zt_model_activation_bytes(&mc);
}

static zo_status measure_model(const zp_hardware *hw, const zp_job *job, zp_speeds *sp,
                               zp_speed_sources *src)
{
    const int L = job->shape.n_layers, cpu = strcmp(hw->backend, "cpu") == 0;
    int mb = job->micro_batch;
    int whole = cpu && micro_flops(job, L, mb) <= MODEL_CPU_FLOPS;
    while (cpu && !whole && mb > 1 && micro_flops(job, 3, mb) > MODEL_CPU_FLOPS &&
           (long)(mb / 2) * job->seq >= MODEL_MIN_TOKENS)
        mb /= 2;
    if (cpu && !whole && micro_flops(job, 3, mb) > MODEL_CPU_MAX_FLOPS) {
        /* too big to run here in seconds: the GEMM rate stands in, saying why */
        snprintf(src->what[ZP_SPEED_MODEL_FLOPS], sizeof src->what[0],
                 "layers too large to time here");
        return ZO_OK;
    }
    uint64_t budget =
        model_bytes(job, whole ? L : 3, mb) + (whole ? 0 : model_bytes(job, 1, mb)) + (64u << 20);
    zo_device_t dev = NULL;
    zo_stream_t s = NULL;
    ZT_TRY(open_device(hw, budget, &dev, &s));
    double sec = 0;
    zo_status st = time_model(dev, s, job, mb, whole, &sec);
    zo_stream_destroy(s);
    zo_device_free(dev);
    ZT_TRY(st);
    record(sp, src, ZP_SPEED_MODEL_FLOPS, micro_flops(job, L, mb) / sec);
    return ZO_OK;
}

zo_status zp_measure(const zp_hardware *hw, const zp_job *job, const char *nvme_dir, zp_speeds *sp,
                     zp_speed_sources *src, void (*progress)(const char *what))
{
    if (strcmp(hw->backend, "cuda") == 0 && zo_device_cuda_count() == 0)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--measure needs the device it plans for: there is no GPU here (give its "
                       "speeds with flags or --bench-json instead)");
    if (wanted(sp, ZP_SPEED_H2D) || wanted(sp, ZP_SPEED_D2H)) {
        tell(progress, "measuring host<->device copies");
        ZT_TRY(measure_links(hw, sp, src));
    }
    if (wanted(sp, ZP_SPEED_ADAM)) {
        tell(progress, "measuring CPU Adam (the engine's update over the model's states)");
        ZT_TRY(measure_adam(job, sp, src));
    }
    if (wanted(sp, ZP_SPEED_FLOPS)) {
        tell(progress, "measuring the device's GEMM rate");
        ZT_TRY(measure_gemm(hw, job, sp, src));
    }
    if (wanted(sp, ZP_SPEED_MODEL_FLOPS)) {
        tell(progress, "measuring the model's layers (training micro-batches)");
        ZT_TRY(measure_model(hw, job, sp, src));
    }
    /* last: closing its store deletes gigabytes, which can slow what runs next */
    if (nvme_dir && (wanted(sp, ZP_SPEED_NVME_READ) || wanted(sp, ZP_SPEED_NVME_WRITE) ||
                     wanted(sp, ZP_SPEED_NVME_UPDATE))) {
        ZT_TRY(measure_nvme(nvme_dir, job, sp, src, progress));
    }
    return ZO_OK;
}
