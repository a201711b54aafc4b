/* Loss scaling with DeepSpeed's fp16 semantics ("fp16" config section):
 * loss_scale > 0 is a static scale; 0 selects dynamic scaling starting at
 * 2^initial_scale_power. On an overflow the step is skipped and, once the
 * hysteresis budget is spent, the scale halves (never below
 * min_loss_scale); after loss_scale_window clean steps past the last
 * overflow it doubles and the hysteresis budget refills. This follows
 * DeepSpeed's current DynamicLossScaler.update_scale, where the doubling
 * happens when (iter - last_overflow_iter - 1) is a positive multiple of the
 * window (older releases tested (iter - last_overflow_iter) % window). */
#include <math.h>

#include "zo/optim.h"
#include "zo_internal.h"

static zo_status check_config(const zo_loss_scaler_config *c)
{
    if (!c || c->struct_size < sizeof *c)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "zo_loss_scaler_config is NULL or its struct_size is "
                       "wrong; initialize it with ZO_LOSS_SCALER_CONFIG_INIT");
    if (!isfinite(c->loss_scale) || c->loss_scale < 0.0)
        return ZO_FAIL(ZO_ERR_CONFIG, "optim",
                       "fp16.loss_scale %g must be finite and >= 0 (0 = dynamic)", c->loss_scale);
    if (c->loss_scale > 0.0)
        return ZO_OK; /* the dynamic knobs are unused */
    if (c->initial_scale_power < 0 || c->initial_scale_power > 127)
        return ZO_FAIL(ZO_ERR_CONFIG, "optim", "fp16.initial_scale_power %d must be in 0..127",
                       c->initial_scale_power);
    if (c->loss_scale_window < 1)
        return ZO_FAIL(ZO_ERR_CONFIG, "optim", "fp16.loss_scale_window %d must be >= 1",
                       c->loss_scale_window);
    if (c->hysteresis < 1)
        return ZO_FAIL(ZO_ERR_CONFIG, "optim", "fp16.hysteresis %d must be >= 1", c->hysteresis);
    if (!isfinite(c->min_loss_scale) || c->min_loss_scale <= 0.0)
        return ZO_FAIL(ZO_ERR_CONFIG, "optim", "fp16.min_loss_scale %g must be finite and > 0",
                       c->min_loss_scale);
    return ZO_OK;
}

zo_status zo_loss_scaler_init(zo_loss_scaler *s, const zo_loss_scaler_config *cfg)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_loss_scaler_init: scaler is NULL");
    ZO_TRY(check_config(cfg));
    s->cfg = *cfg;
    s->dynamic = cfg->loss_scale == 0.0;
    s->cur_scale = s->dynamic ? ldexp(1.0, cfg->initial_scale_power) : cfg->loss_scale;
    s->cur_iter = 0;
    s->last_overflow_iter = -1;
    s->cur_hysteresis = cfg->hysteresis;
    return ZO_OK;
}

static zo_status on_overflow(zo_loss_scaler *s)
{
    const zo_loss_scaler_config *c = &s->cfg;
    if (c->hysteresis == 1 || s->cur_hysteresis == 1) {
        if (s->cur_scale == c->min_loss_scale && c->raise_error_at_min_scale)
            return ZO_FAIL(
                ZO_ERR_OVERFLOW, "optim",
                "gradients overflowed with the loss scale already at "
                "min_loss_scale %g: it cannot be lowered further (lower fp16.min_loss_scale, or "
                "check the model for inf/NaN)",
                c->min_loss_scale);
        double next = s->cur_scale / 2.0;
        s->cur_scale = next > c->min_loss_scale ? next : c->min_loss_scale;
        ZO_LOGI("optim", "overflow at iteration %lld: loss scale lowered to %g",
                (long long)s->cur_iter, s->cur_scale);
    } else {
        s->cur_hysteresis--;
        ZO_LOGI("optim", "overflow at iteration %lld: loss scale kept at %g, hysteresis now %d",
                (long long)s->cur_iter, s->cur_scale, s->cur_hysteresis);
    }
    s->last_overflow_iter = s->cur_iter;
    return ZO_OK;
}

static void on_clean_step(zo_loss_scaler *s)
{
    const zo_loss_scaler_config *c = &s->cfg;
    if (c->consecutive_hysteresis)
        s->cur_hysteresis = c->hysteresis;
    int64_t stable = s->cur_iter - s->last_overflow_iter - 1;
    if (stable > 0 && stable % c->loss_scale_window == 0) {
        if (!c->consecutive_hysteresis)
            s->cur_hysteresis = c->hysteresis;
        s->cur_scale *= 2.0;
    }
}

zo_status zo_loss_scaler_update(zo_loss_scaler *s, int overflow)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_loss_scaler_update: scaler is NULL");
    if (!s->dynamic)
        return ZO_OK;
    if (overflow)
        ZO_TRY(on_overflow(s));
    else
        on_clean_step(s);
    s->cur_iter++;
    return ZO_OK;
}
