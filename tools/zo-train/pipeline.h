/* zo-train's pipeline stages (--pipeline-stages S): the model's engine
 * layers (embedding, blocks, head) split into S contiguous stages, one per
 * rank of a pipeline group, each rank's engine holding its stage's layers
 * only (so each stage tiers its own parameters, gradients and optimizer
 * states, as one rank does), and the PipeDream-Flush (1F1B) schedule over
 * the step's M micro-batches: stage r runs min(S-r-1, M) warm-up forwards,
 * then one forward and one backward in turn, then the cool-down backwards.
 * Activations go to the next stage and their gradients back to the
 * previous one with the communicator's send/recv, on streams of their own
 * ordered by events, so transfers run beside the compute; each stage
 * accumulates its layers' gradients in micro-batch order 0..M-1 as one rank
 * does, and the engine's verdict combines the stages' norm partials
 * (zo_engine_config.pipe_comm): S stages compute bitwise what one rank with
 * grad-accum M computes. Tied embeddings: the first stage sends layer 0's
 * parameters to the last for its head at the start of each step, and the
 * head's gradients of each micro-batch come back to be added to the
 * embedding's first, as one rank adds them. */
#ifndef ZT_PIPELINE_H
#define ZT_PIPELINE_H

#include "model.h"
#include "zo/comm.h"

enum { ZT_MAX_STAGES = 64 };

/* Stage s holds engine layers first[s] .. first[s+1]-1. */
typedef struct zt_pipe_split {
    int stages;
    int first[ZT_MAX_STAGES + 1];
} zt_pipe_split;

/* The split of the model's engine layers into S stages: spec the first
 * engine layer of stages 1..S-1 ("4,9,13"), "uniform" (layer counts as even
 * as they go), or "parameters" or NULL: the split that balances the stages'
 * parameter counts (the largest stage as small as contiguous stages allow).
 * Refuses S above the layer count naming both, and tied embeddings. */
zo_status zt_pipe_split_make(const zt_shape *s, int S, const char *spec, zt_pipe_split *out);
/* "0-3,4-7": each stage's layers, for messages and --json. */
void zt_pipe_split_format(const zt_pipe_split *p, char *buf, size_t cap);

/* The sets of layer inputs stage r of S keeps over M micro-batches: those
 * in flight (its warm-up plus one) and one more, so a micro-batch's input
 * is received while the op before its forward computes. */
int zt_pipe_sets(int S, int r, int M);

typedef struct zt_pipe zt_pipe;

typedef struct zt_pipe_config {
    zo_device_t dev;
    zo_stream_t compute;   /* the model's */
    zo_comm_t comm;        /* the pipeline group: rank r is stage r */
    zt_model *model;       /* made with zt_pipe_sets sets of layer inputs on the device */
    int first, last;       /* this stage's engine layers */
    int n_micro;           /* M */
    zo_dtype act_dtype;    /* the activations' (and parameters') */
    const zt_shape *shape; /* the model's (tied: layer 0 travels to the last stage) */
    zo_trace_fn trace;     /* optional: each micro-batch's forward and backward */
    void *trace_ctx;
} zt_pipe_config;

/* Streams and events of the stage, and the shapes checked once with the
 * neighbours (collective over the group). */
zo_status zt_pipe_init(zt_pipe **out, const zt_pipe_config *c);
void zt_pipe_free(zt_pipe *p);
/* One step's forward and backward of the M micro-batches (their tokens
 * set on the model) in 1F1B order; the loss gradient times grad_scale.
 * Returns once every transfer is done; the caller then ends the engine's
 * step. */
zo_status zt_pipe_train(zt_pipe *p, const zt_param_source *src, float grad_scale);
/* Forward only of micro-batches 0..n-1: the losses on the last stage. */
zo_status zt_pipe_eval(zt_pipe *p, const zt_param_source *src, int n);
/* The last stage's losses of micro-batches 0..n-1 to every stage. */
zo_status zt_pipe_share_losses(zt_pipe *p, float *losses, int n);
/* Host bytes pinned for staging: when the pipeline communicator takes
 * only host buffers (mpi with a CUDA device; zo_comm_takes_device_memory),
 * every activation, gradient and tied tensor goes device -> pinned -> send
 * and recv -> pinned -> device on its transfer stream, in the order the
 * direct path keeps. zt_pipe_test_staged forces that path on any device.
 * 0 when direct. */
size_t zt_pipe_pinned_bytes(const zt_pipe *p);
/* A test hook, defined only in the tests' own build of zo-train
 * (tests/train/pipe_staged.c: 1 when ZT_TEST_PIPE_STAGED=1), where it forces
 * the staged path on the cpu device, whose communicator takes device memory
 * directly. zo-train defines none (a weak reference, NULL), so the shipped
 * program reads no test variable. */
int zt_pipe_test_staged(void) __attribute__((weak));
/* Let the queued transfers finish, dropping their errors (a failed step). */
void zt_pipe_settle(zt_pipe *p);

#endif
