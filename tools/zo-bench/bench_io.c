/* zo-bench io: sequential read or write bandwidth of the swap store (its
 * engine, O_DIRECT, checksummed extents) on one directory, or the rate of
 * the engine's optimizer-update pipeline (--rw update: each extent read two
 * ahead, written back to an alternate extent behind), to be compared with
 * fio on the same directory:
 *   fio --name=zo --directory=DIR --size=SIZE --bs=BS --iodepth=QD --rw=read|write
 *       --ioengine=io_uring --direct=1 --numjobs=1 --group_reporting */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zo/swap.h"
#include "zo_bench.h"

typedef struct io_opts {
    const char *path, *rw, *engine;
    uint64_t size, bs, qd, extent;
    int json;
} io_opts;

typedef struct io_result {
    double seconds;
    uint64_t bytes;
    zo_swap_stats stats;
    char engine[64];
} io_result;

static void io_usage(FILE *out)
{
    fprintf(out,
            "usage: zo-bench io --path DIR --size BYTES --bs BYTES --qd N --rw read|write|update\n"
            "                   [--engine io_uring|sync] [--extent BYTES] [--json]\n"
            "Reads or writes SIZE bytes in DIR through the swap store with O_DIRECT and prints GB/s\n"
            "(10^9 bytes/s). Sizes take K, M, G, T suffixes (powers of 1024). Extents of --extent bytes\n"
            "(default 64M, like offload chunks) are cut into --bs requests, --qd of them in flight.\n"
            "Untimed passes come first: the data is written (as fio lays out its file), and a read run\n"
            "reads it once before the timed read; a write run times an overwrite. An update run\n"
            "times the offload engine's optimizer pipeline: every extent read (two ahead) and written\n"
            "to an alternate extent (behind), reads and writes counted together. Compare with:\n"
            "  fio --name=zo --directory=DIR --size=SIZE --bs=BS --iodepth=QD --rw=read|write \\\n"
            "      --ioengine=io_uring --direct=1\n");
}

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    /* K, M, G, T: powers of 1024, as fio reads them. */
    const char *unit = *end ? strchr("KMGT", toupper((unsigned char)*end)) : NULL;
    int shift = unit ? 10 * (int)(unit - "KMGT" + 1) : 0;
    if (shift) end++;
    if (*end && strcmp(end, "iB") && strcmp(end, "B")) return -1;
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int parse_opts(int argc, char **argv, io_opts *o)
{
    static const struct option longs[] = {
        {"path", required_argument, 0, 'p'}, {"size", required_argument, 0, 's'},
        {"bs", required_argument, 0, 'b'},   {"qd", required_argument, 0, 'q'},
        {"rw", required_argument, 0, 'r'},   {"engine", required_argument, 0, 'e'},
        {"extent", required_argument, 0, 'x'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},       {0, 0, 0, 0},
    };
    *o = (io_opts){NULL, NULL, "auto", 0, 1u << 20, 32, 64u << 20, 0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        uint64_t *num = c == 's' ? &o->size : c == 'b' ? &o->bs : c == 'q' ? &o->qd : c == 'x' ? &o->extent : NULL;
        if (num && parse_bytes(optarg, num) != 0) {
            fprintf(stderr, "zo-bench io: --%s '%s' is not a size (e.g. 4096, 1M, 2G)\n",
                    c == 's' ? "size" : c == 'b' ? "bs" : c == 'q' ? "qd" : "extent", optarg);
            return 2;
        }
        if (c == 'p') o->path = optarg;
        else if (c == 'r') o->rw = optarg;
        else if (c == 'e') o->engine = optarg;
        else if (c == 'j') o->json = 1;
        else if (c == 'h') return io_usage(stdout), 1;
        else if (!num) return io_usage(stderr), 2;
    }
    const char *bad = !o->path ? "--path is required" : !o->size ? "--size is required (> 0)"
                    : !o->rw || (strcmp(o->rw, "read") && strcmp(o->rw, "write") && strcmp(o->rw, "update"))
                        ? "--rw must be read, write or update"
                    : (o->bs % 4096 || !o->bs) ? "--bs must be a multiple of 4096"
                    : (!o->qd || o->qd > 4096) ? "--qd must be 1..4096"
                    : (o->extent % 4096 || !o->extent) ? "--extent must be a multiple of 4096" : NULL;
    if (bad) {
        fprintf(stderr, "zo-bench io: %s\n", bad);
        return 2;
    }
    if (o->extent > o->size) o->extent = (o->size + 4095) / 4096 * 4096;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One sequential pass over all extents, `depth` extents in flight, each
 * using its own slice of buf. */
static zo_status run_pass(zo_swap_t s, const zo_swap_extent_t *ext, uint64_t n, const io_opts *o, uint8_t *buf,
                          uint64_t depth, int write, uint64_t gen)
{
    zo_swap_io_t *io = calloc(depth, sizeof *io);
    if (!io) return ZO_ERR_NO_MEMORY;
    zo_status st = ZO_OK;
    for (uint64_t i = 0; i < n && st == ZO_OK; i++) {
        uint64_t slot = i % depth;
        if (io[slot]) st = zo_swap_wait(io[slot]);
        io[slot] = NULL;
        if (st != ZO_OK) break;
        size_t len = (size_t)(i + 1 < n ? o->extent : o->size - i * o->extent);
        uint8_t *b = buf + slot * o->extent;
        st = write ? zo_swap_write_async(s, ext[i], b, len, gen, NULL, NULL, &io[slot])
                   : zo_swap_read_async(s, ext[i], b, len, gen, NULL, NULL, &io[slot]);
    }
    for (uint64_t k = 0; k < depth; k++) {
        zo_status w = zo_swap_wait(io[k]);
        if (st == ZO_OK) st = w;
    }
    free(io);
    return st;
}

/* The engine's update pipeline (offload/engine_optim.c, three stages):
 * extent i + 2 is read into a stage whose last write has landed while
 * extent i goes out to its alternate, n + i. */
#define UPDATE_STAGES 3u

static zo_status update_pass(zo_swap_t s, const zo_swap_extent_t *ext, uint64_t n, const io_opts *o, uint8_t *buf)
{
    zo_swap_io_t rd[UPDATE_STAGES] = {0}, wr[UPDATE_STAGES] = {0};
    zo_status st = ZO_OK;
    const uint64_t ahead = UPDATE_STAGES - 1;
#define LEN(i) ((size_t)((i) + 1 < n ? o->extent : o->size - (i) * o->extent))
#define STAGE(i) (buf + ((i) % UPDATE_STAGES) * o->extent)
    for (uint64_t i = 0; i < ahead && i < n && st == ZO_OK; i++)
        st = zo_swap_read_async(s, ext[i], STAGE(i), LEN(i), 1, NULL, NULL, &rd[i]);
    for (uint64_t i = 0; i < n && st == ZO_OK; i++) {
        unsigned k = (unsigned)(i % UPDATE_STAGES);
        st = zo_swap_wait(rd[k]);
        rd[k] = NULL;
        if (st == ZO_OK) st = zo_swap_write_async(s, ext[n + i], STAGE(i), LEN(i), 2, NULL, NULL, &wr[k]);
        if (st == ZO_OK && i + ahead < n) {
            unsigned k2 = (unsigned)((i + ahead) % UPDATE_STAGES);
            st = zo_swap_wait(wr[k2]);
            wr[k2] = NULL;
            if (st == ZO_OK)
                st = zo_swap_read_async(s, ext[i + ahead], STAGE(i + ahead), LEN(i + ahead), 1, NULL, NULL, &rd[k2]);
        }
    }
#undef LEN
#undef STAGE
    for (unsigned k = 0; k < UPDATE_STAGES; k++) {
        zo_status a = zo_swap_wait(rd[k]), b = zo_swap_wait(wr[k]);
        if (st == ZO_OK) st = a != ZO_OK ? a : b;
    }
    return st;
}

static zo_status bench(const io_opts *o, io_result *res)
{
    const char *paths[1] = {o->path};
    zo_swap_config c = ZO_SWAP_CONFIG_INIT;
    c.paths = paths;
    c.npaths = 1;
    c.capacity = o->size;
    c.extent_bytes = o->extent;
    c.engine = o->engine;
    c.queue_depth = (uint32_t)o->qd;
    c.block_size = (uint32_t)o->bs;
    c.name = "zo-bench-io";
    c.reuse = ZO_SWAP_REUSE; /* a file left by an interrupted benchmark is ours to take over */
    uint64_t n = (o->size + o->extent - 1) / o->extent;
    const int update = !strcmp(o->rw, "update");
    if (update) c.capacity = 2 * n * o->extent; /* every extent and its alternate */
    /* Extents in flight: enough to fill qd requests of bs bytes, plus two so
     * that the queue stays full while this thread verifies a finished read
     * (in zo_swap_wait) and hashes the next write. */
    uint64_t depth = (o->qd * o->bs + o->extent - 1) / o->extent + 2;
    if (depth > n) depth = n;
    if (update && depth < UPDATE_STAGES) depth = UPDATE_STAGES;
    zo_swap_t s = NULL;
    zo_swap_extent_t *ext = calloc(update ? 2 * n : n, sizeof *ext);
    uint8_t *buf = NULL;
    if (!ext || posix_memalign((void **)&buf, 4096, depth * o->extent)) {
        free(ext);
        return ZO_ERR_NO_MEMORY;
    }
    /* Incompressible contents. */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint64_t i = 0; i < depth * o->extent / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i * 8, &x, 8);
    }
    zo_status st = zo_swap_open(&c, &s);
    if (st == ZO_OK) st = zo_swap_register_buffer(s, buf, depth * o->extent);
    for (uint64_t i = 0; i < (update ? 2 * n : n) && st == ZO_OK; i++) st = zo_swap_alloc_extent(s, i, &ext[i]);
    int write = !strcmp(o->rw, "write");
    /* Untimed passes first: the data is written (as fio lays out its file),
     * and a read run reads it once more before the timed pass, since a first
     * read right after writing can run at another speed than later ones (on
     * this project's VMs, about half) and fio's repeated runs see later ones. */
    if (st == ZO_OK) st = run_pass(s, ext, n, o, buf, depth, 1, 1);
    if (st == ZO_OK && !write) st = run_pass(s, ext, n, o, buf, depth, 0, 1);
    if (st == ZO_OK && update) st = update_pass(s, ext, n, o, buf); /* warms as the read did */
    double t0 = now_s();
    if (st == ZO_OK) st = update ? update_pass(s, ext, n, o, buf) : run_pass(s, ext, n, o, buf, depth, write, write ? 2 : 1);
    res->seconds = now_s() - t0;
    res->bytes = update ? 2 * o->size : o->size;
    res->stats = (zo_swap_stats)ZO_SWAP_STATS_INIT;
    if (s) {
        zo_swap_get_stats(s, &res->stats);
        snprintf(res->engine, sizeof res->engine, "%s", zo_swap_engine_name(s));
        if (st != ZO_OK) fprintf(stderr, "zo-bench io: %s\n", zo_last_error());
        zo_swap_unregister_buffer(s, buf);
    } else {
        fprintf(stderr, "zo-bench io: %s\n", zo_last_error());
    }
    zo_swap_close(s);
    free(buf);
    free(ext);
    return st;
}

static void print_json(const io_opts *o, const io_result *r, double gbps)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:b}", "bench", "io",
                          "rw", o->rw, "path", o->path, "engine", r->engine, "size", (json_int_t)o->size, "bs",
                          (json_int_t)o->bs, "qd", (json_int_t)o->qd, "extent", (json_int_t)o->extent, "seconds",
                          r->seconds, "gbps", gbps, "requests", (json_int_t)r->stats.requests,
                          "requests_fixed", (json_int_t)r->stats.requests_fixed, "retries",
                          (json_int_t)r->stats.retries, "short_ios", (json_int_t)r->stats.short_ios, "o_direct", 1);
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt) puts(txt);
    free(txt);
    json_decref(j);
}

int zo_bench_io_main(int argc, char **argv)
{
    io_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    io_result r;
    memset(&r, 0, sizeof r);
    zo_status st = bench(&o, &r);
    if (st != ZO_OK) return 1;
    double gbps = (double)r.bytes / r.seconds / 1e9;
    if (o.json) {
        print_json(&o, &r, gbps);
    } else {
        printf("zo-bench io: %s %.2f GiB in %s, bs %" PRIu64 " KiB, qd %" PRIu64 ", extent %" PRIu64
               " MiB, engine %s, O_DIRECT\n",
               o.rw, (double)o.size / (1u << 30), o.path, o.bs >> 10, o.qd, o.extent >> 20, r.engine);
        printf("  %.3f GB/s (%.3f s)\n", gbps, r.seconds);
    }
    return 0;
}
