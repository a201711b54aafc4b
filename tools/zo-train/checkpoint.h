/* zo-train's checkpoints.
 *
 * A save directory holds one directory per checkpoint and a pointer to the
 * newest:
 *
 *   DIR/latest                          "step-00000120\n"
 *   DIR/step-00000120/model.safetensors      the fp32 master weights under Hugging Face
 *                                            LLaMA names (model.embed_tokens.weight,
 *                                            model.layers.N.self_attn.q_proj.weight, ...,
 *                                            lm_head.weight): transformers and other tools
 *                                            read it as is
 *   DIR/step-00000120/optimizer.safetensors  Adam's moments: NAME.exp_avg, NAME.exp_avg_sq (F32)
 *   DIR/step-00000120/trainer_state.json     step, update count, loss scaler, learning-rate
 *                                            schedule, data position (seed, epoch, window),
 *                                            model shape, batch sizes
 *   DIR/step-00000120/checksums.json         every tensor's xxh64 (ckpt_sums.h), verified
 *                                            with its values' ranges before a load touches
 *                                            the engine
 *
 * The weights are stored in fp32 because they are the master copy the
 * optimizer continues from (the 16-bit parameters are always those rounded);
 * a 16-bit file for inference is one cast away, and --init-weights reads
 * F32, BF16 and F16.
 *
 * Crash safety: a checkpoint is written into DIR/step-N.tmp (every file
 * through zo_atomic_file: temporary name, fsync, rename, fsync of the
 * directory), which is renamed to DIR/step-N once complete (and DIR
 * fsynced); then DIR/latest is replaced atomically. A crash at any moment
 * leaves latest naming a complete checkpoint (or no latest at all before the
 * first); leftovers (step-*.tmp, a step-N that latest does not name yet) are
 * removed by the next save. Tensors are streamed one at a time from the
 * engine into both files: no copy of the whole model is held in memory.
 *
 * Across ranks (ZeRO, world size N > 1) each rank writes the tensors it owns
 * (zo_engine_tensor_owner), in parallel, as shards under transformers' names:
 *
 *   DIR/step-N/model-0000{R+1}-of-0000{N}.safetensors      rank R's master weights
 *   DIR/step-N/model.safetensors.index.json                 {"metadata": {"total_size"},
 *                                                            "weight_map": {name: shard}}
 *   DIR/step-N/optimizer-0000{R+1}-of-0000{N}.safetensors  rank R's moments, in the
 *                                                            run's state format
 *   DIR/step-N/optimizer.safetensors.index.json             the same for the moments; its
 *                                                            metadata names the format and N
 *   DIR/step-N/trainer_state.json                           as above, batch.world_size N
 *
 * Rank 0 creates step-N.tmp, the ranks write their shards, and once every
 * rank has succeeded (the ranks agree after each stage: one failing fails
 * all, naming it) rank 0 writes the indices and the state and renames: the
 * same crash safety as one rank's. The directories must be one file system
 * that every rank sees (one node, or a shared file system).
 *
 * A checkpoint loads at any world size, single files or shards alike: each
 * rank reads the tensors it owns at the new world size from whichever shard
 * holds them, then the ranks share the 16-bit parameters
 * (zo_engine_share_params). The data position is the same on every rank (each
 * reads the global batch and trains on its share), so rank 0's is the run's. */
#ifndef ZT_CHECKPOINT_H
#define ZT_CHECKPOINT_H

#include <stddef.h>

#include "trainer.h"

#define ZT_CKPT_LATEST      "latest"
#define ZT_CKPT_MODEL       "model.safetensors"
#define ZT_CKPT_OPTIM       "optimizer.safetensors"
#define ZT_CKPT_STATE       "trainer_state.json"
#define ZT_CKPT_MODEL_BASE  "model"     /* shards: model-0000R-of-0000N.safetensors */
#define ZT_CKPT_OPTIM_BASE  "optimizer" /* shards: optimizer-0000R-of-0000N.safetensors */
#define ZT_CKPT_MODEL_INDEX "model.safetensors.index.json"
#define ZT_CKPT_OPTIM_INDEX "optimizer.safetensors.index.json"

/* Save the trainer (between steps) as DIR/step-<step>, created with DIR as
 * needed, and point DIR/latest at it; the checkpoint's directory into path
 * (may be NULL). In dpu mode the pending update is applied first
 * (zo_engine_flush). */
zo_status zt_ckpt_save(zt_trainer *t, const char *dir, char *path, size_t cap);

/* DIR/hf-model beside a checkpoint (zt_hf_save; across ranks each rank
 * writes its own tensors' shard, zt_hf_save_shard). */
zo_status zt_ckpt_save_hf(zt_trainer *t, const char *dir, zo_dtype dt, uint64_t shard_bytes);

/* A checkpoint directory (holding trainer_state.json), or a save directory
 * (holding latest): the checkpoint's directory into out. */
zo_status zt_ckpt_resolve(const char *path, char *out, size_t cap);

/* Load a checkpoint into a trainer before its first step: weights, moments,
 * step state, schedule and data position. Every tensor is checked by name,
 * dtype and shape: a missing, misshapen or mistyped one fails naming it (and
 * the file), as does a model shape that differs from the run's. */
zo_status zt_ckpt_load(zt_trainer *t, const char *ckpt_dir);

/* Initial weights from a safetensors file with Hugging Face LLaMA names, in
 * F32, BF16 or F16 (converted to the fp32 master weights); the optimizer
 * starts fresh. Same checks as zt_ckpt_load. */
zo_status zt_ckpt_init_weights(zt_trainer *t, const char *file);

/* Before anything is allocated: the settings recorded in a checkpoint
 * (--seq, --micro-batch, --grad-accum, --dtype, the --data file) must be
 * o's, else the change is named and refused unless o->resume_allow_changes
 * (zt_ckpt_load checks the same). */
zo_status zt_ckpt_check_settings(const char *ckpt_dir, const zt_options *o);

/* 1 when dir holds a latest pointer (checkpoints of some run). */
int zt_ckpt_has_latest(const char *dir);

/* The Hugging Face name and shape of tensor idx of engine layer `layer`. */
zo_status zt_ckpt_tensor(const zt_shape *s, int layer, int idx, char *name, size_t cap, int *ndim,
                         int64_t shape[2]);

#endif
