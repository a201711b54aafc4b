/* The kernels' plug-in registries: the device backends' lists exactly the
 * backends this build has and finds them by name in any case, the compute
 * ops' has one table per device backend; each checker refuses a table of
 * another version or one missing a required operation (fault injection on
 * copies of the real tables), naming the table and the slot, and the
 * device's accepts a table without the optional stream_wrap. */
#include <string.h>

#include "device_impl.h"
#include "ops_impl.h"
#include "zo_internal.h"
#include "zo_test.h"

static void test_device_registry_lists_exactly_the_built_backends(void **state)
{
    (void)state;
    const zo_backend_ops *const *tab;
    size_t n = zo_device_backends(&tab);
    size_t i = 0;
    if (zo_device_cuda_built())
        assert_string_equal(tab[i++]->name, "cuda"); /* "auto" tries a GPU first */
    assert_string_equal(tab[i++]->name, "cpu");
    assert_int_equal(n, i);
    for (i = 0; i < n; i++)
        ZO_ASSERT_OK(zo_backend_ops_check(tab[i]));
    assert_ptr_equal(zo_device_backend_find("CPU"), &zo_cpu_backend);
    assert_null(zo_device_backend_find("tpu"));
    assert_int_equal(zo_device_cuda_built(), zo_device_backend_find("cuda") != NULL);
    /* The cpu device's streams are its threads: no native handle to hand out. */
    assert_false(zo_cpu_backend.caps & ZO_BACKEND_CAP_NATIVE_STREAMS);
}

static void test_device_checker_refuses_another_version(void **state)
{
    (void)state;
    zo_backend_ops bad = zo_cpu_backend;
    bad.version = ZO_BACKEND_OPS_VERSION + 1;
    ZO_ASSERT_ST(zo_backend_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "device backend table 'cpu'"));
    assert_non_null(strstr(zo_last_error(), "version"));
}

static void test_device_checker_refuses_a_missing_operation(void **state)
{
    (void)state;
    zo_backend_ops bad = zo_cpu_backend;
    bad.event_record = NULL;
    ZO_ASSERT_ST(zo_backend_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'cpu'"));
    assert_non_null(strstr(zo_last_error(), "'event_record'"));
    bad = zo_cpu_backend;
    bad.device_count = NULL;
    ZO_ASSERT_ST(zo_backend_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'device_count'"));
    ZO_ASSERT_ST(zo_backend_ops_check(NULL), ZO_ERR_INTERNAL);
    /* stream_wrap is optional: the front end refuses wrapping instead. */
    bad = zo_cpu_backend;
    bad.stream_wrap = NULL;
    ZO_ASSERT_OK(zo_backend_ops_check(&bad));
}

static void test_device_names_resolved_through_the_registry(void **state)
{
    (void)state;
    const zo_backend_ops *b = NULL;
    ZO_ASSERT_OK(zo_device_backend_pick("Cpu", &b));
    assert_ptr_equal(b, &zo_cpu_backend);
    ZO_ASSERT_OK(zo_device_backend_pick(NULL, &b)); /* auto */
    assert_string_equal(b->name, zo_device_cuda_count() > 0 ? "cuda" : "cpu");
    ZO_ASSERT_ST(zo_device_backend_pick("tpu", &b), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "expected auto, cuda or cpu"));
    if (!zo_device_cuda_built()) {
        ZO_ASSERT_ST(zo_device_backend_pick("cuda", &b), ZO_ERR_UNSUPPORTED);
        assert_non_null(strstr(zo_last_error(), "no CUDA support"));
    }
}

static void test_ops_registry_has_one_table_per_device_backend(void **state)
{
    (void)state;
    const zo_backend_ops *const *dev;
    const zo_ops_backend *const *ops;
    size_t n = zo_device_backends(&dev);
    assert_int_equal(zo_ops_backends(&ops), n);
    for (size_t i = 0; i < n; i++) {
        const zo_ops_backend *o = NULL;
        ZO_ASSERT_OK(zo_ops_backend_for(dev[i]->name, &o));
        assert_ptr_equal(o, ops[i]);
        assert_string_equal(o->name, dev[i]->name);
        assert_true(o->caps & ZO_OPS_CAP_DETERMINISTIC);
    }
    const zo_ops_backend *none = NULL;
    ZO_ASSERT_ST(zo_ops_backend_for("tpu", &none), ZO_ERR_UNSUPPORTED);
    assert_null(none);
}

static void test_ops_checker_refuses_bad_tables(void **state)
{
    (void)state;
    zo_ops_backend bad = zo_ops_cpu;
    bad.version = 0;
    ZO_ASSERT_ST(zo_ops_backend_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "compute ops table 'cpu'"));
    assert_non_null(strstr(zo_last_error(), "version 0"));
    bad = zo_ops_cpu;
    bad.swiglu_bwd = NULL;
    ZO_ASSERT_ST(zo_ops_backend_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'swiglu_bwd'"));
    ZO_ASSERT_ST(zo_ops_backend_check(NULL), ZO_ERR_INTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_registry_lists_exactly_the_built_backends),
        cmocka_unit_test(test_device_checker_refuses_another_version),
        cmocka_unit_test(test_device_checker_refuses_a_missing_operation),
        cmocka_unit_test(test_device_names_resolved_through_the_registry),
        cmocka_unit_test(test_ops_registry_has_one_table_per_device_backend),
        cmocka_unit_test(test_ops_checker_refuses_bad_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
