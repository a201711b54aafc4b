/* The engine's tiers behind operations tables, as devices
 * (kernels/core/device_impl.h) and I/O engines (swap/swap_engine.h) are.
 * Each chunk has a home for its 16-bit parameters and one for its optimizer
 * states (master | m | v), chosen at placement; the engine calls the home's
 * table and never asks which tier it is. Implementations, one file each:
 * engine_tier_device.c, engine_tier_host.c, engine_tier_nvme.c; the registry
 * above them in engine_tier.c, shared helpers below them in
 * engine_tier_common.c.
 *
 * Two tables, one per kind of state, because the kinds have different lives:
 * 16-bit parameters are loaded into device slots and written by the update;
 * optimizer states are updated, speculated on, rolled back and committed.
 * A tier implements the kinds it can hold (all three hold both). Where the
 * two meet (NVMe parameters are written from the NVMe states' stage), the
 * state table asks the parameter table through update_out and store.
 *
 * A tier is {tables, context}: every operation but the plan's account is
 * handed the tier's context first (self: the built-in tiers' part of the
 * engine, e->device, e->host, e->nvme; a registered tier's own), and keeps
 * its state there, never in another part. The engine is handed beside it
 * for what every part reads (the packing: chunks, cfg, the footprint) and
 * the shared services below the tiers (engine_tier_common.c, engine_io.c:
 * the pinned pool, the optimizer pool, traced I/O); what a tier needs of
 * another part comes as an argument or through its context, said where
 * (eng_load to a parameter load: the slot's event, and whether the update
 * behind the forward landed the chunk; the next chunk to speculate on;
 * ZeRO's share buffers to the NVMe tier). The chunk keeps its tables'
 * contexts beside them (eng_chunk.pctx, sctx).
 *
 * Adding a tier: fill both tables with named fields and ENG_TIER_OPS_VERSION,
 * and either add them to the built-in registry (engine_tier.c) under their
 * zo_tier, or register them with eng_tier_register, which gives them the
 * next zo_tier (ZO_TIER_COUNT, ...) and keeps the context their state lives
 * in (eng_tier_ctx), budget included (the usage operation): a tier added so
 * changes no public struct, since every public array a tier indexes has
 * ZO_TIER_MAX entries. eng_tiers_check() refuses an incomplete or
 * mismatched table, at registration and at finalize. */
#ifndef ZO_ENGINE_TIER_H
#define ZO_ENGINE_TIER_H

#include "engine_internal.h"

#define ENG_TIER_OPS_VERSION 1u
/* A chunk's states home when another rank owns them (ZeRO), and at stage 3
 * its 16-bit parameters' too: not a tier, no storage here (engine_zero.c's
 * tables). */
#define ENG_HOME_REMOTE 0xff

/* What a tier's byte accounting sees: the packed model, the homes, the
 * parameter slots (set before the parameter tables are asked). */
typedef struct eng_plan_in {
    const zo_engine_config *cfg;
    uint64_t chunk_bytes, chunk_elems;
    uint32_t n_chunks, max_cpl;
    uint64_t max_chunk_elems; /* elements of the fullest chunk */
    uint64_t pslots;
    int mode_p16_behind; /* the mode writes 16-bit params behind the fetches */
    int mode_backups;    /* the mode backs resident states up before speculating */
    int grad_bufs;       /* host 16-bit gradient buffers per chunk (the mode's, by parity) */
    int grouped;         /* layer-major groups: pinned fp32 group sums per chunk, no staging */
    /* per-chunk homes (NULL: every chunk at cfg's param_home / optim_home) */
    const uint8_t *p16_home, *states_home;
    /* the tables' flags by home, from the registry (eng_plan_flags) */
    int host_copies[ZO_TIER_MAX], p16_behind[ZO_TIER_MAX];
} eng_plan_in;

typedef struct eng_update_args {
    float lr, factor;
    int64_t step;
    int parity;
    /* Told of each chunk whose update has landed (its new 16-bit values
     * readable where a load looks for them: its alternate extents written,
     * or the host copy the commit switches to), as it lands, by the tiers
     * that store it beside the committed states; NULL: nobody asks. */
    void (*landed)(struct zo_engine *e, uint32_t c);
} eng_update_args;

/* What the scheduler tells a tier of a slot's load (eng_param_tier.source),
 * of the parts it does not own. */
typedef struct eng_load {
    zo_event_t filled; /* the slot records it once its H2D is done: staging is free again */
    int latest;        /* an update running behind the forward has landed the chunk's new values
                          beside the committed ones and not committed them yet: read those
                          (engine_behind.c; its fetches waited for the landing) */
} eng_load;

/* A tier holding chunks' 16-bit parameters. */
typedef struct eng_param_tier {
    unsigned version; /* ENG_TIER_OPS_VERSION */
    zo_tier tier;
    const char *name;
    /* Its chunks keep a device slot for good: never evicted, reloaded on publish. */
    int resident;
    /* Its chunks have pinned host copies (two when the update writes behind the fetches). */
    int host_copies;
    /* Resident, its copy read from NVMe: a publish marks the slot for reload
     * at the next fetch (eng_chunk.reload) instead of loading it, so that a
     * failed read fails the step that needs it, not one already committed. */
    int lazy;
    /* Add the bytes of the chunks homed here, and their staging, to fp. */
    void (*account)(const eng_plan_in *in, zo_engine_footprint *fp);
    /* Reserve the home storage of every chunk homed here (after the state tiers placed). */
    zo_status (*place)(void *self, struct zo_engine *e);
    void (*release)(void *self, struct zo_engine *e);
    /* The chunk's 16-bit copies from its master weights: at placement (init) or
     * after a checkpoint wrote the states (then the state tier may have stored them). */
    zo_status (*write)(void *self, struct zo_engine *e, uint32_t c, const float *master, int init);
    /* Where a slot's H2D reads chunk c from, staged first when needed. */
    zo_status (*source)(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                        const void **src);
    /* Where the update writes the new values; tail: the NVMe stage's spare room, or NULL. */
    void *(*update_out)(void *self, struct zo_engine *e, uint32_t c, void *tail);
    /* Store the updated values from src after the update (NULL: the update wrote them home). */
    zo_status (*store)(void *self, struct zo_engine *e, uint32_t c, void *src, zo_swap_io_t *io);
    /* The update becomes current: updated, it ran; stored, its store landed with the states'. */
    void (*commit)(void *self, struct zo_engine *e, uint32_t c, int updated, int stored);
    /* Forget loads staged for H2D copies that never ran (an abandoned step), or NULL. */
    void (*abandon)(void *self, struct zo_engine *e);
} eng_param_tier;

/* A tier holding chunks' optimizer states. */
typedef struct eng_state_tier {
    unsigned version; /* ENG_TIER_OPS_VERSION */
    zo_tier tier;
    const char *name;
    int packed;          /* states are packed to the used elements (eng_state_stride) */
    int in_place;        /* updates in place (cannot be undone but from an overlap backup) */
    int p16_behind;      /* the update writes 16-bit params behind the fetches (double-buffered) */
    int p16_stored;      /* can store 16-bit parameters with the states (update_out's tail) */
    unsigned needs_caps; /* device capabilities it needs (ZO_DEVCAP_*) */
    int needs_paths;     /* needs nvme_paths */
    void (*account)(const eng_plan_in *in, zo_engine_footprint *fp);
    zo_status (*place)(void *self, struct zo_engine *e);
    void (*release)(void *self, struct zo_engine *e);
    /* A chunk-stride buffer for the initial states, then store them from it. */
    float *(*init_buf)(void *self, struct zo_engine *e, uint32_t c);
    zo_status (*init)(void *self, struct zo_engine *e, uint32_t c, float *buf);
    /* Update n chunks (all homed here) and store the results behind the committed ones. */
    zo_status (*update)(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                        const eng_update_args *u);
    /* Overlap mode: update chunk c ahead of the verdict (next: the chunk of
     * the job thread's next queued final hand-over homed here, to read
     * ahead, or -1); drain what that left in flight. */
    zo_status (*speculate)(void *self, struct zo_engine *e, uint32_t c, const eng_job *j, int next);
    zo_status (*drain)(void *self, struct zo_engine *e);
    /* Undo a speculative update in place (a backup), forget a stored uncommitted one. */
    void (*rollback)(void *self, struct zo_engine *e, uint32_t c);
    void (*discard)(void *self, struct zo_engine *e, uint32_t c);
    /* The stored update becomes current; 1 when one was stored. */
    int (*commit)(void *self, struct zo_engine *e, uint32_t c);
    /* Checkpoints: the latest states at the chunk's stride; an editable copy and its store. */
    zo_status (*read)(void *self, struct zo_engine *e, uint32_t c, float *out);
    zo_status (*write_begin)(void *self, struct zo_engine *e, uint32_t c, float **buf);
    zo_status (*write_end)(void *self, struct zo_engine *e, uint32_t c, float *buf);
    /* The tier's budget in bytes (0: none) and the most it has held, from
     * its context alone (no engine: zo-plan asks too). Required of a tier
     * registered with eng_tier_register, whose budget lives in its context:
     * the plan refuses a footprint over the budget naming the tier, and
     * zo_step_stats.peak[] reports the peak. NULL for the built-in tiers,
     * whose budgets are the config's named fields (device_bytes,
     * host_bytes, nvme_bytes) and whose peaks the engine measures. */
    void (*usage)(void *self, uint64_t *budget, uint64_t *peak);
} eng_state_tier;

/* The registry, by zo_tier: the tiers' tables, the first eng_n_tiers
 * entries filled (the ZO_TIER_COUNT built-in ones, then those registered). */
extern int eng_n_tiers;
extern const eng_param_tier *eng_param_tiers[ZO_TIER_MAX];
extern const eng_state_tier *eng_state_tiers[ZO_TIER_MAX];
extern const eng_param_tier eng_param_tier_device, eng_param_tier_host, eng_param_tier_nvme;
/* Device-resident 16-bit parameters whose states are on NVMe (engine_tier_nvme.c,
 * not in the registry: the chunks' home is the device, eng_p16_nvme_backed says which). */
extern const eng_param_tier eng_param_tier_device_nvme;
extern const eng_state_tier eng_state_tier_device, eng_state_tier_host, eng_state_tier_nvme;
extern const eng_state_tier eng_state_tier_remote; /* engine_zero.c, not in the registry */
extern const eng_param_tier eng_param_tier_remote; /* engine_zero.c, not in the registry */

/* NVMe states are packed: master | m | v of a chunk's used elements, each
 * array starting on a 4 KiB boundary (the stride below), so a step moves
 * what the chunk holds rather than the whole chunk (a layer's chunk sized
 * for the embedding may be mostly empty). 16-bit parameters stored with
 * them start at the stage's offset 3 x stride. Resident states keep the
 * chunk's stride. */
static inline size_t eng_state_stride(const struct zo_engine *e, const eng_chunk *k)
{
    return k->st->packed ? zo_round_up(k->n_elems, ZO_SWAP_ALIGN / sizeof(float)) : e->chunk_elems;
}

/* A chunk's states at a stride of S elements in state format fmt (F32, BF16
 * or I8, zo_engine_config.state_dtype): master (4*S bytes) | m | v, each
 * moment zo_adam_moment_bytes (I8: its codes, then its block scales),
 * rounded up to 64 bytes for the compact formats (fp32 keeps 12*S bytes). */
static inline size_t eng_moment_bytes(zo_dtype fmt, size_t S)
{
    size_t b = zo_adam_moment_bytes(fmt, S);
    return fmt == ZO_DTYPE_F32 ? b : zo_round_up(b, 64);
}
static inline size_t eng_states_bytes(zo_dtype fmt, size_t S)
{
    return 4 * S + 2 * eng_moment_bytes(fmt, S);
}
/* ... and what a stage or an extent gives them: whole 4 KiB blocks (what
 * follows, the 16-bit parameters of an NVMe stage, starts there). */
static inline size_t eng_states_io_bytes(zo_dtype fmt, size_t S)
{
    return zo_round_up(eng_states_bytes(fmt, S), ZO_SWAP_ALIGN);
}
static inline void *eng_state_m(zo_dtype fmt, float *st, size_t S)
{
    return (char *)st + 4 * S;
}
static inline void *eng_state_v(zo_dtype fmt, float *st, size_t S)
{
    return (char *)st + 4 * S + eng_moment_bytes(fmt, S);
}

/* The split master (cfg.master_split): an NVMe extent of states at stride S
 * holds the master's up bits, its low halves (2*S bytes) and the moments,
 * and is read into (written from) the stage at this offset, so that its
 * moments meet the full layout's (4*S) and its low halves sit at 2*S, where
 * the master is rebuilt in place front to back. The up bits (S/8 bytes) fit
 * between the offset, a 4 KiB boundary, and 2*S. */
static inline size_t eng_split_head(size_t S)
{
    return (2 * S - S / 8) / ZO_SWAP_ALIGN * ZO_SWAP_ALIGN;
}

/* engine_tier.c (the registry) */
/* Every registered table is complete and of this version. */
zo_status eng_tiers_check(void);
/* A tier of the two tables p and s (each naming the tier it gets: the next,
 * eng_n_tiers) whose state lives in ctx, given to their operations as their
 * self (eng_tier_ctx); its zo_tier in *t. Before any engine is made: the
 * registry is the process's. Refused when full (ZO_TIER_MAX), or when a
 * table is incomplete (usage included), of another version or names another
 * tier. */
zo_status eng_tier_register(const eng_param_tier *p, const eng_state_tier *s, void *ctx,
                            zo_tier *t);
/* The last tier registered leaves the registry (not a built-in one). */
void eng_tier_unregister_last(void);
/* The context tier t was registered with (NULL for the built-in tiers). */
void *eng_tier_ctx(zo_tier t);
/* The context engine e gives tier t's operations (their self): a built-in
 * tier's part of e (e->device, e->host, e->nvme), a registered one's own. */
void *eng_tier_self(struct zo_engine *e, zo_tier t);
/* Tier t's budget and peak (its usage operation with its context self; 0
 * and 0 for a tier without one, a built-in tier). */
void eng_tier_usage(zo_tier t, void *self, uint64_t *budget, uint64_t *peak);
/* The tables' flags a plan asks across kinds, into in. */
void eng_plan_flags(eng_plan_in *in);

/* engine_place.c: each chunk's homes under c's homes and caps (n_chunks
 * entries each, zo_tier values or ENG_HOME_REMOTE); c's caps name only tiers
 * faster than the homes. used_elems: each chunk's used elements (NULL: all
 * full), for stage 3's persistence. */
void eng_place_homes(const zo_engine_config *c, uint32_t n_chunks, uint64_t chunk_bytes,
                     const uint64_t *used_elems, uint8_t *p16_home, uint8_t *states_home);
zo_status eng_check_caps(const zo_engine_config *c);

/* engine_tier_nvme.c: a swap extent of 16-bit (c's param_dtype) parameters
 * for chunks of at most max_chunk_elems elements. */
uint64_t eng_p16_extent(const zo_engine_config *c, uint64_t max_chunk_elems);
/* Chunks whose 16-bit parameters have extents on NVMe (homed there or backed). */
uint32_t eng_p16_on_nvme(const struct zo_engine *e);

/* ZeRO (engine_zero.c) with chunks' 16-bit parameters homed on NVMe: */
/* Chunk k's are homed on NVMe (eng_param_tier_nvme). */
int eng_p16_nvme(const eng_chunk *k);
/* Its committed values (latest: the alternate an update just wrote) into
 * buf (nv->p16_extent bytes, pinned), checksummed; nv: the NVMe tier's
 * context, the chunk's pctx. */
zo_status eng_p16_nvme_read(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c, int latest,
                            void *buf);
/* The owner's broadcast in buf to the alternate extent; the caller sets
 * palt_valid once *io landed, and the commit switches to it. */
zo_status eng_p16_nvme_receive(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c, void *buf,
                               zo_swap_io_t *io);

/* engine_grads.c: the 16-bit gradients' host side in a plan. */
/* Chunk c's gradients come down through the pinned ring (its 16-bit
 * parameters or its states are homed on NVMe: no whole-model mirror
 * there), unless grouped with more than one group per step or in dpu mode. */
int eng_grads_staged(const eng_plan_in *in, uint32_t c);
/* Add the gradients' pinned, host and NVMe bytes to fp, which holds the
 * rest of the plan's: mirrors, the ring, and, within cfg->host_bytes, the
 * staged chunks' gradients kept in host memory (the first *kept of them),
 * the others spilled (*spilled). */
void eng_grads_account(const eng_plan_in *in, zo_engine_footprint *fp, uint32_t *kept,
                       uint32_t *spilled);
/* Bytes of a stage's room for a spilled chunk's gradients read back (at the
 * stage's end, after the 16-bit parameters' room). */
uint64_t eng_grads_stage_room(const struct zo_engine *e);

/* engine_tier_common.c */
/* A chunk's states from stride `from` to stride `to` (in place in buf, which
 * holds the larger of the two): the n elements' bytes moved, the rest zero
 * up to eng_states_io_bytes(fmt, to). */
void eng_states_restride(zo_dtype fmt, float *buf, size_t n, size_t from, size_t to);
zo_tier eng_p16_home(const eng_plan_in *in, uint32_t c);
zo_tier eng_states_home(const eng_plan_in *in, uint32_t c);
/* Chunks homed at t, for 16-bit params (kind 0) or states (kind 1). */
uint32_t eng_count_homed(const eng_plan_in *in, int kind, zo_tier t);
/* Pinned host copies of chunk c's 16-bit parameters. */
int eng_p16_bufs(const eng_plan_in *in, uint32_t c);
/* Chunk c's 16-bit parameters are device-resident with their committed copy
 * on NVMe beside its states (eng_param_tier_device_nvme), not pinned. */
int eng_p16_nvme_backed(const eng_plan_in *in, uint32_t c);
void eng_adam_args(struct zo_engine *e, eng_chunk *k, float *st, const eng_update_args *u,
                   zo_adam_params *p, zo_adam_buffers *b);
/* Chunk k's update over its states st as optimizer pool jobs: one, or with
 * small tensors in I8 states (fp32 moments) one per range; jobs has room for
 * eng_adam_jobs(k), *queued says how many were queued (wait for them
 * whatever the status). eng_adam_wait waits for n and returns the first
 * failure after st; eng_adam_run queues and waits. */
uint32_t eng_adam_jobs(const eng_chunk *k);
/* Chunk k's update over all (eng_adam_args' buffers, wherever they live)
 * as ranges, each handed to fn with its parameters: one, or one per tensor
 * updated apart (its group's settings, fp32 moments under I8 states) and
 * the runs between. eng_adam_zero_padding zeroes what the ranges leave of
 * all's 16-bit output (host memory) in the tensors' padding. */
typedef zo_status (*eng_adam_fn)(void *ctx, const zo_adam_params *p, const zo_adam_buffers *b);
zo_status eng_adam_ranges(struct zo_engine *e, const eng_chunk *k, const zo_adam_params *p,
                          const zo_adam_buffers *all, eng_adam_fn fn, void *ctx);
void eng_adam_zero_padding(struct zo_engine *e, const eng_chunk *k, const zo_adam_buffers *all);
zo_status eng_adam_enqueue(struct zo_engine *e, eng_chunk *k, float *st, const eng_update_args *u,
                           zo_optim_job_t *jobs, uint32_t *queued);
zo_status eng_adam_wait(zo_optim_job_t *jobs, uint32_t n, zo_status st);
zo_status eng_adam_run(struct zo_engine *e, eng_chunk *k, float *st, const eng_update_args *u);
zo_status eng_timed_swap_wait(struct zo_engine *e, zo_swap_io_t io);
/* Zeroed, 4 KiB aligned host memory, counted in the host's high-water mark. */
zo_status eng_host_alloc(struct zo_engine *e, uint64_t bytes, float **out);
/* Releases what eng_host_alloc gave (never with free()); NULL is a no-op. */
void eng_host_free(void *p);
/* Chunks whose 16-bit parameters (kind 0) or states (kind 1) table is at. */
uint32_t eng_chunks_at(const struct zo_engine *e, int kind, const void *table);
/* A swap store a tier opened, whose I/O the step statistics count. */
void eng_store_opened(struct zo_engine *e, zo_swap_t store, uint64_t extent_bytes);
/* n pinned slots of slot_bytes from the pool, as one set. */
zo_status eng_take_pinned(struct zo_engine *e, size_t slot_bytes, size_t n, void **out);
/* A swap store of n_extents extents of extent bytes, named cfg's nvme_name
 * plus suffix, with the engine's NVMe settings and armed faults. */
zo_status eng_open_store(struct zo_engine *e, uint64_t extent, uint64_t n_extents,
                         const char *suffix, zo_swap_t *out);

/* engine_tier_host.c: the resident operations the device tier shares */
void eng_host_p16_account(const eng_plan_in *in, zo_tier t, zo_engine_footprint *fp);
/* Pinned host copies for the chunks whose parameters table holds. */
zo_status eng_host_p16_place(struct zo_engine *e, const eng_param_tier *table);
zo_status eng_host_p16_write(void *self, struct zo_engine *e, uint32_t c, const float *master,
                             int init);
zo_status eng_host_p16_source(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                              const void **src);
void *eng_host_p16_out(void *self, struct zo_engine *e, uint32_t c, void *tail);
void eng_host_p16_commit(void *self, struct zo_engine *e, uint32_t c, int updated, int stored);
/* The backups of the chunks homed at t (to fp); returns the bytes of their states. */
uint64_t eng_resident_account(const eng_plan_in *in, zo_tier t, zo_engine_footprint *fp);
/* The chunks table holds get their states from base (and backups, host memory, in *backups,
 * which the tier releases with eng_host_free). */
zo_status eng_resident_place(struct zo_engine *e, const eng_state_tier *table, float *base,
                             float **backups);
float *eng_resident_init_buf(void *self, struct zo_engine *e, uint32_t c);
zo_status eng_resident_init(void *self, struct zo_engine *e, uint32_t c, float *buf);
zo_status eng_resident_update(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                              const eng_update_args *u);
zo_status eng_resident_speculate(void *self, struct zo_engine *e, uint32_t c, const eng_job *j,
                                 int next);
zo_status eng_resident_drain(void *self, struct zo_engine *e);
void eng_resident_rollback(void *self, struct zo_engine *e, uint32_t c);
void eng_resident_discard(void *self, struct zo_engine *e, uint32_t c);
int eng_resident_commit(void *self, struct zo_engine *e, uint32_t c);
zo_status eng_resident_read(void *self, struct zo_engine *e, uint32_t c, float *out);
zo_status eng_resident_write_begin(void *self, struct zo_engine *e, uint32_t c, float **buf);
zo_status eng_resident_write_end(void *self, struct zo_engine *e, uint32_t c, float *buf);

#endif
