/* What the engine reports of a step: the bytes each link and NVMe moved
 * and the times, exactly; the NVMe request size and depth reaching the
 * swap store; timelines with well-formed spans on every track, tracing
 * changing no result. */
#include <pthread.h>

#include "engine_harness.h"

/* Bytes of one chunk's optimizer states on NVMe: master, m and v of its n
 * used elements, each padded to 4 KiB (the engine packs them). */
static uint64_t packed_states(uint64_t n)
{
    return 3 * ((n * 4 + 4095) / 4096 * 4096);
}

/* Each layer has two chunks: W fills one (CHUNK / 2 elements), b the other. */
static uint64_t layer_states(void)
{
    return packed_states(CHUNK / 2) + packed_states(TM_D);
}

static void test_step_statistics(void **state)
{
    (void)state;
    const uint64_t grad_bytes = TM_L * (CHUNK + TM_D * 2); /* W fills a chunk; b takes 128 bytes */
    for (int m = 0; m < 3; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, (zo_optim_mode)m);
        c.steps = 4;
        c.accum = 2;
        run_out o;
        run(&c, &o);
        for (int s = 0; s < c.steps; s++) {
            const zo_step_stats *st = &o.stats[s];
            assert_int_equal(st->d2h_bytes, 2 * grad_bytes);
            /* everything fits on the device: each chunk goes up once per step, after an update
             * was published (DPU publishes its first update at the end of step 1) */
            assert_int_equal(st->h2d_bytes, m == ZO_OPTIM_DPU && s == 1 ? 0 : grad_bytes);
            assert_int_equal(o.fp.n_chunks, 2 * TM_L);
            assert_int_equal(zo_engine_nvme_state_bytes(TM_D), 3 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(1024), 3 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(1025), 6 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(CHUNK / 2), 6 * CHUNK);
            uint64_t states =
                TM_L * layer_states(); /* W's chunk: 6 x CHUNK; b's: 12 KiB, not 6 x CHUNK */
            if (m != ZO_OPTIM_DPU || s > 0)
                assert_int_equal(st->nvme_read_bytes, states);
            if (m != ZO_OPTIM_DPU || s > 0)
                assert_int_equal(st->nvme_write_bytes, states);
            assert_true(st->step_seconds > 0 && st->optim_seconds > 0);
            assert_true(st->stall_seconds >= 0 && st->nvme_seconds >= 0);
            if (m != ZO_OPTIM_DPU)
                assert_true(st->nvme_seconds > 0);
            assert_true(st->d2h_seconds > 0 && (st->h2d_bytes == 0 || st->h2d_seconds > 0));
            assert_int_equal(st->step, m == ZO_OPTIM_DPU ? s : s + 1);
            assert_true(st->loss_scale == 1.0);
            assert_true(st->grad_norm > 0);
        }
        run_out_free(&o);
    }
}

/* The NVMe requests of finalize's initial placement (one extent written per chunk). */
static uint64_t nvme_requests_at_finalize(const run_cfg *rc, uint32_t *n_chunks)
{
    harness h;
    harness_open(&h, rc);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    zo_swap_stats ss = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(zo_engine_nvme_store(h.eng), &ss));
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &fp));
    *n_chunks = fp.n_chunks;
    harness_close(&h);
    return ss.requests;
}

/* The NVMe request size and depth (DeepSpeed's aio.block_size and
 * aio.queue_depth) reach the swap store: 4 KiB requests split each extent's
 * write into many; a block size the store refuses fails finalize naming it;
 * the results do not depend on them. */
static void test_nvme_request_knobs(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    uint32_t nc;
    uint64_t big = nvme_requests_at_finalize(&c, &nc);
    c.nvme_block_size = 4096;
    c.nvme_queue_depth = 2;
    uint64_t small = nvme_requests_at_finalize(&c, &nc);
    /* an extent's payload is master, m and v of a chunk's used elements: W's 6 x 8 KiB and
     * b's 3 x 4 KiB, one request each under the default 1 MiB, twelve and three of 4 KiB */
    assert_true(big >= nc);
    assert_int_equal(nc, 2 * TM_L);
    assert_int_equal(small - big, (uint64_t)TM_L * (packed_states(CHUNK / 2) / 4096 - 1 +
                                                    packed_states(TM_D) / 4096 - 1));
    c.steps = 4;
    run_out a, b;
    run(&c, &a);
    run_cfg d = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    d.steps = 4;
    run(&d, &b);
    assert_same_weights(&a, &b, 4);
    run_out_free(&a);
    run_out_free(&b);
    c.nvme_block_size = 5000;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "block_size 5000"));
    harness_close(&h);
}

#define MAX_EVENTS 20000

typedef struct event_log {
    pthread_mutex_t mu;
    zo_trace_event ev[MAX_EVENTS];
    int n;
} event_log;

static void log_event(void *ctx, const zo_trace_event *ev)
{
    event_log *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (l->n < MAX_EVENTS)
        l->ev[l->n++] = *ev;
    pthread_mutex_unlock(&l->mu);
}

static int count_events(const event_log *l, zo_trace_track track, int index, const char *name)
{
    int n = 0;
    for (int i = 0; i < l->n; i++)
        n += l->ev[i].track == track && l->ev[i].index == index &&
             (!name || strcmp(l->ev[i].name, name) == 0);
    return n;
}

/* A traced run (parameters and states on NVMe, overlap mode, a slow link
 * without prefetch so that the compute stream waits) reports spans on every
 * track: both copy streams, the compute stream's waits, both NVMe queues,
 * the host job thread, the end-of-step update and the optimizer's workers,
 * each well formed; and tracing changes nothing in the results. */
static void test_trace_covers_every_track(void **state)
{
    (void)state;
    static event_log log;
    pthread_mutex_init(&log.mu, NULL);
    log.n = 0;
    setenv("ZO_CPU_DEVICE_PCIE_GBPS", "0.05", 1);
    run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_OVERLAP);
    c.device_bytes = min_device_bytes();
    c.lookahead = 0;
    c.steps = 3;
    c.max_norm = 1e-3f; /* every step clips: the first step's speculative updates are rolled
                           back and redone, later steps update after the verdict */
    run_out plain, traced;
    run(&c, &plain);
    c.trace = log_event;
    c.trace_ctx = &log;
    run(&c, &traced);
    unsetenv("ZO_CPU_DEVICE_PCIE_GBPS");
    assert_same_weights(&plain, &traced, c.steps);
    assert_true(count_events(&log, ZO_TRACK_H2D, 0, "h2d") > 0);
    assert_int_equal(count_events(&log, ZO_TRACK_D2H, 0, "d2h"), c.steps * (int)traced.fp.n_chunks);
    assert_true(count_events(&log, ZO_TRACK_COMPUTE, 0, "wait for parameters") > 0);
    for (int store = 0; store < 2; store++) {
        assert_true(count_events(&log, ZO_TRACK_NVME, store, "nvme read") > 0);
        assert_true(count_events(&log, ZO_TRACK_NVME, store, "nvme write") > 0);
    }
    assert_int_equal(
        count_events(&log, ZO_TRACK_HOST_JOBS, 0, "gradient norm + speculative update"),
        c.steps * (int)traced.fp.n_chunks);
    assert_int_equal(count_events(&log, ZO_TRACK_UPDATE, 0, "rollback and update"), 1);
    assert_int_equal(
        count_events(&log, ZO_TRACK_UPDATE, 0, "update (not speculated: the last step clipped)"),
        c.steps - 1);
    int workers = count_events(&log, ZO_TRACK_OPTIM_WORKER, 0, NULL) +
                  count_events(&log, ZO_TRACK_OPTIM_WORKER, 1, NULL);
    assert_true(workers > 0);
    for (int i = 0; i < log.n; i++) {
        const zo_trace_event *e = &log.ev[i];
        assert_true(e->t0_ns <= e->t1_ns);
        assert_true(e->layer >= -1 && e->layer < TM_L);
        if (e->track == ZO_TRACK_H2D || e->track == ZO_TRACK_D2H) {
            assert_true(e->chunk >= 0 && e->layer >= 0);
            assert_true(e->bytes > 0 && e->bytes <= CHUNK);
        }
        if (e->track == ZO_TRACK_NVME)
            assert_true(e->index ? e->bytes == CHUNK
                                 : e->bytes == packed_states(CHUNK / 2) ||
                                       e->bytes == packed_states(TM_D));
        if (e->track == ZO_TRACK_OPTIM_WORKER)
            assert_true(e->index < 2 && e->bytes > 0);
    }
    run_out_free(&plain);
    run_out_free(&traced);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_ST(zo_engine_set_trace(h.eng, log_event, &log), ZO_ERR_STATE);
    harness_close(&h);
    pthread_mutex_destroy(&log.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_statistics),
        cmocka_unit_test(test_nvme_request_knobs),
        cmocka_unit_test(test_trace_covers_every_track),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
