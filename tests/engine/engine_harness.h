/* The engine tests' harness (engine_harness.c): a run's configuration and
 * results, the engine built over the cpu device for it, the test model's
 * steps driven through the engine, and the checks and fault drills the
 * test_engine_*.c programs share. */
#ifndef ZO_ENGINE_HARNESS_H
#define ZO_ENGINE_HARNESS_H

#include <stdatomic.h>

#include "test_model.h"
#include "zo/device.h"
#include "zo/device_testing.h"
#include "zo/engine_testing.h"
#include "zo/swap.h"
#include "zo_internal.h"

#define STEPS 20
#define CHUNK (8u << 10)

typedef struct run_cfg {
    zo_tier param_home, optim_home;
    zo_optim_mode mode;
    uint64_t device_bytes, pinned_bytes;
    int accum;
    int lookahead;
    float max_norm;
    zo_dtype dtype;
    uint64_t poison_steps; /* bit s: an infinity in layer 1's gradient at step s */
    int steps;
    int recompute_from; /* from this step on, the backward re-runs each layer's forward first */
    const float *lrs;   /* the learning rate of each step (zo_engine_set_lr), or NULL */
    uint32_t nvme_block_size, nvme_queue_depth;
    zo_trace_fn trace; /* installed before finalize */
    void *trace_ctx;
    zo_engine_caps pcaps, ocaps; /* per-chunk homes: caps of the tiers faster than the homes */
    uint64_t host_bytes;         /* the host tier's budget (0: not limited) */
    int group;                   /* micro_group: > 1 runs the step layer-major in such groups */
    int master_split;            /* zo_engine_config.master_split */
    int fill;                    /* register with zo_engine_register_fill rather than with copies */
    int update_behind;           /* zo_engine_config.update_behind */
} run_cfg;

#define TM_MAXGROUP 8

#define N_CHUNKS   8 /* the test model packs each layer's W into a chunk, its b into another */
#define P16_EXTENT 8192ull /* the fullest chunk's 16-bit bytes, rounded to 4 KiB */

/* The optimizer states' format of the engines the tests build: fp32 but
 * in the format tests. */
extern zo_dtype g_state_dtype;
extern int g_keep_f32; /* a tensor (k) marked by zo_engine_keep_f32_states, or -1 */
/* Tensors (k) given their own weight decay by zo_engine_set_weight_decay. */
extern unsigned char g_own_decay[TM_T];
extern float g_decay[TM_T];
extern unsigned char g_own_adam[TM_T]; /* tensor k gets g_group[k] (zo_engine_set_tensor_adam) */
extern tm_group g_group[TM_T];

typedef struct run_out {
    float *master[TM_T];
    double losses[TM_MAXSTEPS];
    zo_step_stats stats[TM_MAXSTEPS];
    zo_engine_footprint fp;
} run_out;

/* The initial values zo_engine_register_fill asks for, and its calls. */
typedef struct fill_src {
    float *init[TM_T];
    int calls[TM_T];
    int fail_id; /* >= 0: this tensor's fill fails */
} fill_src;

typedef struct harness {
    zo_device_t dev;
    zo_stream_t compute;
    zo_engine_t eng;
    tm_acts *a;
    run_cfg rc;
    char dir[64];
    int ids[TM_T];
    int fault_layer; /* >= 0: a device stream task fails right after this layer's backward */
    tm_acts *ga[TM_MAXGROUP]; /* layer-major: the activations of each micro-batch of a group */
    fill_src fill;
} harness;

typedef struct saved_state {
    float *st[TM_T][3]; /* master, m, v */
    zo_engine_step_state ss;
} saved_state;

/* Flips a byte of every extent of the gradients' store once a gradient
 * write lands (from the trace callback, on the store's I/O thread): the
 * extents written so far this step fail their checksum when read back. */
typedef struct corrupter {
    _Atomic int armed;
    int store; /* the traced store it corrupts: 1 16-bit parameters, 2 gradients */
    int n;
    char path[8][512];
    uint64_t off[64];
    int file[64];
} corrupter;

run_cfg base_cfg(zo_tier ph, zo_tier oh, zo_optim_mode mode);
void run_out_free(run_out *o);
zo_status fill_from(void *ctx, int id, float *dst);
zo_adam_params test_adam(void);

/* The engine for h->rc, its tensors registered; finalized when asked. */
zo_status build_engine(harness *h, const zo_swap_fault *faults, size_t nfaults, int finalize);
zo_status make_engine(harness *h, const zo_swap_fault *faults, size_t nfaults);
void harness_open(harness *h, const run_cfg *rc);
void harness_close(harness *h);
zo_status enqueue(harness *h, zo_stream_fn fn, const void *arg, size_t n);
zo_status forward_layer(harness *h, int l);
zo_status backward_layer(harness *h, int l, int poison, int recompute);
/* One optimizer step; on an error the compute stream is drained and the
 * error returned (the engine has abandoned the step). */
zo_status train_step(harness *h, int step, double *loss, zo_step_stats *stats);
void train_range(harness *h, int s0, int s1, double *losses);
void read_masters(harness *h, float *out[TM_T]);
/* A whole run of rc, its budgets checked at every step. */
void run(const run_cfg *rc, run_out *o);
void assert_same_weights(const run_out *a, const run_out *b, int steps);
void assert_matches_reference(const run_out *o, const tm_ref *r, int steps);
/* The smallest device budget: one layer's parameter and gradient chunks. */
uint64_t min_device_bytes(void);

/* finalize refuses rc with want, naming tier and a shortfall of 1 byte. */
void expect_refusal(const run_cfg *rc, zo_status want, const char *tier);
/* Run step s, which is expected to fail; the weights must stay `before`
 * (read before the fault was armed; freed here). */
zo_status failing_step(harness *h, int s, float *before[TM_T]);
/* Steps [from, to) of h, each must succeed; their losses into losses[s]. */
void train_steps(harness *h, int from, int to, double *losses);
/* A fault drill's start: the run of c without faults into ref, then h's
 * engine for c with swap faults armed (none firing yet). */
void open_for_faults(harness *h, const run_cfg *c, run_out *ref);
/* The run in h, after its faults, must equal the run without them. */
void close_and_compare(harness *h, const double *losses, run_out *ref, int steps);
/* Arm one EIO at each of several request indices of a store in turn; each
 * attempt of step s must fail and leave the weights as they were. */
void fail_step_at(harness *h, zo_swap_t store, int s);
/* Arm one EIO at request `op` of a store: step s fails and leaves the
 * weights as they were. */
void fail_request(harness *h, zo_swap_t store, int s, uint64_t op);

void save_state(harness *h, saved_state *out);
void saved_state_free(saved_state *s);
/* Steps half..2*half-1 of a fresh engine given the state saved at step half
 * (what: bit 0 masters, 1 moments, 2 the step state); 1 when losses and
 * final weights equal ref's. */
int resumed_equals(const run_cfg *c, const saved_state *s, unsigned what, int half,
                   const double *ref_losses, float *ref_master[TM_T]);

void corrupt_on_write(void *ctx, const zo_trace_event *ev);
/* Points k at the payload of every extent of store s. */
void corrupter_locate(corrupter *k, zo_swap_t s);

#endif
