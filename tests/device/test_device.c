/* The device interface, run against one backend (argv[1]: cpu or cuda).
 * The cuda run exits 77 (skipped) when no GPU is present. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zo/device.h"
#include "zo/device_testing.h"
#include "zo_internal.h"
#include "zo_test.h"

static const char *g_backend = "cpu";

static zo_device_t open_dev(uint64_t budget)
{
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = g_backend;
    cfg.mem_budget = budget;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &cfg));
    return dev;
}

static int is_cpu(void)
{
    return strcmp(g_backend, "cpu") == 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- memory budget ---- */

static void test_budget_to_the_byte(void **state)
{
    (void)state;
    const uint64_t cap = (1u << 20) + 13;
    zo_device_t dev = open_dev(cap);
    void *a, *b, *c;
    ZO_ASSERT_OK(zo_device_malloc(dev, 1u << 19, &a));
    ZO_ASSERT_OK(zo_device_malloc(dev, (1u << 19) + 12, &b));
    /* exactly one byte left */
    ZO_ASSERT_ST(zo_device_malloc(dev, 2, &c), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    assert_null(c);
    ZO_ASSERT_OK(zo_device_malloc(dev, 1, &c));
    void *d;
    ZO_ASSERT_ST(zo_device_malloc(dev, 1, &d), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    assert_non_null(strstr(zo_last_error(), "free"));
    zo_device_mem_stats ms;
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &ms));
    assert_int_equal(ms.in_use, cap);
    assert_int_equal(ms.high_water, cap);
    assert_int_equal(ms.n_allocs, 3);
    assert_int_equal(ms.n_failed, 2);
    ZO_ASSERT_OK(zo_device_mfree(dev, b));
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &ms));
    assert_int_equal(ms.in_use, cap - (1u << 19) - 12);
    assert_int_equal(ms.high_water, cap);
    zo_device_mem_reset_high_water(dev);
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &ms));
    assert_int_equal(ms.high_water, ms.in_use);
    ZO_ASSERT_OK(zo_device_mfree(dev, a));
    ZO_ASSERT_OK(zo_device_mfree(dev, c));
    zo_device_free(dev);
}

static void test_random_alloc_free_accounting(void **state)
{
    (void)state;
    const uint64_t cap = 8u << 20;
    zo_device_t dev = open_dev(cap);
    enum { N = 64 };
    void *p[N] = {0};
    size_t sz[N] = {0};
    uint64_t rng = 42, in_use = 0, hw = 0;
    for (int it = 0; it < 2000; it++) {
        int i = (int)(zo_test_rand(&rng) % N);
        if (p[i]) {
            ZO_ASSERT_OK(zo_device_mfree(dev, p[i]));
            in_use -= sz[i];
            p[i] = NULL;
        } else {
            size_t n = 1 + (size_t)(zo_test_rand(&rng) % (512u << 10));
            zo_status st = zo_device_malloc(dev, n, &p[i]);
            if (in_use + n <= cap) {
                assert_int_equal(st, ZO_OK);
                assert_int_equal((uintptr_t)p[i] % 256, 0);
                sz[i] = n;
                in_use += n;
                if (in_use > hw)
                    hw = in_use;
            } else {
                assert_int_equal(st, ZO_ERR_OUT_OF_DEVICE_MEMORY);
                assert_null(p[i]);
            }
        }
        zo_device_mem_stats ms;
        ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &ms));
        assert_int_equal(ms.in_use, in_use);
        assert_int_equal(ms.high_water, hw);
        assert_true(ms.high_water <= cap);
    }
    for (int i = 0; i < N; i++)
        ZO_ASSERT_OK(zo_device_mfree(dev, p[i]));
    zo_device_free(dev);
}

/* ---- ordering ---- */

typedef struct {
    int *log;
    int *pos;
    int value;
} append_arg;

static zo_status append_fn(void *arg)
{
    append_arg *a = arg;
    a->log[(*a->pos)++] = a->value;
    return ZO_OK;
}

static void test_order_within_stream(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(0);
    zo_stream_t s;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    enum { N = 2000 };
    int *log = calloc(N, sizeof *log);
    int pos = 0;
    for (int i = 0; i < N; i++) {
        append_arg a = {log, &pos, i};
        /* the argument is copied at enqueue time, so reusing `a` is safe */
        ZO_ASSERT_OK(zo_stream_enqueue(s, append_fn, &a, sizeof a));
    }
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_int_equal(pos, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(log[i], i);
    free(log);
    ZO_ASSERT_OK(zo_stream_destroy(s));
    zo_device_free(dev);
}

static void test_copy_chain_in_order(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(0);
    zo_stream_t s;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    const size_t n = 3u << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0, n);
    void *d1, *d2;
    ZO_ASSERT_OK(zo_device_malloc(dev, n, &d1));
    ZO_ASSERT_OK(zo_device_malloc(dev, n, &d2));
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, d1, src, n));
    ZO_ASSERT_OK(zo_memcpy_d2d_async(s, d2, d1, n));
    ZO_ASSERT_OK(zo_memset_async(s, d2, 0xAB, 100));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, dst, d2, n));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(dst[i], 0xAB);
    assert_memory_equal(dst + 100, src + 100, n - 100);
    zo_device_copy_stats cs;
    ZO_ASSERT_OK(zo_device_copy_get_stats(dev, &cs));
    assert_int_equal(cs.h2d_bytes, n);
    assert_int_equal(cs.d2h_bytes, n);
    assert_int_equal(cs.d2d_bytes, n);
    ZO_ASSERT_OK(zo_device_mfree(dev, d1));
    ZO_ASSERT_OK(zo_device_mfree(dev, d2));
    free(src);
    free(dst);
    zo_device_free(dev);
}

/* ---- events across streams ---- */

typedef struct {
    _Atomic int *flag;
    int sleep_ms;
    int expect;
    _Atomic int *seen;
} flag_arg;

static zo_status set_flag_late(void *arg)
{
    flag_arg *a = arg;
    sleep_ms(a->sleep_ms);
    atomic_store(a->flag, 1);
    return ZO_OK;
}

static zo_status read_flag(void *arg)
{
    flag_arg *a = arg;
    atomic_store(a->seen, atomic_load(a->flag));
    return ZO_OK;
}

static void test_cross_stream_event_wait(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(0);
    zo_stream_t a, b;
    zo_event_t ev;
    ZO_ASSERT_OK(zo_stream_create(dev, &a));
    ZO_ASSERT_OK(zo_stream_create(dev, &b));
    ZO_ASSERT_OK(zo_event_create(dev, &ev));
    /* never recorded: complete, as in CUDA */
    ZO_ASSERT_OK(zo_event_query(ev));
    for (int round = 0; round < 5; round++) {
        _Atomic int flag = 0, seen = -1;
        flag_arg fa = {&flag, 30, 0, &seen};
        ZO_ASSERT_OK(zo_stream_enqueue(a, set_flag_late, &fa, sizeof fa));
        ZO_ASSERT_OK(zo_event_record(ev, a));
        ZO_ASSERT_ST(zo_event_query(ev), ZO_NOT_READY);
        ZO_ASSERT_OK(zo_stream_wait_event(b, ev));
        ZO_ASSERT_OK(zo_stream_enqueue(b, read_flag, &fa, sizeof fa));
        ZO_ASSERT_OK(zo_stream_synchronize(b));
        assert_int_equal(atomic_load(&seen), 1);
        ZO_ASSERT_OK(zo_event_synchronize(ev));
        ZO_ASSERT_OK(zo_event_query(ev));
    }
    zo_event_t e0, e1;
    ZO_ASSERT_OK(zo_event_create(dev, &e0));
    ZO_ASSERT_OK(zo_event_create(dev, &e1));
    _Atomic int flag = 0, seen = 0;
    flag_arg fa = {&flag, 20, 0, &seen};
    ZO_ASSERT_OK(zo_event_record(e0, a));
    ZO_ASSERT_OK(zo_stream_enqueue(a, set_flag_late, &fa, sizeof fa));
    ZO_ASSERT_OK(zo_event_record(e1, a));
    ZO_ASSERT_OK(zo_event_synchronize(e1));
    float ms = 0;
    ZO_ASSERT_OK(zo_event_elapsed_ms(e0, e1, &ms));
    assert_true(ms >= 15.0f);
    ZO_ASSERT_OK(zo_event_destroy(e0));
    ZO_ASSERT_OK(zo_event_destroy(e1));
    ZO_ASSERT_OK(zo_event_destroy(ev));
    zo_device_free(dev); /* destroys the streams */
}

/* ---- two copy streams and a compute stream at once ---- */

typedef struct {
    const float *x;
    float *y;
    size_t n;
    float scale;
} scale_arg;

static zo_status scale_fn(void *arg)
{
    scale_arg *a = arg;
    for (size_t i = 0; i < a->n; i++)
        a->y[i] = a->x[i] * a->scale + 1.0f;
    return ZO_OK;
}

static void test_copy_copy_compute_pipeline(void **state)
{
    (void)state;
    if (!is_cpu()) {
        /* The compute step dereferences device pointers on the host. */
        print_message("skipped on %s: needs host-addressable device memory\n", g_backend);
        skip();
    }
    zo_device_t dev = open_dev(64u << 20);
    zo_stream_t h2d, d2h, comp;
    ZO_ASSERT_OK(zo_stream_create(dev, &h2d));
    ZO_ASSERT_OK(zo_stream_create(dev, &d2h));
    ZO_ASSERT_OK(zo_stream_create(dev, &comp));
    enum { CHUNKS = 16, SLOTS = 3 };
    const size_t n = 64 * 1024;
    float *in = malloc(CHUNKS * n * sizeof(float)), *out = malloc(CHUNKS * n * sizeof(float));
    for (size_t i = 0; i < CHUNKS * n; i++)
        in[i] = (float)(i % 1000) * 0.5f;
    float *dx[SLOTS], *dy[SLOTS];
    zo_event_t loaded[SLOTS], computed[SLOTS], drained[SLOTS];
    for (int k = 0; k < SLOTS; k++) {
        ZO_ASSERT_OK(zo_device_malloc(dev, n * sizeof(float), (void **)&dx[k]));
        ZO_ASSERT_OK(zo_device_malloc(dev, n * sizeof(float), (void **)&dy[k]));
        ZO_ASSERT_OK(zo_event_create(dev, &loaded[k]));
        ZO_ASSERT_OK(zo_event_create(dev, &computed[k]));
        ZO_ASSERT_OK(zo_event_create(dev, &drained[k]));
    }
    /* A ring of SLOTS buffers: load chunk c while computing c-1 and draining c-2. */
    for (int c = 0; c < CHUNKS; c++) {
        int k = c % SLOTS;
        ZO_ASSERT_OK(zo_stream_wait_event(h2d, computed[k])); /* dx[k] free again */
        ZO_ASSERT_OK(zo_memcpy_h2d_async(h2d, dx[k], in + c * n, n * sizeof(float)));
        ZO_ASSERT_OK(zo_event_record(loaded[k], h2d));
        ZO_ASSERT_OK(zo_stream_wait_event(comp, loaded[k]));
        ZO_ASSERT_OK(zo_stream_wait_event(comp, drained[k])); /* dy[k] free again */
        scale_arg sa = {dx[k], dy[k], n, 2.0f};
        ZO_ASSERT_OK(zo_stream_enqueue(comp, scale_fn, &sa, sizeof sa));
        ZO_ASSERT_OK(zo_event_record(computed[k], comp));
        ZO_ASSERT_OK(zo_stream_wait_event(d2h, computed[k]));
        ZO_ASSERT_OK(zo_memcpy_d2h_async(d2h, out + c * n, dy[k], n * sizeof(float)));
        ZO_ASSERT_OK(zo_event_record(drained[k], d2h));
    }
    ZO_ASSERT_OK(zo_device_synchronize(dev));
    for (size_t i = 0; i < CHUNKS * n; i++)
        assert_true(out[i] == in[i] * 2.0f + 1.0f);
    for (int k = 0; k < SLOTS; k++) {
        ZO_ASSERT_OK(zo_device_mfree(dev, dx[k]));
        ZO_ASSERT_OK(zo_device_mfree(dev, dy[k]));
    }
    free(in);
    free(out);
    zo_device_free(dev);
}

/* Two streams really run at the same time: each task waits for the other
 * at a rendezvous; serialized streams would time out. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
} rendezvous;

static zo_status meet(void *arg)
{
    rendezvous *r = *(rendezvous **)arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    pthread_mutex_lock(&r->mu);
    r->arrived++;
    pthread_cond_broadcast(&r->cv);
    int rc = 0;
    while (r->arrived < 3 && rc == 0)
        rc = pthread_cond_timedwait(&r->cv, &r->mu, &dl);
    int ok = r->arrived >= 3;
    pthread_mutex_unlock(&r->mu);
    return ok ? ZO_OK : ZO_FAIL(ZO_ERR_STATE, "test", "streams did not run concurrently");
}

static void test_streams_run_concurrently(void **state)
{
    (void)state;
    if (!is_cpu()) {
        print_message("skipped on %s: host functions may share one driver thread\n", g_backend);
        skip();
    }
    zo_device_t dev = open_dev(0);
    zo_stream_t s[3];
    rendezvous r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    rendezvous *rp = &r;
    for (int i = 0; i < 3; i++)
        ZO_ASSERT_OK(zo_stream_create(dev, &s[i]));
    for (int i = 0; i < 3; i++)
        ZO_ASSERT_OK(zo_stream_enqueue(s[i], meet, &rp, sizeof rp));
    for (int i = 0; i < 3; i++)
        ZO_ASSERT_OK(zo_stream_synchronize(s[i]));
    assert_int_equal(r.arrived, 3);
    zo_device_free(dev);
}

/* ---- error paths ---- */

static zo_status failing_fn(void *arg)
{
    (void)arg;
    return ZO_FAIL(ZO_ERR_IO, "test", "deliberate failure 1234");
}

static void test_async_errors_kept_and_reported(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(0);
    zo_stream_t s;
    zo_event_t ev;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    ZO_ASSERT_OK(zo_event_create(dev, &ev));
    ZO_ASSERT_OK(zo_stream_enqueue(s, failing_fn, NULL, 0));
    ZO_ASSERT_OK(zo_event_record(ev, s));
    ZO_ASSERT_ST(zo_event_synchronize(ev), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "deliberate failure 1234"));
    ZO_ASSERT_ST(zo_stream_synchronize(s), ZO_ERR_IO);
    /* reported once, then cleared */
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    ZO_ASSERT_OK(zo_event_record(ev, s));
    ZO_ASSERT_OK(zo_event_synchronize(ev));
    /* an injected task fault */
    int pos = 0, log[1];
    append_arg a = {log, &pos, 7};
    ZO_ASSERT_OK(zo_device_inject_fault(dev, ZO_FAULT_STREAM_TASK, 1));
    ZO_ASSERT_OK(zo_stream_enqueue(s, append_fn, &a, sizeof a));
    ZO_ASSERT_ST(zo_stream_synchronize(s), ZO_ERR_INTERNAL);
    assert_int_equal(pos, 0);
    ZO_ASSERT_OK(zo_stream_enqueue(s, append_fn, &a, sizeof a));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_int_equal(pos, 1);
    zo_device_free(dev);
}

static void test_error_paths(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(1u << 20);
    void *p = NULL;
    ZO_ASSERT_ST(zo_device_malloc(dev, (1u << 20) + 1, &p), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    ZO_ASSERT_ST(zo_device_malloc(dev, 0, &p), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_device_malloc(dev, 16, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_device_malloc(NULL, 16, &p), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_device_inject_fault(dev, ZO_FAULT_DEVICE_MALLOC, 1));
    ZO_ASSERT_ST(zo_device_malloc(dev, 16, &p), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    assert_non_null(strstr(zo_last_error(), "injected"));
    ZO_ASSERT_OK(zo_device_malloc(dev, 4096, &p));
    /* double free is caught and changes nothing */
    ZO_ASSERT_OK(zo_device_mfree(dev, p));
    ZO_ASSERT_ST(zo_device_mfree(dev, p), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "double free"));
    int local;
    ZO_ASSERT_ST(zo_device_mfree(dev, &local), ZO_ERR_INVALID_ARG);
    zo_device_mem_stats ms;
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &ms));
    assert_int_equal(ms.in_use, 0);
    ZO_ASSERT_OK(zo_device_mfree(dev, NULL));
    /* copies and memsets must target live device memory, in range */
    zo_stream_t s;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    char host[64] = {0};
    ZO_ASSERT_OK(zo_device_malloc(dev, 32, &p));
    ZO_ASSERT_ST(zo_memcpy_h2d_async(s, host, host, 8), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_memcpy_h2d_async(s, p, host, 33), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_memcpy_d2h_async(s, host, (char *)p + 16, 17), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_memcpy_d2d_async(s, p, host, 8), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_memset_async(s, host, 0, 8), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_memcpy_h2d_async(NULL, p, host, 8), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_stream_enqueue(s, NULL, NULL, 0), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_stream_enqueue(s, failing_fn, NULL, 8), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, (char *)p + 16, host, 16));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    ZO_ASSERT_OK(zo_device_mfree(dev, p));
    /* host registration */
    size_t hn = 1u << 16;
    void *h = aligned_alloc(4096, hn);
    ZO_ASSERT_OK(zo_device_host_register(dev, h, hn));
    ZO_ASSERT_ST(zo_device_host_register(dev, (char *)h + 4096, 4096), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_device_host_unregister(dev, h));
    ZO_ASSERT_ST(zo_device_host_unregister(dev, h), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_device_inject_fault(dev, ZO_FAULT_HOST_REGISTER, 1));
    ZO_ASSERT_ST(zo_device_host_register(dev, h, hn), ZO_ERR_PIN);
    ZO_ASSERT_OK(zo_device_host_register(dev, h, hn));
    ZO_ASSERT_OK(zo_device_host_unregister(dev, h));
    free(h);
    /* null and mismatched handles */
    ZO_ASSERT_ST(zo_stream_synchronize(NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_event_synchronize(NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_event_record(NULL, s), ZO_ERR_INVALID_ARG);
    zo_device_t other = open_dev(0);
    zo_event_t ev;
    ZO_ASSERT_OK(zo_event_create(other, &ev));
    ZO_ASSERT_ST(zo_event_record(ev, s), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_stream_wait_event(s, ev), ZO_ERR_INVALID_ARG);
    zo_device_free(other);
    zo_device_free(dev);
    zo_device_free(NULL);
}

static void test_bad_configs(void **state)
{
    (void)state;
    zo_device_t dev = (zo_device_t)0x1;
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "tpu";
    ZO_ASSERT_ST(zo_device_init(&dev, &cfg), ZO_ERR_INVALID_ARG);
    assert_null(dev);
    assert_non_null(strstr(zo_last_error(), "expected auto, cuda or cpu"));
    cfg.backend = "cpu";
    cfg.struct_size = 8;
    ZO_ASSERT_ST(zo_device_init(&dev, &cfg), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "ZO_DEVICE_CONFIG_INIT"));
    ZO_ASSERT_ST(zo_device_init(NULL, NULL), ZO_ERR_INVALID_ARG);
    if (zo_device_cuda_count() == 0) {
        zo_device_config c2 = ZO_DEVICE_CONFIG_INIT;
        c2.backend = "cuda";
        zo_status st = zo_device_init(&dev, &c2);
        assert_true(st == ZO_ERR_NO_DEVICE || st == ZO_ERR_UNSUPPORTED);
        c2.backend = "auto";
        ZO_ASSERT_OK(zo_device_init(&dev, &c2));
        assert_string_equal(zo_device_backend(dev), "cpu");
        zo_device_free(dev);
    }
}

static void test_info(void **state)
{
    (void)state;
    zo_device_t dev = open_dev(123456789);
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    ZO_ASSERT_OK(zo_device_get_info(dev, &info));
    assert_string_equal(info.backend, g_backend);
    assert_int_equal(info.budget, 123456789);
    if (is_cpu()) {
        assert_true(zo_device_caps(dev) & ZO_DEVCAP_HOST_ADDRESSABLE);
        assert_false(zo_device_caps(dev) & ZO_DEVCAP_REAL_GPU);
    } else {
        assert_true(zo_device_caps(dev) & ZO_DEVCAP_REAL_GPU);
    }
    zo_device_free(dev);
}

/* The cpu device's streams are worker threads it owns: there is no native
 * stream to adopt, and the refusal says what to call instead. */
static void test_stream_wrap_refused_on_cpu(void **state)
{
    (void)state;
    if (!is_cpu()) {
        print_message("skipped on %s: wrapping is tested by test_stream_wrap_cuda\n", g_backend);
        skip();
    }
    zo_device_t dev = open_dev(1 << 20);
    int native = 0;
    zo_stream_t s = (zo_stream_t)0x1;
    ZO_ASSERT_ST(zo_stream_wrap(dev, &native, &s), ZO_ERR_UNSUPPORTED);
    assert_null(s);
    assert_non_null(strstr(zo_last_error(), "worker threads"));
    assert_non_null(strstr(zo_last_error(), "zo_stream_create"));
    ZO_ASSERT_ST(zo_stream_wrap(NULL, &native, &s), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_stream_wrap(dev, &native, NULL), ZO_ERR_INVALID_ARG);
    zo_device_free(dev);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_backend = argv[1];
    if (strcmp(g_backend, "cuda") == 0 && zo_device_cuda_count() == 0) {
        printf("SKIPPED: no CUDA GPU on this machine (built with CUDA: %s); the cuda device tests "
               "need "
               "one\n",
               zo_device_cuda_built() ? "yes" : "no");
        return ZO_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_to_the_byte),
        cmocka_unit_test(test_random_alloc_free_accounting),
        cmocka_unit_test(test_order_within_stream),
        cmocka_unit_test(test_copy_chain_in_order),
        cmocka_unit_test(test_cross_stream_event_wait),
        cmocka_unit_test(test_copy_copy_compute_pipeline),
        cmocka_unit_test(test_streams_run_concurrently),
        cmocka_unit_test(test_async_errors_kept_and_reported),
        cmocka_unit_test(test_error_paths),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_stream_wrap_refused_on_cpu),
    };
    return cmocka_run_group_tests_name(g_backend, tests, NULL, NULL);
}
