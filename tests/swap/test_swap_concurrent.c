/* Several threads share one store, each writing and reading its own
 * extents with many tickets in flight, some through callbacks. Run under
 * ThreadSanitizer in CI (label tsan). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "swap_test_util.h"

enum { NTHREADS = 4, PER_THREAD = 6, ROUNDS = 5 };
#define EXT_BYTES (192u << 10)

typedef struct shared {
    zo_swap_t s;
    atomic_int cb_done;
    atomic_int failures;
} shared;

typedef struct worker {
    shared *sh;
    atomic_int my_cb;
    int id;
    uint8_t *bufs[PER_THREAD];
    uint8_t *rbuf[PER_THREAD];
    zo_swap_extent_t ext[PER_THREAD];
} worker;

struct worker;
static void on_done(void *user, zo_status st, const char *msg)
{
    struct worker *w = user;
    if (st != ZO_OK)
        atomic_fetch_add(&w->sh->failures, 1);
    atomic_fetch_add(&w->sh->cb_done, 1);
    atomic_fetch_add(&w->my_cb, 1);
}

static void *work(void *arg)
{
    worker *w = arg;
    zo_swap_t s = w->sh->s;
    uint64_t rng = 99 + (uint64_t)w->id;
    for (int i = 0; i < PER_THREAD; i++)
        if (zo_swap_alloc_extent(s, (uint64_t)(w->id * 100 + i), &w->ext[i]) != ZO_OK)
            goto fail;
    /* Threads register buffers while others have I/O in flight. */
    for (int i = 0; i < PER_THREAD; i += 2)
        if (zo_swap_register_buffer(s, w->rbuf[i], EXT_BYTES) != ZO_OK)
            goto fail;
    for (int r = 1; r <= ROUNDS; r++) {
        zo_swap_io_t io[PER_THREAD];
        size_t len[PER_THREAD];
        for (int i = 0; i < PER_THREAD; i++) {
            len[i] = 1 + zo_test_rand(&rng) % EXT_BYTES;
            swap_test_fill(w->bufs[i], len[i], rng + (uint64_t)i);
            if (zo_swap_write_async(s, w->ext[i], w->bufs[i], len[i], (uint64_t)r, NULL, NULL,
                                    &io[i]) != ZO_OK)
                goto fail;
        }
        for (int i = 0; i < PER_THREAD; i++)
            if (zo_swap_wait(io[i]) != ZO_OK)
                goto fail;
        /* A third with callbacks only, a third with tickets only, a third with
         * both (as the engine's reads when it traces). */
        for (int i = 0; i < PER_THREAD; i++) {
            zo_swap_io_t *t = i % 3 ? &io[i] : NULL;
            if (zo_swap_read_async(s, w->ext[i], w->rbuf[i], len[i], (uint64_t)r,
                                   i % 3 == 1 ? NULL : on_done, w, t) != ZO_OK)
                goto fail;
        }
        for (int i = 0; i < PER_THREAD; i++)
            if (i % 3 && zo_swap_wait(io[i]) != ZO_OK)
                goto fail;
        /* The callbacks of this round's reads say when their data is in. */
        while (atomic_load(&w->my_cb) < r * (PER_THREAD - PER_THREAD / 3))
            sched_yield();
        for (int i = 0; i < PER_THREAD; i++)
            if (memcmp(w->rbuf[i], w->bufs[i], len[i]))
                goto fail;
    }
    for (int i = 0; i < PER_THREAD; i++)
        if (zo_swap_free_extent(s, w->ext[i]) != ZO_OK)
            goto fail;
    for (int i = 0; i < PER_THREAD; i += 2)
        if (zo_swap_unregister_buffer(s, w->rbuf[i]) != ZO_OK)
            goto fail;
    return NULL;
fail:
    fprintf(stderr, "worker %d: %s\n", w->id, zo_last_error());
    atomic_fetch_add(&w->sh->failures, 1);
    return NULL;
}

static void test_concurrent_submitters(void **state)
{
    swap_test_dirs d;
    assert_int_equal(swap_test_mkdirs(&d), 0);
    zo_swap_config c =
        swap_test_config(&d, 3, NTHREADS * PER_THREAD * (uint64_t)EXT_BYTES, EXT_BYTES);
    c.block_size = 32u << 10;
    shared sh;
    memset(&sh, 0, sizeof sh);
    ZO_ASSERT_OK(zo_swap_open(&c, &sh.s));
    swap_test_check_engine(sh.s);
    worker w[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        w[t].sh = &sh;
        atomic_init(&w[t].my_cb, 0);
        w[t].id = t;
        for (int i = 0; i < PER_THREAD; i++) {
            w[t].bufs[i] = swap_test_alloc(EXT_BYTES);
            w[t].rbuf[i] = swap_test_alloc(EXT_BYTES);
            assert_non_null(w[t].bufs[i]);
            assert_non_null(w[t].rbuf[i]);
        }
        assert_int_equal(pthread_create(&th[t], NULL, work, &w[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    zo_swap_stats st = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(sh.s, &st));
    if (!strcmp(st.engine, "io_uring"))
        assert_true(st.requests_fixed > 0);
    zo_swap_close(sh.s);
    assert_int_equal(atomic_load(&sh.failures), 0);
    assert_int_equal(atomic_load(&sh.cb_done), NTHREADS * ROUNDS * (PER_THREAD - PER_THREAD / 3));
    assert_int_equal(st.writes, NTHREADS * ROUNDS * PER_THREAD);
    assert_int_equal(st.reads, NTHREADS * ROUNDS * PER_THREAD);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.extents_used, 0);
    for (int t = 0; t < NTHREADS; t++)
        for (int i = 0; i < PER_THREAD; i++) {
            free(w[t].bufs[i]);
            free(w[t].rbuf[i]);
        }
    swap_test_rmdirs(&d);
}

int main(void)
{
    swap_test_require_odirect();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_submitters)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
