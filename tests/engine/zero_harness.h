/* What the ZeRO tests (tests/engine/test_engine_zero_*.c, one program per
 * behaviour, each run under mpirun with 1, 2 and 4 ranks) share: a run of the
 * test model on ZeRO's ranks or on the one-rank reference that accumulates
 * their micro-batches, and the checks every behaviour makes against it
 * (zero_harness.c). */
#ifndef ZO_TEST_ZERO_HARNESS_H
#define ZO_TEST_ZERO_HARNESS_H

#include <stdio.h>
#include <unistd.h>

#include "test_model.h"
#include "zo/comm.h"
#include "zo/device.h"
#include "zo/engine_testing.h"
#include "zo_internal.h"

#define STEPS 4
#define CHUNK (8u << 10)

/* The cpu device and the world's communicator every test runs on, this rank and the ranks. */
extern zo_device_t dev;
extern zo_comm_t world;
extern int me, n_ranks;

typedef struct zcfg {
    zo_tier param_home, optim_home;
    int stage;             /* 0: the one-rank reference (grad_accum_steps n_ranks) */
    float max_norm;        /* > 0: clipping */
    int poison_step;       /* >= 0: an infinity in the last micro-batch's gradient at this step */
    int accum;             /* micro-batches per rank and step (the reference: accum x ranks) */
    uint64_t host_bytes;   /* ranks only: the host budget (gradients beyond it spill to NVMe) */
    uint64_t param_cap;    /* param_caps.device (stage 3: over each rank's own chunks) */
    uint64_t persist;      /* zero_persist_elems */
    int gather_only;       /* lookahead 0: each fetch gathers its own layer only */
    zo_optim_mode mode;    /* of the ranks and of the reference alike */
    uint64_t host_cap;     /* param_caps.host (param_home nvme: the rest of the chunks there) */
    int faults;            /* arm the NVMe stores' fault injection (none due) */
    zo_reduce_order order; /* the ranks' (global by default) and their data split */
} zcfg;

typedef struct zrun {
    zo_engine_t eng;
    zo_stream_t compute;
    tm_acts *a;
    int ids[TM_T];
    double losses[STEPS];
    double micro_loss[64]; /* this rank's micro-batches' losses of the current step */
    zo_engine_footprint fp;
    zo_step_stats last;
    char dir[64];
    int gather_only;
    uint64_t persist;
    zo_optim_mode mode;
    uint64_t device_bytes; /* the device allocator's bytes the engine took at finalize */
    uint64_t param_cap;    /* param_caps.device */
    int accum;             /* micro-batches a step on this rank */
} zrun;

zo_status build(zrun *r, const zcfg *z, zo_engine_config *c);
zo_status micro_batch(zrun *r, int step, int micro, int poison);
double global_loss(zo_stream_t s, double mine);
zo_status take_loss(void *p);
int global_micro(const zcfg *z, int rank, int i);
double step_loss(const zcfg *z, zrun *r);
void open_run(const zcfg *z, zrun *r);
void train(const zcfg *z, zrun *r);
void close_run(zrun *r);
uint64_t states_per_chunk(void);
void expect_own_states(const zrun *r, int stage, zo_tier optim_home);
void expect_exact_as(zcfg z);
void expect_exact(zo_tier ph, zo_tier oh, int stage, float max_norm, int poison_step);

/* Opens the device and the world, runs the tests as the group name, closes them. */
int zero_run_tests(const char *name, const struct CMUnitTest *tests, size_t n);

#endif
