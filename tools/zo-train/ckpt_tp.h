/* zo-train's checkpoints across the tensor-parallel degree T.
 *
 * A checkpoint saved at T holds whole tensors under Hugging Face names: the
 * files a run at T = 1 with the same pipeline stages and data-parallel ranks
 * writes (one shard per tensor-parallel group, numbered as world rank / T),
 * so it loads at any T, S and D, and transformers reads its weights as they
 * are. Whole tensors rather than per-rank shards with an index: the loader
 * of every other T then only slices (as --hf-model does), one file format
 * serves every grid, and a checkpoint does not tie a model to the T it was
 * trained at.
 *
 * Saving, the T ranks of the group that holds a tensor read their parts of
 * its master weights and moments (as the engine stores them) and
 * all-gather them; the group's first rank merges them (zt_tp_merge_items)
 * and writes. Loading, each rank reads the whole tensor from the file and
 * keeps its part (zt_tp_slice_items).
 *
 * Moments merge and slice in their stored format where parts cut whole
 * items: fp32 and bf16 element by element, int8's codes and per-block
 * scales where a part's contiguous stretch (zt_tp_run) is a whole number of
 * blocks, so a checkpoint saved and resumed at one T restores every bit.
 * Int8 blocks that would straddle parts are decoded instead: the save
 * stores that tensor's moments in fp32 (the values the engine decodes, as
 * for a tensor it keeps in fp32), and the load encodes the part in the
 * engine's own blocks. */
#ifndef ZT_CKPT_TP_H
#define ZT_CKPT_TP_H

#include "trainer.h"

/* Whether moments stored whole in format fmt cut into T parts in fmt (T = 1:
 * always). */
int zt_ckpt_tp_slices(const zt_shape *full, int T, int layer, int idx, zo_dtype fmt);

/* The format a rank's engine keeps tensor (layer, idx)'s moments in (the
 * engine's rule: small parts and a marked embedding keep fp32), and the
 * format a checkpoint saved at this run's T stores them in. */
zo_dtype zt_ckpt_part_format(const zt_options *o, int layer, int idx);
zo_dtype zt_ckpt_saved_format(const zt_options *o, int layer, int idx);

/* Collective over the tensor-parallel group (every rank calls it for the
 * same tensors in the same order): tensor (layer, idx)'s whole master
 * weights and moments, the moments in zt_ckpt_saved_format's raw layout
 * (zo_engine_read_state_raw's), into master, m and v on the group's first
 * rank, the writer (the others only give their parts). read 0: this rank
 * joins without reading, after it failed. A rank that cannot read fails its
 * own call and the writer's, which names it; the ranks agree on the save's
 * outcome after (zt_ranks_agree). */
zo_status zt_ckpt_tp_gather(zt_trainer *t, int layer, int idx, int read, float *master, void *m,
                            void *v);

/* Rank r's part of tensor (layer, idx)'s whole master weights and moments
 * (in fmt's raw layout; zt_ckpt_tp_slices must hold, else fmt is F32) into
 * the part buffers. */
void zt_ckpt_tp_slice(const zt_shape *full, int T, int r, int layer, int idx, zo_dtype fmt,
                      const float *master, const void *m, const void *v, float *part_master,
                      void *part_m, void *part_v);

#endif
