/* zo-train in fp32 (--dtype fp32; a DeepSpeed config with neither bf16 nor
 * fp16) through the engine on the cpu device: the model computes with the
 * fp32 master weights the engine holds in its slots.
 *
 * - Bitwise equality: 12 optimizer steps (2 micro-batches each, clipping
 *   active) give the same per-step losses and final master weights with
 *   everything on the device, the optimizer on the host, the optimizer on
 *   NVMe with the parameters paged from the host, and both on NVMe with the
 *   smallest device budget that fits, in sync and overlap modes.
 * - fp32 is really fp32: from the same initial weights and data the first
 *   loss differs from bf16's by less than bf16's rounding can explain (the
 *   bound below), but not bit for bit, and training lowers the loss.
 * - fp32 chunks hold chunk_bytes of fp32 parameters: raised to fit the
 *   largest tensor, they take twice bf16's bytes for its elements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_fs_util.h"
#include "train_test_util.h"
#include "trainer.h"
#include "zo_test.h"
#include "zt_error.h"

#define STEPS 12

static char g_swap[256];

static zt_options f32_options(void)
{
    zt_options o = zt_test_small_options(g_swap, STEPS);
    o.dtype = ZO_DTYPE_F32;
    o.grad_accum = 2;
    o.chunk_bytes = 16u << 10; /* several chunks per block */
    o.max_grad_norm = 0.5f;
    return o;
}

typedef struct run_result {
    float losses[STEPS];
    float **weights; /* [layer * ZT_MAX_LAYER_TENSORS + idx] */
    int clipped, rollbacks;
    uint64_t nvme_bytes;
    uint32_t n_chunks;
    uint64_t chunk_bytes;
} run_result;

static void run_free(run_result *r, const zt_shape *s)
{
    for (int l = 0; r->weights && l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++)
            free(r->weights[(size_t)l * ZT_MAX_LAYER_TENSORS + i]);
    free(r->weights);
}

static void train_run(const zt_options *o, run_result *r)
{
    memset(r, 0, sizeof *r);
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    r->n_chunks = zt_trainer_setup(t)->footprint.n_chunks;
    r->chunk_bytes = zt_trainer_setup(t)->footprint.chunk_bytes;
    for (int i = 0; i < STEPS; i++) {
        zo_step_stats s;
        if (zt_trainer_step(t, &r->losses[i], &s) < 0)
            fail_msg("step %d: %s", i, zt_last_error());
        r->clipped += s.clipped;
        r->rollbacks += s.rollbacks;
        r->nvme_bytes += s.nvme_read_bytes + s.nvme_write_bytes;
    }
    const zt_shape *s = &o->shape;
    r->weights = calloc((size_t)zt_engine_layers(s) * ZT_MAX_LAYER_TENSORS, sizeof *r->weights);
    assert_non_null(r->weights);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            float *w = malloc(zt_tensor_numel(s, l, i) * sizeof *w);
            assert_non_null(w);
            ZO_ASSERT_OK(zt_trainer_read_weights(t, l, i, w));
            r->weights[(size_t)l * ZT_MAX_LAYER_TENSORS + i] = w;
        }
    zt_trainer_free(t);
}

static void assert_same_run(const run_result *a, const run_result *b, const zt_shape *s,
                            const char *what)
{
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&a->losses[i], &b->losses[i], sizeof(float)) != 0)
            fail_msg("%s: step %d loss %.9g, the reference's %.9g", what, i, (double)b->losses[i],
                     (double)a->losses[i]);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            size_t k = (size_t)l * ZT_MAX_LAYER_TENSORS + i;
            if (memcmp(a->weights[k], b->weights[k], zt_tensor_numel(s, l, i) * sizeof(float)))
                fail_msg("%s: final weights of layer %d tensor %d differ from the reference's",
                         what, l, i);
        }
}

static void test_fp32_placements_are_bitwise_identical(void **state)
{
    (void)state;
    zt_options base = f32_options();
    base.param_home = ZO_TIER_DEVICE;
    base.optim_home = ZO_TIER_DEVICE;
    run_result ref;
    train_run(&base, &ref);
    assert_true(ref.clipped > 0); /* the overlap runs roll back and redo clipped steps */
    struct {
        const char *name;
        zo_tier param, optim;
        int smallest;
    } cases[] = {
        {"optimizer on host", ZO_TIER_DEVICE, ZO_TIER_HOST, 0},
        {"optimizer on nvme, params on host", ZO_TIER_HOST, ZO_TIER_NVME, 0},
        {"both on nvme, smallest device budget", ZO_TIER_NVME, ZO_TIER_NVME, 1},
    };
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_OVERLAP; mode++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            zt_options o = base;
            o.mode = (zo_optim_mode)mode;
            o.param_home = cases[c].param;
            o.optim_home = cases[c].optim;
            if (cases[c].smallest)
                o.device_mem = zt_test_smallest_budget(o);
            char what[160];
            snprintf(what, sizeof what, "fp32, %s (%s)", cases[c].name, zo_optim_mode_name(o.mode));
            run_result r;
            train_run(&o, &r);
            assert_same_run(&ref, &r, &o.shape, what);
            assert_true((r.nvme_bytes > 0) == (o.optim_home == ZO_TIER_NVME));
            if (o.mode == ZO_OPTIM_OVERLAP)
                assert_true(r.rollbacks > 0);
            run_free(&r, &o.shape);
        }
    run_free(&ref, &base.shape);
}

/* The first loss is the initial weights' on the first batch in both: bf16
 * rounds each weight by at most 2^-9 relative and the activations as they
 * go, which moves a loss of ln 256 = 5.5 by a few hundredths at most on this
 * 2-layer model; fp32 must land within 0.05 of bf16 yet differ from it. */
static void test_fp32_is_not_bf16(void **state)
{
    (void)state;
    zt_options o = f32_options();
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_HOST;
    run_result f, b;
    train_run(&o, &f);
    o.dtype = ZO_DTYPE_BF16;
    train_run(&o, &b);
    if (!(fabsf(f.losses[0] - b.losses[0]) < 0.05f && f.losses[0] != b.losses[0]))
        fail_msg("first loss: fp32 %.9g, bf16 %.9g", (double)f.losses[0], (double)b.losses[0]);
    for (int i = 0; i < STEPS; i++)
        assert_true(isfinite(f.losses[i]));
    assert_true(f.losses[STEPS - 1] < f.losses[0]);
    /* the chunk grows to the largest tensor (the 256 x 32 embedding) in the slots' type:
     * twice the bytes for the same elements, so the same chunks */
    assert_int_equal(b.chunk_bytes, 256 * 32 * 2);
    assert_int_equal(f.chunk_bytes, 2 * b.chunk_bytes);
    assert_int_equal(f.n_chunks, b.n_chunks);
    run_free(&f, &o.shape);
    run_free(&b, &o.shape);
}

/* master_split keeps the master's low halves beside bf16 parameters: with
 * fp32 ones there is nothing to split, and the run is refused saying so. */
static void test_fp32_master_split_is_refused(void **state)
{
    (void)state;
    zt_options o = f32_options();
    o.master_split = 1;
    zt_trainer *t = NULL;
    assert_true(zt_trainer_init(&t, &o) < 0);
    assert_null(t);
    assert_non_null(strstr(zt_last_error(), "--master-split"));
    assert_non_null(strstr(zt_last_error(), "fp32"));
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_swap, sizeof g_swap, "%s/zt-f32-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_swap) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(g_swap);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_placements_are_bitwise_identical),
        cmocka_unit_test(test_fp32_is_not_bf16),
        cmocka_unit_test(test_fp32_master_split_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
