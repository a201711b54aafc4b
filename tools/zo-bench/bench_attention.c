/* zo-bench attention: the fused attention op (zo_op_flash_attention_fwd/bwd)
 * against its peers in the same run, forward plus backward:
 *   1. causal dense at --seq: the materialized op (zo_op_attention_fwd/bwd
 *      on key/value heads repeated by zo_op_repeat_kv) vs the fused op;
 *      the ratio is materialized time / fused time.
 *   2. a sliding window of --window tokens at --window-seq: the fused op
 *      with the window vs the fused op causal dense at the same length; the
 *      efficiency is (dense time x the window's density) / window time, 1
 *      when the time falls exactly with the density.
 * Each timing is the median of --reps runs, the peers alternating. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zo/device.h"
#include "zo/half.h"
#include "zo/ops.h"
#include "zo_bench.h"

/* Return a failing status (the library keeps its message: zo_last_error). */
#define BENCH_TRY(x)                                                                               \
    do {                                                                                           \
        zo_status st_ = (x);                                                                       \
        if (st_ != ZO_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

typedef struct attn_opts {
    int seq, window_seq, window, batch, heads, kv_heads, head_dim, reps, json;
    zo_dtype dt;
    const char *device; /* "cpu" (the emulated device) or "cuda" */
} attn_opts;

static void attn_usage(FILE *out)
{
    fprintf(out,
            "usage: zo-bench attention [--seq N] [--window-seq N] [--window N] [--batch N]\n"
            "                          [--heads N] [--kv-heads N] [--head-dim N] [--dtype "
            "bf16|fp16|fp32]\n"
            "                          [--reps N] [--device cpu|cuda] [--json]\n"
            "On the device (default cpu, the emulated one), forward plus backward: the "
            "materialized attention vs the fused\n"
            "one, causal, at --seq (default 4096); then the fused op with a sliding window of\n"
            "--window tokens (default 1024) vs causal dense at --window-seq (default 16384;\n"
            "0 skips it), the window's time against the dense time times its density.\n"
            "Defaults: --batch 1 --heads 8 --kv-heads 8 --head-dim 64 --dtype bf16 --reps 3.\n");
}

static int parse_int_opt(const char *name, const char *arg, int lo, int hi, int *out)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "zo-bench attention: --%s '%s' must be a whole number in %d..%d\n", name,
                arg, lo, hi);
        return 2;
    }
    *out = (int)v;
    return 0;
}

static int parse_dtype_opt(const char *arg, zo_dtype *dt)
{
    if (!strcmp(arg, "bf16") || !strcmp(arg, "fp16") || !strcmp(arg, "fp32")) {
        *dt = arg[1] == 'f' ? ZO_DTYPE_BF16 : arg[2] == '1' ? ZO_DTYPE_F16 : ZO_DTYPE_F32;
        return 0;
    }
    fprintf(stderr, "zo-bench attention: --dtype '%s' must be bf16, fp16 or fp32\n", arg);
    return 2;
}

static int parse_opts(int argc, char **argv, attn_opts *o)
{
    static const struct option longs[] = {
        {"seq", required_argument, 0, 's'},
        {"window-seq", required_argument, 0, 'S'},
        {"window", required_argument, 0, 'w'},
        {"batch", required_argument, 0, 'b'},
        {"heads", required_argument, 0, 'H'},
        {"kv-heads", required_argument, 0, 'K'},
        {"head-dim", required_argument, 0, 'd'},
        {"reps", required_argument, 0, 'r'},
        {"dtype", required_argument, 0, 't'},
        {"json", no_argument, 0, 'j'},
        {"device", required_argument, 0, 'D'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (attn_opts){4096, 16384, 1024, 1, 8, 0, 64, 3, 0, ZO_DTYPE_BF16, "cpu"};
    optind = 1;
    int c, rc = 0;
    while (!rc && (c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        const int big = 1 << 20;
        switch (c) {
        case 's': rc = parse_int_opt("seq", optarg, 1, big, &o->seq); break;
        case 'S': rc = parse_int_opt("window-seq", optarg, 0, big, &o->window_seq); break;
        case 'w': rc = parse_int_opt("window", optarg, 1, big, &o->window); break;
        case 'b': rc = parse_int_opt("batch", optarg, 1, 4096, &o->batch); break;
        case 'H': rc = parse_int_opt("heads", optarg, 1, 4096, &o->heads); break;
        case 'K': rc = parse_int_opt("kv-heads", optarg, 1, 4096, &o->kv_heads); break;
        case 'd': rc = parse_int_opt("head-dim", optarg, 1, 512, &o->head_dim); break;
        case 'r': rc = parse_int_opt("reps", optarg, 1, 100, &o->reps); break;
        case 't': rc = parse_dtype_opt(optarg, &o->dt); break;
        case 'j': o->json = 1; break;
        case 'D':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
                fprintf(stderr, "zo-bench attention: --device '%s' must be cpu or cuda\n", optarg);
                rc = 2;
            }
            o->device = optarg;
            break;
        case 'h': attn_usage(stdout); return 1;
        default: attn_usage(stderr); return 2;
        }
    }
    if (!o->kv_heads)
        o->kv_heads = o->heads;
    if (!rc && o->heads % o->kv_heads) {
        fprintf(stderr, "zo-bench attention: --heads %d must be a multiple of --kv-heads %d\n",
                o->heads, o->kv_heads);
        rc = 2;
    }
    return rc;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The buffers of one shape: fused needs q/k/v/out/dout/dq/dk/dv plus lse and
 * delta; the materialized peer adds repeated k/v (and their gradients) and
 * two batch x heads x seq x seq matrices. */
typedef struct attn_bufs {
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv, *kr, *vr, *dkr, *dvr, *att, *datt;
    float *lse, *delta;
} attn_bufs;

/* Uniform values in [-1, 1) of dt, from a fixed seed, into a device buffer. */
static zo_status fill_random(zo_stream_t s, void *dst, size_t n, zo_dtype dt, uint64_t seed)
{
    size_t es = zo_dtype_size(dt);
    unsigned char *h = malloc(n * es);
    if (!h)
        return ZO_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(seed >> 11) * 0x1p-53 * 2.0 - 1.0);
        if (dt == ZO_DTYPE_F32)
            memcpy(h + i * es, &v, es);
        else {
            uint16_t x = dt == ZO_DTYPE_BF16 ? zo_f32_to_bf16(v) : zo_f32_to_f16(v);
            memcpy(h + i * es, &x, es);
        }
    }
    zo_status st = zo_memcpy_h2d_async(s, dst, h, n * es);
    if (st == ZO_OK)
        st = zo_stream_synchronize(s);
    free(h);
    return st;
}

static zo_status alloc_bufs(zo_device_t dev, zo_stream_t s, const attn_opts *o, int seq,
                            int materialized, attn_bufs *b)
{
    size_t es = zo_dtype_size(o->dt), rows = (size_t)o->batch * seq;
    size_t qb = rows * o->heads * o->head_dim * es, kb = rows * o->kv_heads * o->head_dim * es;
    size_t lb = rows * o->heads * sizeof(float), mq = materialized ? qb : 0;
    size_t ab = materialized ? (size_t)o->batch * o->heads * seq * seq * es : 0;
    void **p[] = {
        &b->q,  &b->k,  &b->v,   &b->out, &b->dout, &b->dq,   &b->dk,           &b->dv,
        &b->kr, &b->vr, &b->dkr, &b->dvr, &b->att,  &b->datt, (void **)&b->lse, (void **)&b->delta};
    size_t n[] = {qb, kb, kb, qb, qb, qb, kb, kb, mq, mq, mq, mq, ab, ab, lb, lb};
    memset(b, 0, sizeof *b);
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
        if (n[i])
            BENCH_TRY(zo_device_malloc(dev, n[i], p[i]));
    BENCH_TRY(fill_random(s, b->q, qb / es, o->dt, 1));
    BENCH_TRY(fill_random(s, b->k, kb / es, o->dt, 2));
    BENCH_TRY(fill_random(s, b->v, kb / es, o->dt, 3));
    return fill_random(s, b->dout, qb / es, o->dt, 4);
}

static void free_bufs(zo_device_t dev, attn_bufs *b)
{
    void *p[] = {b->q,  b->k,  b->v,   b->out, b->dout, b->dq,   b->dk,  b->dv,
                 b->kr, b->vr, b->dkr, b->dvr, b->att,  b->datt, b->lse, b->delta};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            zo_device_mfree(dev, p[i]);
}

/* One materialized forward plus backward, GQA through repeat_kv as zo-train
 * does without the fused op. */
static zo_status run_materialized(zo_stream_t s, const attn_opts *o, int seq, attn_bufs *b)
{
    size_t rows = (size_t)o->batch * seq;
    int g = o->heads / o->kv_heads;
    BENCH_TRY(zo_op_repeat_kv_fwd(s, b->kr, b->k, rows, o->kv_heads, g, o->head_dim, o->dt));
    BENCH_TRY(zo_op_repeat_kv_fwd(s, b->vr, b->v, rows, o->kv_heads, g, o->head_dim, o->dt));
    BENCH_TRY(zo_op_attention_fwd(s, b->out, b->att, b->q, b->kr, b->vr, o->batch, seq, o->heads,
                                  o->head_dim, o->dt));
    BENCH_TRY(zo_op_attention_bwd(s, b->dq, b->dkr, b->dvr, b->datt, b->dout, b->att, b->q, b->kr,
                                  b->vr, o->batch, seq, o->heads, o->head_dim, o->dt));
    BENCH_TRY(zo_op_repeat_kv_bwd(s, b->dk, b->dkr, rows, o->kv_heads, g, o->head_dim, o->dt));
    BENCH_TRY(zo_op_repeat_kv_bwd(s, b->dv, b->dvr, rows, o->kv_heads, g, o->head_dim, o->dt));
    return zo_stream_synchronize(s);
}

static zo_status run_fused(zo_stream_t s, const attn_opts *o, int seq, int window, attn_bufs *b)
{
    zo_flash_attn_desc d = ZO_FLASH_ATTN_DESC_INIT;
    d.batch = o->batch, d.seq = seq, d.heads = o->heads, d.kv_heads = o->kv_heads;
    d.head_dim = o->head_dim, d.window = window, d.dt = o->dt;
    BENCH_TRY(zo_op_flash_attention_fwd(s, &d, b->out, b->lse, b->q, b->k, b->v));
    BENCH_TRY(zo_op_flash_attention_bwd(s, &d, b->dq, b->dk, b->dv, b->delta, b->dout, b->out,
                                        b->lse, b->q, b->k, b->v));
    return zo_stream_synchronize(s);
}

/* Peer a (kind 0 materialized, else fused with window wa) against peer b
 * (fused with window wb), alternating, --reps times; medians in ta, tb. */
static zo_status time_pair(zo_stream_t s, const attn_opts *o, int seq, attn_bufs *bufs, int wa,
                           int wb, int a_materialized, double *ta, double *tb)
{
    double xa[100], xb[100];
    for (int r = 0; r < o->reps; r++) {
        double t0 = now();
        BENCH_TRY(a_materialized ? run_materialized(s, o, seq, bufs)
                                 : run_fused(s, o, seq, wa, bufs));
        double t1 = now();
        BENCH_TRY(run_fused(s, o, seq, wb, bufs));
        xa[r] = t1 - t0;
        xb[r] = now() - t1;
    }
    qsort(xa, (size_t)o->reps, sizeof xa[0], cmp_double);
    qsort(xb, (size_t)o->reps, sizeof xb[0], cmp_double);
    *ta = xa[o->reps / 2];
    *tb = xb[o->reps / 2];
    return ZO_OK;
}

/* The fraction of causal query-key pairs a window of w keeps at seq. */
static double window_density(int seq, int w)
{
    double kept = 0.0, all = (double)seq * (seq + 1) / 2.0;
    for (int i = 0; i < seq; i++)
        kept += i + 1 < w ? i + 1 : w;
    return kept / all;
}

typedef struct attn_result {
    double mat_s, fused_s, dense_s, window_s, density;
} attn_result;

static zo_status run_case(zo_device_t dev, zo_stream_t s, const attn_opts *o, int seq,
                          int materialized, attn_result *r)
{
    attn_bufs b;
    zo_status st = alloc_bufs(dev, s, o, seq, materialized, &b);
    if (st == ZO_OK && materialized)
        st = time_pair(s, o, seq, &b, 0, 0, 1, &r->mat_s, &r->fused_s);
    else if (st == ZO_OK)
        st = time_pair(s, o, seq, &b, o->window, 0, 0, &r->window_s, &r->dense_s);
    free_bufs(dev, &b);
    return st;
}

static void print_result(const attn_opts *o, const attn_result *r)
{
    double ratio = r->mat_s / r->fused_s;
    double eff = o->window_seq ? r->dense_s * r->density / r->window_s : 0.0;
    if (o->json) {
        json_t *j = json_pack(
            "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:f}", "bench", "attention",
            "device", o->device, "seq", o->seq, "batch", o->batch, "heads", o->heads, "kv_heads",
            o->kv_heads, "head_dim", o->head_dim, "dtype", zo_dtype_name(o->dt), "reps", o->reps,
            "materialized_seconds", r->mat_s, "fused_seconds", r->fused_s, "fused_speedup", ratio);
        if (o->window_seq) {
            json_object_set_new(j, "window_seq", json_integer(o->window_seq));
            json_object_set_new(j, "window", json_integer(o->window));
            json_object_set_new(j, "dense_seconds", json_real(r->dense_s));
            json_object_set_new(j, "window_seconds", json_real(r->window_s));
            json_object_set_new(j, "window_density", json_real(r->density));
            json_object_set_new(j, "window_efficiency", json_real(eff));
        }
        char *txt = json_dumps(j, JSON_COMPACT);
        printf("%s\n", txt ? txt : "{}");
        free(txt);
        json_decref(j);
        return;
    }
    printf("attention fwd+bwd, %s, %s, batch %d, heads %d/%d kv, head_dim %d, median of %d\n",
           o->device, zo_dtype_name(o->dt), o->batch, o->heads, o->kv_heads, o->head_dim, o->reps);
    printf("  causal seq %d: materialized %.3f s, fused %.3f s: fused %.2fx faster\n", o->seq,
           r->mat_s, r->fused_s, ratio);
    if (o->window_seq)
        printf("  seq %d: causal dense %.3f s, window %d %.3f s (density %.3f): efficiency "
               "%.2f (1 = time falls with the density)\n",
               o->window_seq, r->dense_s, o->window, r->window_s, r->density, eff);
}

int zo_bench_attention_main(int argc, char **argv)
{
    attn_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    size_t es = zo_dtype_size(o.dt);
    int big = o.seq > o.window_seq ? o.seq : o.window_seq;
    size_t need = 2 * (size_t)o.batch * o.heads * o.seq * o.seq * es +
                  12 * (size_t)o.batch * big * o.heads * o.head_dim * es + ((size_t)64 << 20);
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = o.device;
    cfg.mem_budget = need;
    zo_device_t dev = NULL;
    zo_stream_t s = NULL;
    attn_result r = {0};
    zo_status st = zo_device_init(&dev, &cfg);
    if (st == ZO_OK)
        st = zo_stream_create(dev, &s);
    if (st == ZO_OK)
        st = run_case(dev, s, &o, o.seq, 1, &r);
    if (st == ZO_OK && o.window_seq) {
        r.density = window_density(o.window_seq, o.window);
        st = run_case(dev, s, &o, o.window_seq, 0, &r);
    }
    if (s)
        zo_stream_destroy(s);
    if (dev)
        zo_device_free(dev);
    if (st != ZO_OK) {
        fprintf(stderr, "zo-bench attention: %s\n",
                st == ZO_ERR_NO_MEMORY ? "out of host memory for the inputs" : zo_last_error());
        return 1;
    }
    print_result(&o, &r);
    return 0;
}
