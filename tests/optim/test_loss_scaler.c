/* The loss scaler against scripted runs whose scales were worked out by hand
 * from DeepSpeed's DynamicLossScaler.update_scale (current upstream): an
 * overflow spends one unit of hysteresis, or halves the scale when only one
 * is left; the scale doubles when (iter - last_overflow_iter - 1) is a
 * positive multiple of loss_scale_window, refilling hysteresis. */
#include <string.h>

#include "zo/optim.h"
#include "zo_test.h"

typedef struct script_step {
    int overflow;
    double scale_after; /* the scale the next step uses */
} script_step;

static void run_script(const zo_loss_scaler_config *cfg, double initial, const script_step *steps,
                       int n)
{
    zo_loss_scaler s;
    ZO_ASSERT_OK(zo_loss_scaler_init(&s, cfg));
    assert_true(zo_loss_scaler_scale(&s) == initial);
    for (int i = 0; i < n; i++) {
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, steps[i].overflow));
        if (zo_loss_scaler_scale(&s) != steps[i].scale_after)
            fail_msg("iteration %d (overflow %d): scale %g, expected %g", i, steps[i].overflow,
                     zo_loss_scaler_scale(&s), steps[i].scale_after);
    }
}

static zo_loss_scaler_config small_config(void)
{
    zo_loss_scaler_config c = ZO_LOSS_SCALER_CONFIG_INIT;
    c.initial_scale_power = 4; /* 16 */
    c.loss_scale_window = 3;
    c.hysteresis = 2;
    c.min_loss_scale = 1.0;
    return c;
}

/* window 3, hysteresis 2, min 1, consecutive_hysteresis off. */
static const script_step hysteresis_script[] = {
    {0, 16}, {0, 16}, {0, 16}, {0, 32},         /* 3 clean steps after iteration 0, then double */
    {1, 32},                                    /* hysteresis 2 -> 1, scale kept */
    {1, 16},                                    /* hysteresis exhausted: halve */
    {0, 16}, {0, 16}, {0, 16}, {0, 32},         /* doubling refills hysteresis to 2 */
    {1, 32},                                    /* 2 -> 1 */
    {0, 32},                                    /* a clean step does not refill it */
    {1, 16}, {1, 8},  {1, 4},  {1, 2},  {1, 1}, /* halving down to min_loss_scale */
};

static void test_dynamic_hysteresis(void **state)
{
    zo_loss_scaler_config c = small_config();
    run_script(&c, 16, hysteresis_script,
               (int)(sizeof hysteresis_script / sizeof *hysteresis_script));
}

static void test_error_at_min_scale_keeps_state(void **state)
{
    zo_loss_scaler_config c = small_config();
    zo_loss_scaler s;
    ZO_ASSERT_OK(zo_loss_scaler_init(&s, &c));
    int n = (int)(sizeof hysteresis_script / sizeof *hysteresis_script);
    for (int i = 0; i < n; i++)
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, hysteresis_script[i].overflow));
    zo_loss_scaler before = s;
    ZO_ASSERT_ST(zo_loss_scaler_update(&s, 1), ZO_ERR_OVERFLOW);
    assert_true(strstr(zo_last_error(), "min_loss_scale") != NULL);
    assert_memory_equal(&before, &s, sizeof s);
    /* Without raise_error_at_min_scale the scale stays at the floor. */
    c.raise_error_at_min_scale = 0;
    ZO_ASSERT_OK(zo_loss_scaler_init(&s, &c));
    for (int i = 0; i < n; i++)
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, hysteresis_script[i].overflow));
    ZO_ASSERT_OK(zo_loss_scaler_update(&s, 1));
    assert_true(zo_loss_scaler_scale(&s) == 1.0);
}

/* consecutive_hysteresis: every clean step refills the budget, so isolated
 * overflows never lower the scale. */
static void test_consecutive_hysteresis(void **state)
{
    zo_loss_scaler_config c = small_config();
    c.consecutive_hysteresis = 1;
    static const script_step script[] = {
        {1, 16}, {0, 16}, {1, 16}, {0, 16}, {1, 16}, {1, 8}, /* two in a row halve */
        {0, 8},  {0, 8},  {0, 8},  {0, 16}, /* window of 3 after the last overflow */
    };
    run_script(&c, 16, script, (int)(sizeof script / sizeof *script));
}

static void test_hysteresis_one_halves_every_overflow(void **state)
{
    zo_loss_scaler_config c = small_config();
    c.hysteresis = 1;
    c.min_loss_scale = 4;
    static const script_step script[] = {{1, 8}, {1, 4}, {0, 4}, {1, 4},
                                         {0, 4}, {0, 4}, {0, 4}, {0, 8}};
    c.raise_error_at_min_scale = 0;
    run_script(&c, 16, script, (int)(sizeof script / sizeof *script));
}

/* DeepSpeed's defaults: 2^16, window 1000: the first doubling comes on the
 * update of iteration 1000 (the 1001st clean step). */
static void test_defaults(void **state)
{
    zo_loss_scaler_config c = ZO_LOSS_SCALER_CONFIG_INIT;
    zo_loss_scaler s;
    ZO_ASSERT_OK(zo_loss_scaler_init(&s, &c));
    assert_true(zo_loss_scaler_scale(&s) == 65536.0);
    for (int i = 0; i < 1000; i++)
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, 0));
    assert_true(zo_loss_scaler_scale(&s) == 65536.0);
    ZO_ASSERT_OK(zo_loss_scaler_update(&s, 0));
    assert_true(zo_loss_scaler_scale(&s) == 131072.0);
    for (int i = 0; i < 999; i++)
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, 0));
    assert_true(zo_loss_scaler_scale(&s) == 131072.0);
    ZO_ASSERT_OK(zo_loss_scaler_update(&s, 0));
    assert_true(zo_loss_scaler_scale(&s) == 262144.0);
}

static void test_static_scale(void **state)
{
    zo_loss_scaler_config c = ZO_LOSS_SCALER_CONFIG_INIT;
    c.loss_scale = 128;
    c.loss_scale_window = 0; /* ignored for a static scale */
    zo_loss_scaler s;
    ZO_ASSERT_OK(zo_loss_scaler_init(&s, &c));
    for (int i = 0; i < 50; i++) {
        ZO_ASSERT_OK(zo_loss_scaler_update(&s, i % 3 == 0));
        assert_true(zo_loss_scaler_scale(&s) == 128.0);
    }
}

/* Each bad value, one at a time, on top of the defaults. */
static void test_bad_configs(void **state)
{
    static const struct {
        const char *what;
        zo_status st;
    } cases[] = {{"loss_scale", ZO_ERR_CONFIG}, {"window", ZO_ERR_CONFIG},
                 {"hysteresis", ZO_ERR_CONFIG}, {"min_loss_scale", ZO_ERR_CONFIG},
                 {"power", ZO_ERR_CONFIG},      {"struct_size", ZO_ERR_INVALID_ARG}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zo_loss_scaler_config c = ZO_LOSS_SCALER_CONFIG_INIT;
        const char *w = cases[i].what;
        if (!strcmp(w, "loss_scale"))
            c.loss_scale = -1;
        if (!strcmp(w, "window"))
            c.loss_scale_window = 0;
        if (!strcmp(w, "hysteresis"))
            c.hysteresis = 0;
        if (!strcmp(w, "min_loss_scale"))
            c.min_loss_scale = 0;
        if (!strcmp(w, "power"))
            c.initial_scale_power = 200;
        if (!strcmp(w, "struct_size"))
            c.struct_size = 0;
        zo_loss_scaler s;
        ZO_ASSERT_ST(zo_loss_scaler_init(&s, &c), cases[i].st);
    }
    ZO_ASSERT_ST(zo_loss_scaler_update(NULL, 0), ZO_ERR_INVALID_ARG);
}

/* DeepSpeed's unscale-and-clip factor. */
static void test_grad_scale_factor(void **state)
{
    assert_true(zo_grad_scale_factor(100.0, 4.0f, 0.0f) == 0.25f); /* no clipping */
    assert_true(zo_grad_scale_factor(4.0, 4.0f, 2.0f) == 0.25f);   /* true norm 1 <= 2 */
    float f = zo_grad_scale_factor(40.0, 4.0f, 2.0f);              /* true norm 10 > 2 */
    double expect = 1.0 / (((40.0 / 4.0 + 1e-6) / 2.0) * 4.0);
    assert_true(f == (float)expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamic_hysteresis),
        cmocka_unit_test(test_error_at_min_scale_keeps_state),
        cmocka_unit_test(test_consecutive_hysteresis),
        cmocka_unit_test(test_hysteresis_one_halves_every_overflow),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_static_scale),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_grad_scale_factor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
