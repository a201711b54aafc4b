/* zo-train across ranks: rank discovery, rank-tagged stderr, the
 * communicator and the options' check across the ranks (ranks.h). */
#include "ranks.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensor_parallel.h"
#include "zo/launch.h"
#include "zo/optim_mode.h"
#include "zo/topo.h"
#include "zt_error.h"
#include "zt_tiers.h"

/* A positive integer from the environment, or 0. */
static int env_count(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : 0;
    return v && end != v && *end == 0 && n > 0 && n < (1 << 24) ? (int)n : 0;
}

/* Slurm's tasks on node `node` from a list such as "4(x2),3": 0 when it
 * cannot be read. */
static int slurm_tasks_on(const char *list, int node)
{
    for (const char *p = list; p && *p;) {
        char *end;
        long n = strtol(p, &end, 10), times = 1;
        if (end == p || n <= 0)
            return 0;
        if (strncmp(end, "(x", 2) == 0) {
            times = strtol(end + 2, &end, 10);
            if (times <= 0 || *end++ != ')')
                return 0;
        }
        if (node < times)
            return (int)n;
        node -= (int)times;
        p = *end == ',' ? end + 1 : NULL;
    }
    return 0;
}

/* The ranks on this node: mpirun's, torchrun's, or Slurm's count; without
 * any, every rank is taken to be local (one node). */
static int local_size(int world_size, const char **from)
{
    int n = env_count("OMPI_COMM_WORLD_LOCAL_SIZE");
    *from = "OMPI_COMM_WORLD_LOCAL_SIZE";
    if (!n) {
        n = env_count("LOCAL_WORLD_SIZE");
        *from = "LOCAL_WORLD_SIZE";
    }
    if (!n && getenv("SLURM_NODEID")) {
        const char *list = getenv("SLURM_STEP_TASKS_PER_NODE");
        n = slurm_tasks_on(list ? list : getenv("SLURM_TASKS_PER_NODE"), env_count("SLURM_NODEID"));
        *from = "SLURM_STEP_TASKS_PER_NODE";
    }
    if (!n) {
        n = world_size;
        *from = "no launcher variable: every rank on this node";
    }
    return n;
}

zo_status zt_ranks_discover(zt_options *o)
{
    zo_rank_info ri = ZO_RANK_INFO_INIT;
    zo_status st = zo_launch_discover(NULL, &ri);
    if (st < 0)
        return zt_lib_fail(st, "zo_launch_discover");
    o->rank = ri.rank;
    o->world_size = ri.world_size;
    o->local_size = 1;
    o->local_rank = 0;
    if (ri.world_size <= 1)
        return ZO_OK;
    o->local_size = local_size(ri.world_size, &o->local_from);
    o->local_rank = ri.local_rank >= 0 ? ri.local_rank : ri.rank % o->local_size;
    if (o->local_rank >= o->local_size)
        return zt_fail(ZO_ERR_CONFIG, "local rank %d but %d ranks on this node (%s)", o->local_rank,
                       o->local_size, o->local_from);
    return ZO_OK;
}

uint64_t zt_ranks_share(uint64_t total, int local_rank, int local_size)
{
    if (local_size <= 1)
        return total;
    uint64_t n = (uint64_t)local_size, r = (uint64_t)local_rank;
    return total / n + (r < total % n); /* the first ranks one byte more: the shares sum to total */
}

/* ---- stderr tagged with the rank ---- */

typedef struct tagger {
    int in, out; /* the pipe's read end, the real stderr */
    char tag[32];
} tagger;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Copies the pipe to the real stderr, the tag at the start of every line.
 * Each line goes out in one write with its tag in front: the ranks' stderr
 * meet in one stream (mpirun forwards them), and a tag written apart from
 * its line can land in front of another rank's line. A line longer than the
 * buffer goes out in pieces; one cut short by the end is written at the end. */
static void *tag_lines(void *arg)
{
    tagger *t = arg;
    char in[4096], line[8192];
    size_t tag = strlen(t->tag), len = 0;
    ssize_t n;
    while ((n = read(t->in, in, sizeof in)) > 0)
        for (ssize_t i = 0; i < n; i++) {
            if (len == 0) {
                memcpy(line, t->tag, tag);
                len = tag;
            }
            line[len++] = in[i];
            if (in[i] == '\n' || in[i] == '\r' || len == sizeof line) {
                write_all(t->out, line, len);
                len = 0;
            }
        }
    write_all(t->out, line, len);
    return NULL;
}

static tagger tags; /* lives as long as the process: stderr is written to the end */
static pthread_t tag_thread;

/* At exit: stderr back on its own file, which closes the pipe; what is
 * still in it is tagged and written before the process ends. */
static void drain_tags(void)
{
    fflush(stderr);
    dup2(tags.out, STDERR_FILENO);
    pthread_join(tag_thread, NULL);
}

zo_status zt_ranks_tag_stderr(int rank)
{
    tagger *t = &tags;
    int fds[2];
    fflush(stderr);
    t->out = dup(STDERR_FILENO);
    if (t->out < 0 || pipe(fds) != 0)
        return zt_fail(ZO_ERR_SYSTEM, "tagging stderr with the rank: no pipe");
    t->in = fds[0];
    snprintf(t->tag, sizeof t->tag, "[rank %d] ", rank);
    if (dup2(fds[1], STDERR_FILENO) < 0)
        return zt_fail(ZO_ERR_SYSTEM, "tagging stderr with the rank: dup2");
    close(fds[1]);
    setvbuf(stderr, NULL, _IOLBF, 0);
    if (pthread_create(&tag_thread, NULL, tag_lines, t) != 0)
        return zt_fail(ZO_ERR_SYSTEM, "tagging stderr with the rank: no thread");
    atexit(drain_tags);
    return ZO_OK;
}

/* ---- the communicator and the options' check ---- */

enum { N_KEYS = 28, VALUE_BYTES = 96 };

typedef struct keyset {
    const char *keys[N_KEYS];
    char values[N_KEYS][VALUE_BYTES];
    size_t n;
} keyset;

static void put(keyset *k, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void put_float(keyset *k, const char *flag, float v)
{
    char text[32];
    for (int digits = 1; digits <= 9; digits++) { /* 9 digits always round-trip a float */
        snprintf(text, sizeof text, "%.*g", digits, (double)v);
        if (strtof(text, NULL) == v || digits == 9 || v != v)
            break;
    }
    put(k, flag, "%s", text);
}

/* --offload-param/--offload-optimizer's words: none (device), cpu, nvme, or
 * the default (not given). */
static const char *home_name(int home)
{
    return home == ZT_HOME_DEFAULT ? "default" : zt_home_name((zo_tier)home);
}

static void put(keyset *k, const char *flag, const char *fmt, ...)
{
    if (k->n == N_KEYS)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->values[k->n], VALUE_BYTES, fmt, ap);
    va_end(ap);
    k->keys[k->n++] = flag;
}

/* The options that must agree across ranks, under their flags' names (what
 * a rank may set its own way, such as --nvme-path, is not among them), as a
 * user writes them: floats in the fewest digits that read back as the same
 * float (so equal text is equal value: 0.001, not 0x1.0624dep-10), enums by
 * name. */
static void option_keys(const zt_options *o, keyset *k)
{
    const zt_shape *s = &o->shape;
    put(k, "--zero-stage", "%d", o->zero_stage);
    put(k, "--steps", "%d", o->steps);
    put(k, "--seq", "%d", o->seq);
    put(k, "--micro-batch", "%d", o->micro_batch);
    put(k, "--grad-accum", "%d", o->grad_accum);
    put_float(k, "--lr", o->lr);
    put_float(k, "--weight-decay", o->weight_decay);
    put_float(k, "--max-grad-norm", o->max_grad_norm);
    put(k, "--seed", "%llu", (unsigned long long)o->seed);
    put(k, "--dtype", "%s", zo_dtype_name(o->dtype));
    put(k, "--state-dtype", "%s", zt_state_dtype_name(o->state_dtype));
    put(k, "--master-split", "%d", o->master_split);
    put(k, "--embedding-f32-states", "%d", o->embedding_f32);
    put(k, "--reduce-order", "%s", o->reduce_order == ZO_REDUCE_ORDER_RANK ? "rank" : "global");
    put(k, "--optimizer-mode", "%s", zo_optim_mode_name(o->mode));
    put(k, "--offload-param", "%s", home_name(o->param_home));
    put(k, "--offload-optimizer", "%s", home_name(o->optim_home));
    put(k, "--chunk-bytes", "%llu", (unsigned long long)o->chunk_bytes);
    put(k, "--micro-group", "%d", o->micro_group);
    /* stage 3: the gathers follow the lookahead and the persistence */
    put(k, "zoffload.prefetch_lookahead", "%d", o->lookahead);
    put(k, "zero_optimization.stage3_param_persistence_threshold", "%llu",
        (unsigned long long)o->zero_persist);
    put(k, "--data", "%s", o->data_path ? o->data_path : "");
    put(k, "--vocab", "%d", s->vocab);
    put(k, "--dim", "%d", s->dim);
    put(k, "--layers", "%d", s->n_layers);
    put(k, "--heads", "%d", s->n_heads);
    put(k, "--ffn", "%d", s->ffn_dim);
    put(k, "model n_kv_heads", "%d", s->n_kv_heads);
    put(k, "model head_dim", "%d", s->head_dim);
}

zo_status zt_ranks_open_device(zo_comm_t *out, zo_device_t dev, const zt_options *o,
                               const char *backend)
{
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = backend ? backend : o->comm_backend ? o->comm_backend : "host";
    cc.device_buffers_only = backend == NULL;
    cc.device = dev;
    cc.launch.rank = o->rank;
    cc.launch.world_size = o->world_size;
    cc.timeout_s = o->comm_timeout_s;
    if (backend && !zo_comm_backend_built(backend))
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--tensor-parallel on a GPU all-reduces device memory over %s, which this "
                       "build lacks: rebuild with it (the CUDA toolkit's NCCL)",
                       backend);
    zo_status st = zo_comm_init(out, &cc);
    return st < 0 ? zt_fail(st, "joining %d ranks over %s for device memory: %s", o->world_size,
                            cc.backend, zt_lib_message())
                  : ZO_OK;
}

zo_status zt_ranks_open(zo_comm_t *out, zo_device_t dev, const zt_options *o)
{
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = o->comm_backend ? o->comm_backend : "host";
    cc.device = dev;
    cc.launch.rank = o->rank;
    cc.launch.world_size = o->world_size;
    cc.timeout_s = o->comm_timeout_s;
    zo_status st = zo_comm_init(out, &cc);
    if (st < 0)
        return zt_fail(st,
                       "joining %d ranks: %s (the engine reduces host buffers: over mpi under "
                       "mpirun or srun, over tcp under torchrun)",
                       o->world_size, zt_lib_message());
    if (o->verbose)
        fprintf(stderr, "zo-train: rank %d of %d joined the others over the %s communicator\n",
                o->rank, o->world_size, zo_comm_backend(*out));
    keyset k = {0};
    option_keys(o, &k);
    const char *values[N_KEYS];
    for (size_t i = 0; i < k.n; i++)
        values[i] = k.values[i];
    st = zo_comm_check_config(*out, k.keys, values, k.n);
    if (st < 0)
        return zt_fail(st, "the ranks disagree: %s", zt_lib_message());
    return ZO_OK;
}

/* ---- agreeing on an outcome ---- */

zo_status zt_ranks_agree(zo_comm_t c, zo_stream_t s, zo_status st, const char *what)
{
    if (!c)
        return st;
    int n = zo_comm_size(c);
    int32_t mine = st, *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return zt_fail(ZO_ERR_NO_MEMORY, "%s: the ranks' outcomes", what);
    zo_status cs = zt_host_all_gather(c, s, NULL, 0, &mine, all, sizeof mine);
    int bad = -1;
    for (int r = 0; cs >= 0 && r < n && bad < 0; r++)
        bad = all[r] < 0 ? r : -1;
    zo_status other = bad >= 0 ? (zo_status)all[bad] : ZO_OK;
    free(all);
    if (cs < 0)
        return zt_fail(cs, "%s: the ranks could not agree: %s", what, zt_lib_message());
    if (st < 0 || bad < 0)
        return st; /* this rank's own failure keeps its message */
    return zt_fail(other, "%s failed on rank %d (its log says why)", what, bad);
}

/* ---- the NUMA node of a rank's optimizer threads ---- */

/* The OS node holding cpu, or -1. */
static int node_of_cpu(int cpu)
{
    int cpus[1024], n = 0;
    for (int i = 0; i < zo_topo_numa_node_count(); i++) {
        zo_topo_node nd = ZO_TOPO_NODE_INIT;
        if (zo_topo_get_node(i, &nd) != ZO_OK ||
            zo_topo_node_cpu_list(nd.node, cpus, 1024, &n) != ZO_OK)
            continue;
        for (int k = 0; k < n && k < 1024; k++)
            if (cpus[k] == cpu)
                return nd.node;
    }
    return -1;
}

int zt_ranks_host_node(const zt_options *o, int cuda, char *why, size_t cap)
{
    if (o->local_size <= 1) {
        snprintf(why, cap, "one rank on this node: the engine's default node");
        return -1;
    }
    if (cuda) {
        snprintf(why, cap, "the NUMA node nearest this rank's GPU (the engine's default)");
        return -1;
    }
    if (zo_topo_numa_node_count() <= 1) {
        snprintf(why, cap, "one NUMA node on this machine: nothing to bind");
        return -1;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) == 0) {
        snprintf(why, cap, "the process's cores are unknown: the engine's default node");
        return -1;
    }
    int n = CPU_COUNT(&set), want = (int)((int64_t)o->local_rank * n / o->local_size), cpu = -1;
    for (int c = 0, k = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &set) && k++ == want)
            cpu = c;
    int node = node_of_cpu(cpu);
    snprintf(why, cap, "the node of core %d, the first of local rank %d's share (1/%d) of %d cores",
             cpu, o->local_rank, o->local_size, n);
    return node;
}
