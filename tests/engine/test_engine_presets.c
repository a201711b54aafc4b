/* The engine's plan of the 1b, 7b and 13b presets' layouts (zoshape) with
 * their 16-bit parameters and optimizer states on NVMe: the pinned staging
 * is the same size for all three (it does not grow with the model), in
 * every mode, with or without a host budget that spills gradients, and with
 * part of the parameters resident on the device. Planned with
 * zo_engine_footprint_for: nothing is allocated. */
#include <stdio.h>
#include <stdlib.h>

#include "model_shape.h"
#include "zo/engine.h"
#include "zo_test.h"

#define GiB (1ull << 30)

/* The plan of a preset's tensors under cfg. */
static zo_engine_footprint plan_preset(const char *name, const zo_engine_config *cfg)
{
    zt_shape s;
    ZO_ASSERT_OK(zt_preset(name, &s));
    size_t n = 0;
    for (int l = 0; l < zt_engine_layers(&s); l++)
        n += (size_t)zt_layer_tensors(&s, l);
    size_t *numel = calloc(n, sizeof *numel);
    int *layer = calloc(n, sizeof *layer);
    assert_non_null(numel);
    assert_non_null(layer);
    size_t k = 0;
    for (int l = 0; l < zt_engine_layers(&s); l++)
        for (int i = 0; i < zt_layer_tensors(&s, l); i++, k++) {
            numel[k] = zt_tensor_numel(&s, l, i);
            layer[k] = l;
        }
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = n;
    ly.numel = numel;
    ly.layer = layer;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    char msg[512];
    ZO_ASSERT_OK(zo_engine_footprint_for(cfg, &ly, &fp, &fits, msg, sizeof msg));
    if (!fits)
        fail_msg("%s does not fit: %s", name, msg);
    free(numel);
    free(layer);
    return fp;
}

static void test_nvme_plans_pin_the_same_staging(void **state)
{
    (void)state;
    static const char *const presets[3] = {"1b", "7b", "13b"};
    zt_shape big;
    ZO_ASSERT_OK(zt_preset("13b", &big));
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++)
        for (int budgeted = 0; budgeted < 2; budgeted++) {
            zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
            c.param_home = ZO_TIER_NVME;
            c.optim_home = ZO_TIER_NVME;
            c.mode = (zo_optim_mode)mode;
            c.chunk_bytes = zt_default_chunk_bytes(&big); /* one chunk size for all three */
            c.device_bytes = budgeted ? 24 * GiB : 0;     /* 0: a device slot per chunk */
            c.host_bytes = budgeted ? 64 * GiB : 0;
            zo_engine_footprint fp[3];
            for (int i = 0; i < 3; i++) {
                fp[i] = plan_preset(presets[i], &c);
                print_message(
                    "%s %s%s: %u chunks, pinned %llu (gradients %llu, parameter "
                    "staging %llu), host %llu (gradients %llu), gradients on NVMe %llu\n",
                    presets[i], zo_optim_mode_name(c.mode),
                    budgeted ? ", 24 GiB GPU, 64 GiB host" : "", fp[i].n_chunks,
                    (unsigned long long)fp[i].pinned, (unsigned long long)fp[i].grad_pinned,
                    (unsigned long long)fp[i].param_staging,
                    (unsigned long long)fp[i].bytes[ZO_TIER_HOST],
                    (unsigned long long)fp[i].grad_host, (unsigned long long)fp[i].grad_nvme);
                assert_true(fp[i].n_chunks > (uint32_t)c.lookahead + 2);
                /* the rings: the staging depth's chunks, whatever the model */
                assert_int_equal(fp[i].grad_pinned, (uint64_t)(c.lookahead + 2) * c.chunk_bytes);
                assert_int_equal(fp[i].param_staging, (uint64_t)(c.lookahead + 2) * c.chunk_bytes);
                if (budgeted)
                    assert_true(fp[i].pinned + fp[i].bytes[ZO_TIER_HOST] <= c.host_bytes);
            }
            /* the 13b model holds 12 times the 1b's parameters, its staging is the same */
            assert_true(fp[2].n_params > 12 * fp[0].n_params);
            for (int i = 1; i < 3; i++)
                assert_int_equal(fp[i].pinned, fp[0].pinned);
        }
}

/* The same plans with part of the 16-bit parameters resident on the
 * device (8 GiB of them: every chunk of 1b, about a third of 13b) over
 * their states on NVMe: those chunks keep their copy on NVMe, not pinned, so
 * the pinned memory is the all-NVMe plan's staging, the same for the three,
 * in every mode. */
static void test_resident_chunks_pin_no_copy(void **state)
{
    (void)state;
    static const char *const presets[3] = {"1b", "7b", "13b"};
    zt_shape big;
    ZO_ASSERT_OK(zt_preset("13b", &big));
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
        zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
        c.param_home = ZO_TIER_NVME;
        c.optim_home = ZO_TIER_NVME;
        c.mode = (zo_optim_mode)mode;
        c.chunk_bytes = zt_default_chunk_bytes(&big);
        c.device_bytes = 24 * GiB;
        c.host_bytes = 64 * GiB;
        zo_engine_footprint all_nvme = plan_preset("13b", &c);
        c.param_caps.bytes[ZO_TIER_DEVICE] = 8 * GiB;
        for (int i = 0; i < 3; i++) {
            zo_engine_footprint fp = plan_preset(presets[i], &c);
            uint64_t resident = c.param_caps.bytes[ZO_TIER_DEVICE] / c.chunk_bytes;
            if (resident > fp.n_chunks)
                resident = fp.n_chunks;
            print_message("%s %s, 24 GiB GPU, 64 GiB host, %llu of %u chunks resident: pinned "
                          "%llu (parameter staging %llu), NVMe %llu\n",
                          presets[i], zo_optim_mode_name(c.mode), (unsigned long long)resident,
                          fp.n_chunks, (unsigned long long)fp.pinned,
                          (unsigned long long)fp.param_staging,
                          (unsigned long long)fp.bytes[ZO_TIER_NVME]);
            assert_true(resident > 0);
            assert_true(fp.device_param_slots >= resident);
            assert_int_equal(fp.pinned, all_nvme.pinned);
            assert_true(fp.pinned + fp.bytes[ZO_TIER_HOST] <= c.host_bytes);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvme_plans_pin_the_same_staging),
        cmocka_unit_test(test_resident_chunks_pin_no_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
