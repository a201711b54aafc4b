/* zo_stream_wrap on cuda: a zoffload stream over a cudaStream_t the test
 * owns (as PyTorch's current stream would be) copies, orders events and runs
 * enqueued functions like any stream, and destroying the wrapper leaves the
 * native stream working. Exits 77 (skipped) without a GPU or without CUDA. */
#include <stdio.h>
#include <string.h>

#include "zo/device.h"
#include "zo_test.h"

#ifdef ZO_TEST_CUDA_RUNTIME
#include <cuda_runtime.h>

enum { N_BYTES = 1 << 20 };

static zo_status bump(void *arg)
{
    ++*(int *)arg;
    return ZO_OK;
}

/* Host -> device through the wrapper, device -> host through a zoffload
 * stream that waits on an event recorded on the wrapper. */
static void copy_through(zo_device_t dev, zo_stream_t wrapped, unsigned char *src,
                         unsigned char *dst)
{
    void *d = NULL;
    ZO_ASSERT_OK(zo_device_malloc(dev, N_BYTES, &d));
    zo_stream_t own = NULL;
    zo_event_t ev = NULL;
    ZO_ASSERT_OK(zo_stream_create(dev, &own));
    ZO_ASSERT_OK(zo_event_create(dev, &ev));
    ZO_ASSERT_OK(zo_memcpy_h2d_async(wrapped, d, src, N_BYTES));
    ZO_ASSERT_OK(zo_event_record(ev, wrapped));
    ZO_ASSERT_OK(zo_stream_wait_event(own, ev));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(own, dst, d, N_BYTES));
    ZO_ASSERT_OK(zo_stream_synchronize(own));
    assert_memory_equal(src, dst, N_BYTES);
    ZO_ASSERT_OK(zo_event_destroy(ev));
    ZO_ASSERT_OK(zo_stream_destroy(own));
    ZO_ASSERT_OK(zo_device_mfree(dev, d));
}

static void test_wrapped_stream_copies_and_outlives_its_wrapper(void **state)
{
    (void)state;
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cuda";
    cfg.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &cfg));
    cudaStream_t native;
    assert_int_equal(cudaStreamCreate(&native), cudaSuccess);
    zo_stream_t w = NULL;
    ZO_ASSERT_OK(zo_stream_wrap(dev, native, &w));
    assert_ptr_equal(zo_stream_native(w), native);
    assert_ptr_equal(zo_stream_device(w), dev);

    static unsigned char src[N_BYTES], dst[N_BYTES];
    for (size_t i = 0; i < N_BYTES; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    copy_through(dev, w, src, dst);
    int ran = 0;
    ZO_ASSERT_OK(zo_stream_enqueue(w, bump, &ran, 0));
    ZO_ASSERT_OK(zo_stream_synchronize(w));
    assert_int_equal(ran, 1);
    ZO_ASSERT_OK(zo_stream_destroy(w));

    /* The owner's stream survived its wrapper. */
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, N_BYTES), cudaSuccess);
    memset(dst, 0, N_BYTES);
    assert_int_equal(cudaMemcpyAsync(d, src, N_BYTES, cudaMemcpyHostToDevice, native), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dst, d, N_BYTES, cudaMemcpyDeviceToHost, native), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(native), cudaSuccess);
    assert_memory_equal(src, dst, N_BYTES);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(native), cudaSuccess);
    zo_device_free(dev);
}

/* NULL wraps the legacy default stream (PyTorch's stream 0, the current
 * stream of every script that picks none): copies and events work on it, and
 * destroying the wrapper leaves it alone. */
static void test_wrap_default_stream(void **state)
{
    (void)state;
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cuda";
    cfg.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &cfg));
    zo_stream_t w = NULL;
    ZO_ASSERT_OK(zo_stream_wrap(dev, NULL, &w));
    assert_ptr_equal(zo_stream_native(w), (void *)cudaStreamLegacy);
    static unsigned char src[N_BYTES], dst[N_BYTES];
    for (size_t i = 0; i < N_BYTES; i++)
        src[i] = (unsigned char)(i * 5 + 1);
    copy_through(dev, w, src, dst);
    ZO_ASSERT_OK(zo_stream_destroy(w));
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    zo_device_free(dev);
}

int main(void)
{
    if (zo_device_cuda_count() == 0) {
        printf("SKIPPED: no CUDA GPU on this machine; zo_stream_wrap on cuda needs one\n");
        return ZO_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrapped_stream_copies_and_outlives_its_wrapper),
        cmocka_unit_test(test_wrap_default_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIPPED: built without CUDA; zo_stream_wrap on cuda needs the CUDA backend\n");
    return ZO_TEST_SKIP;
}
#endif
