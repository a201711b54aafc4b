/* zo-train's learning-rate schedules against DeepSpeed's scheduler objects,
 * emulated here step by step as lr_schedules.py runs them (the scheduler is
 * built, then stepped after each applied update), and against values worked
 * out by hand; then the rates reaching the engine: a WarmupCosineLR run's
 * first updates have rate 0 (the weights do not move), an fp16 overflow holds
 * the schedule, and a run with a schedule differs from one without. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schedule.h"
#include "train_test_util.h"
#include "trainer.h"
#include "zo_test.h"
#include "zt_error.h"

/* ---- DeepSpeed's objects, as in lr_schedules.py ---- */

typedef struct ds_sched {
    zt_schedule p;
    double org_lr, group_lr; /* the optimizer's lr when built, and its param group's lr now */
    int64_t last_batch_iteration;
} ds_sched;

static double ds_gamma_warmup(const ds_sched *d, double w)
{
    double it = (double)d->last_batch_iteration;
    return d->p.warmup_type == ZO_WARMUP_LOG ? (1.0 / log(w)) * log(it + 1) : it / w;
}

static double ds_get_lr(const ds_sched *d)
{
    double w = d->p.warmup_num_steps > 2 ? (double)d->p.warmup_num_steps : 2.0;
    int64_t it = d->last_batch_iteration;
    if (d->p.type == ZO_SCHEDULER_WARMUP_COSINE_LR) {
        if (it < 0)
            return 0.0;
        double ratio;
        if ((double)it < w) {
            ratio = d->p.warmup_min_ratio + ds_gamma_warmup(d, w) * (1. - d->p.warmup_min_ratio);
        } else {
            double real_last_step = (double)it - w + 1,
                   real_total = (double)d->p.total_num_steps - w;
            ratio = (1 + cos(M_PI * real_last_step / real_total)) / 2;
            ratio = fmax(0.0, d->p.cos_min_ratio + (1. - d->p.cos_min_ratio) * ratio);
        }
        return d->org_lr * ratio;
    }
    if (it < 0)
        return d->p.warmup_min_lr;
    double gamma;
    if ((double)it < w)
        gamma = ds_gamma_warmup(d, w);
    else if (d->p.type == ZO_SCHEDULER_WARMUP_LR)
        gamma = 1.0;
    else
        gamma = fmax(0.0, (double)(d->p.total_num_steps - it) /
                              fmax(1.0, (double)d->p.total_num_steps - w));
    return d->p.warmup_min_lr + (d->p.warmup_max_lr - d->p.warmup_min_lr) * gamma;
}

static void ds_init(ds_sched *d, const zt_schedule *p, double optimizer_lr)
{
    d->p = *p;
    d->org_lr = d->group_lr = optimizer_lr;
    d->last_batch_iteration = p->last_batch_iteration;
    if (p->type != ZO_SCHEDULER_NONE &&
        d->last_batch_iteration == -1) /* "Initialize lr in optimizer" */
        d->group_lr = ds_get_lr(d);
}

/* After an applied update (no scheduler: the optimizer's lr stays). */
static void ds_step(ds_sched *d)
{
    if (d->p.type == ZO_SCHEDULER_NONE)
        return;
    d->last_batch_iteration++;
    d->group_lr = ds_get_lr(d);
}

/* zo-train's rates over n updates (as the trainer advances them) against the emulation. */
static void check_against_deepspeed(const zt_schedule *p, double lr, int n)
{
    ZO_ASSERT_OK(zt_schedule_check(p));
    ds_sched d;
    ds_init(&d, p, lr);
    double mine = zt_schedule_first_lr(p, lr);
    int64_t it = p->last_batch_iteration;
    for (int k = 0; k < n; k++) {
        if (fabs(mine - d.group_lr) > 1e-15 * fmax(1.0, fabs(d.group_lr)))
            fail_msg("%s update %d: zo-train %.17g, DeepSpeed %.17g",
                     zo_scheduler_type_name(p->type), k, mine, d.group_lr);
        ds_step(&d);
        mine = zt_schedule_lr_at(p, lr, ++it);
    }
}

static void test_schedules_match_deepspeed(void **state)
{
    const zo_scheduler_type types[] = {ZO_SCHEDULER_WARMUP_LR, ZO_SCHEDULER_WARMUP_DECAY_LR,
                                       ZO_SCHEDULER_WARMUP_COSINE_LR};
    const int64_t warmups[] = {0, 1, 2, 10};
    const int64_t starts[] = {-1, 0, 7};
    for (int t = 0; t < 3; t++)
        for (int wt = 0; wt < 2; wt++)
            for (int w = 0; w < 4; w++)
                for (int s = 0; s < 3; s++) {
                    zt_schedule p = ZT_SCHEDULE_INIT;
                    p.type = types[t];
                    p.warmup_type = wt ? ZO_WARMUP_LINEAR : ZO_WARMUP_LOG;
                    p.warmup_num_steps = warmups[w];
                    p.warmup_min_lr = 1e-5;
                    p.warmup_max_lr = 3e-4;
                    p.total_num_steps = 40;
                    p.warmup_min_ratio = 0.1;
                    p.cos_min_ratio = 0.05;
                    p.last_batch_iteration = starts[s];
                    check_against_deepspeed(&p, 2e-3, 60); /* past total_num_steps too */
                }
    zt_schedule none = ZT_SCHEDULE_INIT;
    check_against_deepspeed(&none, 2e-3, 5);
}

/* A few rates worked out by hand. */
static void test_schedule_values(void **state)
{
    zt_schedule p = ZT_SCHEDULE_INIT;
    p.type = ZO_SCHEDULER_WARMUP_LR;
    p.warmup_num_steps = 10; /* log warmup from 0 to 1e-3 */
    assert_true(zt_schedule_first_lr(&p, 5.0) == 0.0);
    assert_true(fabs(zt_schedule_lr_at(&p, 5.0, 1) - 1e-3 * 0.30102999566398120) < 1e-15);
    assert_true(zt_schedule_lr_at(&p, 5.0, 10) == 1e-3);
    p.type = ZO_SCHEDULER_WARMUP_DECAY_LR;
    p.warmup_type = ZO_WARMUP_LINEAR;
    p.total_num_steps = 110;
    assert_true(fabs(zt_schedule_lr_at(&p, 5.0, 5) - 0.5e-3) < 1e-15);
    assert_true(fabs(zt_schedule_lr_at(&p, 5.0, 60) - 0.5e-3) < 1e-15); /* (110-60)/(110-10) */
    assert_true(zt_schedule_lr_at(&p, 5.0, 200) == 0.0);
    p.type = ZO_SCHEDULER_WARMUP_COSINE_LR;
    p.total_num_steps = 19; /* W 10: the cosine spans 9 updates */
    p.cos_min_ratio = 0.0;
    assert_true(zt_schedule_first_lr(&p, 2.0) == 0.0);
    assert_true(fabs(zt_schedule_lr_at(&p, 2.0, 5) - 1.0) < 1e-15);
    /* it 13: (1 + cos(pi 4/9)) / 2 = 0.58682408883346517 */
    assert_true(fabs(zt_schedule_lr_at(&p, 2.0, 13) - 2.0 * 0.58682408883346517) < 1e-14);
    assert_true(fabs(zt_schedule_lr_at(&p, 2.0, 18)) < 1e-15); /* the end: cos(pi) */
    p.last_batch_iteration = 3; /* a resumed scheduler keeps the optimizer's rate first */
    assert_true(zt_schedule_first_lr(&p, 2.0) == 2.0);
}

static void test_schedule_errors(void **state)
{
    zt_schedule p = ZT_SCHEDULE_INIT;
    p.type = ZO_SCHEDULER_WARMUP_DECAY_LR;
    ZO_ASSERT_ST(zt_schedule_check(&p), ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "'scheduler.params.total_num_steps' is required by "
                                            "WarmupDecayLR"));
    p.type = ZO_SCHEDULER_WARMUP_COSINE_LR;
    p.total_num_steps = 1000;
    p.warmup_num_steps = 1000;
    ZO_ASSERT_ST(zt_schedule_check(&p), ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "must differ from max(2, warmup_num_steps) (1000)"));
    p.type = ZO_SCHEDULER_WARMUP_LR;
    p.total_num_steps = 0;
    ZO_ASSERT_OK(zt_schedule_check(&p));
}

/* ---- the rates reach the engine ---- */

#define STEPS 8

static char g_swap[256];

static zt_options small_options(void)
{
    zt_options o = zt_test_small_options(g_swap, STEPS);
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_HOST;
    return o;
}

typedef struct sched_run {
    double lrs[STEPS];
    int overflow[STEPS];
    float *w0_before, *w0[STEPS]; /* the embedding, before and after each step */
    size_t n;
} sched_run;

static void run_steps(const zt_options *o, sched_run *r)
{
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    r->n = zt_tensor_numel(&o->shape, 0, 0);
    r->w0_before = malloc(r->n * sizeof(float));
    ZO_ASSERT_OK(zt_trainer_read_weights(t, 0, 0, r->w0_before));
    for (int i = 0; i < STEPS; i++) {
        float loss;
        zo_step_stats s;
        if (zt_trainer_step(t, &loss, &s) < 0)
            fail_msg("step %d: %s", i, zt_last_error());
        r->lrs[i] = zt_trainer_lr(t);
        r->overflow[i] = s.overflow;
        r->w0[i] = malloc(r->n * sizeof(float));
        ZO_ASSERT_OK(zt_trainer_read_weights(t, 0, 0, r->w0[i]));
    }
    zt_trainer_free(t);
}

static void sched_run_free(sched_run *r)
{
    free(r->w0_before);
    for (int i = 0; i < STEPS; i++)
        free(r->w0[i]);
}

static void test_rates_reach_the_engine(void **state)
{
    zt_options o = small_options();
    o.sched.type = ZO_SCHEDULER_WARMUP_COSINE_LR;
    o.sched.warmup_num_steps = 4;
    o.sched.total_num_steps = STEPS;
    sched_run r;
    run_steps(&o, &r);
    /* DeepSpeed's WarmupCosineLR: rate 0 when built, and ln(1) = 0 at it 0 */
    assert_true(r.lrs[0] == 0.0 && r.lrs[1] == 0.0);
    assert_memory_equal(r.w0_before, r.w0[1], r.n * sizeof(float));
    assert_true(fabs(r.lrs[2] - (double)o.lr * log(2.0) / log(4.0)) < 1e-15);
    assert_true(memcmp(r.w0[1], r.w0[2], r.n * sizeof(float)) != 0);
    sched_run c;
    o.sched.type = ZO_SCHEDULER_NONE;
    run_steps(&o, &c);
    assert_true(c.lrs[0] == (double)1e-2f);
    assert_true(memcmp(c.w0[0], r.w0[0], r.n * sizeof(float)) != 0);
    sched_run_free(&r);
    sched_run_free(&c);

    /* fp16 overflows on the first steps (scale 2^24): the schedule waits for applied updates */
    o = small_options();
    o.dtype = ZO_DTYPE_F16;
    o.loss_scaler.initial_scale_power = 24;
    o.sched.type = ZO_SCHEDULER_WARMUP_LR;
    o.sched.warmup_type = ZO_WARMUP_LINEAR;
    o.sched.warmup_num_steps = 10;
    o.sched.warmup_max_lr = 1e-2;
    run_steps(&o, &r);
    int applied = 0;
    for (int i = 0; i < STEPS; i++) {
        double want = zt_schedule_lr_at(&o.sched, o.lr, applied - 1);
        if (r.lrs[i] != want)
            fail_msg("step %d: rate %.17g, expected %.17g (%d updates applied before)", i, r.lrs[i],
                     want, applied);
        applied += !r.overflow[i];
    }
    assert_true(r.overflow[0]);
    assert_true(applied > 0);
    sched_run_free(&r);
}

static int setup(void **state)
{
    snprintf(g_swap, sizeof g_swap, "/tmp/zt-sched-XXXXXX");
    return mkdtemp(g_swap) ? 0 : -1;
}

static int teardown(void **state)
{
    return rmdir(g_swap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules_match_deepspeed),
        cmocka_unit_test(test_schedule_values),
        cmocka_unit_test(test_schedule_errors),
        cmocka_unit_test(test_rates_reach_the_engine),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
