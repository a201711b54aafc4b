/* zo-train across ranks (ZeRO, --zero-stage): who this process is (from
 * mpirun, srun or torchrun's variables, zo/launch.h), its stderr lines tagged
 * with its rank, the communicator the engine reduces over, and the check at
 * start that every rank runs with the same options. */
#ifndef ZT_RANKS_H
#define ZT_RANKS_H

#include <stdint.h>

#include "trainer.h"
#include "zo/comm.h"

/* o->rank and o->world_size from the launcher's environment (one rank:
 * 0 of 1), and the ranks sharing this node: o->local_size from
 * OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), LOCAL_WORLD_SIZE (torchrun) or
 * SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID (srun), every rank without
 * any; o->local_rank from the launcher (zo/launch.h). */
zo_status zt_ranks_discover(zt_options *o);

/* Local rank r's share of a node's total among its n local ranks: total / n,
 * the first total % n ranks one more, so the shares sum to total. */
uint64_t zt_ranks_share(uint64_t total, int local_rank, int local_size);

/* From now on every line this process writes to stderr (its own and the
 * library's log lines) starts with "[rank R] ". */
zo_status zt_ranks_tag_stderr(int rank);

/* The communicator of the run's ranks (mpi: the engine reduces host
 * buffers), then the options compared across the ranks: ZO_ERR_CONFIG naming
 * the first flag whose value differs on some rank. */
zo_status zt_ranks_open(zo_comm_t *out, zo_device_t dev, const zt_options *o);
/* A second world communicator for device memory: over backend ("nccl" on a
 * GPU), or with backend NULL the host one taking device allocations only
 * (zo_comm_config.device_buffers_only), as NCCL does: the tests' stand-in. */
zo_status zt_ranks_open_device(zo_comm_t *out, zo_device_t dev, const zt_options *o,
                               const char *backend);

/* Every rank's outcome of a collective piece of work (one status each,
 * all-gathered): st when this rank failed, else the first failing rank's
 * status with an error naming it and `what`; ZO_OK when all succeeded. c
 * NULL (one rank): st. */
zo_status zt_ranks_agree(zo_comm_t c, zo_stream_t s, zo_status st, const char *what);

/* The NUMA node for this rank's pinned pool and optimizer threads
 * (zo_engine_config.host_node): on the cpu device with several local ranks
 * and several nodes, the node of the local_rank-th share of the process's
 * cores; else -1, the engine's default (the node nearest the GPU). why says
 * which, for -v. */
int zt_ranks_host_node(const zt_options *o, int cuda, char *why, size_t cap);

#endif
