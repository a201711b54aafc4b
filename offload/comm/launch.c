/* Rank discovery: the caller's configuration and the launchers' environment
 * variables (mpirun, srun, torchrun), checked against each other. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/launch.h"
#include "zo_internal.h"

/* One source of rank, size and local rank: its variables' names. */
typedef struct launch_source {
    const char *launcher;
    const char *rank_var, *size_var, *local_var;
} launch_source;

/* In order of precedence. mpirun inside an sbatch allocation inherits the
 * batch's SLURM_PROCID (0 on every rank), so when mpirun's variables are
 * present SLURM's are not compared with them (see find_conflict). */
static const launch_source sources[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};
enum { N_SOURCES = sizeof sources / sizeof sources[0] };

typedef struct found_ids {
    int present; /* any of the source's variables is set */
    int rank, size, local;
} found_ids;

static zo_status parse_int_var(const char *var, int max, int *out)
{
    const char *s = getenv(var);
    *out = -1;
    if (!s)
        return ZO_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > max)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "%s='%s' is not a number in 0..%d", var, s, max);
    *out = (int)v;
    return ZO_OK;
}

static zo_status read_source(const launch_source *src, found_ids *f)
{
    enum { MAX_RANKS = 1 << 24 };
    ZO_TRY(parse_int_var(src->rank_var, MAX_RANKS, &f->rank));
    ZO_TRY(parse_int_var(src->size_var, MAX_RANKS, &f->size));
    ZO_TRY(parse_int_var(src->local_var, MAX_RANKS, &f->local));
    f->present = f->rank >= 0 || f->size >= 0 || f->local >= 0;
    if (!f->present)
        return ZO_OK;
    if (f->rank < 0 || f->size < 0)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "%s is set but %s is not: %s needs both",
                       f->rank < 0 ? src->size_var : src->rank_var,
                       f->rank < 0 ? src->rank_var : src->size_var, src->launcher);
    if (f->size == 0 || f->rank >= f->size)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "%s=%d is not below %s=%d", src->rank_var, f->rank,
                       src->size_var, f->size);
    return ZO_OK;
}

/* A disagreement between a and b on one value (-1 is "not given"). */
static zo_status compare_value(const char *what_a, int a, const char *what_b, int b)
{
    if (a >= 0 && b >= 0 && a != b)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch",
                       "conflicting ranks: %s=%d but %s=%d (unset one, or launch with one tool)",
                       what_a, a, what_b, b);
    return ZO_OK;
}

static zo_status compare_sources(const launch_source *sa, const found_ids *a,
                                 const launch_source *sb, const found_ids *b)
{
    ZO_TRY(compare_value(sa->rank_var, a->rank, sb->rank_var, b->rank));
    ZO_TRY(compare_value(sa->size_var, a->size, sb->size_var, b->size));
    return compare_value(sa->local_var, a->local, sb->local_var, b->local);
}

static const launch_source config_source = {"config", "config rank", "config world_size",
                                            "config local_rank"};

static zo_status find_conflict(const found_ids *cfg, const found_ids *env)
{
    for (int i = 0; i < N_SOURCES; i++) {
        if (!env[i].present)
            continue;
        ZO_TRY(compare_sources(&config_source, cfg, &sources[i], &env[i]));
        for (int j = i + 1; j < N_SOURCES; j++) {
            int mpirun_in_allocation = i == 0 && !strcmp(sources[j].launcher, "srun");
            if (env[j].present && !mpirun_in_allocation)
                ZO_TRY(compare_sources(&sources[i], &env[i], &sources[j], &env[j]));
        }
    }
    return ZO_OK;
}

static zo_status read_config(const zo_launch_config *cfg, found_ids *f)
{
    *f = (found_ids){0, -1, -1, -1};
    if (!cfg)
        return ZO_OK;
    if (cfg->struct_size != sizeof(zo_launch_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "launch",
                       "zo_launch_config.struct_size is %zu, expected %zu", cfg->struct_size,
                       sizeof(zo_launch_config));
    if (cfg->rank < -1 || cfg->world_size < -1 || cfg->world_size == 0 || cfg->local_rank < -1)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch",
                       "config rank=%d world_size=%d local_rank=%d: use -1 for 'from the "
                       "launcher', else rank >= 0 and world_size >= 1",
                       cfg->rank, cfg->world_size, cfg->local_rank);
    f->rank = cfg->rank;
    f->size = cfg->world_size;
    f->local = cfg->local_rank;
    f->present = f->rank >= 0 || f->size >= 0;
    if (f->present && (f->rank < 0 || f->size < 0))
        return ZO_FAIL(ZO_ERR_CONFIG, "launch",
                       "config gives %s but not %s: give both, or neither to use the launcher's",
                       f->rank < 0 ? "world_size" : "rank", f->rank < 0 ? "rank" : "world_size");
    if (f->present && f->rank >= f->size)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "config rank=%d is not below world_size=%d",
                       f->rank, f->size);
    return ZO_OK;
}

static zo_status read_master(const zo_launch_config *cfg, zo_rank_info *out)
{
    const char *env_addr = getenv("MASTER_ADDR");
    const char *addr = cfg && cfg->master_addr ? cfg->master_addr : env_addr;
    if (cfg && cfg->master_addr && env_addr && strcmp(cfg->master_addr, env_addr))
        return ZO_FAIL(ZO_ERR_CONFIG, "launch",
                       "conflicting rendezvous hosts: config master_addr=%s but MASTER_ADDR=%s",
                       cfg->master_addr, env_addr);
    if (!addr)
        addr = "127.0.0.1";
    if (strlen(addr) >= sizeof out->master_addr || !*addr)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "MASTER_ADDR '%s' is empty or too long", addr);
    snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    int env_port;
    ZO_TRY(parse_int_var("MASTER_PORT", 65535, &env_port));
    int port = cfg && cfg->master_port > 0 ? cfg->master_port : env_port;
    if (cfg && cfg->master_port > 0 && env_port >= 0 && env_port != cfg->master_port)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch",
                       "conflicting rendezvous ports: config master_port=%d but MASTER_PORT=%d",
                       cfg->master_port, env_port);
    if (cfg && (cfg->master_port < 0 || cfg->master_port > 65535))
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "config master_port=%d is not in 1..65535",
                       cfg->master_port);
    out->master_port = port > 0 ? port : 29500;
    return ZO_OK;
}

zo_status zo_launch_discover(const zo_launch_config *cfg, zo_rank_info *out)
{
    if (!out || out->struct_size != sizeof(zo_rank_info))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "launch",
                       "out must be a zo_rank_info set up with ZO_RANK_INFO_INIT");
    found_ids conf, env[N_SOURCES];
    ZO_TRY(read_config(cfg, &conf));
    for (int i = 0; i < N_SOURCES; i++)
        ZO_TRY(read_source(&sources[i], &env[i]));
    ZO_TRY(find_conflict(&conf, env));
    const char *launcher = "none";
    found_ids use = {1, 0, 1, -1};
    if (conf.present) {
        use = conf;
        launcher = "config";
    } else {
        for (int i = N_SOURCES - 1; i >= 0; i--)
            if (env[i].present) {
                use = env[i];
                launcher = sources[i].launcher;
            }
    }
    for (int i = 0; i < N_SOURCES && use.local < 0; i++)
        use.local = env[i].local;
    if (use.local < 0) /* not given anywhere: one node */
        use.local = use.rank;
    out->rank = use.rank;
    out->world_size = use.size;
    out->local_rank = use.local;
    snprintf(out->launcher, sizeof out->launcher, "%s", launcher);
    return read_master(cfg, out);
}
