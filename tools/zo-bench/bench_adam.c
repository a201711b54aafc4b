/* zo-bench adam: times the fused CPU Adam step on N parameters against the
 * step's memory roofline: a kernel that moves exactly the same bytes with no
 * arithmetic, run by the same number of threads on the same buffers, each
 * thread streaming its own contiguous share with no pool in between (a
 * roofline run through the pool would hide the pool's own cost). The same
 * kernel through the pool is timed too. All three are interleaved, their
 * order rotated, so that noise from other work on the machine hits them
 * alike; reports parameters per second, GB/s and the step's ratios. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include "zo/cpu.h"
#include "zo/optim.h"
#include "zo/units.h"
#include "zo_bench.h"

typedef struct adam_opts {
    size_t params;
    zo_dtype grad, out, states;
    int threads, reps, json;
    int cores[256];
    int ncores;
} adam_opts;

typedef struct adam_bufs {
    zo_adam_buffers b;
    void *mem[7]; /* grad, master, m, v, out, and the int8 moments' scales */
} adam_bufs;

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: zo-bench adam --params N [--grad bf16|fp16|fp32] [--out bf16|fp16|none]\n"
        "                     [--states fp32|bf16|int8] [--threads T] [--cores LIST] [--reps R] "
        "[--json]\n"
        "  --params N    parameters (K, M, G suffixes are powers of 1024)\n"
        "  --grad        gradient type read (default bf16)\n"
        "  --out         16-bit weight copy written (default bf16)\n"
        "  --states      Adam m and v: fp32 (default), bf16, or int8 (8-bit blockwise, with\n"
        "                one fp32 scale per 256 elements)\n"
        "  --threads T   optimizer worker threads (default 2)\n"
        "  --cores LIST  bind the workers to these cores, e.g. 0,1\n"
        "  --reps R      timed repetitions of each kernel, interleaved (default 5)\n"
        "  --json        one JSON object on stdout\n"
        "The SIMD variant is the library's (ZO_SIMD=scalar|neon|avx2|avx512|avx512_bf16\n"
        "lowers it). Under an emulator (qemu-user) it says so: its timings are the emulator's.\n");
}

/* --params: a count with the byte suffixes ("4M"), 1 up to 2^40. */
static int parse_count(const char *s, size_t *out)
{
    uint64_t v;
    if (zo_parse_bytes(s, &v) < 0 || v == 0 || v > 1ull << 40)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_dtype(const char *s, int allow_fp32, int allow_none, zo_dtype *out)
{
    if (!strcmp(s, "bf16"))
        *out = ZO_DTYPE_BF16;
    else if (!strcmp(s, "fp16"))
        *out = ZO_DTYPE_F16;
    else if (allow_fp32 && !strcmp(s, "fp32"))
        *out = ZO_DTYPE_F32;
    else if (allow_none && !strcmp(s, "none"))
        *out = ZO_DTYPE_NONE;
    else
        return -1;
    return 0;
}

static int parse_cores(char *s, adam_opts *o)
{
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        long c = strtol(tok, &end, 10);
        if (*end || c < 0 || o->ncores == (int)(sizeof o->cores / sizeof *o->cores))
            return -1;
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
        {"params", required_argument, 0, 'n'},  {"grad", required_argument, 0, 'g'},
        {"out", required_argument, 0, 'o'},     {"states", required_argument, 0, 's'},
        {"threads", required_argument, 0, 't'}, {"cores", required_argument, 0, 'c'},
        {"reps", required_argument, 0, 'r'},    {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    *o = (adam_opts){0, ZO_DTYPE_BF16, ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 5, 0, {0}, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_count(optarg, &o->params))
                return bad("--params", optarg);
            break;
        case 'g':
            if (parse_dtype(optarg, 1, 0, &o->grad))
                return bad("--grad", optarg);
            break;
        case 'o':
            if (parse_dtype(optarg, 0, 1, &o->out))
                return bad("--out", optarg);
            break;
        case 's':
            if (!strcmp(optarg, "int8"))
                o->states = ZO_DTYPE_I8;
            else if (parse_dtype(optarg, 1, 0, &o->states) || o->states == ZO_DTYPE_F16)
                return bad("--states", optarg);
            break;
        case 't':
            o->threads = atoi(optarg);
            if (o->threads < 1)
                return bad("--threads", optarg);
            break;
        case 'c':
            if (parse_cores(optarg, o))
                return bad("--cores", optarg);
            break;
        case 'r':
            o->reps = atoi(optarg);
            if (o->reps < 1)
                return bad("--reps", optarg);
            break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc)
        return bad("argument", argv[optind]);
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
    if (p)
        madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static void free_bufs(adam_bufs *a)
{
    for (int i = 0; i < 7; i++)
        free(a->mem[i]);
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
        if (o->grad == ZO_DTYPE_F32)
            ((float *)a->mem[0])[i] = r * 2e-3f;
        else
            ((uint16_t *)a->mem[0])[i] = o->grad == ZO_DTYPE_BF16 ? (uint16_t)(0x3a80u + (x >> 25))
                                                                  : (uint16_t)(0x1400u + (x >> 22));
        b->master[i] = r * 2e-2f;
    }
    size_t ss = zo_dtype_size(o->states);
    memset(a->mem[2], 0, b->n * ss);
    memset(a->mem[3], 0, b->n * ss);
    if (a->mem[5]) {
        memset(a->mem[5], 0, zo_adam_q8_blocks(b->n) * 4);
        memset(a->mem[6], 0, zo_adam_q8_blocks(b->n) * 4);
    }
    if (a->mem[4])
        memset(a->mem[4], 0, b->n * 2);
}

static int alloc_bufs(adam_bufs *a, const adam_opts *o)
{
    size_t n = o->params, ss = zo_dtype_size(o->states);
    memset(a, 0, sizeof *a);
    a->mem[0] = big_alloc(n * zo_dtype_size(o->grad));
    a->mem[1] = big_alloc(n * 4);
    a->mem[2] = big_alloc(n * ss);
    a->mem[3] = big_alloc(n * ss);
    if (o->out != ZO_DTYPE_NONE)
        a->mem[4] = big_alloc(n * 2);
    int q8 = o->states == ZO_DTYPE_I8;
    if (q8) {
        a->mem[5] = big_alloc(zo_adam_q8_blocks(n) * 4);
        a->mem[6] = big_alloc(zo_adam_q8_blocks(n) * 4);
    }
    if (!a->mem[0] || !a->mem[1] || !a->mem[2] || !a->mem[3] ||
        (o->out != ZO_DTYPE_NONE && !a->mem[4]) || (q8 && (!a->mem[5] || !a->mem[6]))) {
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
    a->b.m_absmax = a->mem[5];
    a->b.v_absmax = a->mem[6];
    fill(a, o);
    return 0;
}

static int failed(const char *what, zo_status st)
{
    fprintf(stderr, "zo-bench adam: %s: %s: %s\n", what, zo_status_str(st), zo_last_error());
    return 1;
}

/* The contiguous roofline: each of T threads streams its own 1/T of the
 * buffers (cut at 64 elements, or int8 blocks) with the library's roofline kernel, between
 * two barriers, so that it is what the machine's memory gives. */
typedef struct contig_thread {
    struct contig_team *team;
    zo_adam_buffers part;
    pthread_t th;
} contig_thread;

typedef struct contig_team {
    pthread_barrier_t start, end;
    contig_thread *t;
    int n, started, stop;
} contig_team;

static zo_adam_buffers buffers_part(const zo_adam_buffers *b, size_t off, size_t len)
{
    zo_adam_buffers p = *b;
    size_t gs = zo_dtype_size(b->grad_type), ss = zo_dtype_size(b->state_type);
    p.n = len;
    p.grad = (const char *)b->grad + off * gs;
    p.master = b->master + off;
    p.m = (char *)b->m + off * ss;
    p.v = (char *)b->v + off * ss;
    if (b->out)
        p.out = (char *)b->out + off * 2;
    if (b->state_type == ZO_DTYPE_I8) { /* off is on a block */
        p.m_absmax = b->m_absmax + off / ZO_ADAM_Q8_BLOCK;
        p.v_absmax = b->v_absmax + off / ZO_ADAM_Q8_BLOCK;
    }
    return p;
}

static void *contig_main(void *arg)
{
    contig_thread *t = arg;
    for (;;) {
        pthread_barrier_wait(&t->team->start);
        if (t->team->stop)
            return NULL;
        zo_adam_roofline(&t->part, -1); /* checked by the pool's run before */
        pthread_barrier_wait(&t->team->end);
    }
}

/* The same binding as the pool's workers: one core each when there are
 * enough, else the whole list; without --cores, the process's own mask. */
static int contig_attr(const adam_opts *o, int i, pthread_attr_t *attr)
{
    if (!o->ncores)
        return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (o->threads <= o->ncores)
        CPU_SET(o->cores[i], &set);
    else
        for (int c = 0; c < o->ncores; c++)
            CPU_SET(o->cores[c], &set);
    return pthread_attr_setaffinity_np(attr, sizeof set, &set);
}

static void contig_stop(contig_team *team)
{
    if (team->started == team->n) {
        team->stop = 1;
        pthread_barrier_wait(&team->start);
    }
    for (int i = 0; i < team->started; i++)
        pthread_join(team->t[i].th, NULL);
    if (team->n) {
        pthread_barrier_destroy(&team->start);
        pthread_barrier_destroy(&team->end);
    }
    free(team->t);
}

static int contig_start(contig_team *team, const adam_opts *o, const zo_adam_buffers *b)
{
    *team = (contig_team){.n = o->threads};
    team->t = calloc((size_t)o->threads, sizeof *team->t);
    if (!team->t)
        return -1;
    pthread_barrier_init(&team->start, NULL, (unsigned)o->threads + 1);
    pthread_barrier_init(&team->end, NULL, (unsigned)o->threads + 1);
    size_t cut = b->state_type == ZO_DTYPE_I8 ? ZO_ADAM_Q8_BLOCK : 64;
    size_t blocks = (b->n + cut - 1) / cut, n = (size_t)o->threads;
    for (int i = 0; i < o->threads; i++) {
        size_t lo = blocks * (size_t)i / n * cut, hi = blocks * ((size_t)i + 1) / n * cut;
        hi = hi < b->n ? hi : b->n;
        team->t[i] = (contig_thread){team, buffers_part(b, lo, hi - lo), 0};
        pthread_attr_t attr;
        int rc = pthread_attr_init(&attr);
        if (!rc)
            rc = contig_attr(o, i, &attr);
        if (!rc)
            rc = pthread_create(&team->t[i].th, &attr, contig_main, &team->t[i]);
        pthread_attr_destroy(&attr);
        if (rc) {
            fprintf(stderr, "zo-bench adam: starting roofline thread %d: %s\n", i, strerror(rc));
            return -1;
        }
        team->started++;
    }
    return 0;
}

static double contig_run(contig_team *team)
{
    double t0 = zo_now_s();
    pthread_barrier_wait(&team->start);
    pthread_barrier_wait(&team->end);
    return zo_now_s() - t0;
}

enum { K_STEP, K_POOL_ROOF, K_CONTIG_ROOF, NKERNELS };

typedef struct timings {
    double *secs[NKERNELS];
} timings;

static int time_pool(zo_optim_pool_t pool, const adam_bufs *a, int64_t step, int roofline,
                     double *secs)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.adamw = 1;
    p.weight_decay = 0.01f;
    p.step = step;
    zo_optim_job_t job;
    double t0 = zo_now_s();
    zo_status st = roofline ? zo_optim_pool_roofline_enqueue(pool, &a->b, -1, &job)
                            : zo_optim_pool_adam_enqueue(pool, &p, &a->b, &job);
    if (st < 0)
        return failed(roofline ? "roofline" : "adam step", st);
    zo_optim_job_wait(job, NULL);
    *secs = zo_now_s() - t0;
    return 0;
}

static int time_one(zo_optim_pool_t pool, contig_team *team, const adam_bufs *a, int64_t step,
                    int kernel, double *secs)
{
    if (kernel != K_CONTIG_ROOF)
        return time_pool(pool, a, step, kernel == K_POOL_ROOF, secs);
    *secs = contig_run(team);
    return 0;
}

static int run_timings(zo_optim_pool_t pool, contig_team *team, const adam_bufs *a, int reps,
                       timings *t)
{
    double warm;
    for (int k = 0; k < NKERNELS; k++)
        if (time_one(pool, team, a, 1, k, &warm))
            return 1;
    for (int r = 0; r < reps; r++) {
        /* Rotate which goes first so none always follows another. */
        for (int i = 0; i < NKERNELS; i++) {
            int k = (r + i) % NKERNELS;
            if (time_one(pool, team, a, 2 + r, k, &t->secs[k][r]))
                return 1;
        }
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
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static double median(const double *v, int n)
{
    double *c = malloc((size_t)n * sizeof *c);
    if (!c)
        return NAN;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static json_t *json_array_of(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

/* One kernel's figures, and the step's ratios to it (roofline time over
 * step time: 1 is the roofline reached). */
typedef struct kernel_stats {
    double gparams, gbytes;                   /* best of the repetitions */
    double ratio, ratio_medians, ratio_pairs; /* the step's, against this one */
} kernel_stats;

/* pairs: the median over repetitions of roofline time / step time taken in
 * the same round, the statistic least moved by load that comes and goes. */
static kernel_stats stats_of(const adam_opts *o, const timings *t, int k, double bytes_per_param,
                             double *per_rep_ratio)
{
    kernel_stats ks;
    double n = (double)o->params;
    ks.gparams = n / best(t->secs[k], o->reps) * 1e-9;
    ks.gbytes = ks.gparams * bytes_per_param;
    ks.ratio = best(t->secs[k], o->reps) / best(t->secs[K_STEP], o->reps);
    ks.ratio_medians = median(t->secs[k], o->reps) / median(t->secs[K_STEP], o->reps);
    for (int r = 0; r < o->reps; r++)
        per_rep_ratio[r] = t->secs[k][r] / t->secs[K_STEP][r];
    ks.ratio_pairs = median(per_rep_ratio, o->reps);
    return ks;
}

/* prefix names the kernel's rates ("", "roofline_", ...), sfx the step's
 * ratios to it ("ratio<sfx>..."); none for the step itself. */
static void json_kernel(json_t *j, const char *prefix, const char *secs_key, const char *sfx,
                        const kernel_stats *ks, const double *secs, const double *per_rep_ratio,
                        int reps)
{
    char key[64];
    snprintf(key, sizeof key, "%sgparams_per_s", prefix);
    json_object_set_new(j, key, json_real(ks->gparams));
    snprintf(key, sizeof key, "%sgbytes_per_s", prefix);
    json_object_set_new(j, key, json_real(ks->gbytes));
    json_object_set_new(j, secs_key, json_array_of(secs, reps));
    if (!sfx)
        return;
    snprintf(key, sizeof key, "ratio%s", sfx);
    json_object_set_new(j, key, json_real(ks->ratio));
    snprintf(key, sizeof key, "ratio%s_median", sfx);
    json_object_set_new(j, key, json_real(ks->ratio_medians));
    snprintf(key, sizeof key, "ratio%s_pairs_median", sfx);
    json_object_set_new(j, key, json_real(ks->ratio_pairs));
    snprintf(key, sizeof key, "ratio%s_reps", sfx);
    json_object_set_new(j, key, json_array_of(per_rep_ratio, reps));
}

/* The --states spelling. */
static const char *states_name(zo_dtype t)
{
    return t == ZO_DTYPE_I8 ? "int8" : zo_dtype_name(t);
}

/* Whether this program runs on another architecture's kernel, as under
 * qemu-user (qemu answers uname() with the program's architecture, but
 * not the kernel's own /proc/sys/kernel/arch, Linux 6.1 on): then its
 * timings are the emulator's and say nothing of the CPU it was built for.
 * The kernel's architecture goes to kernel_arch. */
static int runs_emulated(char *kernel_arch, size_t len)
{
    struct utsname u;
    FILE *f = fopen("/proc/sys/kernel/arch", "r");
    if (!f)
        return 0;
    int got = fgets(kernel_arch, (int)len, f) != NULL;
    fclose(f);
    if (!got || uname(&u) != 0)
        return 0;
    kernel_arch[strcspn(kernel_arch, "\n")] = '\0';
    return strcmp(kernel_arch, u.machine) != 0;
}

static void report_json(const adam_opts *o, const timings *t, double bytes_per_param,
                        const kernel_stats *ks, double *const per_rep[NKERNELS])
{
    json_t *j = json_object();
    json_object_set_new(j, "bench", json_string("adam"));
    json_object_set_new(j, "params", json_integer((json_int_t)o->params));
    json_object_set_new(j, "grad", json_string(zo_dtype_name(o->grad)));
    json_object_set_new(j, "out", json_string(zo_dtype_name(o->out)));
    json_object_set_new(j, "states", json_string(states_name(o->states)));
    json_object_set_new(j, "threads", json_integer(o->threads));
    json_object_set_new(j, "simd", json_string(zo_simd_level_name(zo_cpu_simd_level())));
    json_object_set_new(j, "bytes_per_param", json_real(bytes_per_param));
    char arch[64];
    json_object_set_new(j, "emulated", json_boolean(runs_emulated(arch, sizeof arch)));
    json_kernel(j, "", "step_seconds", NULL, &ks[K_STEP], t->secs[K_STEP], NULL, o->reps);
    /* "roofline": the contiguous one, the machine's; "pool_roofline": the
     * same kernel through the pool. */
    json_kernel(j, "roofline_", "roofline_seconds", "", &ks[K_CONTIG_ROOF], t->secs[K_CONTIG_ROOF],
                per_rep[K_CONTIG_ROOF], o->reps);
    json_kernel(j, "pool_roofline_", "pool_roofline_seconds", "_pool", &ks[K_POOL_ROOF],
                t->secs[K_POOL_ROOF], per_rep[K_POOL_ROOF], o->reps);
    json_dumpf(j, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(j);
}

static void report_human(const adam_opts *o, const timings *t, double bytes_per_param,
                         const kernel_stats *ks, double *const per_rep[NKERNELS])
{
    printf("adam step: %zu params, grad %s, out %s, states %s, %d threads, simd %s, %.2f B/param\n",
           o->params, zo_dtype_name(o->grad), zo_dtype_name(o->out), states_name(o->states),
           o->threads, zo_simd_level_name(zo_cpu_simd_level()), bytes_per_param);
    char arch[64];
    struct utsname u;
    if (runs_emulated(arch, sizeof arch) && uname(&u) == 0)
        printf(
            "  emulated: %s code on a %s kernel (qemu-user?): these timings are the emulator's,\n"
            "  they say nothing of how fast a real %s CPU is\n",
            u.machine, arch, u.machine);
    static const char *names[NKERNELS] = {"fused step", "roofline, pool", "roofline, contiguous"};
    for (int k = 0; k < NKERNELS; k++)
        printf("  %-21s %7.3f Gparams/s %7.2f GB/s  (best of %d, %.1f ms)\n", names[k],
               ks[k].gparams, ks[k].gbytes, o->reps, best(t->secs[k], o->reps) * 1e3);
    for (int k = K_CONTIG_ROOF; k >= K_POOL_ROOF; k--)
        printf("  step / %-14s %7.3f  (of medians %.3f, median of same-round ratios %.3f)\n",
               k == K_CONTIG_ROOF ? "contiguous" : "pool", ks[k].ratio, ks[k].ratio_medians,
               ks[k].ratio_pairs);
    printf("  per round: contiguous roofline GB/s, step / it:");
    for (int r = 0; r < o->reps; r++)
        printf(" %.1f %.3f%s",
               (double)o->params * bytes_per_param / t->secs[K_CONTIG_ROOF][r] * 1e-9,
               per_rep[K_CONTIG_ROOF][r], r + 1 < o->reps ? "," : "\n");
}

static void report(const adam_opts *o, const timings *t, double bytes_per_param)
{
    double *per_rep[NKERNELS] = {0};
    kernel_stats ks[NKERNELS];
    for (int k = 0; k < NKERNELS; k++) {
        per_rep[k] = calloc((size_t)o->reps, sizeof(double));
        if (!per_rep[k])
            goto out;
    }
    for (int k = 0; k < NKERNELS; k++)
        ks[k] = stats_of(o, t, k, bytes_per_param, per_rep[k]);
    if (o->json)
        report_json(o, t, bytes_per_param, ks, per_rep);
    else
        report_human(o, t, bytes_per_param, ks, per_rep);
out:
    for (int k = 0; k < NKERNELS; k++)
        free(per_rep[k]);
}

static int time_all(zo_optim_pool_t pool, const adam_opts *o, const adam_bufs *a, timings *t)
{
    for (int k = 0; k < NKERNELS; k++)
        if (!(t->secs[k] = calloc((size_t)o->reps, sizeof(double))))
            return failed("allocating timings", ZO_ERR_NO_MEMORY);
    contig_team team;
    if (contig_start(&team, o, &a->b)) {
        contig_stop(&team);
        return 1;
    }
    int rc = run_timings(pool, &team, a, o->reps, t);
    contig_stop(&team);
    return rc;
}

int zo_bench_adam_main(int argc, char **argv)
{
    adam_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = o.threads;
    cfg.cores = o.ncores ? o.cores : NULL;
    cfg.ncores = o.ncores;
    zo_optim_pool_t pool;
    zo_status st = zo_optim_pool_init(&pool, &cfg);
    if (st < 0)
        return failed("starting the worker pool", st);
    adam_bufs a;
    if (alloc_bufs(&a, &o)) {
        zo_optim_pool_free(pool);
        return 1;
    }
    timings t = {{0}};
    rc = time_all(pool, &o, &a, &t);
    /* read and written: master and both moments (int8: with their scales) */
    double moments = 2.0 * (double)zo_adam_moment_bytes(o.states, o.params) / (double)o.params;
    double bytes = (double)(zo_dtype_size(o.grad) + zo_dtype_size(o.out)) + 2 * (4 + moments);
    if (!rc)
        report(&o, &t, bytes);
    for (int k = 0; k < NKERNELS; k++)
        free(t.secs[k]);
    free_bufs(&a);
    zo_optim_pool_free(pool);
    return rc;
}
