/* The communicator backends' registry: it lists exactly the backends this
 * build has (self and tcp always, mpi and nccl when found at configure time), each
 * table passes the checker, and the checker refuses a table of another
 * version or one missing a required operation (fault injection on copies
 * of the real self table), naming the table and the slot. */
#include <string.h>

#include "comm_impl.h"
#include "zo_test.h"

static void test_registry_lists_exactly_the_built_backends(void **state)
{
    (void)state;
    const char *want[4];
    size_t nwant = 0;
    want[nwant++] = "self";
    want[nwant++] = "tcp";
#ifdef ZO_TEST_HAVE_MPI
    want[nwant++] = "mpi";
#endif
#ifdef ZO_TEST_HAVE_NCCL
    want[nwant++] = "nccl";
#endif
    const zo_comm_ops *const *tab;
    size_t n = zo_comm_backends(&tab);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(tab[i]->name, want[i]);
        ZO_ASSERT_OK(zo_comm_ops_check(tab[i]));
        assert_true(zo_comm_backend_built(want[i]));
        assert_true(tab[i]->caps & (ZO_COMM_CAP_HOST_BUFFERS | ZO_COMM_CAP_DEVICE_BUFFERS));
    }
    assert_false(zo_comm_backend_built("gloo"));
    assert_true(zo_comm_self_backend.caps & ZO_COMM_CAP_ONE_RANK);
    /* tcp reaches host-addressable buffers only: device data is staged */
    assert_int_equal(zo_comm_tcp_backend.caps, ZO_COMM_CAP_HOST_BUFFERS);
}

static void test_checker_refuses_another_version(void **state)
{
    (void)state;
    zo_comm_ops bad = zo_comm_self_backend;
    bad.version = ZO_COMM_OPS_VERSION + 7;
    ZO_ASSERT_ST(zo_comm_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "communicator backend table 'self'"));
    assert_non_null(strstr(zo_last_error(), "version"));
}

static void test_checker_refuses_a_missing_operation(void **state)
{
    (void)state;
    zo_comm_ops bad = zo_comm_self_backend;
    bad.host_all_gather = NULL;
    ZO_ASSERT_ST(zo_comm_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'self'"));
    assert_non_null(strstr(zo_last_error(), "'host_all_gather'"));
    ZO_ASSERT_ST(zo_comm_ops_check(NULL), ZO_ERR_INTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_lists_exactly_the_built_backends),
        cmocka_unit_test(test_checker_refuses_another_version),
        cmocka_unit_test(test_checker_refuses_a_missing_operation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
