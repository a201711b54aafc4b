/* zo-bench comm: bus bandwidth of the communicator's collectives, beside the
 * backend's own call on the same buffers in the same run (for mpi:
 * MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, made on
 * the communicator's progress thread through zo_comm_run_native). Bus
 * bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw times
 * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for
 * broadcast; bytes is the whole vector (all-reduce, broadcast), the whole
 * input (reduce-scatter) or the whole output (all-gather). Each repetition
 * times both, in alternating order, from a barrier; a repetition's time is
 * the slowest rank's, and the median repetition is reported. Run it under
 * the launcher: mpirun -np 4 zo-bench comm. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/comm.h"
#include "zo/units.h"
#include "zo_bench.h"
#ifdef ZO_HAVE_MPI
#include <mpi.h>
#endif

enum { MAX_REPS = 101 };

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        zo_status try_st_ = (expr);                                                                \
        if (try_st_ < 0)                                                                           \
            return try_st_;                                                                        \
    } while (0)

static float *alloc_floats(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, 2u << 20, n * sizeof(float)) ? NULL : p;
}

typedef enum { OP_AR, OP_RS, OP_AG, OP_BC, OP_AR_EXACT, OP_RS_EXACT, N_OPS } comm_op;

static const char *const op_names[] = {"all-reduce", "reduce-scatter",   "all-gather",
                                       "broadcast",  "all-reduce-exact", "reduce-scatter-exact"};
static const char *const native_names[] = {"MPI_Allreduce", "MPI_Reduce_scatter_block",
                                           "MPI_Allgather", "MPI_Bcast",
                                           "MPI_Allreduce", "MPI_Reduce_scatter_block"};

typedef struct comm_opts {
    uint64_t min, max;
    int factor, reps, json;
    int ops[N_OPS];
    const char *backend;
} comm_opts;

typedef struct comm_run {
    zo_comm_t c;
    zo_stream_t s;
    int n, me;
    float *send, *recv;
} comm_run;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: mpirun -np N zo-bench comm [--min BYTES] [--max BYTES] [--factor F] [--reps R]\n"
           "                                 [--ops LIST] [--backend mpi|self] [--json]\n"
           "  --min, --max  sizes from min to max, times F each step (default 1M to 256M, F 2)\n"
           "  --reps R      timed repetitions of each call, interleaved (default 5, median)\n"
           "  --ops LIST    of all-reduce, reduce-scatter, all-gather, broadcast,\n"
           "                all-reduce-exact, reduce-scatter-exact (default the first four)\n"
           "  --json        one JSON object on stdout (rank 0)\n"
           "Bus bandwidth as nccl-tests defines it (GB/s, 10^9 bytes/s) of zoffload's\n"
           "collective (fp32 sums) and of the backend's own call on the same buffers;\n"
           "ratio = zoffload's busbw / the backend's. The exact rows compare the rank-order\n"
           "chain with the backend's own (unordered) reduction.\n");
}

static int parse_ops(const char *list, int *ops)
{
    memset(ops, 0, sizeof(int) * N_OPS);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < N_OPS && strcmp(t, op_names[k]))
            k++;
        if (k == N_OPS) {
            fprintf(stderr,
                    "zo-bench comm: unknown op '%s': use all-reduce, reduce-scatter, all-gather, "
                    "broadcast, all-reduce-exact or reduce-scatter-exact\n",
                    t);
            return -1;
        }
        ops[k] = 1;
    }
    return 0;
}

static int parse_size(const char *what, const char *s, uint64_t *out)
{
    if (zo_parse_bytes(s, out) < 0 || *out < 1024 || *out > (1ull << 34)) {
        fprintf(stderr, "zo-bench comm: %s '%s' is not a size from 1K to 16G (e.g. 64M)\n", what,
                s);
        return -1;
    }
    return 0;
}

static int parse_int(const char *what, const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s || v < lo || v > hi) {
        fprintf(stderr, "zo-bench comm: %s '%s' is not a number from %d to %d\n", what, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_opts(int argc, char **argv, comm_opts *o)
{
    static const struct option longs[] = {
        {"min", required_argument, 0, 'a'},
        {"max", required_argument, 0, 'b'},
        {"factor", required_argument, 0, 'f'},
        {"reps", required_argument, 0, 'r'},
        {"ops", required_argument, 0, 'o'},
        {"backend", required_argument, 0, 'k'},
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (comm_opts){1u << 20, 256u << 20, 2, 5, 0, {1, 1, 1, 1, 0, 0}, "mpi"};
    optind = 1;
    int c, rc = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'a': rc = parse_size("--min", optarg, &o->min); break;
        case 'b': rc = parse_size("--max", optarg, &o->max); break;
        case 'f': rc = parse_int("--factor", optarg, 2, 1024, &o->factor); break;
        case 'r': rc = parse_int("--reps", optarg, 1, MAX_REPS, &o->reps); break;
        case 'o': rc = parse_ops(optarg, o->ops); break;
        case 'k': o->backend = optarg; break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "zo-bench comm: unexpected argument '%s'\n", argv[optind]);
        rc = -1;
    }
    if (rc == 0 && o->min > o->max) {
        fprintf(stderr, "zo-bench comm: --min is above --max\n");
        rc = -1;
    }
    return rc;
}

/* Element counts of op at `bytes` on n ranks (the whole vector's). */
static size_t elems(uint64_t bytes, int n)
{
    size_t e = bytes / sizeof(float);
    return e / (size_t)n * (size_t)n;
}

static zo_status run_zo(comm_run *r, comm_op op, size_t cnt)
{
    zo_comm_t c = r->c;
    size_t per = cnt / (size_t)r->n;
    switch (op) {
    case OP_AR:
    case OP_AR_EXACT:
        return zo_comm_all_reduce(c, r->s, r->send, r->recv, cnt, ZO_DTYPE_F32,
                                  op == OP_AR ? ZO_REDUCE_FAST : ZO_REDUCE_EXACT);
    case OP_RS:
    case OP_RS_EXACT:
        return zo_comm_reduce_scatter(c, r->s, r->send, r->recv, per, ZO_DTYPE_F32,
                                      op == OP_RS ? ZO_REDUCE_FAST : ZO_REDUCE_EXACT);
    case OP_AG: return zo_comm_all_gather(c, r->s, r->send, r->recv, per, ZO_DTYPE_F32);
    default: return zo_comm_broadcast(c, r->s, r->recv, cnt, ZO_DTYPE_F32, 0);
    }
}

/* One timed zoffload call from a barrier: this rank's seconds. */
static zo_status time_zo(comm_run *r, comm_op op, size_t cnt, double *sec)
{
    TRY(zo_comm_barrier(r->c, r->s));
    TRY(zo_stream_synchronize(r->s));
    uint64_t t0 = zo_now_ns();
    TRY(run_zo(r, op, cnt));
    TRY(zo_stream_synchronize(r->s));
    *sec = (double)(zo_now_ns() - t0) * 1e-9;
    return ZO_OK;
}

#ifdef ZO_HAVE_MPI
typedef struct native_call {
    comm_run *r;
    comm_op op;
    size_t cnt;
    double sec;
} native_call;

/* On the progress thread: the backend's own call, from a barrier. */
static zo_status run_native(void *native, void *arg)
{
    native_call *nc = arg;
    MPI_Comm comm = *(MPI_Comm *)native;
    comm_run *r = nc->r;
    int per = (int)(nc->cnt / (size_t)r->n), cnt = (int)nc->cnt, rc;
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    switch (nc->op) {
    case OP_AR:
    case OP_AR_EXACT: rc = MPI_Allreduce(r->send, r->recv, cnt, MPI_FLOAT, MPI_SUM, comm); break;
    case OP_RS:
    case OP_RS_EXACT:
        rc = MPI_Reduce_scatter_block(r->send, r->recv, per, MPI_FLOAT, MPI_SUM, comm);
        break;
    case OP_AG: rc = MPI_Allgather(r->send, per, MPI_FLOAT, r->recv, per, MPI_FLOAT, comm); break;
    default: rc = MPI_Bcast(r->recv, cnt, MPI_FLOAT, 0, comm); break;
    }
    nc->sec = MPI_Wtime() - t0;
    return rc == MPI_SUCCESS ? ZO_OK : ZO_ERR_MPI;
}
#endif

static zo_status time_native(comm_run *r, comm_op op, size_t cnt, double *sec)
{
#ifdef ZO_HAVE_MPI
    if (!strcmp(zo_comm_backend(r->c), "mpi")) {
        native_call nc = {r, op, cnt, 0};
        TRY(zo_comm_run_native(r->c, run_native, &nc));
        *sec = nc.sec;
        return ZO_OK;
    }
#endif
    *sec = 0; /* no own call to compare with */
    return ZO_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median over repetitions of the slowest rank's time. */
static zo_status slowest_median(comm_run *r, const double *mine, int reps, double *out)
{
    double *all = malloc(sizeof(double) * (size_t)reps * (size_t)r->n);
    double *slow = calloc((size_t)reps, sizeof(double));
    zo_status st = all && slow ? ZO_OK : ZO_ERR_NO_MEMORY;
    if (st == ZO_OK)
        st = zo_comm_all_gather(r->c, r->s, mine, all, (size_t)reps, ZO_DTYPE_F64);
    if (st == ZO_OK)
        st = zo_stream_synchronize(r->s);
    for (int k = 0; st == ZO_OK && k < reps; k++)
        for (int q = 0; q < r->n; q++)
            if (all[(size_t)q * (size_t)reps + (size_t)k] > slow[k])
                slow[k] = all[(size_t)q * (size_t)reps + (size_t)k];
    if (st == ZO_OK) {
        qsort(slow, (size_t)reps, sizeof(double), cmp_double);
        *out = slow[reps / 2];
    }
    free(all);
    free(slow);
    return st;
}

typedef struct comm_result {
    comm_op op;
    uint64_t bytes;
    double zo_s, native_s, zo_busbw, native_busbw;
} comm_result;

static double bus_factor(comm_op op, int n)
{
    switch (op) {
    case OP_AR:
    case OP_AR_EXACT: return 2.0 * (n - 1) / n;
    case OP_RS:
    case OP_RS_EXACT:
    case OP_AG: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

static zo_status measure(comm_run *r, const comm_opts *o, comm_op op, uint64_t bytes,
                         comm_result *res)
{
    size_t cnt = elems(bytes, r->n);
    double zt[MAX_REPS], nt[MAX_REPS];
    /* one untimed round each: first-touch, connections, the algorithms' buffers */
    TRY(time_zo(r, op, cnt, &zt[0]));
    TRY(time_native(r, op, cnt, &nt[0]));
    for (int k = 0; k < o->reps; k++) {
        if (k & 1) {
            TRY(time_native(r, op, cnt, &nt[k]));
            TRY(time_zo(r, op, cnt, &zt[k]));
        } else {
            TRY(time_zo(r, op, cnt, &zt[k]));
            TRY(time_native(r, op, cnt, &nt[k]));
        }
    }
    res->op = op;
    res->bytes = cnt * sizeof(float);
    TRY(slowest_median(r, zt, o->reps, &res->zo_s));
    TRY(slowest_median(r, nt, o->reps, &res->native_s));
    double f = bus_factor(op, r->n);
    res->zo_busbw = res->zo_s > 0 ? (double)res->bytes / res->zo_s * f * 1e-9 : 0;
    res->native_busbw = res->native_s > 0 ? (double)res->bytes / res->native_s * f * 1e-9 : 0;
    return ZO_OK;
}

static void print_human(const comm_run *r, const comm_opts *o, const comm_result *res, int nres)
{
    printf("zo-bench comm: backend %s, %d ranks, fp32, median of %d reps of the slowest rank\n",
           zo_comm_backend(r->c), r->n, o->reps);
    printf("busbw (GB/s) as nccl-tests: all-reduce x 2(n-1)/n, reduce-scatter and all-gather x "
           "(n-1)/n, broadcast x 1\n");
    printf("%-21s %9s %10s %10s %10s %7s  %s\n", "op", "bytes", "zo ms", "zo busbw", "own busbw",
           "ratio", "own call");
    for (int i = 0; i < nres; i++) {
        char sz[32];
        zo_fmt_bytes(sz, sizeof sz, res[i].bytes);
        double ratio = res[i].native_busbw > 0 ? res[i].zo_busbw / res[i].native_busbw : 0;
        printf("%-21s %9s %10.3f %10.2f %10.2f %7.3f  %s\n", op_names[res[i].op], sz,
               res[i].zo_s * 1e3, res[i].zo_busbw, res[i].native_busbw, ratio,
               res[i].native_busbw > 0 ? native_names[res[i].op] : "(none)");
    }
}

static void print_json(const comm_run *r, const comm_opts *o, const comm_result *res, int nres)
{
    json_t *arr = json_array();
    for (int i = 0; i < nres; i++) {
        double ratio = res[i].native_busbw > 0 ? res[i].zo_busbw / res[i].native_busbw : 0;
        json_array_append_new(
            arr, json_pack("{s:s,s:I,s:f,s:f,s:f,s:f,s:f,s:s}", "op", op_names[res[i].op], "bytes",
                           (json_int_t)res[i].bytes, "zo_seconds", res[i].zo_s, "zo_busbw_gbs",
                           res[i].zo_busbw, "own_seconds", res[i].native_s, "own_busbw_gbs",
                           res[i].native_busbw, "ratio", ratio, "own_call",
                           res[i].native_busbw > 0 ? native_names[res[i].op] : ""));
    }
    json_t *root = json_pack("{s:s,s:i,s:i,s:s,s:o}", "backend", zo_comm_backend(r->c), "ranks",
                             r->n, "reps", o->reps, "dtype", "fp32", "results", arr);
    char *text = json_dumps(root, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(root);
}

static zo_status setup(comm_run *r, const comm_opts *o, zo_device_t *dev)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    TRY(zo_device_init(dev, &dc));
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.device = *dev;
    cc.backend = o->backend;
    TRY(zo_comm_init(&r->c, &cc));
    TRY(zo_stream_create(*dev, &r->s));
    r->n = zo_comm_size(r->c);
    r->me = zo_comm_rank(r->c);
    size_t cnt = elems(o->max, r->n) + (size_t)r->n;
    r->send = alloc_floats(cnt);
    r->recv = alloc_floats(cnt);
    if (!r->send || !r->recv)
        return ZO_ERR_NO_MEMORY;
    for (size_t i = 0; i < cnt; i++) {
        r->send[i] = (float)(i % 1000) * 0.001f;
        r->recv[i] = 0;
    }
    return ZO_OK;
}

int zo_bench_comm_main(int argc, char **argv)
{
    comm_opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;
    comm_run r = {0};
    zo_device_t dev = NULL;
    comm_result res[N_OPS * 32];
    int nres = 0;
    zo_status st = setup(&r, &o, &dev);
    if (st == ZO_OK && r.n < 2) {
        fprintf(stderr, "zo-bench comm: one rank, so nothing crosses a link: run it under the "
                        "launcher with two ranks or more (mpirun -np 4 zo-bench comm)\n");
        zo_stream_destroy(r.s);
        zo_comm_free(r.c);
        zo_device_free(dev);
        free(r.send);
        free(r.recv);
        return 2;
    }
    for (uint64_t b = o.min; st == ZO_OK && b <= o.max && nres < N_OPS * 32;
         b *= (uint64_t)o.factor)
        for (int op = 0; op < N_OPS && st == ZO_OK; op++)
            if (o.ops[op])
                st = measure(&r, &o, (comm_op)op, b, &res[nres++]);
    if (st != ZO_OK)
        fprintf(stderr, "zo-bench comm: rank %d: %s\n", r.me,
                *zo_last_error() ? zo_last_error() : zo_status_str(st));
    else if (r.me == 0)
        o.json ? print_json(&r, &o, res, nres) : print_human(&r, &o, res, nres);
    free(r.send);
    free(r.recv);
    zo_stream_destroy(r.s);
    zo_comm_free(r.c);
    zo_device_free(dev);
    return st == ZO_OK ? 0 : 1;
}
