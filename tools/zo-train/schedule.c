/* DeepSpeed's warmup schedules (see schedule.h for the formulas). */
#include "schedule.h"

#include <math.h>

#include "zt_error.h"

void zt_schedule_from_config(zt_schedule *s, const zo_train_config *cfg)
{
    s->type = cfg->scheduler.type;
    s->warmup_min_lr = cfg->scheduler.warmup_min_lr;
    s->warmup_max_lr = cfg->scheduler.warmup_max_lr;
    s->warmup_num_steps = cfg->scheduler.warmup_num_steps;
    s->warmup_type = cfg->scheduler.warmup_type;
    s->total_num_steps = cfg->scheduler.total_num_steps;
    s->warmup_min_ratio = cfg->scheduler.warmup_min_ratio;
    s->cos_min_ratio = cfg->scheduler.cos_min_ratio;
    s->last_batch_iteration = cfg->scheduler.last_batch_iteration;
}

static int64_t warmup_steps(const zt_schedule *s)
{
    return s->warmup_num_steps > 2 ? s->warmup_num_steps : 2;
}

zo_status zt_schedule_check(const zt_schedule *s)
{
    if (s->type == ZO_SCHEDULER_NONE)
        return ZO_OK;
    if (s->type != ZO_SCHEDULER_WARMUP_LR && s->total_num_steps <= 0)
        return zt_fail(ZO_ERR_CONFIG, "'scheduler.params.total_num_steps' is required by %s",
                       zo_scheduler_type_name(s->type));
    if (s->type == ZO_SCHEDULER_WARMUP_COSINE_LR && s->total_num_steps == warmup_steps(s))
        return zt_fail(ZO_ERR_CONFIG,
                       "WarmupCosineLR: 'scheduler.params.total_num_steps' (%lld) must differ from "
                       "max(2, warmup_num_steps) (%lld): the cosine divides by their difference",
                       (long long)s->total_num_steps, (long long)warmup_steps(s));
    return ZO_OK;
}

/* The warmup fraction g(it) for 0 <= it < W. */
static double warmup_fraction(const zt_schedule *s, int64_t it)
{
    double w = (double)warmup_steps(s);
    if (s->warmup_type == ZO_WARMUP_LINEAR)
        return (double)it / w;
    return log((double)it + 1.0) / log(w);
}

static double warmup_lr(const zt_schedule *s, int64_t it)
{
    double delta = s->warmup_max_lr - s->warmup_min_lr;
    if (it < 0)
        return s->warmup_min_lr;
    if (it < warmup_steps(s))
        return s->warmup_min_lr + delta * warmup_fraction(s, it);
    if (s->type == ZO_SCHEDULER_WARMUP_LR)
        return s->warmup_max_lr;
    double rest = (double)(s->total_num_steps - it) /
                  fmax(1.0, (double)(s->total_num_steps - warmup_steps(s)));
    return s->warmup_min_lr + delta * fmax(0.0, rest);
}

static double cosine_ratio(const zt_schedule *s, int64_t it)
{
    const double pi = 3.14159265358979323846;
    if (it < warmup_steps(s))
        return s->warmup_min_ratio + warmup_fraction(s, it) * (1.0 - s->warmup_min_ratio);
    double done = (double)(it - warmup_steps(s) + 1),
           total = (double)(s->total_num_steps - warmup_steps(s));
    double r = (1.0 + cos(pi * done / total)) / 2.0;
    return fmax(0.0, s->cos_min_ratio + (1.0 - s->cos_min_ratio) * r);
}

double zt_schedule_lr_at(const zt_schedule *s, double lr, int64_t it)
{
    switch (s->type) {
    case ZO_SCHEDULER_NONE: return lr;
    case ZO_SCHEDULER_WARMUP_LR:
    case ZO_SCHEDULER_WARMUP_DECAY_LR: return warmup_lr(s, it);
    case ZO_SCHEDULER_WARMUP_COSINE_LR: return it < 0 ? 0.0 : lr * cosine_ratio(s, it);
    }
    return lr;
}

double zt_schedule_first_lr(const zt_schedule *s, double lr)
{
    if (s->type == ZO_SCHEDULER_NONE || s->last_batch_iteration != -1)
        return lr;
    return zt_schedule_lr_at(s, lr, -1);
}
