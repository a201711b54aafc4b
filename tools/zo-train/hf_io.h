/* Hugging Face model directories in and out of zo-train (--hf-model, and the
 * directory --save writes beside the optimizer state): config.json and the
 * weights as safetensors under transformers' names, one file or shards with
 * model.safetensors.index.json. */
#ifndef ZT_HF_IO_H
#define ZT_HF_IO_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "trainer.h"
#include "zo/safetensors.h"

/* DIR/config.json as the model's shape (hf_config.h), its sliding window
 * included (the fused attention applies it at any sequence length; with the
 * dense op zt_model_config_check refuses one shorter than the sequence).
 * A tied head (tie_word_embeddings) stays tied: out->tied, one tensor. */
zo_status zt_hf_read_shape(const char *dir, zt_shape *out);

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

/* The same directory written by the ranks of a ZeRO run, each its own
 * tensors (those zo_engine_tensor_owner gives it) as
 * model-0000{rank+1}-of-0000{ranks}.safetensors: rank 0 begins (dir.tmp,
 * empty, its path into tmp), every rank writes its shard, then rank 0 ends
 * (config.json, model.safetensors.index.json, the rename). The caller keeps
 * the ranks in step between the three. */
zo_status zt_hf_save_begin(const char *dir, char *tmp, size_t cap);
zo_status zt_hf_save_shard(zt_trainer *t, const char *tmp, zo_dtype dt, int rank, int ranks);
zo_status zt_hf_save_end(zt_trainer *t, const char *tmp, const char *dir, zo_dtype dt, int ranks);

/* ---- safetensors file sets (checkpoints use them too) ---- */

/* One file (DIR/single) or the shards DIR/index names in its weight_map, as
 * transformers writes them; shards are opened when first needed. */
typedef struct zt_st_files zt_st_files;
zo_status zt_st_files_open(zt_st_files **out, const char *dir, const char *single,
                           const char *index);
/* The reader holding tensor name (NULL when an index does not name it);
 * *file the file it is in, or the index that does not name it. */
zo_status zt_st_files_find(zt_st_files *f, const char *name, zo_st_reader_t *rd, const char **file);
/* 1 when the set is an index's shards. */
int zt_st_files_sharded(const zt_st_files *f);
/* The tensors of the set: the index's weight_map entries, or the file's. */
zo_status zt_st_files_count(zt_st_files *f, size_t *n);
/* A string of the index's "metadata" object, or of the one file's header
 * metadata (NULL when absent). */
zo_status zt_st_files_metadata(zt_st_files *f, const char *key, const char **value);
void zt_st_files_free(zt_st_files *f);

/* BASE.safetensors for one shard, else BASE-0000{shard+1}-of-0000{shards}.safetensors. */
void zt_st_shard_name(char *out, size_t cap, const char *base, int shard, int shards);
/* PATH (atomically): {"metadata": metadata (taken), "weight_map": {names[i]:
 * the file of shard[i]}}, as transformers writes model.safetensors.index.json. */
zo_status zt_st_write_index(const char *path, json_t *metadata, const char *const *names,
                            const int *shard, size_t n, const char *base, int shards);

#endif
