/* zo-train's model: a decoder-only transformer in the LLaMA layout, computed
 * with the compute ops (zo/ops.h) on a device stream.
 *
 *   tokens -> embedding -> L x block -> RMSNorm -> lm_head -> cross-entropy
 *   block:  x2 = x + Wo attn(rope(Wq n1), rope(Wk n1), Wv n1),  n1 = rmsnorm(x) * w_attn_norm
 *           y  = x2 + Wdown (silu(Wgate n2) * Wup n2),          n2 = rmsnorm(x2) * w_mlp_norm
 *
 * The output head is untied (its own vocab x dim matrix); tying it to the
 * embedding is left out because the engine hands each layer's gradients to
 * the optimizer at grads_ready, and a tied matrix would be written by two
 * layers. Multi-query / grouped-query attention is left out (Llama-2 7B and
 * 13B do not use it).
 *
 * Engine layers, in execution order: 0 = the embedding, 1..L = the blocks,
 * L+1 = the final norm and the head. Linear weights are stored [out, in]
 * (y = x W^T), as PyTorch and the Llama checkpoints store them.
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

#include "zo/device.h"
#include "zo/engine.h"
#include "zo/ops.h"

typedef struct zt_shape {
    int vocab;
    int dim;
    int n_layers;
    int n_heads;
    int ffn_dim;
    float norm_eps;   /* RMSNorm epsilon (1e-5 as Llama-2) */
    float rope_theta; /* 10000 */
} zt_shape;

/* Fill *out with a preset: tiny, small, 1b, 7b, 13b. ZO_ERR_INVALID_ARG
 * (message lists the names) for another name. */
zo_status zt_preset(const char *name, zt_shape *out);
/* The names, comma-separated, for --help. */
const char *zt_preset_names(void);
/* The shape flags over a preset: vocab, dim, layers, heads, ffn in that
 * order; 0 keeps the preset's value. */
void zt_shape_override(zt_shape *s, const int dims[5]);
/* Every dimension positive, heads dividing dim, head_dim even. */
zo_status zt_shape_check(const zt_shape *s);
uint64_t zt_shape_n_params(const zt_shape *s);
/* Training FLOPs per token without the recompute (6 N_matmul + the attention
 * 6 * 2 * L * seq * dim of QK^T and PV, forward and backward; as in PaLM's
 * model-FLOPs utilization). */
double zt_shape_flops_per_token(const zt_shape *s, int seq);

/* ---- parameter tensors, per engine layer ---- */

enum { ZT_BLOCK_TENSORS = 9, ZT_MAX_LAYER_TENSORS = ZT_BLOCK_TENSORS };
enum { /* tensors of a block, in the order the forward uses them */
       ZT_ATTN_NORM = 0,
       ZT_WQ,
       ZT_WK,
       ZT_WV,
       ZT_WO,
       ZT_MLP_NORM,
       ZT_WGATE,
       ZT_WUP,
       ZT_WDOWN
};
enum { ZT_HEAD_NORM = 0, ZT_HEAD_OUT = 1 };

int zt_engine_layers(const zt_shape *s); /* n_layers + 2 */
int zt_layer_tensors(const zt_shape *s, int layer);
/* The tensor's name ("blocks.3.wq") into name, and its element count. */
size_t zt_tensor_numel(const zt_shape *s, int layer, int idx);
void zt_tensor_name(const zt_shape *s, int layer, int idx, char *name, size_t cap);
/* Deterministic initial values from the seed: norms 1, every matrix
 * N(0, init_std^2), the residual outputs (wo, wdown) scaled by
 * 1/sqrt(2 n_layers) as in GPT-2. The values depend only on (seed, layer,
 * idx), so any placement of the tensors sees the same model. */
void zt_tensor_init(const zt_shape *s, int layer, int idx, uint64_t seed, float init_std,
                    float *out);

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

typedef struct zt_model_config {
    zt_shape shape;
    int seq;         /* tokens per sequence */
    int micro_batch; /* sequences per micro-batch */
    int n_micro;     /* micro-batches whose tokens are held at once (the gradient accumulation) */
    zo_dtype dt;     /* parameter and activation dtype (bf16, fp16; fp32 for tests) */
} zt_model_config;

typedef struct zt_model zt_model;

/* Device bytes zt_model_init allocates (one arena; exact). */
uint64_t zt_model_activation_bytes(const zt_model_config *c);
/* The arena by what uses it (for the planner): the tokens, losses and RoPE
 * table; the checkpoints (every block's input and the head's, with the
 * residual gradient); one layer's workspace (the largest of a block's, the
 * head's and the embedding gradient's fp32 accumulator). */
typedef struct zt_activation_parts {
    uint64_t total, inputs, checkpoints, workspace;
} zt_activation_parts;
void zt_model_activation_parts(const zt_model_config *c, zt_activation_parts *out);
zo_status zt_model_init(zt_model **out, zo_device_t dev, zo_stream_t compute,
                        const zt_model_config *c);
void zt_model_free(zt_model *m);

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
/* Forward and loss only (validation). */
zo_status zt_model_eval_micro(zt_model *m, const zt_param_source *src, int i);
/* Wait for the compute stream and copy the losses of micro-batches 0..n-1
 * (mean cross-entropy of each, fp32). */
zo_status zt_model_read_losses(zt_model *m, float *losses, int n);

#endif
