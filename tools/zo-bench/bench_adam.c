/* zo-bench adam: times the fused CPU Adam step on N parameters and, in the
 * same run and on the same buffers and threads, a kernel that moves exactly
 * the same bytes with no arithmetic (the step's memory roofline); reports
 * parameters per second, GB/s and their ratio. The two are interleaved so
 * that noise from other work on the machine hits both alike. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "zo/cpu.h"
#include "zo/optim.h"
#include "zo_bench.h"
#include "zo/units.h"

typedef struct adam_opts {
    size_t params;
    zo_optim_dtype grad, out, states;
    int threads, reps, json;
    int cores[256];
    int ncores;
} adam_opts;

typedef struct adam_bufs {
    zo_adam_buffers b;
    void *mem[5];
} adam_bufs;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-bench adam --params N [--grad bf16|fp16|fp32] [--out bf16|fp16|none]\n"
            "                     [--states fp32|bf16] [--threads T] [--cores LIST] [--reps R] [--json]\n"
            "  --params N    parameters (K, M, G suffixes are powers of 1024)\n"
            "  --grad        gradient type read (default bf16)\n"
            "  --out         16-bit weight copy written (default bf16)\n"
            "  --states      Adam m and v type (default fp32)\n"
            "  --threads T   optimizer worker threads (default 2)\n"
            "  --cores LIST  bind the workers to these cores, e.g. 0,1\n"
            "  --reps R      timed repetitions of each kernel, interleaved (default 5)\n"
            "  --json        one JSON object on stdout\n"
            "The SIMD variant is the library's (ZO_SIMD=scalar|avx2|avx512|avx512_bf16 lowers it).\n");
}

/* --params: a count with the byte suffixes ("4M"), 1 up to 2^40. */
static int parse_count(const char *s, size_t *out)
{
    uint64_t v;
    if (zo_parse_bytes(s, &v) < 0 || v == 0 || v > 1ull << 40) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_dtype(const char *s, int allow_fp32, int allow_none, zo_optim_dtype *out)
{
    if (!strcmp(s, "bf16")) *out = ZO_OPTIM_BF16;
    else if (!strcmp(s, "fp16")) *out = ZO_OPTIM_FP16;
    else if (allow_fp32 && !strcmp(s, "fp32")) *out = ZO_OPTIM_FP32;
    else if (allow_none && !strcmp(s, "none")) *out = ZO_OPTIM_NONE;
    else return -1;
    return 0;
}

static int parse_cores(char *s, adam_opts *o)
{
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        long c = strtol(tok, &end, 10);
        if (*end || c < 0 || o->ncores == (int)(sizeof o->cores / sizeof *o->cores)) return -1;
        o->cores[o->ncores++] = (int)c;
    }
    return o->ncores ? 0 : -1;
}

static int bad(const char *what, const char *val)
{
    fprintf(stderr, "zo-bench adam: bad %s '%s' (see --help)\n", what, val);
    return 2;
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, adam_opts *o)
{
    static const struct option lo[] = {
        {"params", required_argument, 0, 'n'}, {"grad", required_argument, 0, 'g'},
        {"out", required_argument, 0, 'o'},    {"states", required_argument, 0, 's'},
        {"threads", required_argument, 0, 't'}, {"cores", required_argument, 0, 'c'},
        {"reps", required_argument, 0, 'r'},   {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    *o = (adam_opts){0, ZO_OPTIM_BF16, ZO_OPTIM_BF16, ZO_OPTIM_FP32, 2, 5, 0, {0}, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n': if (parse_count(optarg, &o->params)) return bad("--params", optarg); break;
        case 'g': if (parse_dtype(optarg, 1, 0, &o->grad)) return bad("--grad", optarg); break;
        case 'o': if (parse_dtype(optarg, 0, 1, &o->out)) return bad("--out", optarg); break;
        case 's':
            if (parse_dtype(optarg, 1, 0, &o->states) || o->states == ZO_OPTIM_FP16) return bad("--states", optarg);
            break;
        case 't': o->threads = atoi(optarg); if (o->threads < 1) return bad("--threads", optarg); break;
        case 'c': if (parse_cores(optarg, o)) return bad("--cores", optarg); break;
        case 'r': o->reps = atoi(optarg); if (o->reps < 1) return bad("--reps", optarg); break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) return bad("argument", argv[optind]);
    if (!o->params) {
        fprintf(stderr, "zo-bench adam: --params N is required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* 2 MiB-aligned and advised into huge pages, so TLB misses do not blur the
 * bandwidth being measured (both kernels use the same buffers). */
static void *big_alloc(size_t bytes)
{
    size_t align = 2u << 20;
    void *p = aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static void free_bufs(adam_bufs *a)
{
    for (int i = 0; i < 5; i++) free(a->mem[i]);
}

/* Gradients near 1e-3, weights near 1e-2: ordinary magnitudes, so no
 * subnormal slow paths. */
static void fill(adam_bufs *a, const adam_opts *o)
{
    zo_adam_buffers *b = &a->b;
    uint32_t x = 12345;
    for (size_t i = 0; i < b->n; i++) {
        x = x * 1664525u + 1013904223u;
        float r = (float)(x >> 8) * 0x1p-24f - 0.5f;
        if (o->grad == ZO_OPTIM_FP32) ((float *)a->mem[0])[i] = r * 2e-3f;
        else ((uint16_t *)a->mem[0])[i] = o->grad == ZO_OPTIM_BF16 ? (uint16_t)(0x3a80u + (x >> 25))
                                                                    : (uint16_t)(0x1400u + (x >> 22));
        b->master[i] = r * 2e-2f;
    }
    size_t ss = zo_optim_dtype_size(o->states);
    memset(a->mem[2], 0, b->n * ss);
    memset(a->mem[3], 0, b->n * ss);
    if (a->mem[4]) memset(a->mem[4], 0, b->n * 2);
}

static int alloc_bufs(adam_bufs *a, const adam_opts *o)
{
    size_t n = o->params, ss = zo_optim_dtype_size(o->states);
    memset(a, 0, sizeof *a);
    a->mem[0] = big_alloc(n * zo_optim_dtype_size(o->grad));
    a->mem[1] = big_alloc(n * 4);
    a->mem[2] = big_alloc(n * ss);
    a->mem[3] = big_alloc(n * ss);
    if (o->out != ZO_OPTIM_NONE) a->mem[4] = big_alloc(n * 2);
    if (!a->mem[0] || !a->mem[1] || !a->mem[2] || !a->mem[3] || (o->out != ZO_OPTIM_NONE && !a->mem[4])) {
        fprintf(stderr, "zo-bench adam: cannot allocate buffers for %zu parameters\n", n);
        free_bufs(a);
        return -1;
    }
    a->b = (zo_adam_buffers)ZO_ADAM_BUFFERS_INIT;
    a->b.n = n;
    a->b.grad = a->mem[0];
    a->b.grad_type = o->grad;
    a->b.master = a->mem[1];
    a->b.m = a->mem[2];
    a->b.v = a->mem[3];
    a->b.state_type = o->states;
    a->b.out = a->mem[4];
    a->b.out_type = o->out;
    fill(a, o);
    return 0;
}

static int failed(const char *what, zo_status st)
{
    fprintf(stderr, "zo-bench adam: %s: %s: %s\n", what, zo_status_str(st), zo_last_error());
    return 1;
}

typedef struct timings {
    double *step, *roof;
} timings;

static int time_one(zo_optim_pool_t pool, const adam_bufs *a, int64_t step, int roofline, double *secs)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.adamw = 1;
    p.weight_decay = 0.01f;
    p.step = step;
    zo_optim_job_t job;
    double t0 = zo_now_s();
    zo_status st = roofline ? zo_optim_pool_roofline_enqueue(pool, &a->b, -1, &job)
                            : zo_optim_pool_adam_enqueue(pool, &p, &a->b, &job);
    if (st < 0) return failed(roofline ? "roofline" : "adam step", st);
    zo_optim_job_wait(job, NULL);
    *secs = zo_now_s() - t0;
    return 0;
}

static int run_timings(zo_optim_pool_t pool, const adam_bufs *a, int reps, timings *t)
{
    double warm;
    if (time_one(pool, a, 1, 1, &warm) || time_one(pool, a, 1, 0, &warm)) return 1;
    for (int r = 0; r < reps; r++) {
        /* Alternate which goes first so neither always follows the other. */
        int first = r & 1;
        if (time_one(pool, a, 2 + r, first, first ? &t->roof[r] : &t->step[r])) return 1;
        if (time_one(pool, a, 2 + r, !first, first ? &t->step[r] : &t->roof[r])) return 1;
    }
    return 0;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double best(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static json_t *json_times(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* Median over repetitions of roofline time / step time for runs taken back
 * to back: the statistic least moved by load that comes and goes. */
static double pair_ratio_median(const timings *t, int reps)
{
    double *r = malloc((size_t)reps * sizeof *r);
    if (!r) return NAN;
    for (int i = 0; i < reps; i++) r[i] = t->roof[i] / t->step[i];
    double m = median(r, reps);
    free(r);
    return m;
}

static void report(const adam_opts *o, const timings *t, double bytes_per_param)
{
    double n = (double)o->params;
    double pair_ratio = pair_ratio_median(t, o->reps);
    double ts = best(t->step, o->reps), tr = best(t->roof, o->reps);
    double gp = n / ts * 1e-9, rgp = n / tr * 1e-9;
    const char *simd = zo_simd_level_name(zo_cpu_simd_level());
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "bench", json_string("adam"));
        json_object_set_new(j, "params", json_integer((json_int_t)o->params));
        json_object_set_new(j, "grad", json_string(zo_optim_dtype_name(o->grad)));
        json_object_set_new(j, "out", json_string(zo_optim_dtype_name(o->out)));
        json_object_set_new(j, "states", json_string(zo_optim_dtype_name(o->states)));
        json_object_set_new(j, "threads", json_integer(o->threads));
        json_object_set_new(j, "simd", json_string(simd));
        json_object_set_new(j, "bytes_per_param", json_real(bytes_per_param));
        json_object_set_new(j, "gparams_per_s", json_real(gp));
        json_object_set_new(j, "roofline_gparams_per_s", json_real(rgp));
        json_object_set_new(j, "gbytes_per_s", json_real(gp * bytes_per_param));
        json_object_set_new(j, "roofline_gbytes_per_s", json_real(rgp * bytes_per_param));
        json_object_set_new(j, "ratio", json_real(gp / rgp));
        json_object_set_new(j, "step_seconds", json_times(t->step, o->reps));
        json_object_set_new(j, "roofline_seconds", json_times(t->roof, o->reps));
        double ms = median(t->step, o->reps), mr = median(t->roof, o->reps);
        json_object_set_new(j, "ratio_median", json_real(mr / ms));
        json_object_set_new(j, "ratio_pairs_median", json_real(pair_ratio));
        json_dumpf(j, stdout, JSON_COMPACT);
        putchar('\n');
        json_decref(j);
        return;
    }
    printf("adam step: %zu params, grad %s, out %s, states %s, %d threads, simd %s, %.0f B/param\n",
           o->params, zo_optim_dtype_name(o->grad), zo_optim_dtype_name(o->out), zo_optim_dtype_name(o->states),
           o->threads, simd, bytes_per_param);
    printf("  fused step   %8.3f Gparams/s  %7.2f GB/s   (best of %d, %.1f ms)\n", gp, gp * bytes_per_param,
           o->reps, ts * 1e3);
    printf("  roofline     %8.3f Gparams/s  %7.2f GB/s   (best of %d, %.1f ms)\n", rgp, rgp * bytes_per_param,
           o->reps, tr * 1e3);
    double ms = median(t->step, o->reps), mr = median(t->roof, o->reps);
    printf("  ratio        %8.3f  (of medians: %.3f, median of back-to-back pairs: %.3f)\n", gp / rgp, mr / ms,
           pair_ratio);
}

int zo_bench_adam_main(int argc, char **argv)
{
    adam_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = o.threads;
    cfg.cores = o.ncores ? o.cores : NULL;
    cfg.ncores = o.ncores;
    zo_optim_pool_t pool;
    zo_status st = zo_optim_pool_init(&pool, &cfg);
    if (st < 0) return failed("starting the worker pool", st);
    adam_bufs a;
    if (alloc_bufs(&a, &o)) {
        zo_optim_pool_free(pool);
        return 1;
    }
    timings t = {calloc((size_t)o.reps, sizeof(double)), calloc((size_t)o.reps, sizeof(double))};
    rc = !t.step || !t.roof ? failed("allocating timings", ZO_ERR_NO_MEMORY) : run_timings(pool, &a, o.reps, &t);
    size_t ss = zo_optim_dtype_size(o.states);
    double bytes = (double)(zo_optim_dtype_size(o.grad) + 4 + 2 * ss + 4 + 2 * ss + zo_optim_dtype_size(o.out));
    if (!rc) report(&o, &t, bytes);
    free(t.step);
    free(t.roof);
    free_bufs(&a);
    zo_optim_pool_free(pool);
    return rc;
}
