/* zo-train's options from a DeepSpeed-style config (zo/config.h), read with
 * zo_train_config_load's parser: which key sets which option.
 *
 *   train_micro_batch_size_per_gpu, gradient_accumulation_steps -> --micro-batch, --grad-accum
 *   optimizer.params {lr, betas, eps, weight_decay}; Adam/AdamW, adam_w_mode,
 *     bias_correction                                   -> the engine's Adam
 *   scheduler {type, params}                            -> the learning-rate schedule
 *   fp16 {enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis,
 *     consecutive_hysteresis, min_loss_scale}, bf16.enabled -> --dtype and the loss scaler
 *   gradient_clipping                                   -> --max-grad-norm
 *   steps_per_print                                     -> --log-every
 *   zero_optimization.offload_optimizer.device, offload_param.device
 *                                                       -> --offload-optimizer, --offload-param
 *   zoffload.nvme_paths, else offload_optimizer.nvme_path and offload_param.nvme_path
 *                                                       -> --nvme-path
 *   aio.block_size, aio.queue_depth                     -> the NVMe request size and depth
 *   zoffload {device_mem, host_mem, chunk_size, optimizer_mode, prefetch_lookahead,
 *             micro_group, act_home}                    -> --device-mem, --host-mem,
 *                                                          --chunk-bytes, --optimizer-mode,
 *                                                          the prefetch depth, --micro-group,
 *                                                          --act-home
 *   pipeline {stages, partition}                        -> --pipeline-stages, --pipeline-split
 *                                                          (parameters or uniform)
 * With neither fp16 nor bf16 enabled (DeepSpeed would train in fp32) zo-train
 * trains in bf16 and says so. The keys the parser stores but zo-train has no
 * use for (zero_optimization.stage3_*, sub_group_size, buffer counts and
 * sizes, pin_memory, pipeline_read/write, aio.intra_op_parallelism,
 * single_submit, overlap_events) get one warning each when set to another
 * value than DeepSpeed's default. zero_optimization.stage -> --zero-stage:
 * with one process it has nothing to partition and is accepted silently;
 * across ranks 1 and 2 run (0 runs as 2: the same results in less memory), 3
 * is refused. */
#ifndef ZT_DS_CONFIG_H
#define ZT_DS_CONFIG_H

#include <stdio.h>

#include "ds_merge.h"
#include "trainer.h"
#include "zo/config.h"

/* Read the config file, merge the flags into it (ds_merge.h: they fill
 * "auto", satisfy absent batch keys and win over the file's values), apply
 * the KEY=VALUE overrides (zo_config_set_arg) and resolve it for one
 * process; rep says what each "auto" became. Messages are the parser's,
 * after "configuration error in FILE: ". */
zo_status zt_config_load(const char *path, const char *const *sets, int n_sets,
                         const zt_config_flags *flags, const zt_options *defaults,
                         zo_train_config *out, zt_config_report *rep);

/* Set the options the config speaks for; *log_every from steps_per_print.
 * The NVMe path strings point into cfg, which must outlive o. Fails (naming
 * the key) on a value zo-train cannot run with. */
zo_status zt_options_from_config(zt_options *o, const zo_train_config *cfg, int *log_every);

/* DeepSpeed's sparse_attention section as the fused op's block layout, as
 * zt_options_from_config maps it (zo-plan maps its --set keys with it):
 * *out is {0} (no layout) when the section is absent. */
zo_status zt_sparse_layout(const zo_sparse_attention_config *sa, zo_attn_layout *out);

/* One warning line on f for each stored key that has no effect here and is
 * not at its default; returns how many. */
int zt_config_warn_unused(const zo_train_config *cfg, FILE *f);

#endif
