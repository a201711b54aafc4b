/* The model FLOPs per token with a sliding window: the window's share of
 * causal attention against a plain count of the pairs, a window as long as
 * the sequence changing nothing, and only the windowed layers scaled (Qwen2's
 * max_window_layers). */
#include <math.h>

#include "model_shape.h"
#include "zo_test.h"

/* The query-key pairs a causal window keeps, counted one query at a time. */
static double counted_density(int window, int seq)
{
    double kept = 0, all = 0;
    for (int i = 0; i < seq; i++) {
        kept += i + 1 < window || window <= 0 ? i + 1 : window;
        all += i + 1;
    }
    return kept / all;
}

static void test_density_counts_the_pairs(void **state)
{
    (void)state;
    const int cases[][2] = {{1, 7},    {3, 7},        {7, 7},        {8, 7}, {0, 64},
                            {16, 128}, {1024, 16384}, {4096, 32768}, {5, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = zt_window_density(cases[i][0], cases[i][1]);
        double want = counted_density(cases[i][0], cases[i][1]);
        assert_true(fabs(got - want) <= 1e-12 * want);
    }
    assert_true(zt_window_density(1024, 16384) < 0.13); /* about 2 w / seq */
}

static double attention_term(const zt_shape *s, int seq, double layers)
{
    return 12.0 * layers * seq * zt_q_dim(s);
}

static void test_windowed_layers_count_their_share(void **state)
{
    (void)state;
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("small", &s));
    const int seq = 4096;
    const double full = zt_shape_flops_per_token(&s, seq);
    s.window = seq; /* not shorter than the sequence: nothing hidden */
    assert_true(zt_shape_flops_per_token(&s, seq) == full);
    s.window = 512;
    const double d = zt_window_density(512, seq);
    double want = full - attention_term(&s, seq, s.n_layers * (1 - d));
    assert_true(fabs(zt_shape_flops_per_token(&s, seq) - want) <= 1e-12 * full);
    s.window_from = s.n_layers / 2; /* the first half full causal */
    want = full - attention_term(&s, seq, (s.n_layers - s.n_layers / 2) * (1 - d));
    assert_true(fabs(zt_shape_flops_per_token(&s, seq) - want) <= 1e-12 * full);
    assert_true(zt_block_attention_share(&s, 0, seq) == 1.0);
    assert_true(zt_block_attention_share(&s, s.n_layers - 1, seq) == d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_density_counts_the_pairs),
        cmocka_unit_test(test_windowed_layers_count_their_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
