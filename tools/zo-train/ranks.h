/* zo-train across ranks (ZeRO, --zero-stage): who this process is (from
 * mpirun, srun or torchrun's variables, zo/launch.h), its stderr lines tagged
 * with its rank, the communicator the engine reduces over, and the check at
 * start that every rank runs with the same options. */
#ifndef ZT_RANKS_H
#define ZT_RANKS_H

#include "trainer.h"
#include "zo/comm.h"

/* o->rank and o->world_size from the launcher's environment (one rank:
 * 0 of 1). */
zo_status zt_ranks_discover(zt_options *o);

/* From now on every line this process writes to stderr (its own and the
 * library's log lines) starts with "[rank R] ". */
zo_status zt_ranks_tag_stderr(int rank);

/* The communicator of the run's ranks (mpi: the engine reduces host
 * buffers), then the options compared across the ranks: ZO_ERR_CONFIG naming
 * the first flag whose value differs on some rank. */
zo_status zt_ranks_open(zo_comm_t *out, zo_device_t dev, const zt_options *o);

/* Every rank's outcome of a collective piece of work (one status each,
 * all-gathered): st when this rank failed, else the first failing rank's
 * status with an error naming it and `what`; ZO_OK when all succeeded. c
 * NULL (one rank): st. */
zo_status zt_ranks_agree(zo_comm_t c, zo_stream_t s, zo_status st, const char *what);

#endif
