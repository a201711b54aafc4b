/* zo-train's flags merged into a DeepSpeed config before it is resolved.
 *
 * A Hugging Face Trainer config is full of "auto": the Trainer fills each
 * from its own arguments (transformers' HfTrainerDeepSpeedConfig). zo-train
 * does the same with its flags, or their defaults when not given:
 *
 *   train_micro_batch_size_per_gpu  --micro-batch (8)
 *   gradient_accumulation_steps     --grad-accum (1)
 *   train_batch_size                derived from the two, as DeepSpeed derives it
 *   gradient_clipping               --max-grad-norm (1)
 *   optimizer.params lr, betas, eps, weight_decay
 *                                   --lr (2e-3), (0.9, 0.95), 1e-8, --weight-decay (0)
 *   scheduler.params warmup_min_lr  0
 *   scheduler.params warmup_max_lr  the optimizer's lr (the parser's rule)
 *   scheduler.params warmup_num_steps 0 (no zo-train flag; the Trainer's default)
 *   scheduler.params total_num_steps  --steps (also when absent: DeepSpeed needs it)
 *   fp16.enabled, bf16.enabled      --dtype (bf16; fp32 turns both off)
 * No optimizer section: zo-train's own AdamW with the values above (DeepSpeed
 * would have none; zo-train always trains with one).
 *
 * The batch flags also satisfy absent batch keys. A flag given on the command
 * line wins over a concrete value in the file: the user asked for it on this
 * run. When --micro-batch or --grad-accum contradicts the file, zo-train says
 * so once, naming the global batch that results: the file's
 * train_batch_size is kept when the other key was left for DeepSpeed to
 * derive (train 32, micro 1: --micro-batch 2 accumulates 16), and dropped,
 * with the new global batch named, when the file fixes both others. --set
 * KEY=VALUE overrides are applied after all this, so they have the last word.
 */
#ifndef ZT_DS_MERGE_H
#define ZT_DS_MERGE_H

#include <jansson.h>
#include <stdio.h>

#include "trainer.h"
#include "zo/config.h"

/* The flags that speak for config keys, as given (NULL or 0: not given). */
typedef struct zt_config_flags {
    int micro_batch, grad_accum;                   /* 0: not given */
    const char *lr, *max_grad_norm, *weight_decay; /* the flags' text, NULL: not given */
    int dtype_given;                               /* --dtype was given: */
    zo_dtype dtype;                                /* bf16, fp16 or fp32 */
    int steps;                                     /* the run's steps (given or default) */
} zt_config_flags;

enum { ZT_MAX_RESOLVED = 64 };

/* What each "auto" (or absent batch key, or missing optimizer) became. */
typedef struct zt_config_report {
    int n;
    struct {
        char key[ZO_CONFIG_KEY_CAP];
        char value[64];
        char from[64];
    } items[ZT_MAX_RESOLVED];
} zt_config_report;

/* Merge the flags (defaults: d, zo-train's options before any flag) into
 * c, whose document is the file at path as written (doc). Refuses a batch
 * flag that cannot split the file's train_batch_size. */
zo_status zt_config_merge_flags(zo_config_t c, const json_t *doc, const char *path,
                                const zt_config_flags *f, const zt_options *d,
                                zt_config_report *rep);

/* After the resolve: add the keys the parser left "auto" (their defaults)
 * and the derived values, print each once on f, one line per key. */
void zt_config_report_finish(zt_config_report *rep, const zo_train_config *cfg, FILE *f);

/* {"KEY": "VALUE (FROM)", ...} for --json. */
json_t *zt_config_report_json(const zt_config_report *rep);

#endif
