/* DeepSpeed's sparse_attention section through zo-train: each mode, read by
 * the config parser and mapped onto the fused op's layout, trains with the
 * layout applied (losses not dense's, but for mode dense) and bit for bit as
 * the same layout given through the C API (zo_attn_layout). The dense
 * attention op refuses a layout, naming --attention flash. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds_config.h"
#include "train_test_util.h"
#include "zo_test.h"
#include "zt_error.h"

#define STEPS 5

static char g_swap[256];

/* The options of a sparse_attention section (JSON), over zo-train's test
 * model at seq 64 (four blocks of 16), in fp32. */
static zt_options options_of(const char *section)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}%s%s}",
             section ? ", \"sparse_attention\": " : "", section ? section : "");
    zo_config_t c = NULL;
    zo_train_config cfg = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_config_init(&c));
    ZO_ASSERT_OK(zo_config_load_string(c, json, "test"));
    ZO_ASSERT_OK(zo_config_resolve(c, 1, &cfg));
    zo_config_free(c);
    zt_options o = zt_test_small_options(g_swap, STEPS);
    o.seq = 64;
    o.param_home = o.optim_home = ZO_TIER_DEVICE;
    int log_every;
    ZO_ASSERT_OK(zt_options_from_config(&o, &cfg, &log_every));
    return o;
}

static void losses_of(const zt_options *o, float *out)
{
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    for (int i = 0; i < STEPS; i++) {
        zo_step_stats s;
        if (zt_trainer_step(t, &out[i], &s) < 0)
            fail_msg("step %d: %s", i, zt_last_error());
    }
    zt_trainer_free(t);
}

static void test_each_mode_applies_its_layout(void **state)
{
    struct {
        const char *section;
        zo_attn_layout_kind kind;
        int window, global, random; /* the C API's layout */
    } modes[] = {
        {"{\"mode\": \"dense\"}", ZO_ATTN_LAYOUT_DENSE, 1, 0, 0},
        {"{\"mode\": \"fixed\", \"num_local_blocks\": 2, \"num_global_blocks\": 1, "
         "\"attention\": \"unidirectional\"}",
         ZO_ATTN_LAYOUT_FIXED, 2, 1, 0},
        {"{\"mode\": \"bigbird\", \"num_sliding_window_blocks\": 1, \"num_global_blocks\": 1, "
         "\"num_random_blocks\": 1, \"seed\": 5}",
         ZO_ATTN_LAYOUT_BIGBIRD, 1, 1, 1},
        {"{\"mode\": \"sliding_window\", \"num_sliding_window_blocks\": 3}",
         ZO_ATTN_LAYOUT_SLIDING_WINDOW, 2, 0, 0}, /* rows r - 1 .. r */
    };
    float dense[STEPS], got[STEPS], api[STEPS];
    zt_options plain = options_of(NULL);
    assert_int_equal(plain.sparse_layout.struct_size, 0);
    losses_of(&plain, dense);
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        zt_options o = options_of(modes[i].section);
        losses_of(&o, got);
        zt_options c = plain; /* the same layout through the C API */
        zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
        l.kind = modes[i].kind;
        l.block = 16;
        l.window_blocks = modes[i].window;
        l.global_blocks = modes[i].global;
        l.random_blocks = modes[i].random;
        l.seed = modes[i].kind == ZO_ATTN_LAYOUT_BIGBIRD ? 5 : 0;
        assert_memory_equal(&o.sparse_layout, &l, sizeof l);
        c.sparse_layout = l;
        losses_of(&c, api);
        if (memcmp(got, api, sizeof got) != 0)
            fail_msg("%s: losses %.9g... differ from the C API layout's %.9g...", modes[i].section,
                     (double)got[0], (double)api[0]);
        double diff = 0; /* the largest relative difference from dense attention's */
        for (int k = 0; k < STEPS; k++)
            diff = fmax(diff, fabs((double)got[k] - dense[k]) / dense[k]);
        print_message("%-40.40s worst relative loss difference from dense %.3g\n", modes[i].section,
                      diff);
        /* fp32: the dense layout gives dense's losses (0 measured); an untrained
         * model's attention is near uniform, so a layout moves them by 2e-3 to 6e-3 */
        int dense_like = diff < 1e-6;
        if (dense_like != (modes[i].kind == ZO_ATTN_LAYOUT_DENSE))
            fail_msg("%s: losses %s dense attention's (relative %.3g)", modes[i].section,
                     dense_like ? "follow" : "differ from", diff);
    }
}

/* A layout is the fused op's: the dense op refuses it, naming the flag. */
static void test_dense_op_refuses_a_layout(void **state)
{
    zt_options o = options_of("{\"mode\": \"fixed\"}");
    o.flash_attention = 0;
    zt_trainer *t = NULL;
    assert_int_equal(zt_trainer_init(&t, &o), ZO_ERR_CONFIG);
    assert_null(t);
    assert_non_null(strstr(zt_last_error(), "use --attention flash"));
}

static int setup(void **state)
{
    snprintf(g_swap, sizeof g_swap, "%s/zt-sparse-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_swap) ? 0 : -1;
}

static int teardown(void **state)
{
    rmdir(g_swap);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_mode_applies_its_layout),
        cmocka_unit_test(test_dense_op_refuses_a_layout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
