/* zo-train's model: a decoder-only transformer in the LLaMA layout, computed
 * with the compute ops (zo/ops.h) on a device stream.
 *
 *   tokens -> embedding -> L x block -> RMSNorm -> lm_head -> cross-entropy
 *   block:  x2 = x + Wo attn(rope(Wq n1), rope(Wk n1), Wv n1),  n1 = rmsnorm(x) * w_attn_norm
 *           y  = x2 + Wdown (silu(Wgate n2) * Wup n2),          n2 = rmsnorm(x2) * w_mlp_norm
 *
 * Hugging Face variants (model_shape.h): grouped-query attention (the k and
 * v projections have n_kv_heads heads, RoPE'd then repeated to the query
 * heads with zo_op_repeat_kv_fwd; their gradients summed back per group in
 * fp32, ascending query head), an explicit head_dim, q/k/v biases (added
 * after the projections, before RoPE), RoPE scaling (linear, llama3). With
 * none of them the model is the Llama-2 one op for op.
 *
 * The output head is its own vocab x dim matrix, or the embedding's when
 * tied (tie_word_embeddings): then one tensor in engine layer 0 beside the
 * final norm, and the head computes under layer 0's forward fetch (the
 * parameters the engine hands out stay those of the step until end_step).
 * The engine hands a layer's gradients over at grads_ready, so the head's
 * gradients of the matrix and the norm wait in the arena (per micro-batch
 * of a group) until the embedding's backward, which adds them to layer 0's
 * gradients before its own part: head + embedding, transformers' order.
 *
 * The shapes, the tensors of each engine layer and the activation arena's
 * layout are the shape part's (tools/model-shape/model_shape.h): zo-plan
 * plans with them without this compute.
 *
 * Activation checkpointing: the forward keeps only each block's input (and
 * the head's input); the backward of block l recomputes its forward from that
 * input before computing its gradients. The head is computed once, in the
 * backward phase: its forward, the loss and its backward run under one fetch.
 *
 * Parameters are fetched per layer through a zt_param_source: the engine in
 * zo-train, device-resident buffers (zt_resident) in the gradient tests. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "act_store.h"
#include "model_shape.h"
#include "zo/comm.h"
#include "zo/device.h"
#include "zo/engine.h"
#include "zo/ops.h"

/* ---- where the parameters come from ---- */

typedef struct zt_param_source {
    void *ctx;
    zo_status (*fetch)(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **params,
                       void **grads, int n);
    zo_status (*release)(void *ctx, int layer, zo_stream_t s);
    zo_status (*grads_ready)(void *ctx, int layer, zo_stream_t s);
} zt_param_source;

/* Device-resident parameters and gradients in one dtype (fp32 allowed), for
 * tests and references: every fetch returns the same buffers; gradients
 * accumulate until zt_resident_zero_grads. */
typedef struct zt_resident zt_resident;
zo_status zt_resident_init(zt_resident **out, zo_device_t dev, zo_stream_t stream,
                           const zt_shape *s, zo_dtype dt, uint64_t seed, float init_std);
void zt_resident_free(zt_resident *r);
zt_param_source zt_resident_source(zt_resident *r);
zo_status zt_resident_zero_grads(zt_resident *r, zo_stream_t s);
/* Copy a tensor's parameters or gradients to/from host fp32 in stream order
 * on s, and wait for s. */
zo_status zt_resident_read(zt_resident *r, zo_stream_t s, int layer, int idx, int grad, float *out);
zo_status zt_resident_write(zt_resident *r, zo_stream_t s, int layer, int idx, const float *in);

/* ---- the model's activations and the compute ---- */

typedef struct zt_model zt_model;

/* The model for c on dev: its activation arena (exactly
 * zt_model_activation_bytes, model_shape.h) computed on the compute stream. */
zo_status zt_model_init(zt_model **out, zo_device_t dev, zo_stream_t compute,
                        const zt_model_config *c);
/* The same with layer-major groups g (NULL: none; the arena is then
 * zt_model_activation_bytes_group's, and with act_home host or nvme the
 * group's layer inputs take zt_model_host_activation_bytes of pinned host
 * memory, nvme adding zt_model_act_carry_bytes of pageable memory). */
zo_status zt_model_init_group(zt_model **out, zo_device_t dev, zo_stream_t compute,
                              const zt_model_config *c, const zt_act_group *g);
/* The same with act_home nvme's store on nv (NULL for other homes). */
zo_status zt_model_init_act(zt_model **out, zo_device_t dev, zo_stream_t compute,
                            const zt_model_config *c, const zt_act_group *g, const zt_act_nvme *nv);
void zt_model_free(zt_model *m);
/* Wait for the work queued on the compute and copy streams, dropping their
 * errors (after a failed step, before it is run again). */
void zt_model_settle(zt_model *m);
/* The layer-input store (act_home host or nvme with groups; else NULL). */
zt_act_store *zt_model_act_store(zt_model *m);

/* Queue the copy of n_micro micro-batches of tokens (host arrays of
 * n_micro * micro_batch * seq ids; targets are the next tokens). The host
 * arrays are copied at once (the caller may reuse them). */
zo_status zt_model_set_batch(zt_model *m, const int32_t *inputs, const int32_t *targets,
                             int n_micro);
/* Forward, loss and backward of micro-batch i through the whole model: the
 * parameter gradients accumulate into the source's gradient buffers. The
 * loss gradient is multiplied by grad_scale (the loss scale divided by the
 * number of micro-batches). Asynchronous on the compute stream. */
zo_status zt_model_train_micro(zt_model *m, const zt_param_source *src, int i, float grad_scale);
/* Micro-batches first..first+n-1 layer-major (n at most zt_model_group of
 * the model's groups): each layer fetched once per phase for the group, each
 * micro-batch's gradients handed over in turn under that fetch; the layer
 * inputs the backward recomputes from and the residual gradients are kept
 * per micro-batch (act_home). A group of 1 is zt_model_train_micro. */
zo_status zt_model_train_group(zt_model *m, const zt_param_source *src, int first, int n,
                               float grad_scale);
/* Forward and loss only (validation). */
zo_status zt_model_eval_micro(zt_model *m, const zt_param_source *src, int i);
/* Wait for the compute stream and copy the losses of micro-batches 0..n-1
 * (mean cross-entropy of each, fp32). A failed load or store of the step's
 * layer inputs (act_home nvme: an NVMe error) is reported here. */
zo_status zt_model_read_losses(zt_model *m, float *losses, int n);

/* Tensor parallelism (tensor_parallel.h): the model was made with a rank's
 * local shape (zt_tp_local_shape); tp, its group, sums the row-parallel
 * outputs in the forward and the column-parallel input gradients in the
 * backward, and the rank's part of the embedding lookup; the head's loss
 * combines the ranks' vocabulary parts (collectives on the compute stream:
 * every rank of tp must run the same micro-batches). It takes
 * zt_model_tp_bytes (tp_shape.h) of device memory beside the arena. NULL: none. */
zo_status zt_model_set_tp(zt_model *m, zo_comm_t tp);

/* ---- pipeline stages (pipeline.h) ----
 * A stage computes engine layers first..last (0: the embedding, 1..L the
 * blocks, L+1 the head) of one micro-batch on set `set` of the arena's
 * layer inputs (a model made with a group of K sets on the device holds K
 * micro-batches in flight). The stage's input is the block input of layer
 * first (received from the previous stage), its output the block input of
 * layer last + 1 (sent to the next); its gradients travel in the set's
 * residual gradient: received before the backward, the input's gradient
 * after it. Each op is the one the whole model runs, in the same order, so
 * stages compute bitwise what one rank computes. The stage of the last
 * engine layer computes the head; a tied model's head there fetches layer
 * 0 (the embedding and the final norm: its source must hand out a copy)
 * and leaves its gradients in the set's head gradients, which the first
 * stage's embedding backward adds first, as one rank does (the pipeline
 * moves them). */
size_t zt_model_stage_elems(const zt_model *m); /* elements of an input, an output, a gradient */
void *zt_model_stage_input(zt_model *m, int set, int first); /* NULL for the first stage */
void *zt_model_stage_output(zt_model *m, int set, int last); /* NULL for the last stage */
void *zt_model_stage_grad(zt_model *m, int set);
/* Tied: a set's head gradients (matrix and final norm) and their bytes; NULL and 0 untied. */
uint64_t zt_model_stage_head_bytes(const zt_model *m);
void *zt_model_stage_head_grads(zt_model *m, int set);
/* The forward of layers first..min(last, L) (the head runs in the backward). */
zo_status zt_model_stage_forward(zt_model *m, const zt_param_source *src, int first, int last,
                                 int i, int set);
/* The head's forward, loss and backward when last is L+1, then the
 * backward of the blocks down to first (recomputing each from its input),
 * then the embedding's when first is 0. */
zo_status zt_model_stage_backward(zt_model *m, const zt_param_source *src, int first, int last,
                                  int i, int set, float grad_scale);
/* Forward only, and the loss when the stage holds the head (validation). */
zo_status zt_model_stage_eval(zt_model *m, const zt_param_source *src, int first, int last, int i,
                              int set);

#endif
