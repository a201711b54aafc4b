/* A fourth tier added from outside the engine: a second host pool ("host2"),
 * registered through the tier registry (eng_tier_register) with a context
 * that owns its state (its budget, its buffers, their high-water mark). Its
 * tables reuse the host tier's resident operations, so a run whose 16-bit
 * parameters and optimizer states are homed there trains bit for bit as the
 * same run homed on the host tier, in sync and overlap modes; the footprint
 * counts its bytes at its own index (no public struct changed for it), its
 * pool holds exactly those and is empty again once the engine is freed, and
 * the step statistics report the peak its usage operation gives; a budget
 * one byte short, which only its context holds, is refused by the plan
 * naming the tier; and the registry refuses an incomplete table (usage
 * included), one of another version, and a tier beyond ZO_TIER_MAX. Its operations reach their
 * state through the context they are handed (self), as the built-in tiers'
 * do. */
#include <stdlib.h>
#include <string.h>

#include "engine_harness.h"
#include "engine_tier.h"

#define TOY ((zo_tier)ZO_TIER_COUNT) /* the index the registry gives the first tier added */

/* The toy tier's context: everything it holds lives here, none of it in the engine. */
typedef struct toy_pool {
    uint64_t budget; /* bytes it may hold (0: any) */
    uint64_t in_use; /* bytes it holds now */
    uint64_t peak;   /* the most it held */
    float *states;   /* the optimizer states of the chunks homed here */
    float *backups;  /* overlap mode's copies of them (host memory, as the host tier's) */
    uint64_t placed; /* bytes of states */
    int places;      /* place calls, to see it was used */
} toy_pool;

static toy_pool pool;

static void toy_states_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    fp->bytes[TOY] += eng_resident_account(in, TOY, fp);
}

static zo_status toy_states_place(void *self, struct zo_engine *e);

static void toy_states_release(void *self, struct zo_engine *e)
{
    toy_pool *p = self; /* the context it was registered with */
    free(p->states);
    eng_host_free(p->backups); /* eng_resident_place took them with eng_host_alloc */
    p->states = p->backups = NULL;
    p->in_use -= p->placed;
    p->placed = 0;
}

/* Its budget and high-water mark, which only its context knows. */
static void toy_usage(void *self, uint64_t *budget, uint64_t *peak)
{
    const toy_pool *p = self;
    *budget = p->budget;
    *peak = p->peak;
}

static const eng_state_tier toy_states = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = TOY,
    .name = "host2",
    .in_place = 1,
    .account = toy_states_account,
    .place = toy_states_place,
    .release = toy_states_release,
    .init_buf = eng_resident_init_buf,
    .init = eng_resident_init,
    .update = eng_resident_update,
    .speculate = eng_resident_speculate,
    .drain = eng_resident_drain,
    .rollback = eng_resident_rollback,
    .discard = eng_resident_discard,
    .commit = eng_resident_commit,
    .read = eng_resident_read,
    .write_begin = eng_resident_write_begin,
    .write_end = eng_resident_write_end,
    .usage = toy_usage,
};

/* The states of the chunks homed here, from the pool (overlap's backups go to
 * the host tier, as the host tier's do). */
static zo_status toy_states_place(void *self, struct zo_engine *e)
{
    toy_pool *p = self;
    uint64_t bytes = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].st == &toy_states)
            bytes += eng_states_bytes(e->cfg.state_dtype, e->chunk_elems);
    if (p->budget && p->in_use + bytes > p->budget)
        return ZO_FAIL(ZO_ERR_BUDGET, "test", "the host2 tier: %llu bytes asked, %llu left",
                       (unsigned long long)bytes, (unsigned long long)(p->budget - p->in_use));
    p->states = aligned_alloc(4096, bytes ? (bytes + 4095) / 4096 * 4096 : 4096);
    if (!p->states)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "test", "the host2 tier's states");
    memset(p->states, 0, bytes);
    p->placed = bytes;
    p->in_use += bytes;
    if (p->in_use > p->peak)
        p->peak = p->in_use;
    p->places++;
    return eng_resident_place(e, &toy_states, p->states, &p->backups);
}

/* 16-bit parameters: pinned host copies, as the host tier keeps them. */
static void toy_p16_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    eng_host_p16_account(in, TOY, fp);
}

static zo_status toy_p16_place(void *self, struct zo_engine *e);

static void toy_p16_release(void *self, struct zo_engine *e)
{
    (void)e; /* the pinned pool goes with the engine's */
}

static const eng_param_tier toy_params = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = TOY,
    .name = "host2",
    .host_copies = 1,
    .account = toy_p16_account,
    .place = toy_p16_place,
    .release = toy_p16_release,
    .write = eng_host_p16_write,
    .source = eng_host_p16_source,
    .update_out = eng_host_p16_out,
    .commit = eng_host_p16_commit,
};

static zo_status toy_p16_place(void *self, struct zo_engine *e)
{
    return eng_host_p16_place(e, &toy_params);
}

/* Parameters and states homed on the toy tier train as on the host tier. */
static void test_toy_tier_trains_as_the_host_tier(void **state)
{
    (void)state;
    const zo_optim_mode modes[2] = {ZO_OPTIM_SYNC, ZO_OPTIM_OVERLAP};
    for (int m = 0; m < 2; m++) {
        run_cfg host = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, modes[m]);
        run_cfg toy = base_cfg(TOY, TOY, modes[m]);
        host.steps = toy.steps = 6;
        run_out a, b;
        int places = pool.places;
        run(&toy, &a);
        run(&host, &b);
        assert_int_equal(pool.places, places + 1);
        assert_same_weights(&a, &b, toy.steps);
        uint64_t states = N_CHUNKS * eng_states_bytes(ZO_DTYPE_F32, CHUNK / 2);
        assert_int_equal(a.fp.bytes[TOY], states);
        assert_int_equal(b.fp.bytes[TOY], 0);
        assert_int_equal(a.fp.pinned, b.fp.pinned); /* the same pinned 16-bit copies */
        /* the host tier holds only what it held beside its own states */
        assert_int_equal(a.fp.bytes[ZO_TIER_HOST] + states, b.fp.bytes[ZO_TIER_HOST]);
        assert_true(pool.peak >= states);
        assert_int_equal(pool.in_use, 0);
        /* the step statistics report the peak the tier keeps, at its index */
        assert_int_equal(a.stats[toy.steps - 1].peak[TOY], pool.peak);
        assert_int_equal(a.stats[toy.steps - 1].peak[TOY], states);
        run_out_free(&a);
        run_out_free(&b);
    }
}

/* The toy's own budget, one byte short, refuses the plan naming the tier. */
static void test_toy_tier_budget_is_its_own(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, TOY, ZO_OPTIM_SYNC);
    pool.budget = N_CHUNKS * eng_states_bytes(ZO_DTYPE_F32, CHUNK / 2) - 1;
    harness h;
    harness_open(&h, &c);
    int places = pool.places;
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_BUDGET);
    if (!strstr(zo_last_error(), "host2"))
        fail_msg("refusal: %s", zo_last_error());
    /* the plan asked the tier for its budget: refused before anything was placed */
    if (!strstr(zo_last_error(), "the plan does not fit"))
        fail_msg("refusal: %s", zo_last_error());
    assert_int_equal(pool.places, places);
    harness_close(&h);
    assert_int_equal(pool.in_use, 0);
    pool.budget = 0;
}

static zo_status no_place(void *self, struct zo_engine *e)
{
    (void)e;
    return ZO_OK;
}

/* The registry takes only complete tables of its version, up to ZO_TIER_MAX. */
static void test_registry_refuses_bad_tables(void **state)
{
    (void)state;
    eng_state_tier missing = toy_states, old = toy_states;
    missing.tier = old.tier = (zo_tier)eng_n_tiers;
    eng_param_tier params = toy_params;
    params.tier = (zo_tier)eng_n_tiers;
    missing.update = NULL;
    old.version = ENG_TIER_OPS_VERSION + 1;
    int n = eng_n_tiers;
    ZO_ASSERT_ST(eng_tier_register(&params, &missing, NULL, NULL), ZO_ERR_INTERNAL);
    if (!strstr(zo_last_error(), "an operation is missing"))
        fail_msg("refusal: %s", zo_last_error());
    ZO_ASSERT_ST(eng_tier_register(&params, &old, NULL, NULL), ZO_ERR_INTERNAL);
    eng_state_tier mute = toy_states; /* no usage: its budget would go unchecked */
    mute.tier = (zo_tier)eng_n_tiers;
    mute.usage = NULL;
    ZO_ASSERT_ST(eng_tier_register(&params, &mute, NULL, NULL), ZO_ERR_INTERNAL);
    if (!strstr(zo_last_error(), "usage"))
        fail_msg("refusal: %s", zo_last_error());
    ZO_ASSERT_ST(eng_tier_register(&toy_params, &toy_states, NULL, NULL), ZO_ERR_INTERNAL);
    assert_int_equal(eng_n_tiers, n); /* misfiled: it names another index */
    /* fill the registry: the next is refused, naming the limit */
    static eng_param_tier p[ZO_TIER_MAX];
    static eng_state_tier s[ZO_TIER_MAX];
    while (eng_n_tiers < ZO_TIER_MAX) {
        int t = eng_n_tiers;
        p[t] = toy_params, s[t] = toy_states;
        p[t].tier = s[t].tier = (zo_tier)t;
        s[t].place = no_place;
        zo_tier got;
        ZO_ASSERT_OK(eng_tier_register(&p[t], &s[t], NULL, &got));
        assert_int_equal(got, t);
    }
    ZO_ASSERT_ST(eng_tier_register(&p[0], &s[0], NULL, NULL), ZO_ERR_UNSUPPORTED);
    if (!strstr(zo_last_error(), "ZO_TIER_MAX"))
        fail_msg("refusal: %s", zo_last_error());
    while (eng_n_tiers > n)
        eng_tier_unregister_last();
    assert_int_equal(eng_n_tiers, n);
}

int main(void)
{
    zo_tier t;
    if (eng_tier_register(&toy_params, &toy_states, &pool, &t) != ZO_OK || t != TOY) {
        fprintf(stderr, "test_engine_tier_toy: registering the tier: %s\n", zo_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_toy_tier_trains_as_the_host_tier),
        cmocka_unit_test(test_toy_tier_budget_is_its_own),
        cmocka_unit_test(test_registry_refuses_bad_tables),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    eng_tier_unregister_last();
    return failed ? 1 : 0;
}
