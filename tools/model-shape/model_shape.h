/* The model's shapes, in one place for every tool: the presets, the shape
 * of zo-train's decoder-only transformer (LLaMA layout, see zo-train's
 * model.h for the compute) and what follows from it alone: the parameter
 * tensors of each engine layer, the parameter count, the FLOPs per token,
 * and the layout of the activation arena for a batch. zo-train computes
 * with it; zo-plan plans with it without linking the trainer's compute.
 *
 * Engine layers, in execution order: 0 = the embedding, 1..L = the blocks,
 * L+1 = the final norm and the head. A tied model (tie_word_embeddings) has
 * no layer L+1: its head is the embedding's matrix, one tensor, so layer 0
 * holds the embedding and the final norm and the head computes under layer
 * 0's fetch. Linear weights are stored [out, in] (y = x W^T), as PyTorch and
 * the Llama checkpoints store them. */
#ifndef ZT_MODEL_SHAPE_H
#define ZT_MODEL_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "zo/ops.h"
#include "zo/status.h"

typedef struct zt_shape {
    int vocab;
    int dim;
    int n_layers;
    int n_heads;
    int ffn_dim;
    float norm_eps;   /* RMSNorm epsilon (1e-5 as Llama-2) */
    float rope_theta; /* 10000 */
    /* The Hugging Face variants (Llama 3, Mistral, Qwen2); zero keeps the
     * Llama-2 layout, so a preset is the Llama-2 model exactly. */
    int n_kv_heads;               /* grouped-query attention: key/value heads (0: n_heads) */
    int head_dim;                 /* 0: dim / n_heads */
    int attn_bias;                /* q, k and v projections with biases (Qwen2) */
    int tied;                     /* the head's weight is the embedding's: one tensor,
                                     trained as one (layer 0 holds it and the final norm) */
    zo_rope_scaling rope_scaling; /* type NONE: unscaled */
    int o_bias;      /* o_proj with a bias too (Llama's attention_bias; needs attn_bias) */
    int window;      /* sliding window (Mistral's, Qwen2's sliding_window): query i sees keys
                        j with i - j < window; 0: none. The fused op applies it; the dense
                        one only where it is not shorter than the sequence */
    int window_from; /* the first layer with the window (Qwen2's max_window_layers):
                        the layers before it are full causal */
} zt_shape;

/* The effective key/value heads, head dimension, and the widths of the
 * query (n_heads * head_dim) and key/value (n_kv_heads * head_dim) projections. */
int zt_kv_heads(const zt_shape *s);
int zt_head_dim(const zt_shape *s);
int zt_q_dim(const zt_shape *s);
int zt_kv_dim(const zt_shape *s);

/* Fill *out with a preset: tiny, small, 1b, 7b, 13b, 70b. ZO_ERR_INVALID_ARG
 * (message lists the names) for another name. */
zo_status zt_preset(const char *name, zt_shape *out);
/* The names, comma-separated, for --help. */
const char *zt_preset_names(void);
/* The shape flags over a preset: vocab, dim, layers, heads, ffn in that
 * order; 0 keeps the preset's value. */
void zt_shape_override(zt_shape *s, const int dims[5]);
/* Every dimension positive, heads dividing dim (or head_dim given), head_dim
 * even, kv heads dividing heads, the RoPE scaling valid. */
zo_status zt_shape_check(const zt_shape *s);
uint64_t zt_shape_n_params(const zt_shape *s);
/* Training FLOPs per token without the recompute (6 N_matmul + the attention
 * 6 * 2 * L * seq * dim of QK^T and PV, forward and backward; as in PaLM's
 * model-FLOPs utilization). A layer with a sliding window counts its
 * attention times zt_window_density: the fused op skips what the window
 * hides, so counting it would inflate the MFU and the planner's step time. */
double zt_shape_flops_per_token(const zt_shape *s, int seq);
/* The share of causal attention's query-key pairs a sliding window keeps at
 * seq (query i sees min(i + 1, window) keys, of i + 1): 1 without a window
 * or with one not shorter than seq. */
double zt_window_density(int window, int seq);
/* Block b's (0-based) attention work against a full causal layer's:
 * zt_window_density for a layer with the window, else 1. */
double zt_block_attention_share(const zt_shape *s, int block, int seq);
/* The share of causal attention's work the fused op runs in a layer with
 * the block-sparse layout l (NULL or struct_size 0: none) and the sliding
 * window (0: none) at seq. Without a layout zt_window_density. With one,
 * the query x key blocks the mask of zo_attn_layout_build (the op's own
 * mask) keeps, and with a window too only those of them the window reaches
 * (the op skips a tile no pair of which it allows), over the blocks of a
 * causal sweep (nb (nb + 1) / 2; nb^2 for a full one): the builder's
 * density. ZO_ERR_INVALID_ARG for a layout the builder refuses, or one of
 * more than ZT_LAYOUT_MAX_BLOCKS blocks a side (its mask would take over
 * 256 MiB to count). The last answer is kept per thread: the planners ask
 * for the same layout and length for every layer and candidate. */
enum { ZT_LAYOUT_MAX_BLOCKS = 16384 };
zo_status zt_layout_share(const zo_attn_layout *l, int window, int seq, double *out);
/* zt_block_attention_share with the layout l: zt_layout_share for block's
 * window; NaN where that fails (a caller checks the layout with
 * zt_layout_share first). */
double zt_block_layout_share(const zt_shape *s, const zo_attn_layout *l, int block, int seq);
/* zt_shape_flops_per_token with the layout l: every block's attention
 * scaled by its zt_block_layout_share (NaN where that fails). */
double zt_layout_flops_per_token(const zt_shape *s, const zo_attn_layout *l, int seq);

/* ---- parameter tensors, per engine layer ---- */

/* A block has 9 tensors, 12 with attn_bias, 13 with o_bias too (the biases
 * last, so the first nine keep their indices). */
enum {
    ZT_BLOCK_TENSORS = 9,
    ZT_BLOCK_TENSORS_BIAS = 12,
    ZT_BLOCK_TENSORS_O_BIAS = 13,
    ZT_MAX_LAYER_TENSORS = 13
};
enum { /* tensors of a block, in the order the forward uses them */
       ZT_ATTN_NORM = 0,
       ZT_WQ,
       ZT_WK,
       ZT_WV,
       ZT_WO,
       ZT_MLP_NORM,
       ZT_WGATE,
       ZT_WUP,
       ZT_WDOWN,
       ZT_BQ,
       ZT_BK,
       ZT_BV,
       ZT_BO
};
enum { ZT_HEAD_NORM = 0, ZT_HEAD_OUT = 1 };
/* Layer 0 of a tied model: the embedding (also the head's matrix), then the final norm. */
enum { ZT_EMBEDDING = 0, ZT_TIED_NORM = 1 };

int zt_engine_layers(const zt_shape *s); /* n_layers + 2; n_layers + 1 tied */
int zt_layer_tensors(const zt_shape *s, int layer);
/* The tensor's name ("blocks.3.wq") into name, and its element count. */
size_t zt_tensor_numel(const zt_shape *s, int layer, int idx);
void zt_tensor_name(const zt_shape *s, int layer, int idx, char *name, size_t cap);
/* Whether the tensor keeps fp32 Adam moments under int8 states when the
 * run asks (zo_engine_keep_f32_states): the token embedding, tied or not,
 * as bitsandbytes' and transformers' 8-bit Adam keep every nn.Embedding's;
 * an untied head is a linear layer and stays 8-bit, as theirs. */
int zt_tensor_embedding(const zt_shape *s, int layer, int idx);
/* The tensor's Hugging Face name (model.layers.3.self_attn.q_proj.weight,
 * ...q_proj.bias, lm_head.weight) and shape ([out, in] or [n]; ndim 1 or 2). */
void zt_tensor_hf(const zt_shape *s, int layer, int idx, char *name, size_t cap, int *ndim,
                  int64_t shape[2]);
/* Deterministic initial values from the seed: norms 1, biases 0, every matrix
 * N(0, init_std^2), the residual outputs (wo, wdown) scaled by
 * 1/sqrt(2 n_layers) as in GPT-2. The values depend only on (seed, layer,
 * idx), so any placement of the tensors sees the same model. */
void zt_tensor_init(const zt_shape *s, int layer, int idx, uint64_t seed, float init_std,
                    float *out);
/* The element count of the model's largest tensor. */
uint64_t zt_largest_tensor(const zt_shape *s);
/* The default chunk size: the largest tensor's 16-bit bytes, rounded to 4 KiB. */
uint64_t zt_default_chunk_bytes(const zt_shape *s);

/* ---- the activation arena of a batch ---- */

typedef struct zt_model_config {
    zt_shape shape;
    int seq;         /* tokens per sequence */
    int micro_batch; /* sequences per micro-batch */
    int n_micro;     /* micro-batches whose tokens are held at once (the gradient accumulation) */
    zo_dtype dt;     /* parameter and activation dtype (bf16, fp16; fp32 for tests) */
    int flash;       /* 1: the fused attention op (--attention flash): att and datt
                        hold lse and delta (O(seq)), GQA reads the key/value heads in place */
    zo_attn_layout layout; /* the fused op's block-sparse layout (DeepSpeed's sparse_attention),
                              causal; struct_size 0: none */
    int seq_par; /* sequence parallelism (Megatron's, with tensor parallelism): the ranks a
                    micro-batch's tokens are split over outside attention and the MLP, each
                    holding micro_batch x seq / seq_par rows of the residual stream (0 or 1:
                    none; it must divide micro_batch x seq) */
    uint64_t mlp_chunk_bytes; /* a block's position-wise chunk limit (zo-train's
                                 --mlp-chunk-bytes, zoffload.mlp_chunk_bytes): bytes of each
                                 ffn-wide buffer; 0: zt_mlp_chunk_bytes() */
} zt_model_config;

/* The rows of the residual stream a rank holds: micro_batch x seq, or its
 * 1/seq_par share with sequence parallelism. */
uint64_t zt_model_res_rows(const zt_model_config *c);

/* Layer-major micro-batches (zo-train's --micro-group, --act-home): the layer
 * inputs the backward recomputes from (every block's input and the head's)
 * and the residual gradient are kept per micro-batch of a group. NULL where
 * a function takes one: micro-batch-major. */
typedef struct zt_act_group {
    int micro_group; /* micro-batches per group (0 or 1: none) */
    int act_home;    /* where a group's are kept: ZT_ACT_DEVICE (in the arena), ZT_ACT_HOST
                        (pinned host memory) or ZT_ACT_NVME (checksummed NVMe extents, with
                        the residual stream carried in pageable host memory), staged through
                        the arena's one set on the device's copy streams */
} zt_act_group;

enum { ZT_ACT_DEVICE = 0, ZT_ACT_HOST = 1, ZT_ACT_NVME = 2 };

/* Pinned staging slots of layer inputs with act_home ZT_ACT_NVME: one per
 * copy direction (each direction is one stream, so a slot is free again when
 * its stream moves on); independent of the model's depth and the group. */
enum { ZT_ACT_RING_SLOTS = 2 };

/* act_home ZT_ACT_HOST at one micro-batch a group (no --micro-group, or a
 * group of one): the layer inputs leave the device layer by layer. The
 * arena keeps two checkpoint slots that a block's input and output
 * alternate in, and the residual gradient; every block's input waits in
 * pinned host memory (n_layers strides) from its forward to the backward,
 * which loads the next block's while the current one computes. */
int zt_act_per_layer(const zt_model_config *c, const zt_act_group *g);

/* Micro-batches per group: micro_group, at most n_micro; 1 without groups. */
int zt_model_group(const zt_model_config *c, const zt_act_group *g);
/* micro_group >= 0 and act_home device, host or nvme (g may be NULL). */
zo_status zt_act_group_check(const zt_act_group *g);

/* The shape, the batch and the dtype valid for the model. */
zo_status zt_model_config_check(const zt_model_config *c);
/* A job's sizes against the shape, in checked arithmetic (zo/checked.h),
 * refused naming --seq, --micro-batch, --grad-accum (and the ranks): a
 * micro-batch's tokens times the widest GEMM operand within 32 bits (the
 * GEMMs index with int), the tokens of a step over all ranks within
 * INT32_MAX, and a step's layer inputs (tokens x dim x (layers + 1) x 4
 * bytes) within 2^62, so that no byte count derived from them wraps. */
zo_status zt_job_sizes_check(const zt_shape *s, int seq, int micro_batch, int grad_accum,
                             int ranks);

/* The arena by what uses it (for the planner): the tokens, losses and RoPE
 * table; the checkpoints (every block's input and the head's, with the
 * residual gradient); one layer's workspace (the largest of a block's, the
 * head's and the embedding gradient's fp32 accumulator). */
typedef struct zt_activation_parts {
    uint64_t total, inputs, checkpoints, workspace;
} zt_activation_parts;

/* Where each piece of the arena starts (bytes from its base, 256-aligned).
 * The workspace pieces of a block, of the head and the embedding gradient
 * share one region: they are never live at the same time. */
typedef struct zt_block_offsets { /* one block's forward intermediates and backward buffers */
    uint64_t h1, q, k, v, att, attn_out, x2, h2, gate, up, act; /* h1 = h2: one chunk's rows */
    uint64_t dq, dk, dv, datt; /* flash: dq in attn_out's piece, dk and dv in k's and v's
                                  (the fused backward writes them in place) */
    uint64_t rstd1, rstd2;
    uint64_t kc, vc, dkc, dvc; /* the n_kv_heads projections (k, v, dk, dv without GQA or
                                  with flash) */
    uint64_t dattn; /* flash: d(attn_out), beside attn_out (the backward reads both), in x2's
                       piece (dead once the MLP half's backward is done) */
} zt_block_offsets;

typedef struct zt_head_offsets {
    uint64_t hf, logits, rstd, row_loss;
} zt_head_offsets;

typedef struct zt_activation_layout {
    uint64_t tok_in, tok_tgt;   /* n_micro * micro_batch * seq int32 each */
    uint64_t losses;            /* n_micro floats */
    uint64_t rope;              /* seq x head_dim/2 x {cos, sin} */
    uint64_t block_mask;        /* the layout's nb x nb mask bytes (no layout: none) */
    uint64_t ckpt, ckpt_stride; /* block l's input (l = 0..n_layers; n_layers: the head's) */
    uint64_t dres;              /* the residual stream's gradient */
    /* Sequence parallel: every token's rows gathered from the ranks (a norm's
     * output, the residual gradient) or the partial sums before their
     * reduce-scatter, micro_batch x seq x dim each, and the rank's own rows
     * before a gather or after a reduce-scatter; 0 without. */
    uint64_t sp_all, sp_grad, sp_own;
    zt_block_offsets block;
    zt_head_offsets head;
    uint64_t emb_grad; /* the embedding gradient's fp32 accumulator */
    /* Tied: the head's gradients of the embedding matrix and of the final norm
     * (dt), kept from the head's backward to the embedding's, one pair per set
     * of layer inputs (set j at head_grad + j * head_stride); 0 untied. */
    uint64_t head_grad, head_stride, head_norm_grad;
    zt_activation_parts parts;
} zt_activation_layout;

void zt_activation_layout_of(const zt_model_config *c, zt_activation_layout *out);
/* The head's logits and loss run in chunks of rows (tokens) whose logits
 * take at most ZO_HEAD_CHUNK_BYTES (the environment, bytes; default
 * ZT_HEAD_CHUNK_BYTES): nothing is tokens x vocab. The rows of one chunk,
 * 1 to the micro-batch's tokens (all of them: one chunk, today's head). */
enum { ZT_HEAD_CHUNK_BYTES = 64 << 20 };
uint64_t zt_head_chunk_bytes(void);
uint64_t zt_head_chunk_rows(const zt_model_config *c);
/* A block's position-wise parts run in chunks of rows (tokens) whose
 * ffn-wide buffers take at most c->mlp_chunk_bytes each (when 0,
 * ZO_MLP_CHUNK_BYTES from the environment, bytes; default
 * ZT_MLP_CHUNK_BYTES): the MLP half (its norm, gate and up,
 * their SwiGLU product, down) and the attention half's norm with the q, k,
 * v projections. Nothing tokens x ffn is live, and the norms' outputs (h1,
 * h2: one piece) are one chunk's. The backward recomputes each chunk's norm
 * (and the MLP chunk's forward) from the block's input or x2 just before
 * the chunk's gradients. The rows of one chunk, 1 to the micro-batch's
 * tokens (all of them: one chunk, the unchunked block's bits). */
enum { ZT_MLP_CHUNK_BYTES = 16 << 20 };
uint64_t zt_mlp_chunk_bytes(void);
uint64_t zt_mlp_chunk_rows(const zt_model_config *c);
/* Device bytes of the arena (exact: what zo-train's zt_model_init allocates). */
uint64_t zt_model_activation_bytes(const zt_model_config *c);
/* The same with layer-major groups: with act_home device the arena holds a
 * set of layer inputs and a residual gradient per micro-batch of a group (set
 * j at ckpt + j (n_layers + 1) strides and dres + j strides). */
void zt_activation_layout_group(const zt_model_config *c, const zt_act_group *g,
                                zt_activation_layout *out);
uint64_t zt_model_activation_bytes_group(const zt_model_config *c, const zt_act_group *g);
void zt_model_activation_parts_group(const zt_model_config *c, const zt_act_group *g,
                                     zt_activation_parts *out);
/* Pinned host bytes of a group's layer inputs and residual gradients: with
 * act_home ZT_ACT_HOST all of them (and a tied model's head gradients,
 * zt_head_grad_stride each, after them), with ZT_ACT_NVME the staging ring
 * (ZT_ACT_RING_SLOTS strides, 4 KiB-rounded); per layer (zt_act_per_layer)
 * the n_layers block inputs; 0 on the device, or nvme without groups. */
uint64_t zt_model_host_activation_bytes(const zt_model_config *c, const zt_act_group *g);
/* act_home ZT_ACT_NVME: the pageable host bytes that carry each micro-batch's
 * residual stream from one layer to the next (a stride per micro-batch of a
 * group), and the NVMe payload bytes of the layer inputs the backward reads
 * back (n_layers extents per micro-batch: every block's input; the head's
 * is the carried one). 0 otherwise. */
uint64_t zt_model_act_carry_bytes(const zt_model_config *c, const zt_act_group *g);
uint64_t zt_model_act_nvme_bytes(const zt_model_config *c, const zt_act_group *g);
/* The stride of one layer input (bytes, 256-aligned), and its NVMe extent
 * (its bytes rounded to 4 KiB, as the swap store keeps them). */
uint64_t zt_model_act_stride(const zt_model_config *c);
uint64_t zt_model_act_extent(const zt_model_config *c);
void zt_model_activation_parts(const zt_model_config *c, zt_activation_parts *out);
/* A tied model's head gradients of one micro-batch (the matrix's and the
 * final norm's in dt, each 256-aligned): the bytes of one set; 0 untied. */
uint64_t zt_head_grad_stride(const zt_model_config *c);

#endif
