/* Hugging Face model directories in and out of zo-train (--hf-model, and the
 * directory --save writes beside the optimizer state): config.json and the
 * weights as safetensors under transformers' names, one file or shards with
 * model.safetensors.index.json. */
#ifndef ZT_HF_IO_H
#define ZT_HF_IO_H

#include <stddef.h>
#include <stdint.h>

#include "trainer.h"

/* DIR/config.json as the model's shape (hf_config.h); a sliding window
 * shorter than seq is refused (the model attends to the whole sequence).
 * A tied head (tie_word_embeddings) stays tied: out->tied, one tensor. */
zo_status zt_hf_read_shape(const char *dir, int seq, zt_shape *out);

/* The weights of DIR (model.safetensors, or the shards its
 * model.safetensors.index.json names) into the trainer's master weights, F32,
 * BF16 or F16 on disk, each checked by name, shape and finiteness. A tied
 * model reads no lm_head.weight (one that is there anyway is ignored, as
 * transformers ignores it). */
zo_status zt_hf_load_weights(zt_trainer *t, const char *dir);

/* The same reading for any destination: put(ctx, layer, idx, name, fp32
 * values) for every tensor of shape s in registration order. */
typedef zo_status (*zt_hf_put_fn)(void *ctx, int layer, int idx, const char *name, const float *w);
zo_status zt_hf_read_weights(const char *dir, const zt_shape *s, zt_hf_put_fn put, void *ctx);

/* Write the trainer's model as a directory transformers loads as is
 * (LlamaForCausalLM, or Qwen2ForCausalLM with q/k/v biases; a tied model
 * with tie_word_embeddings true and no lm_head.weight): config.json and
 * the weights in dt (bf16 or fp32), one model.safetensors or, when they pass
 * shard_bytes, model-0000i-of-0000n.safetensors with
 * model.safetensors.index.json (a tensor larger than shard_bytes has a shard
 * of its own). Written as dir.tmp then renamed to dir (an old dir is replaced). */
zo_status zt_hf_save(zt_trainer *t, const char *dir, zo_dtype dt, uint64_t shard_bytes);

#endif
