/* Internal state of the offload engine, shared by its files. Calls between
 * them go one way: a file calls only the files on the lines below its own
 * (not those beside it), directly or through the mode, reducer and tier tables
 * (engine_tier.h); nothing calls up, so no files call each other around.
 * The ctest check_engine_order reads this list and holds the objects' calls
 * to it (tools/scripts/check-engine-order.py):
 *   engine_api.c, engine_state.c
 *                              the public API: configuration, registration,
 *                              the step protocol; checkpoints
 *   engine_finalize.c          finalize: every tier allocated as planned, the
 *                              initial states placed
 *   engine_plan.c              packing, the homes and the footprint (the
 *                              planner's too)
 *   engine_place.c             per-chunk homes: the fastest tier first, up to
 *                              its cap
 *   engine_sync.c, engine_overlap.c, engine_dpu.c
 *                              the optimizer modes (eng_mode_ops)
 *   engine_behind.c            overlap's update behind the next forward: its
 *                              thread, the fetches' per-chunk waits, the join
 *   engine_group.c             layer-major micro-batch groups: the gradient
 *                              slots' fp32 sums on the device
 *   engine_optim.c             the host job thread, the update of every chunk
 *   engine_reduce.c            the gradient path's reducers (eng_reducer_ops):
 *                              the chain, its front end, the local reducer
 *   engine_zero.c              ZeRO: chunk owners, the reductions over the
 *                              ranks, the owners' 16-bit broadcast (ZeRO's
 *                              reducer), the table of the states other ranks
 *                              own
 *   engine_pipe.c              pipeline stages: the verdict over every stage's
 *                              chunks (the pipeline's reducer)
 *   engine_sched.c             trace, residency, prefetch, eviction, publish
 *   engine_tier.c              the tier tables' registry; a step's update
 *                              committed or discarded through them
 *   engine_tier_device.c       the tiers (engine_tier.h); the device's keeps
 *                              the host tier's copies behind its slots
 *   engine_tier_host.c, engine_tier_nvme.c
 *   engine_zero_loads.c        ZeRO as a chunk's load sees it: gathered,
 *                              stale copies, failed loads kept
 *   engine_grads.c             the host side of the 16-bit gradients: pinned
 *                              mirrors or the staging ring, kept in host
 *                              memory or spilled to NVMe, read back
 *   engine_tier_common.c       what the tiers share
 *   engine_io.c                timelines, stream timers, traced NVMe requests */
#ifndef ZO_ENGINE_INTERNAL_H
#define ZO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "zo/engine.h"
#include "zo/hostpool.h"
#include "zo/swap.h"
#include "zo_internal.h"

#define ENG_SUBSYS "offload"
/* Tensor offsets inside a chunk are aligned to this many elements (256 B). */
#define ENG_TENSOR_ALIGN 128u
/* NVMe state staging slots: read chunk i+2 while updating i+1 and writing i. */
#define ENG_NVME_STAGES 3u
/* eng_chunk.reload: from the home's 16-bit copy, or from the committed master */
#define ENG_RELOAD_HOME   1
#define ENG_RELOAD_MASTER 2
/* eng_chunk.pstale (ZeRO, engine_zero.c) */
#define ENG_P16_MISSED 1
#define ENG_P16_STALE  2

/* A parameter group's own Adam settings for one tensor: which of them it
 * sets (ENG_OWN_*) and their values; the others are the config's. */
#define ENG_OWN_DECAY 1u
#define ENG_OWN_ADAM  2u /* lr_scale, beta1, beta2, eps */
typedef struct eng_hyper {
    unsigned set;
    float decay, beta1, beta2, eps;
    double lr_scale; /* times the step's learning rate, in double, rounded once */
} eng_hyper;

typedef struct eng_tensor {
    int layer;
    char name[64];
    size_t numel;
    float *init;            /* copy of the initial values until finalize (or NULL: fill) */
    zo_engine_fill_fn fill; /* writes the initial values where they are placed */
    void *fill_ctx;
    uint32_t chunk;
    size_t off;    /* element offset inside the chunk */
    int keep_f32;  /* zo_engine_keep_f32_states: fp32 moments under I8 states */
    eng_hyper own; /* its parameter group's settings (zo_engine_set_weight_decay, _tensor_adam) */
} eng_tensor;

typedef struct eng_layer {
    int *tensors;
    int n_tensors, cap;
    uint32_t first_chunk, n_chunks;
} eng_layer;

struct eng_param_tier;
struct eng_state_tier;

typedef struct eng_chunk {
    const struct eng_param_tier *pt; /* home of its 16-bit parameters (engine_tier.h) */
    const struct eng_state_tier *st; /* home of its optimizer states */
    void *pctx, *sctx; /* the contexts of pt and st (eng_tier_self), given to their every call */
    int p16_bufs;      /* pinned host copies of its 16-bit parameters (0, 1 or 2) */
    int layer;
    size_t n_elems; /* elements in use (last tensor's end) */
    void *p16[2];   /* host 16-bit params (home host/device): current and next */
    int p16_cur;
    void *g16[2];   /* host 16-bit gradients, by step parity (DPU uses both; not when grouped): the
                       chunk's pinned   mirror, or where a staged chunk's are now (ring slot, gkeep,
                       NVMe stage) */
    int g_staged;   /* its gradients come down through the pinned ring (engine_grads.c) */
    int g_kept;     /* ... and wait for the update in gkeep, else in gext on NVMe */
    void *gkeep[2]; /* pageable copies, by step parity */
    zo_swap_extent_t gext[2]; /* spilled: one extent per parity, rewritten every step */
    uint64_t ggen[2];
    int gring;     /* the ring slot its hand-over in flight holds, or -1 */
    float *acc[2]; /* fp32 accumulators (grad_accum_steps > 1), by step parity; grouped: the
                      pinned fp32 group sums (the running sum, the final gradient) */
    float *states; /* master | m | v (optim_home host or device) */
    float *backup; /* overlap, host/device states: copy taken before the speculative update */
    zo_swap_extent_t ext[2];  /* optim_home nvme: current and alternate extents */
    zo_swap_extent_t pext[2]; /* param_home nvme: the 16-bit parameters' extents */
    uint64_t pgen[2];
    int pext_cur;
    int palt_valid;
    atomic_int pstale; /* ZeRO, another rank's chunk on NVMe here: ENG_P16_MISSED, its owner's
                          broadcast of this step failed to land in the alternate extent (sent
                          again before the commit); ENG_P16_STALE, the current extent is older
                          than the committed values (loads fail until its owner sends them) */
    uint64_t gen[2];
    int split_ref[2]; /* master_split: the 16-bit copy (p16 index) an extent's master was split
                         against, or -1: the full master */
    int ext_cur;
    int alt_valid; /* the alternate extent holds an update not yet committed */
    int slot;      /* device param slot holding this chunk, or -1 */
    int reload;    /* resident, lazy table (engine_tier.h): the slot is older than the committed
                      values, the next fetch (or prefetch) reloads it; ENG_RELOAD_MASTER: from
                      the committed master, since a load of its 16-bit copy failed */
    int in_use;    /* fetched and not released */
    int grad_slot; /* device grad slot handed out in the backward, or -1 */
    int n_ready;   /* grads_ready calls this step (micro-batches) */
    uint64_t jobs_queued, jobs_done; /* host jobs (under e->jobs.mu) */
    zo_grad_stats gstats;            /* of the step's final gradients */
    zo_event_t computed; /* the caller's work that produced the micro-batch's gradients (its job
                            checks it: a failure on the compute stream fails the step) */
    int spec_done;       /* overlap: the speculative update ran */
    int owner;           /* the rank that owns its optimizer states (ZeRO; else this rank) */
    float *zgrad[2];     /* ZeRO: its gradient reduced over the ranks (fp32), where kept, by step
                            parity (dpu: the delayed update reads one, the next step fills the other) */
    int zpart;           /* ZeRO stage 3: its 16-bit parameters live on its owner only */
    int zg_slot;         /* ... the gather buffer its last gather of this step took (held while the
                            buffer's chunk is still this one), or -1; a non-owner's is then p16[0] */
    uint32_t small_first, n_small; /* its tensors updated apart (e->small, eng_apart) */
} eng_chunk;

/* Elements [off, off + numel) of a chunk. */
typedef struct eng_span {
    size_t off, numel;
} eng_span;

/* A tensor whose update runs apart from its chunk's (eng_adam_enqueue): with
 * fp32 moments under I8 states, or its parameter group's own settings. */
typedef struct eng_apart {
    size_t off, numel;
    int f32;       /* fp32 moments in the I8 code bytes (its room: zo_adam_q8_small_room) */
    eng_hyper own; /* its group's settings instead of the config's */
} eng_apart;

typedef struct eng_pslot {
    void *ptr;
    int chunk;          /* -1 when free */
    zo_event_t ready;   /* the H2D that filled it */
    zo_event_t lastuse; /* the compute work that last read it */
    uint64_t tick;      /* when it was last fetched (LRU when no trace is followed) */
} eng_pslot;

/* param_home nvme: a pinned staging twin of the NVMe parameter loads (a
 * ring of them, engine_tier_nvme.c): the NVMe read lands here, then the H2D. */
typedef struct eng_twin {
    void *ptr;
    _Atomic(zo_swap_io_t) io; /* the read's ticket until the h2d stream has waited it */
    zo_event_t filled;        /* the event the slot its last H2D filled records after it, or NULL */
} eng_twin;

/* A slot of the pinned gradient ring (engine_grads.c), under e->jobs.mu. */
typedef struct eng_gring {
    void *ptr;
    int busy;        /* held from a hand-over until its host job is done */
    zo_swap_io_t io; /* a spill write from it still in flight */
    int chunk;       /* ... of this chunk's gradients */
} eng_gring;

/* Bytes per element of what the slots hold, the parameters and their
 * gradients ("16-bit" throughout, for the common case): 2 for bf16 and
 * fp16, 4 for fp32 parameters, which are the master weights themselves. */
static inline size_t eng_param_bytes(const zo_engine_config *c)
{
    return c->param_dtype == ZO_DTYPE_F32 ? 4 : 2;
}

/* Bytes of a chunk's elements in fp32 (accumulators, group sums, reduced
 * gradients): 2 x chunk_bytes with 16-bit parameters, chunk_bytes with fp32. */
static inline uint64_t eng_f32_chunk_bytes(const zo_engine_config *c, uint64_t chunk_bytes)
{
    return chunk_bytes / eng_param_bytes(c) * sizeof(float);
}

/* Chunk buffers of the pinned staging rings (gradients, NVMe parameter
 * loads): the transfer being served, the lookahead's, and one more to
 * overlap, whatever the model's size. */
static inline uint32_t eng_staging_depth(const zo_engine_config *c)
{
    return (uint32_t)c->lookahead + 2u;
}

typedef struct eng_gslot {
    void *ptr;
    int busy;
    zo_event_t drained; /* the D2H that emptied it */
    float *acc;         /* grouped: the fp32 sum of the group's micro-batches (device) */
    zo_event_t loaded;  /* grouped: the H2D of the running sum into acc */
} eng_gslot;

typedef struct eng_job {
    struct eng_job *next;
    int chunk;
    int micro; /* 1-based micro-batch of this hand-over */
    int last;  /* the step's final gradients of the chunk */
    int parity;
    int arrived;  /* the D2H finished (set from the d2h stream) */
    float lr;     /* the learning rate of the step the gradients belong to */
    float factor; /* the speculative update's gradient factor (overlap) */
    int64_t step; /* ... and its Adam step */
} eng_job;

/* Overlap mode with states on NVMe: the host job thread's pipeline over the
 * stages (read the next chunk's states ahead, write the updated ones behind). */
typedef struct eng_spec_pipe {
    zo_swap_io_t rd[ENG_NVME_STAGES], wr[ENG_NVME_STAGES], pwr[ENG_NVME_STAGES];
    int rd_chunk[ENG_NVME_STAGES]; /* chunk being read into the stage, or -1 */
    int wr_chunk[ENG_NVME_STAGES]; /* chunk being written from the stage, or -1 */
    unsigned next;                 /* the next stage to hand out */
} eng_spec_pipe;

/* The end of a step's verdict on its gradients. */
typedef struct eng_verdict {
    double sum_sq;
    int overflow;
    float factor, plain; /* the right gradient factor, and the one without clipping */
    double loss_scale;
} eng_verdict;

/* An optimizer mode: what the host job does with a chunk's final gradients,
 * and how the step ends. One table per mode, each in its own file. */
typedef struct eng_mode_ops {
    const char *name;
    int grad_bufs;        /* host 16-bit gradient buffers per chunk (2: by step parity) */
    int p16_behind;       /* the update writes 16-bit params behind the fetches (double-buffered) */
    int backups;          /* resident states are copied before a speculative update */
    const char *job_name; /* the host job on a chunk's final gradients, for traces */
    int speculates; /* the job updates each chunk on its final gradients, ahead of the verdict */
    /* End of step, the host jobs idle: apply (or launch) the update, commit,
     * publish. The loss scaler goes back to *saved when it fails before its commit. */
    zo_status (*end_step)(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                          const zo_loss_scaler *saved);
    /* Wait for the mode's updates still in flight; the first failure. */
    zo_status (*settle)(struct zo_engine *e);
    /* An abandoned step: undo what the mode did ahead of the verdict. */
    void (*abort)(struct zo_engine *e);
} eng_mode_ops;

extern const eng_mode_ops eng_mode_sync, eng_mode_overlap, eng_mode_dpu;

/* A reducer (engine_reduce.c): how a chunk's gradients meet the other ranks'
 * on their way to the update, and how the step's verdict and the updated
 * 16-bit parameters are agreed. The engine calls the chain its configuration
 * turns on (eng_reducers_for): ZeRO's, then the pipeline's or the local one.
 * Each reducer's state is its own part of the engine (e->zero, e->pipe).
 * Slots marked (optional) may be NULL. */
#define ENG_REDUCER_OPS_VERSION 1u
typedef struct eng_reducer_ops {
    const char *name;
    unsigned version; /* ENG_REDUCER_OPS_VERSION */
    /* (optional) What finalize needs beyond the plan (the communicator). */
    zo_status (*check)(const zo_engine_config *c);
    /* (optional) Its buffers, streams and communicators, after the tiers; release frees them. */
    zo_status (*place)(struct zo_engine *e);
    void (*release)(struct zo_engine *e);
    /* (optional) Before a fetch's loads of layer (at trace position pos). */
    zo_status (*gather)(struct zo_engine *e, int layer, int pos);
    /* (optional) The step closed or was abandoned: what it gathered is stale. */
    void (*forget)(struct zo_engine *e);
    /* (optional) A hand-over of chunk c's gradients (host job j); *taken 1
     * when it took the step's final gradients (they are then the owner's). */
    zo_status (*hand_over)(struct zo_engine *e, uint32_t c, const eng_job *j, int *taken);
    /* Its share of the step's verdict, in chain order. */
    zo_status (*judge)(struct zo_engine *e, eng_verdict *v);
    /* (optional) After the update (mine: its status): the updated 16-bit
     * parameters where the ranks need them; the step's status. */
    zo_status (*share)(struct zo_engine *e, zo_status mine);
} eng_reducer_ops;

#define ENG_MAX_REDUCERS 2
typedef struct eng_reducers {
    const eng_reducer_ops *ops[ENG_MAX_REDUCERS];
    int n;
} eng_reducers;

extern const eng_reducer_ops eng_reducer_local, eng_reducer_zero, eng_reducer_pipe;

/* The engine's state, one struct per part that owns it: a part's files
 * reach the others' only through their functions (the order above), except
 * for the packing (chunks, homes) every part reads. */

/* Owned copies of the configuration's strings and arrays (engine_api.c). */
typedef struct eng_owned {
    char **paths, *engine_name, *file_name;
    zo_swap_fault *faults; /* armed when the swap stores open (zo/engine_testing.h, tests) */
    size_t n_faults;
} eng_owned;

/* The registered tensors and layers (engine_api.c). */
typedef struct eng_registry {
    eng_tensor *tensors;
    int n_tensors, cap_tensors;
    eng_layer *layers;
    int n_layers, cap_layers;
} eng_registry;

/* The device tier (engine_finalize.c, engine_tier_device.c, engine_group.c):
 * the parameter and gradient slots and the states it holds. */
typedef struct eng_device_tier {
    void *dev_params, *dev_grads;
    void *gacc;    /* grouped: the gradient slots' fp32 accumulators */
    void *states;  /* the device tier's optimizer states */
    float *backup; /* ... and their overlap backups (host memory) */
    /* Their update, zo_op_adam on a stream of the tier's own: one chunk's
     * gradients brought up (fp32 room) and its 16-bit output taken down, a
     * pinned stage of one chunk's states for the host's reads and writes,
     * and the first failure of a rollback (which returns nothing), told at
     * the next update or drain. */
    zo_stream_t adam;
    void *adam_grad, *adam_out;
    float *stage;
    zo_status failed;
    eng_pslot *pslots;
    uint32_t n_pslots;
    eng_gslot *gslots;
    uint32_t n_gslots;
} eng_device_tier;

/* The host tier (engine_tier_host.c) and the pinned pool every tier draws on. */
typedef struct eng_host_tier {
    zo_hostpool_t pool;
    float *states, *backup, *acc;
    uint64_t bytes, high; /* host memory taken beside the pool, and its high-water mark */
} eng_host_tier;

/* The NVMe tier (engine_tier_nvme.c). */
typedef struct eng_nvme_tier {
    zo_swap_t swap;
    uint64_t state_extent_bytes;
    uint64_t nvme_state_extent; /* a swap extent of states: the fullest chunk's, packed */
    uint64_t p16_extent;        /* a swap extent of 16-bit parameters: the fullest chunk's */
    uint64_t stage_bytes; /* one stage: master | m | v (| 16-bit params when they live on NVMe) */
    zo_swap_t pswap;      /* param_home nvme: the store of the 16-bit parameters */
    float *stage[ENG_NVME_STAGES];
    uint8_t *split_bits[ENG_NVME_STAGES]; /* master_split: each stage's up bits in transit */
    eng_spec_pipe spec;
    eng_twin *twins; /* param_home nvme: the ring of staging twins */
    uint32_t n_twins, next_twin;
    /* ZeRO's ENG_ZERO_SHARE_BUFS buffers for the owners' broadcasts of the
     * chunks whose 16-bit parameters are here (e->zero.pbuf, handed over at
     * finalize): this tier takes them from the pinned pool and registers
     * them with its store, since the broadcasts read and write its extents */
    void **share_bufs;
} eng_nvme_tier;

/* The 16-bit gradients' host side (engine_grads.c). */
typedef struct eng_grads {
    eng_gring *ring;
    uint32_t n_ring;
    uint32_t kept_chunks, spilled_chunks; /* staged chunks kept in host memory, spilled */
    zo_swap_t swap;                       /* the spilled gradients' store */
    void *host;                           /* the kept gradients' pageable memory */
    uint64_t extent; /* its extents: the fullest chunk's gradient bytes, rounded to 4 KiB */
    int grouped;     /* layer-major groups: what comes down are the fp32 sums (acc) */
    uint64_t bytes;  /* a chunk's gradients as they come down (ring slots, kept copies) */
    int bufs;        /* host gradient buffers per chunk (the mode's, by parity) */
} eng_grads;

/* The fetch trace and the residency counters (engine_sched.c). */
typedef struct eng_sched {
    int *trace, n_trace, cap_trace; /* layer * 2 + phase of each fetch of the recorded step */
    int *cur, n_cur, cap_cur;       /* this step's fetches */
    int trace_valid, deviated;
    uint64_t hits, misses, evictions, prefetches, lru_tick;
} eng_sched;

/* The step protocol's counters (engine_api.c). */
typedef struct eng_step {
    int64_t opt_step; /* updates applied (Adam's step count) */
    int64_t steps;    /* end_step calls that succeeded */
    float lr_next;    /* zo_engine_set_lr's value, taken by the next step to open */
    float lr;         /* the open step's learning rate (every update of its gradients uses it) */
    int open;
    int spec_paused; /* overlap: this step updates after the verdict, not ahead of it
                        (the last step clipped: a speculation would be rolled back) */
} eng_step;

/* An update on a thread of its own: the delayed update (engine_dpu.c), beside
 * the job thread (which keeps taking the next step's gradients: other
 * buffers by parity), or the overlap mode's update behind the next forward
 * (engine_behind.c, cfg.update_behind), whose fetches wait per chunk. */
typedef struct eng_dpu {
    int pending; /* a DPU update was launched and not yet published */
    int skip;    /* ... and it was skipped (overflow) */
    pthread_t thread;
    int running;
    float lr, factor;
    int64_t step;
    int parity;
    zo_status st;
    char msg[512];
    /* behind the next forward: running, and which chunks' new values have
     * landed (their alternate extents, read by the fetches until the join
     * commits them); finished once the thread's update returned */
    int behind;
    /* it failed and was dropped: run again (lr, factor, step, parity above)
     * before the next fetch or read of the states (eng_behind_redo) */
    int redo;
    atomic_uchar *landed;
    int finished;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} eng_dpu;

/* The host job thread (engine_optim.c). */
typedef struct eng_jobs {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eng_job *qhead, *qtail;
    int stop;
    int running;        /* a job is being run */
    zo_status async_st; /* first asynchronous failure, with its message */
    char async_msg[512];
} eng_jobs;

/* A swap store a tier opened (eng_store_opened), for the step's I/O statistics. */
typedef struct eng_store {
    zo_swap_t store;
    uint64_t extent_bytes;
    zo_swap_stats at_open;
    zo_swap_stats at_launch; /* when an update was launched on its own thread (eng_stats_launch) */
} eng_store;

/* The step's statistics (engine_api.c, engine_io.c). */
typedef struct eng_stats {
    _Atomic uint64_t optim_ns, nvme_ns;
    /* stream timers, run by tasks on the stream: 0 h2d busy, 1 d2h busy, 2 compute stalled */
    _Atomic uint64_t busy_t0[3], busy_ns[3];
    uint64_t at_open[5]; /* stall, optim, nvme, h2d, d2h counters when the step opened */
    int carried;  /* the counters' window was opened at the last end_step (an update was still
                     running on its own thread): the next step's open keeps it */
    int launched; /* this end_step launched an update on its own thread: its I/O counts from
                     the stores' at_launch on, in the next step */
    uint64_t step_t0;
    zo_device_copy_stats copy0;
    eng_store stores[3];
    int n_stores;
} eng_stats;

/* ZeRO (engine_zero.c, engine_zero_loads.c). */
typedef struct eng_zero {
    float *scratch;     /* one chunk's states: initial states of others' chunks, widened grads */
    float *grads;       /* the reduced gradients this rank keeps */
    zo_stream_t stream; /* the stream carrying the collectives */
    zo_comm_t comm;     /* the engine's own split of cfg.comm: its collectives never meet the
                           caller's */
    zo_comm_t pcomm;    /* stage 3: another split, for the gathers (on the h2d stream, from the
                           fetches, while the host job reduces on comm) */
    zo_comm_t dcomm;    /* dpu: a third, for the owners' broadcasts from the delayed update's
                           thread while the next step runs */
    zo_stream_t dstream;
    void **gbuf; /* stage 3: the pinned gather buffers, one window's (eng_zero_gather) */
    uint32_t n_g;
    int *g_chunk;     /* ... the chunk each holds, or -1 */
    uint64_t *g_used; /* ... the fetch (tick) that last used it */
    uint64_t g_tick;  /* fetches that gathered so far */
    uint64_t g_seq;   /* gathers issued so far (the same count on every rank) */
    uint32_t *g_list; /* a fetch's window of chunks */
    /* a rank's NVMe failure in a step (a parameter read at a load or a gather)
     * kept until the ranks agree on the step (eng_zero_share_partials) rather
     * than failing it here alone, which would leave the others waiting in its
     * collectives; under jobs.mu */
    zo_status defer_st;
    char defer_msg[256];
    int defer_slots;  /* ... and a device slot was loaded from what the read left */
    int defer_repair; /* ... another rank's chunk whose copy here failed its checksum, or -1 */
#define ENG_ZERO_SHARE_BUFS 2
    void *pbuf[ENG_ZERO_SHARE_BUFS]; /* 16-bit parameters on NVMe: the pinned buffers of the
                                        owners' broadcasts (read back, received, written) */
} eng_zero;

/* Pipeline stages (engine_pipe.c). */
typedef struct eng_pipe {
    zo_comm_t comm; /* the engine's own split of cfg.pipe_comm */
    zo_stream_t stream;
    uint64_t *counts; /* every stage's chunk count */
    uint64_t max;     /* ... the largest */
} eng_pipe;

/* The timeline's callback (zo_engine_set_trace, engine_io.c). */
typedef struct eng_timeline {
    zo_trace_fn fn;
    void *ctx;
} eng_timeline;

struct zo_engine {
    zo_engine_config cfg; /* its strings and arrays point into own */
    eng_owned own;
    zo_device_t dev;
    const eng_mode_ops *mode;
    eng_reducers reducers; /* the gradient path's chain (engine_reduce.c) */
    int finalized;
    int cuda;
    size_t pel; /* bytes per element of the parameter and gradient slots (eng_param_bytes) */
    eng_registry reg;

    /* packing (engine_plan.c), read by every part */
    size_t chunk_bytes, chunk_elems;
    eng_chunk *chunks;
    eng_apart *small; /* the tensors updated apart, by chunk (eng_chunk) */
    uint32_t n_small;
    uint8_t *p16_home, *states_home; /* each chunk's homes (zo_tier), chosen at packing */
    uint32_t n_chunks, max_cpl;
    zo_engine_footprint fp;

    /* the tiers and the gradients' way down */
    eng_device_tier device;
    eng_host_tier host;
    eng_nvme_tier nvme;
    eng_grads grads;
    zo_stream_t h2d, d2h;
    zo_stream_t compute; /* the last compute stream seen (to fence an aborted step) */

    eng_sched sched;

    /* optimizer */
    zo_optim_pool_t opool;
    zo_loss_scaler scaler;
    eng_step step;
    eng_dpu dpu;
    eng_jobs jobs;

    eng_stats stats;
    eng_zero zero;
    eng_pipe pipe;
    eng_timeline timeline;
};

/* The step's host gradient buffers: by step parity where there are two
 * (dpu mode, and sync mode's update behind the forward), else the one. */
static inline int eng_step_parity(const struct zo_engine *e)
{
    return e->grads.bufs == 2 ? (int)(e->step.steps & 1) : 0;
}

/* engine_behind.c: the update behind the next forward (cfg.update_behind) */
/* Whether this engine's update can run behind the next forward (its config
 * asks, every chunk's states are on NVMe, and its 16-bit parameters on NVMe
 * or in double-buffered host copies). */
int eng_behind_takes(const struct zo_engine *e);
/* Start the update of every chunk on a thread of its own; the slots are
 * published (dropped or marked for reload) and the step counted now. */
zo_status eng_behind_launch(struct zo_engine *e, float lr, float factor, int64_t step, int parity);
/* Wait until chunk c's new values have landed (a fetch); its failure then.
 * The wait counts as compute's stall from where compute runs dry. */
zo_status eng_behind_wait(struct zo_engine *e, uint32_t c, zo_stream_t compute);
/* Wait for the whole update and commit it, or drop it and say why (it is
 * then run again by eng_behind_redo). */
zo_status eng_behind_join(struct zo_engine *e);
/* Run a dropped update again, in place, from the step's gradients (which no
 * later step has replaced: the join comes before any), and commit it; on a
 * failure it stays to run again. Before a step's first fetch and a read or
 * write of the states, never inside an abandoned step. */
zo_status eng_behind_redo(struct zo_engine *e);
/* Chunk c's update is running and has not landed: no load may read it yet. */
static inline int eng_behind_pending(const struct zo_engine *e, uint32_t c)
{
    return e->dpu.behind && !atomic_load_explicit(&e->dpu.landed[c], memory_order_acquire);
}
/* Chunk c's update has landed and is not committed yet: loads read its
 * alternate extents (the values the commit will make current). */
static inline int eng_behind_latest(const struct zo_engine *e, uint32_t c)
{
    return e->dpu.behind && atomic_load_explicit(&e->dpu.landed[c], memory_order_acquire);
}

/* engine_plan.c: packing, the homes and the footprint */
/* The optimizer mode's table for m (sync for an unknown one, which
 * eng_check_plan_config refuses first). */
const eng_mode_ops *eng_mode_for(zo_optim_mode m);
/* What a plan depends on: the homes, the mode, the dtype (no device or paths needed). */
zo_status eng_check_plan_config(const zo_engine_config *c);
/* Pack the registered tensors into chunks, choose their homes and count every
 * tier into *fp; *fits 0 with msg naming the tier when a budget is short. */
zo_status eng_compute_plan(struct zo_engine *e, zo_engine_footprint *fp, int *fits, char *msg,
                           size_t cap);

/* engine_finalize.c: the plan made real */
/* Tensor id's initial values into dst: its copy, or what its fill writes. */
zo_status eng_initial_values(struct zo_engine *e, int id, float *dst);
/* Free what finalize allocated, after the streams and the job thread are idle
 * (a partial finalize too). */
void eng_release_tiers(struct zo_engine *e);

/* engine_sched.c */
int eng_trace_push(struct zo_engine *e, int layer, zo_phase phase);
void eng_trace_end_step(struct zo_engine *e);
zo_status eng_make_resident(struct zo_engine *e, uint32_t c, int pos);
void eng_prefetch(struct zo_engine *e);
zo_status eng_load_slot(struct zo_engine *e, uint32_t c, uint32_t s);
zo_status eng_publish(struct zo_engine *e, int updated);
/* After a checkpoint wrote chunk c: the device sees the new 16-bit values. */
zo_status eng_publish_chunk(struct zo_engine *e, uint32_t c);

/* Whether a tensor keeps fp32 moments: one below its state format's
 * min_numel or named by zo_engine_keep_f32_states (keep), in a format with
 * that rule (zo_state_format). (inline: the packing and the checkpoints ask it) */
static inline int eng_keeps_f32(zo_dtype state_dtype, size_t numel, int keep)
{
    return zo_state_format_keeps_f32(zo_state_format_of(state_dtype), numel, keep);
}

/* engine_group.c: layer-major micro-batch groups (micro_group > 1 with
 * grad_accum_steps > 1: "grouped"; inline: ZeRO's plan and the host jobs
 * ask it too) */
static inline int eng_grouped(const zo_engine_config *c)
{
    return c->micro_group > 1 && c->grad_accum_steps > 1;
}
/* Micro-batches per group: micro_group, at most grad_accum_steps; 1 when not grouped. */
int eng_group_size(const zo_engine_config *c);
/* The device fp32 accumulators of the gradient slots (after they are allocated). */
zo_status eng_group_alloc(struct zo_engine *e);
void eng_group_release(struct zo_engine *e);
/* Chunk c's gradient slot was just taken by a backward fetch: a group after
 * the step's first starts its slot's sum from the running sum (an H2D). */
zo_status eng_group_take(struct zo_engine *e, uint32_t c, zo_stream_t compute);
/* grads_ready of one micro-batch for chunk c: add it to the slot's sum; the
 * group's last sends the sum down and queues the host job. */
zo_status eng_group_hand_over(struct zo_engine *e, uint32_t c, zo_stream_t compute);
/* After an abandoned step: the slots' events anew on the clean copy stream. */
void eng_group_reset(struct zo_engine *e);

/* engine_optim.c */
/* The scale the gradients carry: the loss scaler's under fp16, else 1
 * (inline: the host jobs read it below zo_engine_loss_scale's engine_api.c). */
static inline double eng_loss_scale(const struct zo_engine *e)
{
    return e->cfg.param_dtype == ZO_DTYPE_F16 ? zo_loss_scaler_scale(&e->scaler) : 1.0;
}
zo_status eng_thread_start(struct zo_engine *e);
void eng_thread_stop(struct zo_engine *e);
eng_job *eng_job_new(const eng_job *tmpl);
void eng_job_push(struct zo_engine *e, eng_job *j);
/* Queue the host job on chunk c's latest gradients behind the d2h stream's copy. */
zo_status eng_queue_grads_job(struct zo_engine *e, uint32_t c, int parity);
zo_status eng_wait_idle(struct zo_engine *e);
void eng_wait_chunk_jobs(struct zo_engine *e, uint32_t c);
zo_status eng_arrival_fn(void *arg);
void eng_set_async_error(struct zo_engine *e, zo_status st);
zo_status eng_take_async_error(struct zo_engine *e);
zo_status eng_update_all(struct zo_engine *e, float lr, float factor, int64_t step, int parity);
/* ... telling landed of each chunk stored beside the committed states as it lands. */
zo_status eng_update_all_landing(struct zo_engine *e, float lr, float factor, int64_t step,
                                 int parity, void (*landed)(struct zo_engine *e, uint32_t c));
/* Whether this step's chunks are updated ahead of the verdict (overlap mode,
 * unless paused: e->step.spec_paused). */
int eng_speculates_now(const struct zo_engine *e);
/* The update of every chunk now, timed and traced as `name(v, *rollbacks)`
 * says, then commit and publish (sync and overlap); the loss scaler goes back
 * to *saved when the update fails. */
zo_status eng_update_now(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                         const zo_loss_scaler *saved,
                         zo_status (*apply)(struct zo_engine *, const eng_verdict *, int *),
                         const char *(*name)(const struct zo_engine *, const eng_verdict *, int));

/* Wait for speculative updates still in flight in every tier; the first failure. */
zo_status eng_spec_drain(struct zo_engine *e);
/* Undo speculative updates (resident states from their backups). */
void eng_restore_backups(struct zo_engine *e);

/* engine_reduce.c: the reducers' chain for c, checked; the front end
 * that walks e->reducers */
void eng_reducers_for(const zo_engine_config *c, eng_reducers *out);
zo_status eng_reducers_check(const eng_reducers *r, const zo_engine_config *c);
zo_status eng_reducers_place(struct zo_engine *e);
void eng_reducers_release(struct zo_engine *e);
zo_status eng_reduce_gather(struct zo_engine *e, int layer, int pos);
void eng_reduce_forget(struct zo_engine *e);
zo_status eng_reduce_hand_over(struct zo_engine *e, uint32_t c, const eng_job *j, int *taken);
zo_status eng_reduce_judge(struct zo_engine *e, eng_verdict *v);
zo_status eng_reduce_share(struct zo_engine *e, zo_status mine);

/* engine_tier.c: the step's update made the current state through every
 * chunk's tiers (updated: it was not skipped), or the updates stored beside
 * the committed states forgotten */
void eng_commit(struct zo_engine *e, int updated);
void eng_discard_uncommitted(struct zo_engine *e);

/* engine_zero.c: ZeRO over the ranks of cfg.comm (engine.h) */
/* world_size > 1 (inline: the tiers and the gradients' plan ask it too) */
static inline int eng_zero_on(const zo_engine_config *c)
{
    return c->world_size > 1;
}
/* ZeRO in the global reduction order: each micro-batch's gradients are
 * reduced over the ranks as they come down, onto the running sum at the
 * owner, so no rank keeps fp32 accumulators. */
static inline int eng_zero_rounds(const zo_engine_config *c)
{
    return eng_zero_on(c) && c->reduce_order == ZO_REDUCE_ORDER_GLOBAL;
}
/* The host's fp32 accumulators sum a rank's micro-batches (grad_accum_steps
 * > 1, not summed on the device by layer-major groups, not reduced round by
 * round). */
static inline int eng_host_accumulates(const zo_engine_config *c)
{
    return c->grad_accum_steps > 1 && !eng_grouped(c) && !eng_zero_rounds(c);
}
/* ZeRO stage 3: 16-bit parameters partitioned too. */
static inline int eng_zero_p3(const zo_engine_config *c)
{
    return eng_zero_on(c) && c->zero_stage == 3;
}
/* Stage 3: a chunk of used_elems elements persists whole on every rank (its
 * owner broadcasts its updates, as in stages 1 and 2) rather than being
 * gathered at each use. */
static inline int eng_zero_persists(const zo_engine_config *c, uint64_t used_elems)
{
    return used_elems <= c->zero_persist_elems;
}
/* Stage 3: pinned bytes of the gather ring for chunks of chunk_bytes, at
 * most max_cpl per layer (0 otherwise). */
uint64_t eng_zero_gather_bytes(const zo_engine_config *c, uint32_t max_cpl, uint64_t chunk_bytes);
/* Stage 3: the device parameter slots beyond the resident ones that the
 * gathers keep busy (lookahead + 1 layers): more would cache others' chunks. */
uint64_t eng_zero_gather_slots(const zo_engine_config *c, uint32_t max_cpl);
/* Stage 3, a fetch of `layer` (pos: its trace position when the step
 * follows the trace, else -1): its chunks, then the next lookahead fetches'
 * of the trace, gathered from their owners on the h2d stream, each rank
 * issuing the same gathers whatever its device slots hold. */
zo_status eng_zero_gather(struct zo_engine *e, int layer, int pos);
/* The step is over (or abandoned): the gathered parameters are stale. */
void eng_zero_forget_gathers(struct zo_engine *e);
/* The rank owning chunk `chunk` of n_chunks (this rank without ZeRO). */
int eng_zero_owner(const zo_engine_config *c, uint32_t n_chunks, uint32_t chunk);
/* The plan's ZeRO settings; the communicator's agreement with them. */
zo_status eng_zero_check_plan(const zo_engine_config *c);
zo_status eng_zero_check(const zo_engine_config *c);
/* Host bytes of the reduced gradients kept and the scratch. */
uint64_t eng_zero_host_bytes(const zo_engine_config *c, uint32_t n_chunks, uint64_t chunk_elems);
zo_status eng_zero_place(struct zo_engine *e);
void eng_zero_release(struct zo_engine *e);
/* The host job on chunk c's gradients of job j: reduced over the ranks at
 * once (on the engine's own communicator, in the order every rank hands its
 * chunks over): in the global order every micro-batch's (eng_zero_rounds),
 * else the rank's final sum; after the last, its norm partial from the
 * reduced gradient where this rank keeps it. The rank's copy is then free. */
zo_status eng_zero_reduce_chunk(struct zo_engine *e, uint32_t c, const eng_job *j);
/* Before the verdict: each chunk's norm partial and overflow flag the same
 * on every rank (stage 2: from the owners). */
zo_status eng_zero_share_partials(struct zo_engine *e);
/* After the update (mine: how it went here): every chunk's new 16-bit
 * parameters from its owner (dpu: from the delayed update's thread, on a
 * communicator of its own);
 * chunks homed on NVMe go through pinned buffers to their alternate
 * extents. Every rank's outcome is then shared: an owner's failure fails
 * the update on all, naming the rank. A copy that failed to land on another
 * rank (outside dpu mode) is no failure of the step: its owner sends it
 * again before the commit and, should that fail too, once more at the next
 * step's end, whose loads of it fail meanwhile (ENG_P16_STALE). */
zo_status eng_zero_share_params(struct zo_engine *e, zo_status mine);

/* engine_zero_loads.c: ZeRO as a chunk's load sees it */
/* Chunk c's parameters of this step are in its gather buffer (stage 3). */
int eng_zero_held(const struct zo_engine *e, uint32_t c);
/* Stage 3: the gather buffer holding chunk c's parameters of this step, or
 * NULL (an owner loads its own chunk homed on NVMe from there: the gather
 * read it already, and a second read of the extent may not overlap it). */
const void *eng_zero_gathered(const struct zo_engine *e, uint32_t c);
/* Under ZeRO, keep st (with the thread's last error) as this rank's
 * failure of the step, to be agreed on at its end; returns ZO_OK so that the
 * rank keeps issuing the step's collectives. chunk: the chunk whose load
 * into a device slot failed, or -1. One rank: returns st. */
zo_status eng_zero_defer(struct zo_engine *e, zo_status st, int chunk);
/* A load of chunk c's copy here: a failure when it is stale (eng_chunk.pstale). */
zo_status eng_zero_check_copy(const struct zo_engine *e, uint32_t c);

/* engine_pipe.c: pipeline stages */
static inline int eng_pipe_on(const zo_engine_config *c)
{
    return c->pipe_comm && zo_comm_size(c->pipe_comm) > 1;
}
zo_status eng_pipe_place(struct zo_engine *e);
void eng_pipe_release(struct zo_engine *e);
/* The verdict's norm and overflow over every stage's chunks, in stage and
 * chunk order (collective over the stages, at every end of step). */
zo_status eng_pipe_judge(struct zo_engine *e, eng_verdict *v);

/* engine_dpu.c */
zo_status eng_dpu_join(struct zo_engine *e);
/* Commit the delayed update of the last step, when one is pending. */
zo_status eng_dpu_commit_pending(struct zo_engine *e);

/* engine_grads.c (plan side in engine_tier.h) */
/* Before chunk c's D2H: a staged chunk takes a ring slot (its g16[parity]). */
zo_status eng_grads_stage(struct zo_engine *e, uint32_t c, int parity);
/* The host job is done with the hand-over in j: a staged chunk's final
 * gradients are kept or spilled, its ring slot freed. */
zo_status eng_grads_done(struct zo_engine *e, const eng_job *j);
/* Before the update: every spill write has landed; the first failure. */
zo_status eng_grads_settle(struct zo_engine *e);
/* An abandoned step: spill writes waited for, ring slots freed. */
void eng_grads_abandon(struct zo_engine *e);
/* Start reading chunk c's spilled gradients of `parity` back into the
 * stage's room (g16[parity] points there); *io stays NULL when they are not spilled. */
zo_status eng_grads_read_back(struct zo_engine *e, uint32_t c, int parity, float *stage,
                              zo_swap_io_t *io);
/* Grouped (layer-major micro-batches): the pinned fp32 group sums of every
 * chunk (acc) in place of the 16-bit mirrors, and no staging. */
zo_status eng_grads_place(struct zo_engine *e, int grouped);
void eng_grads_release(struct zo_engine *e);

/* engine_io.c */
/* n fp32 values as parameters of type t (bf16, fp16: rounded; fp32: copied). */
void eng_cast_params(zo_dtype t, const float *src, void *dst, size_t n);
/* out = n parameters (or gradients) of type t widened to fp32, added onto
 * base where there is one (base + x, as an accumulator adds); out may be base. */
void eng_widen_params(zo_dtype t, const void *src, const float *base, float *out, size_t n);
/* A copy on the h2d (d2h = 0) or d2h stream, its duration added to the stream's busy time. */
zo_status eng_timed_copy(struct zo_engine *e, int d2h, uint32_t chunk, void *dst, const void *src,
                         size_t n);
/* Make compute wait for ev, timing the wait when the data is not there yet. */
zo_status eng_compute_wait(struct zo_engine *e, zo_stream_t compute, zo_event_t ev, uint32_t chunk);
/* Where compute starts (end = 0) or stops (1) waiting for chunk's parameters:
 * tasks on the stream, so that the stall counted is the time the stream sat
 * idle between the two, not the time the host spent waiting while queued
 * work still ran. */
zo_status eng_stall_mark(struct zo_engine *e, zo_stream_t compute, uint32_t chunk, int end);
/* An update is about to start on its own thread (dpu, behind the forward):
 * the stores' I/O counters now end this step's window and open the next
 * one's, whatever the thread moves before the step's statistics are read. */
void eng_stats_launch(struct zo_engine *e);
void eng_trace(struct zo_engine *e, zo_trace_track track, int index, const char *name, uint64_t t0,
               uint64_t t1, int chunk, uint64_t bytes);
/* zo_swap_{write,read}_async on store 0 (states), 1 (parameters) or 2 (gradients), traced. */
zo_status eng_swap_async(struct zo_engine *e, int write, int store, uint32_t chunk,
                         zo_swap_extent_t ext, void *buf, size_t len, uint64_t gen,
                         zo_swap_io_t *io);
/* The optimizer pool's trace adapter (config fields), when traced. */
void eng_trace_pool(struct zo_engine *e, zo_optim_pool_config *oc);

#endif
