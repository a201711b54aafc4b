/* zo-train's learning-rate schedules: DeepSpeed's WarmupLR, WarmupDecayLR and
 * WarmupCosineLR (deepspeed/runtime/lr_schedules.py), with its semantics:
 *
 * The schedule has a state, last_batch_iteration (it), starting at the
 * config's value (-1 by default). The rate of an update is the schedule's rate
 * at the current it; after every update that was applied (a step skipped by
 * an fp16 overflow does not count, as DeepSpeed steps its scheduler only
 * after an applied step) it grows by one. DeepSpeed sets the rate when the
 * scheduler is built only when it == -1; otherwise the optimizer's own lr
 * stays until the first update (zt_schedule_first_lr). With W =
 * max(2, warmup_num_steps) and the warmup fraction
 *     g(it) = ln(it + 1) / ln(W)  (log, the default)   or   it / W  (linear):
 *
 *   WarmupLR:       it < 0: min_lr;  it < W: min_lr + (max_lr - min_lr) g(it);  else max_lr
 *   WarmupDecayLR:  as WarmupLR while it < W; then
 *                   min_lr + (max_lr - min_lr) max(0, (T - it) / max(1, T - W))
 *   WarmupCosineLR: it < 0: 0;  it < W: lr (r0 + (1 - r0) g(it));  then
 *                   lr max(0, rc + (1 - rc) (1 + cos(pi (it - W + 1) / (T - W))) / 2)
 * where T = total_num_steps, lr = the optimizer's learning rate, r0 =
 * warmup_min_ratio, rc = cos_min_ratio. Computed in double; the engine's
 * Adam takes the rate as a float. */
#ifndef ZT_SCHEDULE_H
#define ZT_SCHEDULE_H

#include <stdint.h>

#include "zo/config.h"
#include "zo/status.h"

typedef struct zt_schedule {
    zo_scheduler_type type; /* ZO_SCHEDULER_NONE: the optimizer's lr, constant */
    double warmup_min_lr, warmup_max_lr;
    int64_t warmup_num_steps;
    zo_warmup_type warmup_type;
    int64_t total_num_steps;
    double warmup_min_ratio, cos_min_ratio;
    int64_t last_batch_iteration; /* the state the run starts from (DeepSpeed's -1) */
} zt_schedule;

/* DeepSpeed's defaults, no schedule. */
#define ZT_SCHEDULE_INIT                                                                           \
    {                                                                                              \
        ZO_SCHEDULER_NONE, 0.0, 1e-3, 1000, ZO_WARMUP_LOG, 0, 0.0, 1e-4, -1                        \
    }

/* The schedule of a resolved config. */
void zt_schedule_from_config(zt_schedule *s, const zo_train_config *cfg);
/* Parameters a schedule cannot run with (WarmupDecayLR and WarmupCosineLR
 * need total_num_steps > 0; WarmupCosineLR divides by total_num_steps - W). */
zo_status zt_schedule_check(const zt_schedule *s);
/* The rate at state it, lr being the optimizer's learning rate. */
double zt_schedule_lr_at(const zt_schedule *s, double lr, int64_t it);
/* The rate of the first update of a run starting at s->last_batch_iteration. */
double zt_schedule_first_lr(const zt_schedule *s, double lr);

#endif
