/* zo-bench io: sequential read or write bandwidth of the swap store (its
 * engine, O_DIRECT, checksummed extents) on one directory, or the rate of
 * the engine's optimizer-update pipeline (--rw update: each extent read two
 * ahead, written back to an alternate extent behind). Read and write
 * passes are interleaved with fio's on the same directory in its best
 * configuration (bench_fio.c) when fio is installed, and the ratio of the
 * medians printed. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_fio.h"
#include "zo/swap.h"
#include "zo/swap_bench.h"
#include "zo/units.h"
#include "zo_bench.h"

typedef struct io_opts {
    const char *path, *rw, *engine;
    uint64_t size, bs, qd, extent;
    double idle; /* seconds the disk rests before each timed pass */
    int passes;  /* timed passes; the median is reported */
    int json;
    int fio; /* run fio beside read and write passes */
} io_opts;

#define IO_MAX_PASSES 100

typedef struct io_result {
    double seconds; /* the median pass */
    double pass_seconds[IO_MAX_PASSES];
    uint64_t bytes;
    zo_swap_stats stats;
    char engine[64];
    /* fio's passes: fio_runs of them, on huge pages or not; or why none */
    double fio_gbps[IO_MAX_PASSES];
    int fio_runs, fio_huge;
    char fio_note[512];
} io_result;

static void io_usage(FILE *out)
{
    fprintf(
        out,
        "usage: zo-bench io --path DIR --size BYTES --bs BYTES --qd N --rw read|write|update\n"
        "                   [--engine io_uring|sync|null] [--extent BYTES] [--passes N] [--idle "
        "SECONDS]\n"
        "                   [--no-fio] [--json]\n"
        "Reads or writes SIZE bytes in DIR through the swap store with O_DIRECT and prints GB/s\n"
        "(10^9 bytes/s). Sizes take K, M, G, T suffixes (powers of 1024). Extents of --extent "
        "bytes\n"
        "(default 64M, like offload chunks) are cut into --bs requests, --qd of them in flight.\n"
        "Untimed passes come first: the data is written (as fio lays out its file), and a read "
        "run\n"
        "reads it once before the timed read; a write run times an overwrite. An update run\n"
        "times the offload engine's optimizer pipeline: every extent read (two ahead) and written\n"
        "to an alternate extent (behind), reads and writes counted together; the next pass reads\n"
        "what the last one wrote, as the engine's next step does. --passes N times N passes and\n"
        "reports their median (default 1); --idle S rests the disk S seconds before each, as\n"
        "the engine's update follows a forward and backward that leave the disk idle.\n"
        "With fio on PATH, each read or write pass is followed (or, every other pass, preceded)\n"
        "by fio on the same directory with the same size, bs, qd and direction, in its best\n"
        "configuration: --ioengine=io_uring --direct=1 --mem=shmhuge --fixedbufs --registerfiles\n"
        "(shmhuge needs vm.nr_hugepages; without them fio runs with --mem=malloc and says so),\n"
        "and the ratio of the medians is printed, with the median and middle half of the ratios\n"
        "of each pass to the fio pass beside it (how far the disk's drift moves one ratio);\n"
        "--no-fio leaves it out.\n");
}

static int parse_opts(int argc, char **argv, io_opts *o)
{
    static const struct option longs[] = {
        {"path", required_argument, 0, 'p'},
        {"size", required_argument, 0, 's'},
        {"bs", required_argument, 0, 'b'},
        {"qd", required_argument, 0, 'q'},
        {"rw", required_argument, 0, 'r'},
        {"engine", required_argument, 0, 'e'},
        {"extent", required_argument, 0, 'x'},
        {"json", no_argument, 0, 'j'},
        {"passes", required_argument, 0, 'n'},
        {"idle", required_argument, 0, 'i'},
        {"help", no_argument, 0, 'h'},
        {"no-fio", no_argument, 0, 'f'},
        {0, 0, 0, 0},
    };
    *o = (io_opts){NULL, NULL, "auto", 0, 1u << 20, 32, 64u << 20, 0.0, 1, 0, 1};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        uint64_t *num = c == 's'   ? &o->size
                        : c == 'b' ? &o->bs
                        : c == 'q' ? &o->qd
                        : c == 'x' ? &o->extent
                                   : NULL;
        if (num && zo_parse_bytes(optarg, num) < 0) {
            fprintf(stderr, "zo-bench io: --%s '%s' is not a size (e.g. 4096, 1M, 2G)\n",
                    c == 's'   ? "size"
                    : c == 'b' ? "bs"
                    : c == 'q' ? "qd"
                               : "extent",
                    optarg);
            return 2;
        }
        if (c == 'p')
            o->path = optarg;
        else if (c == 'r')
            o->rw = optarg;
        else if (c == 'e')
            o->engine = optarg;
        else if (c == 'j')
            o->json = 1;
        else if (c == 'f')
            o->fio = 0;
        else if (c == 'n' || c == 'i') {
            char *end = NULL;
            double v = strtod(optarg, &end);
            int ok = end != optarg && !*end &&
                     (c == 'n' ? v >= 1 && v <= IO_MAX_PASSES && v == (int)v : v >= 0 && v <= 3600);
            if (!ok) {
                fprintf(stderr, "zo-bench io: --%s '%s': %s\n", c == 'n' ? "passes" : "idle",
                        optarg,
                        c == 'n' ? "a whole number of passes, 1 to 100" : "seconds, 0 to 3600");
                return 2;
            }
            if (c == 'n')
                o->passes = (int)v;
            else
                o->idle = v;
        } else if (c == 'h')
            return io_usage(stdout), 1;
        else if (!num)
            return io_usage(stderr), 2;
    }
    const char *bad =
        !o->path   ? "--path is required"
        : !o->size ? "--size is required (> 0)"
        : !o->rw || (strcmp(o->rw, "read") && strcmp(o->rw, "write") && strcmp(o->rw, "update"))
            ? "--rw must be read, write or update"
        : (o->bs % 4096 || !o->bs) ? "--bs must be a multiple of 4096"
        : o->size < o->bs ? "--size must be at least --bs (one request), else nothing is timed"
        : (!o->qd || o->qd > 4096)         ? "--qd must be 1..4096"
        : (o->extent % 4096 || !o->extent) ? "--extent must be a multiple of 4096"
                                           : NULL;
    if (bad) {
        fprintf(stderr, "zo-bench io: %s\n", bad);
        return 2;
    }
    if (o->extent > o->size)
        o->extent = (o->size + 4095) / 4096 * 4096;
    return 0;
}

static void rest(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of n values sorted in place. */
static double median_sorted(double *s, int n)
{
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double median_seconds(const double *v, int n)
{
    double s[IO_MAX_PASSES];
    memcpy(s, v, (size_t)n * sizeof *s);
    return median_sorted(s, n);
}

/* One fio pass beside the store's pass: on huge pages until that fails,
 * then (once, saying why) on malloc'd buffers; none after a failure there. */
static void fio_pass(const io_opts *o, io_result *res)
{
    if (res->fio_runs < 0)
        return;
    bench_fio_job j = {o->path, o->size, o->bs, o->qd, !strcmp(o->rw, "write")};
    char why[400];
    double gbps;
    if (res->fio_huge && bench_fio_run(&j, 1, &gbps, why, sizeof why) == 0) {
        res->fio_gbps[res->fio_runs++] = gbps;
        return;
    }
    if (res->fio_huge)
        snprintf(res->fio_note, sizeof res->fio_note,
                 "on huge pages it failed (%s), so it ran with "
                 "--mem=malloc",
                 why);
    res->fio_huge = 0;
    if (bench_fio_run(&j, 0, &gbps, why, sizeof why) == 0) {
        res->fio_gbps[res->fio_runs++] = gbps;
        return;
    }
    snprintf(res->fio_note, sizeof res->fio_note, "fio failed: %s", why);
    res->fio_runs = -1;
}

/* Whether fio runs beside this benchmark; if not, why not in the note. */
static int fio_wanted(const io_opts *o, io_result *res)
{
    const char *why = !o->fio                    ? "left out (--no-fio)"
                      : !strcmp(o->rw, "update") ? "fio has no update pipeline to compare"
                      : !bench_fio_found()       ? "not installed (no fio on PATH): no peer figure"
                                                 : NULL;
    if (why)
        snprintf(res->fio_note, sizeof res->fio_note, "%s", why);
    res->fio_huge = 1;
    res->fio_runs = why ? -1 : 0;
    return !why;
}

/* The benchmark store (zo/swap_bench.h) runs the passes: untimed ones
 * first, the data written (as fio lays out its file); a read run reads it
 * once more before the timed pass, since a first read right after writing
 * can run at another speed than later ones (on this project's VMs, about
 * half) and fio's repeated runs see later ones; an update run warms the
 * pipeline (laying out the alternates) the same way. */
static zo_status bench(const io_opts *o, io_result *res)
{
    const int update = !strcmp(o->rw, "update"), write = !strcmp(o->rw, "write");
    zo_swap_bench_config c = ZO_SWAP_BENCH_CONFIG_INIT;
    c.path = o->path;
    c.name = "zo-bench-io";
    c.engine = o->engine;
    c.queue_depth = (uint32_t)o->qd;
    c.block_size = (uint32_t)o->bs;
    c.bytes = o->size;
    c.extent_bytes = o->extent;
    /* Extents in flight: enough to fill qd requests of bs bytes, plus two so
     * that the queue stays full while this thread verifies a finished read
     * (in zo_swap_wait) and hashes the next write. */
    uint64_t depth = (o->qd * o->bs + o->extent - 1) / o->extent + 2;
    c.window = depth > 4096 ? 4096 : (uint32_t)depth;
    c.alternates = update;
    zo_swap_bench_t b = NULL;
    zo_swap_bench_pass timed = update  ? ZO_SWAP_BENCH_UPDATE
                               : write ? ZO_SWAP_BENCH_WRITE
                                       : ZO_SWAP_BENCH_READ;
    zo_status st = zo_swap_bench_open(&c, &b);
    if (st == ZO_OK)
        st = zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE, NULL);
    if (st == ZO_OK && !write)
        st = zo_swap_bench_run(b, timed, NULL);
    int fio = fio_wanted(o, res);
    for (int k = 0; k < o->passes && st == ZO_OK; k++) {
        if (fio && k % 2) /* every other pass fio first: a trend hits both alike */
            fio_pass(o, res);
        rest(o->idle);
        st = zo_swap_bench_run(b, timed, &res->pass_seconds[k]);
        if (fio && k % 2 == 0)
            fio_pass(o, res);
    }
    if (fio)
        bench_fio_remove_file(o->path);
    res->seconds = median_seconds(res->pass_seconds, o->passes);
    res->bytes = zo_swap_bench_pass_bytes(b, timed);
    res->stats = (zo_swap_stats)ZO_SWAP_STATS_INIT;
    if (st != ZO_OK)
        fprintf(stderr, "zo-bench io: %s\n", zo_last_error());
    if (b) {
        zo_swap_bench_stats(b, &res->stats);
        snprintf(res->engine, sizeof res->engine, "%s", zo_swap_bench_engine(b));
    }
    zo_swap_bench_close(b);
    return st;
}

/* fio's median GB/s, or 0 when it did not run. */
static double fio_median(const io_result *r)
{
    if (r->fio_runs <= 0)
        return 0.0;
    double s[IO_MAX_PASSES];
    for (int k = 0; k < r->fio_runs; k++)
        s[k] = 1.0 / r->fio_gbps[k]; /* as seconds, so the median is the same kind */
    return 1.0 / median_seconds(s, r->fio_runs);
}

/* Each store pass over the fio pass beside it: pairs share the disk's state
 * of the moment, so their spread shows how far one ratio can be trusted on
 * a disk whose speed drifts between passes. 0 when fio did not run beside
 * every pass. */
typedef struct paired_ratio {
    double median, q1, q3; /* q1..q3: the middle half */
    int n;
} paired_ratio;

static paired_ratio fio_paired(const io_result *r, int passes)
{
    paired_ratio p = {0, 0, 0, 0};
    if (r->fio_runs != passes || passes < 1)
        return p;
    double v[IO_MAX_PASSES];
    for (int k = 0; k < passes; k++)
        v[k] = (double)r->bytes / r->pass_seconds[k] / 1e9 / r->fio_gbps[k];
    p.n = passes;
    p.median = median_sorted(v, passes);
    p.q1 = v[(passes - 1) / 4];
    p.q3 = v[passes - 1 - (passes - 1) / 4];
    return p;
}

static void json_fio(json_t *j, const io_result *r, double gbps, int passes)
{
    double fio = fio_median(r);
    if (fio > 0) {
        json_t *runs = json_array();
        for (int k = 0; k < r->fio_runs; k++)
            json_array_append_new(runs, json_real(r->fio_gbps[k]));
        json_object_set_new(j, "fio_gbps", json_real(fio));
        json_object_set_new(j, "fio_passes_gbps", runs);
        json_object_set_new(j, "fio_config", json_string(bench_fio_config(r->fio_huge)));
        json_object_set_new(j, "ratio_fio", json_real(gbps / fio));
        paired_ratio p = fio_paired(r, passes);
        if (p.n)
            json_object_set_new(j, "ratio_fio_paired",
                                json_pack("{s:f, s:f, s:f, s:i}", "median", p.median, "q1", p.q1,
                                          "q3", p.q3, "passes", p.n));
    }
    if (r->fio_note[0])
        json_object_set_new(j, "fio_note", json_string(r->fio_note));
}

static void print_json(const io_opts *o, const io_result *r, double gbps)
{
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:b}", "bench",
        "io", "rw", o->rw, "path", o->path, "engine", r->engine, "size", (json_int_t)o->size, "bs",
        (json_int_t)o->bs, "qd", (json_int_t)o->qd, "extent", (json_int_t)o->extent, "seconds",
        r->seconds, "gbps", gbps, "requests", (json_int_t)r->stats.requests, "requests_fixed",
        (json_int_t)r->stats.requests_fixed, "retries", (json_int_t)r->stats.retries, "short_ios",
        (json_int_t)r->stats.short_ios, "o_direct", 1);
    json_t *runs = json_array();
    for (int k = 0; k < o->passes; k++)
        json_array_append_new(runs, json_real(r->pass_seconds[k]));
    if (j) {
        json_object_set_new(j, "passes", runs);
        json_object_set_new(j, "idle_seconds", json_real(o->idle));
        /* of the bytes read, those hashed while the rest of their read was in flight */
        json_object_set_new(j, "bytes_hashed_early",
                            json_integer((json_int_t)r->stats.bytes_hashed_early));
        json_fio(j, r, gbps, o->passes);
    } else {
        json_decref(runs);
    }
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt)
        puts(txt);
    free(txt);
    json_decref(j);
}

static void print_fio(const io_result *r, double gbps, int passes)
{
    double fio = fio_median(r);
    if (fio > 0) {
        printf("  fio %.3f GB/s (%s; median of %d:", fio, bench_fio_config(r->fio_huge),
               r->fio_runs);
        for (int k = 0; k < r->fio_runs; k++)
            printf(" %.3f", r->fio_gbps[k]);
        printf(")\n  zo-bench / fio: %.3f", gbps / fio);
        paired_ratio p = fio_paired(r, passes);
        if (p.n >= 4)
            printf(" (pass by pass: median %.3f, middle half %.3f-%.3f)", p.median, p.q1, p.q3);
        printf("\n");
    }
    if (r->fio_note[0])
        printf("  fio: %s\n", r->fio_note);
}

int zo_bench_io_main(int argc, char **argv)
{
    io_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    io_result r;
    memset(&r, 0, sizeof r);
    zo_status st = bench(&o, &r);
    if (st != ZO_OK)
        return 1;
    double gbps = (double)r.bytes / r.seconds / 1e9;
    if (o.json) {
        print_json(&o, &r, gbps);
    } else {
        printf("zo-bench io: %s %.2f GiB in %s, bs %" PRIu64 " KiB, qd %" PRIu64 ", extent %" PRIu64
               " MiB, engine %s, O_DIRECT\n",
               o.rw, (double)o.size / (1u << 30), o.path, o.bs >> 10, o.qd, o.extent >> 20,
               r.engine);
        if (o.passes == 1) {
            printf("  %.3f GB/s (%.3f s)\n", gbps, r.seconds);
        } else {
            printf("  %.3f GB/s (median of %d passes, %.3f s; passes:", gbps, o.passes, r.seconds);
            for (int k = 0; k < o.passes; k++)
                printf(" %.3f", (double)r.bytes / r.pass_seconds[k] / 1e9);
            printf(" GB/s%s)\n", o.idle > 0 ? ", each after the idle rest" : "");
        }
        print_fio(&r, gbps, o.passes);
    }
    return 0;
}
