/* zo-bench engine: training steps of a synthetic model through the offload
 * engine, against the limit of perfect overlap measured in the same run.
 *
 * Each layer holds --layer-params parameters; its forward "kernel" occupies
 * the compute stream for --compute-ms, its backward twice that. The limit is
 * the slowest single resource of one step, each measured alone here: the
 * compute stream (the kernels with nothing else), the host->device link (the
 * step's H2D bytes as one copy stream), the device->host link, and the CPU
 * optimizer (one Adam step over all parameters with the same worker pool
 * size), and NVMe (the step's NVMe reads and writes, each alone,
 * through a swap store in the same directory). In sync mode the optimizer cannot overlap, so its
 * time is added instead. efficiency = limit / median step time (1.0: nothing waits that need not).
 * On the cpu device, ZO_CPU_DEVICE_PCIE_GBPS (or --pcie-gbps) emulates the link's bandwidth. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zo/engine.h"
#include "zo/units.h"
#include "zo_bench.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        zo_status try_st_ = (expr);                                                                \
        if (try_st_ < 0)                                                                           \
            return try_st_;                                                                        \
    } while (0)

typedef struct eng_opts {
    int layers, steps, json, lookahead, threads;
    size_t layer_params, chunk;
    double compute_ms, pcie_gbps;
    uint64_t device_mb;
    zo_tier param_home, optim_home;
    zo_optim_mode mode;
    const char *nvme, *backend;
} eng_opts;

typedef struct eng_result {
    double step_s, compute_s, h2d_s, d2h_s, optim_s, nvme_s, limit_s;
    zo_step_stats last;
    zo_engine_footprint fp;
} eng_result;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: zo-bench engine [--layers N] [--layer-params N] [--compute-ms MS] [--steps S]\n"
           "                       [--mode sync|overlap|dpu] [--param-home device|host|nvme]\n"
           "                       [--optim-home device|host|nvme] [--nvme DIR] [--device-mb MB]\n"
           "                       [--chunk BYTES] [--lookahead K] [--threads T] [--pcie-gbps G]\n"
           "                       [--backend auto|cpu|cuda] [--json]\n"
           "  defaults: 8 layers of 1M parameters, 4 ms forward per layer (backward 2x), 6 steps,\n"
           "  overlap mode, parameters and optimizer states on the host, chunks of 4 MiB,\n"
           "  lookahead 2, 2 optimizer threads, a device budget holding 3 layers.\n"
           "Prints the median step time, the limit of perfect overlap measured in the same run\n"
           "and their ratio (efficiency), with stall, busy times and bytes per link.\n");
}

static int parse_tier(const char *s, zo_tier *t)
{
    if (!strcmp(s, "device"))
        *t = ZO_TIER_DEVICE;
    else if (!strcmp(s, "host"))
        *t = ZO_TIER_HOST;
    else if (!strcmp(s, "nvme"))
        *t = ZO_TIER_NVME;
    else
        return -1;
    return 0;
}

static int parse_mode(const char *s, zo_optim_mode *m)
{
    if (!strcmp(s, "sync"))
        *m = ZO_OPTIM_SYNC;
    else if (!strcmp(s, "overlap"))
        *m = ZO_OPTIM_OVERLAP;
    else if (!strcmp(s, "dpu"))
        *m = ZO_OPTIM_DPU;
    else
        return -1;
    return 0;
}

static int parse_opts(int argc, char **argv, eng_opts *o)
{
    static const struct option longs[] = {
        {"layers", required_argument, 0, 'l'},
        {"layer-params", required_argument, 0, 'p'},
        {"compute-ms", required_argument, 0, 'c'},
        {"steps", required_argument, 0, 's'},
        {"mode", required_argument, 0, 'm'},
        {"param-home", required_argument, 0, 'P'},
        {"optim-home", required_argument, 0, 'O'},
        {"nvme", required_argument, 0, 'n'},
        {"device-mb", required_argument, 0, 'd'},
        {"chunk", required_argument, 0, 'k'},
        {"lookahead", required_argument, 0, 'a'},
        {"threads", required_argument, 0, 't'},
        {"pcie-gbps", required_argument, 0, 'g'},
        {"backend", required_argument, 0, 'b'},
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (eng_opts){8,
                    6,
                    0,
                    2,
                    2,
                    1u << 20,
                    4u << 20,
                    4.0,
                    0.0,
                    0,
                    ZO_TIER_HOST,
                    ZO_TIER_HOST,
                    ZO_OPTIM_OVERLAP,
                    NULL,
                    "auto"};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        int bad = 0;
        switch (c) {
        case 'l':
            o->layers = (int)strtol(optarg, &end, 10);
            bad = o->layers < 1;
            break;
        case 'p':
            o->layer_params = strtoull(optarg, &end, 10);
            bad = o->layer_params < 1;
            break;
        case 'c':
            o->compute_ms = strtod(optarg, &end);
            bad = o->compute_ms < 0;
            break;
        case 's':
            o->steps = (int)strtol(optarg, &end, 10);
            bad = o->steps < 2;
            break;
        case 'd': o->device_mb = strtoull(optarg, &end, 10); break;
        case 'k': o->chunk = strtoull(optarg, &end, 10); break;
        case 'a':
            o->lookahead = (int)strtol(optarg, &end, 10);
            bad = o->lookahead < 0;
            break;
        case 't':
            o->threads = (int)strtol(optarg, &end, 10);
            bad = o->threads < 1;
            break;
        case 'g':
            o->pcie_gbps = strtod(optarg, &end);
            bad = o->pcie_gbps < 0;
            break;
        case 'm': bad = parse_mode(optarg, &o->mode); break;
        case 'P': bad = parse_tier(optarg, &o->param_home); break;
        case 'O': bad = parse_tier(optarg, &o->optim_home); break;
        case 'n': o->nvme = optarg; break;
        case 'b': o->backend = optarg; break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (bad || errno || (end && *end)) {
            fprintf(stderr, "zo-bench engine: bad value '%s' for an option (see --help)\n", optarg);
            return 2;
        }
    }
    if ((o->param_home == ZO_TIER_NVME || o->optim_home == ZO_TIER_NVME) && !o->nvme) {
        fprintf(stderr, "zo-bench engine: an nvme home needs --nvme DIR\n");
        return 2;
    }
    return 0;
}

/* A kernel that keeps the compute stream busy for its duration. */
static zo_status spin(void *arg)
{
    double until = zo_now_s() + *(double *)arg;
    while (zo_now_s() < until) {
    }
    return ZO_OK;
}

static zo_status run_kernel(zo_stream_t s, double ms)
{
    double sec = ms * 1e-3;
    return zo_stream_enqueue(s, spin, &sec, sizeof sec);
}

static zo_status train_step(zo_engine_t e, zo_stream_t s, const eng_opts *o, zo_step_stats *st)
{
    void *p[1], *g[1];
    for (int l = 0; l < o->layers; l++) {
        TRY(zo_engine_fetch(e, l, ZO_PHASE_FORWARD, s, p, NULL, 1));
        TRY(run_kernel(s, o->compute_ms));
        TRY(zo_engine_release(e, l, s));
    }
    for (int l = o->layers - 1; l >= 0; l--) {
        TRY(zo_engine_fetch(e, l, ZO_PHASE_BACKWARD, s, p, g, 1));
        TRY(run_kernel(s, 2 * o->compute_ms));
        TRY(zo_engine_grads_ready(e, l, s));
        TRY(zo_engine_release(e, l, s));
    }
    TRY(zo_engine_end_step(e, st));
    return zo_stream_synchronize(s);
}

static zo_status build_engine(zo_device_t dev, const eng_opts *o, zo_engine_t *out)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    const char *paths[1] = {o->nvme};
    c.device = dev;
    c.chunk_bytes = o->chunk;
    c.param_home = o->param_home;
    c.optim_home = o->optim_home;
    uint64_t layer_bytes = (uint64_t)o->layer_params * 2;
    c.device_bytes = o->device_mb ? o->device_mb << 20 : 0;
    if (!o->device_mb && o->param_home != ZO_TIER_DEVICE)
        c.device_bytes =
            4 * ((layer_bytes + o->chunk - 1) / o->chunk + 1) * o->chunk; /* ~3 layers + grads */
    c.nvme_paths = paths;
    c.n_nvme_paths = o->nvme ? 1 : 0;
    c.lookahead = o->lookahead;
    c.mode = o->mode;
    c.optim_threads = o->threads;
    TRY(zo_engine_init(out, &c));
    float *init = calloc(o->layer_params, sizeof *init);
    if (!init)
        return ZO_ERR_NO_MEMORY;
    for (size_t i = 0; i < o->layer_params; i++)
        init[i] = 0.01f * (float)((i * 2654435761u) % 200) - 1.0f;
    zo_status st = ZO_OK;
    for (int l = 0; l < o->layers && st == ZO_OK; l++)
        st = zo_engine_register(*out, l, "w", o->layer_params, init, NULL);
    free(init);
    TRY(st);
    return zo_engine_finalize(*out);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The compute stream alone: the step's kernels with no engine. */
static zo_status time_compute(zo_stream_t s, const eng_opts *o, double *sec)
{
    *sec = 1e30;
    for (int rep = 0; rep < 3; rep++) { /* best of 3: the machine may be shared */
        double t0 = zo_now_s();
        for (int l = 0; l < o->layers; l++)
            TRY(run_kernel(s, 3 * o->compute_ms));
        TRY(zo_stream_synchronize(s));
        if (zo_now_s() - t0 < *sec)
            *sec = zo_now_s() - t0;
    }
    return ZO_OK;
}

/* One direction of the link alone: `bytes` as chunk-sized copies on one stream. */
static zo_status time_link(zo_device_t dev, const eng_opts *o, uint64_t bytes, int d2h, double *sec)
{
    void *dptr = NULL, *hptr = NULL;
    zo_stream_t s = NULL;
    size_t n = o->chunk;
    zo_status st = zo_device_malloc(dev, n, &dptr);
    if (st == ZO_OK)
        st = posix_memalign(&hptr, 4096, n) ? ZO_ERR_NO_MEMORY : ZO_OK;
    if (st == ZO_OK)
        memset(hptr, 1, n);
    int pinned =
        st == ZO_OK && zo_device_host_register(dev, hptr, n) == ZO_OK; /* unpinned still copies */
    if (st == ZO_OK)
        st = zo_stream_create(dev, &s);
    *sec = 1e30;
    for (int rep = 0; rep < 4;
         rep++) { /* the first pass warms pages and the stream up; best of 3 */
        double t0 = zo_now_s();
        for (uint64_t done = 0; st == ZO_OK && done < bytes; done += n) {
            size_t len = bytes - done < n ? (size_t)(bytes - done) : n;
            st = d2h ? zo_memcpy_d2h_async(s, hptr, dptr, len)
                     : zo_memcpy_h2d_async(s, dptr, hptr, len);
        }
        if (st == ZO_OK)
            st = zo_stream_synchronize(s);
        if (rep > 0 && zo_now_s() - t0 < *sec)
            *sec = zo_now_s() - t0;
    }
    zo_stream_destroy(s);
    if (pinned)
        zo_device_host_unregister(dev, hptr);
    free(hptr);
    zo_device_mfree(dev, dptr);
    return st;
}

/* The NVMe link alone: the step's NVMe reads, and separately its writes,
 * chunk-state-sized extents, all in flight; best of 3 each; the larger of the
 * two (a lower bound even for a drive that reads and writes at once). */
static zo_status time_nvme(const eng_opts *o, uint64_t rbytes, uint64_t wbytes, double *sec)
{
    *sec = 0;
    if (!o->nvme || (!rbytes && !wbytes))
        return ZO_OK;
    uint64_t ext = 6ull * o->chunk;
    uint32_t nr = (uint32_t)((rbytes + ext - 1) / ext), nw = (uint32_t)((wbytes + ext - 1) / ext),
             n = nr + nw;
    const char *paths[1] = {o->nvme};
    zo_swap_config c = ZO_SWAP_CONFIG_INIT;
    c.paths = paths;
    c.npaths = 1;
    c.capacity = (uint64_t)n * ext;
    c.extent_bytes = ext;
    c.name = "zo-bench-engine";
    zo_swap_t sw = NULL;
    void *buf = NULL;
    zo_swap_extent_t *e = calloc(n, sizeof *e);
    zo_swap_io_t *io = calloc(n, sizeof *io);
    zo_status st =
        e && io && !posix_memalign(&buf, 4096, ext * n) ? zo_swap_open(&c, &sw) : ZO_ERR_NO_MEMORY;
    if (buf)
        memset(buf, 3, ext * n);
    for (uint32_t i = 0; st == ZO_OK && i < n; i++)
        st = zo_swap_alloc_extent(sw, i, &e[i]);
    for (uint32_t i = 0; st == ZO_OK && i < nr; i++)
        st = zo_swap_write(sw, e[i], (char *)buf + i * ext, ext, 1);
    double best[2] = {1e30, 1e30}; /* reads, writes */
    for (int pass = 0; pass < 6 && st == ZO_OK; pass++) {
        int w = pass % 2;
        uint32_t lo = w ? nr : 0, hi = w ? n : nr;
        double t0 = zo_now_s();
        for (uint32_t i = lo; i < hi && st == ZO_OK; i++) {
            char *b = (char *)buf + i * ext;
            st = w ? zo_swap_write_async(sw, e[i], b, ext, 1, NULL, NULL, &io[i])
                   : zo_swap_read_async(sw, e[i], b, ext, 1, NULL, NULL, &io[i]);
        }
        for (uint32_t i = lo; i < hi; i++) {
            zo_status ws = zo_swap_wait(io[i]);
            io[i] = NULL;
            if (st == ZO_OK)
                st = ws;
        }
        if (zo_now_s() - t0 < best[w])
            best[w] = zo_now_s() - t0;
    }
    *sec = best[0] > best[1] ? best[0] : best[1];
    zo_swap_close(sw);
    free(buf);
    free(e);
    free(io);
    return st;
}

/* The CPU optimizer alone: one Adam step over every parameter. */
static zo_status time_optim(const eng_opts *o, double *sec)
{
    size_t n = (size_t)o->layers * o->layer_params;
    zo_optim_pool_config pc = ZO_OPTIM_POOL_CONFIG_INIT;
    pc.nthreads = o->threads;
    zo_optim_pool_t pool = NULL;
    float *w = calloc(n * 3, sizeof *w);
    uint16_t *g = calloc(n * 2, sizeof *g);
    zo_status st = (w && g) ? zo_optim_pool_init(&pool, &pc) : ZO_ERR_NO_MEMORY;
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
    b.n = n;
    b.grad = g;
    b.grad_type = ZO_DTYPE_BF16;
    b.master = w;
    b.m = w + n;
    b.v = w + 2 * n;
    b.out = g + n;
    b.out_type = ZO_DTYPE_BF16;
    *sec = 1e30;
    for (int rep = 0; rep < 4 && st == ZO_OK;
         rep++) { /* the first pass faults the pages in; best of 3 */
        double t0 = zo_now_s();
        st = zo_optim_pool_adam_step(pool, &p, &b);
        if (rep > 0 && zo_now_s() - t0 < *sec)
            *sec = zo_now_s() - t0;
    }
    zo_optim_pool_free(pool);
    free(w);
    free(g);
    return st;
}

static zo_status bench(const eng_opts *o, eng_result *r)
{
    if (o->pcie_gbps > 0) {
        char v[32];
        snprintf(v, sizeof v, "%g", o->pcie_gbps);
        setenv("ZO_CPU_DEVICE_PCIE_GBPS", v, 1);
    }
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = o->backend;
    dc.mem_budget = 4ull << 30;
    zo_device_t dev = NULL;
    zo_engine_t e = NULL;
    zo_stream_t s = NULL;
    TRY(zo_device_init(&dev, &dc));
    zo_status st = zo_stream_create(dev, &s);
    if (st == ZO_OK)
        st = build_engine(dev, o, &e);
    double *times = calloc((size_t)o->steps, sizeof *times);
    if (!times)
        st = ZO_ERR_NO_MEMORY;
    r->fp.struct_size = sizeof r->fp;
    if (st == ZO_OK)
        st = zo_engine_footprint_get(e, &r->fp);
    for (int i = 0; i < o->steps && st == ZO_OK; i++) {
        zo_step_stats ss = ZO_STEP_STATS_INIT;
        double t0 = zo_now_s();
        st = train_step(e, s, o, &ss);
        times[i] = zo_now_s() - t0;
        r->last = ss;
    }
    zo_engine_free(e);
    if (st == ZO_OK) {
        qsort(times + 1, (size_t)o->steps - 1, sizeof *times,
              cmp_double); /* step 0 records the trace */
        r->step_s = times[1 + (o->steps - 1) / 2];
        st = time_compute(s, o, &r->compute_s);
    }
    if (st == ZO_OK)
        st = time_link(dev, o, r->last.h2d_bytes, 0, &r->h2d_s);
    if (st == ZO_OK)
        st = time_link(dev, o, r->last.d2h_bytes, 1, &r->d2h_s);
    if (st == ZO_OK)
        st = time_optim(o, &r->optim_s);
    if (st == ZO_OK)
        st = time_nvme(o, r->last.nvme_read_bytes, r->last.nvme_write_bytes, &r->nvme_s);
    free(times);
    zo_stream_destroy(s);
    zo_device_free(dev);
    double io = r->compute_s > r->h2d_s ? r->compute_s : r->h2d_s;
    if (r->d2h_s > io)
        io = r->d2h_s;
    if (r->nvme_s > io)
        io = r->nvme_s;
    r->limit_s = o->mode == ZO_OPTIM_SYNC ? io + r->optim_s : (io > r->optim_s ? io : r->optim_s);
    return st;
}

static const char *tier(zo_tier t)
{
    return zo_tier_name(t);
}

static void print_json(const eng_opts *o, const eng_result *r)
{
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f,"
        " s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
        "bench", "engine", "mode", zo_optim_mode_name(o->mode), "param_home", tier(o->param_home),
        "optim_home", tier(o->optim_home), "layers", o->layers, "layer_params",
        (json_int_t)o->layer_params, "step_seconds", r->step_s, "limit_seconds", r->limit_s,
        "efficiency", r->limit_s / r->step_s, "compute_seconds", r->compute_s, "h2d_link_seconds",
        r->h2d_s, "d2h_link_seconds", r->d2h_s, "nvme_link_seconds", r->nvme_s,
        "optim_alone_seconds", r->optim_s, "stall_seconds", r->last.stall_seconds, "optim_seconds",
        r->last.optim_seconds, "nvme_seconds", r->last.nvme_seconds, "h2d_bytes",
        (json_int_t)r->last.h2d_bytes, "d2h_bytes", (json_int_t)r->last.d2h_bytes,
        "nvme_read_bytes", (json_int_t)r->last.nvme_read_bytes, "nvme_write_bytes",
        (json_int_t)r->last.nvme_write_bytes, "peak_device",
        (json_int_t)r->fp.bytes[ZO_TIER_DEVICE], "peak_pinned", (json_int_t)r->fp.pinned,
        "peak_host", (json_int_t)r->fp.bytes[ZO_TIER_HOST], "peak_nvme",
        (json_int_t)r->fp.bytes[ZO_TIER_NVME], "prefetches", (json_int_t)r->last.prefetches,
        "fetch_misses", (json_int_t)r->last.fetch_misses);
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt)
        printf("%s\n", txt);
    free(txt);
    json_decref(j);
}

static void print_human(const eng_opts *o, const eng_result *r)
{
    printf("engine: %d layers x %zu params, %s mode, params on %s, optimizer states on %s\n",
           o->layers, o->layer_params, zo_optim_mode_name(o->mode), tier(o->param_home),
           tier(o->optim_home));
    printf("  step (median)  %8.2f ms\n", r->step_s * 1e3);
    printf("  limit          %8.2f ms  (compute %.2f, h2d link %.2f, d2h link %.2f, nvme %.2f, "
           "optimizer %.2f%s)\n",
           r->limit_s * 1e3, r->compute_s * 1e3, r->h2d_s * 1e3, r->d2h_s * 1e3, r->nvme_s * 1e3,
           r->optim_s * 1e3, o->mode == ZO_OPTIM_SYNC ? ", added: sync" : "");
    printf("  efficiency     %8.2f  (limit / step)\n", r->limit_s / r->step_s);
    printf(
        "  last step: stall %.2f ms, optimizer busy %.2f ms, nvme wait %.2f ms, h2d busy %.2f ms, "
        "d2h busy %.2f ms\n",
        r->last.stall_seconds * 1e3, r->last.optim_seconds * 1e3, r->last.nvme_seconds * 1e3,
        r->last.h2d_seconds * 1e3, r->last.d2h_seconds * 1e3);
    printf(
        "  bytes: h2d %llu, d2h %llu, nvme read %llu, write %llu; prefetches %llu, misses %llu\n",
        (unsigned long long)r->last.h2d_bytes, (unsigned long long)r->last.d2h_bytes,
        (unsigned long long)r->last.nvme_read_bytes, (unsigned long long)r->last.nvme_write_bytes,
        (unsigned long long)r->last.prefetches, (unsigned long long)r->last.fetch_misses);
    printf("  peak bytes: device %llu, pinned %llu, host %llu, nvme %llu\n",
           (unsigned long long)r->fp.bytes[ZO_TIER_DEVICE], (unsigned long long)r->fp.pinned,
           (unsigned long long)r->fp.bytes[ZO_TIER_HOST],
           (unsigned long long)r->fp.bytes[ZO_TIER_NVME]);
}

int zo_bench_engine_main(int argc, char **argv)
{
    eng_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    eng_result r;
    memset(&r, 0, sizeof r);
    zo_status st = bench(&o, &r);
    if (st != ZO_OK) {
        fprintf(stderr, "zo-bench engine: %s: %s\n", zo_status_str(st), zo_last_error());
        return 1;
    }
    if (o.json)
        print_json(&o, &r);
    else
        print_human(&o, &r);
    return 0;
}
