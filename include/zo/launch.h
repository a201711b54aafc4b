/* zoffload: launch and rank discovery for multi-rank runs.
 *
 * A process learns its rank, the world size and its rank on its node from an
 * explicit configuration or from the launcher's environment: mpirun
 * (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), srun (SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID) or torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT). Two sources that disagree are refused, naming
 * both variables. Ranks without MPI meet over TCP: rank 0 serves the others
 * on MASTER_ADDR:MASTER_PORT (zo_launch_rendezvous), which is how NCCL's
 * unique id travels when MPI is absent. */
#ifndef ZO_LAUNCH_H
#define ZO_LAUNCH_H

#include <stddef.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the caller states; -1 (or NULL, 0) leaves a field to the launcher. */
typedef struct zo_launch_config {
    size_t struct_size;
    int rank, world_size, local_rank;
    const char *master_addr; /* TCP rendezvous host; NULL: MASTER_ADDR or 127.0.0.1 */
    int master_port;         /* 0: MASTER_PORT or 29500 */
} zo_launch_config;

#define ZO_LAUNCH_CONFIG_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(zo_launch_config), .rank = -1, .world_size = -1, .local_rank = -1    \
    }

typedef struct zo_rank_info {
    size_t struct_size;
    int rank, world_size, local_rank;
    char launcher[16];     /* "config", "mpirun", "srun", "torchrun", or "none" (one rank) */
    char master_addr[256]; /* the TCP rendezvous host */
    int master_port;
} zo_rank_info;

#define ZO_RANK_INFO_INIT                                                                          \
    {                                                                                              \
        .struct_size = sizeof(zo_rank_info)                                                        \
    }

/* Fills out from cfg (may be NULL) and the environment. With no source at all
 * the process is rank 0 of 1 ("none"). ZO_ERR_CONFIG, naming the variables,
 * when sources disagree, a value is not a number in range, or a launcher's
 * variables are incomplete (RANK without WORLD_SIZE). */
ZO_API zo_status zo_launch_discover(const zo_launch_config *cfg, zo_rank_info *out);

/* Gathers `bytes` bytes from every rank over TCP: rank 0 listens on
 * master_addr:master_port, the others connect (retrying until timeout_s), each
 * sends its block and receives all world_size blocks in rank order into all.
 * A rank that does not arrive within timeout_s fails every rank with
 * ZO_ERR_IO naming the missing ranks. */
ZO_API zo_status zo_launch_rendezvous(const zo_rank_info *ri, const void *mine, void *all,
                                      size_t bytes, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
