/* The model FLOPs per token with a sliding window: the window's share of
 * causal attention against a plain count of the pairs, a window as long as
 * the sequence changing nothing, and only the windowed layers scaled (Qwen2's
 * max_window_layers). A block-sparse layout's share (zt_layout_share)
 * against a brute-force count of the tiles the op runs: every query x key
 * pair the rules allow (causal, the mask of zo_attn_layout_build, the
 * window) marks its tile; layouts the builder refuses, or too large to
 * count, are refused. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model_shape.h"
#include "zo_test.h"
#include "zt_error.h"

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

/* The tiles of block x block tokens with at least one pair the rules allow,
 * over a causal sweep's tiles, counted pair by pair. */
static double counted_tiles(const zo_attn_layout *l, int window, int seq)
{
    int nb = (seq + l->block - 1) / l->block;
    uint8_t *mask = malloc((size_t)nb * nb), *runs = calloc((size_t)nb * nb, 1);
    assert_non_null(mask);
    assert_non_null(runs);
    int got_nb;
    ZO_ASSERT_OK(zo_attn_layout_build(l, seq, mask, (size_t)nb * nb, &got_nb, NULL));
    assert_int_equal(got_nb, nb);
    for (int i = 0; i < seq; i++)
        for (int j = 0; j <= i; j++) {
            size_t t = (size_t)(i / l->block) * nb + j / l->block;
            if (mask[t] && (window <= 0 || i - j < window))
                runs[t] = 1;
        }
    double kept = 0;
    for (size_t t = 0; t < (size_t)nb * nb; t++)
        kept += runs[t];
    free(mask);
    free(runs);
    return kept / ((double)nb * (nb + 1) / 2);
}

static zo_attn_layout layout_of(zo_attn_layout_kind kind, int block, int window_blocks,
                                int global_blocks, int random_blocks)
{
    zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
    l.kind = kind, l.block = block, l.window_blocks = window_blocks;
    l.global_blocks = global_blocks, l.random_blocks = random_blocks, l.seed = 7;
    return l;
}

static void test_layout_share_counts_the_tiles(void **state)
{
    (void)state;
    const zo_attn_layout layouts[] = {
        layout_of(ZO_ATTN_LAYOUT_DENSE, 16, 1, 0, 0),
        layout_of(ZO_ATTN_LAYOUT_SLIDING_WINDOW, 16, 3, 0, 0),
        layout_of(ZO_ATTN_LAYOUT_FIXED, 16, 4, 1, 0),
        layout_of(ZO_ATTN_LAYOUT_FIXED, 32, 3, 2, 0),
        layout_of(ZO_ATTN_LAYOUT_BIGBIRD, 16, 3, 1, 2),
    };
    const int seqs[] = {16, 100, 512, 600};
    const int windows[] = {0, 40, 100000};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (size_t k = 0; k < sizeof seqs / sizeof seqs[0]; k++)
            for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
                double got, want = counted_tiles(&layouts[i], windows[w], seqs[k]);
                ZO_ASSERT_OK(zt_layout_share(&layouts[i], windows[w], seqs[k], &got));
                if (fabs(got - want) > 1e-12)
                    fail_msg("layout %zu, seq %d, window %d: share %.15g, counted %.15g", i,
                             seqs[k], windows[w], got, want);
            }
    /* the fixed layout keeps well under half the blocks; the answer kept for
     * the last question is not given for another length or seed */
    double fixed, at_512, reseeded;
    ZO_ASSERT_OK(zt_layout_share(&layouts[2], 0, 600, &fixed));
    assert_true(fixed < 0.5);
    ZO_ASSERT_OK(zt_layout_share(&layouts[2], 0, 512, &at_512));
    assert_true(at_512 == counted_tiles(&layouts[2], 0, 512) && at_512 != fixed);
    zo_attn_layout other = layouts[4];
    other.seed = 8;
    ZO_ASSERT_OK(zt_layout_share(&layouts[4], 0, 600, &fixed));
    ZO_ASSERT_OK(zt_layout_share(&other, 0, 600, &reseeded));
    assert_true(reseeded == counted_tiles(&other, 0, 600) && reseeded != fixed);
    /* no layout: the window's density */
    double none;
    ZO_ASSERT_OK(zt_layout_share(NULL, 40, 600, &none));
    assert_true(none == zt_window_density(40, 600));
}

/* Every block's attention scaled by the layout's share, a windowed block's
 * by the share with its window. */
static void test_layout_scales_the_flops(void **state)
{
    (void)state;
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("small", &s));
    const int seq = 4096;
    const zo_attn_layout l = layout_of(ZO_ATTN_LAYOUT_FIXED, 64, 4, 1, 0);
    const double full = zt_shape_flops_per_token(&s, seq);
    double share, windowed;
    ZO_ASSERT_OK(zt_layout_share(&l, 0, seq, &share));
    double want = full - attention_term(&s, seq, s.n_layers * (1 - share));
    assert_true(fabs(zt_layout_flops_per_token(&s, &l, seq) - want) <= 1e-12 * full);
    const zo_attn_layout none = {0};
    assert_true(zt_layout_flops_per_token(&s, &none, seq) == full);
    s.window = 512;
    s.window_from = 4;
    ZO_ASSERT_OK(zt_layout_share(&l, 512, seq, &windowed));
    assert_true(windowed < share);
    want = full - attention_term(&s, seq, 4 * (1 - share) + (s.n_layers - 4) * (1 - windowed));
    assert_true(fabs(zt_layout_flops_per_token(&s, &l, seq) - want) <= 1e-12 * full);
    assert_true(zt_block_layout_share(&s, &l, 3, seq) == share);
    assert_true(zt_block_layout_share(&s, &l, 4, seq) == windowed);
}

/* Bad layouts: what the builder refuses, and more blocks than are counted;
 * the FLOPs of a layer whose share cannot be counted are NaN, not dense's. */
static void test_bad_layouts_refused(void **state)
{
    (void)state;
    double share = -1;
    zo_attn_layout l = layout_of(ZO_ATTN_LAYOUT_FIXED, 24, 4, 1, 0);
    assert_int_equal(zt_layout_share(&l, 0, 256, &share), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "block 24 must be a multiple of 16 in 16..512"));
    l = layout_of(ZO_ATTN_LAYOUT_FIXED, 16, 4, 5, 0);
    assert_int_equal(zt_layout_share(&l, 0, 256, &share), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "global_blocks 5 must be in 1..window_blocks (4)"));
    l = layout_of(ZO_ATTN_LAYOUT_FIXED, 16, 4, 1, 0);
    const int seq = (ZT_LAYOUT_MAX_BLOCKS + 1) * 16;
    assert_int_equal(zt_layout_share(&l, 0, seq, &share), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "use a larger block"));
    assert_true(share == -1);
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("tiny", &s));
    assert_true(isnan(zt_layout_flops_per_token(&s, &l, seq)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_share_counts_the_tiles),
        cmocka_unit_test(test_layout_scales_the_flops),
        cmocka_unit_test(test_bad_layouts_refused),
        cmocka_unit_test(test_density_counts_the_pairs),
        cmocka_unit_test(test_windowed_layers_count_their_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
