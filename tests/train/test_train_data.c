/* zo-train's data reader: text and token files, the split, the shuffled
 * order, and every malformed token file refused with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "zo_test.h"
#include "zt_error.h"

static char g_dir[256];

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A text file: bytes are tokens, the last 10% is validation, windows of
 * seq+1 start at multiples of seq. */
static void test_text_windows_and_split(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "text.txt");
    unsigned char text[1000];
    for (int i = 0; i < 1000; i++)
        text[i] = (unsigned char)(i * 31 + 7);
    write_file(path, text, sizeof text);
    zt_data *d = NULL;
    ZO_ASSERT_OK(zt_data_open(&d, path, 8, 0.1, 42));
    zt_data_info in;
    zt_data_get_info(d, &in);
    assert_int_equal(in.binary, 0);
    assert_int_equal(in.vocab, 256);
    assert_int_equal(in.n_tokens, 1000);
    assert_int_equal(in.n_train, 900);
    assert_int_equal(in.train_windows, (900 - 1) / 8);
    assert_int_equal(in.val_windows, (100 - 1) / 8);
    int32_t x[2 * 8], y[2 * 8];
    zt_data_val(d, 1, x, y, 2);
    for (int t = 0; t < 16; t++) {
        int pos = 900 + 8 + t; /* windows 1 and 2 of the split are consecutive */
        assert_int_equal(x[t], text[pos]);
        assert_int_equal(y[t], text[pos + 1]);
    }
    zt_data_free(d);
    unlink(path);
}

/* One epoch visits every training window once; the order is a function of
 * the seed alone; the next epoch is reshuffled. */
static void test_shuffle_is_a_seeded_permutation(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "perm.tok");
    enum { N = 4001, SEQ = 4 };
    uint32_t *ids = malloc(N * sizeof *ids);
    assert_non_null(ids);
    for (uint32_t i = 0; i < N; i++)
        ids[i] = i; /* a window is identified by its first id */
    ZO_ASSERT_OK(zt_data_write_tokens(path, ids, N, 4, N));
    const int W = (N - 1) / SEQ;
    zt_data *a = NULL, *b = NULL, *c = NULL;
    ZO_ASSERT_OK(zt_data_open(&a, path, SEQ, 0.0, 1));
    ZO_ASSERT_OK(zt_data_open(&b, path, SEQ, 0.0, 1));
    ZO_ASSERT_OK(zt_data_open(&c, path, SEQ, 0.0, 2));
    int32_t x[SEQ], y[SEQ], xb[SEQ], xc[SEQ];
    char *seen = calloc((size_t)W, 1);
    int *first_epoch = malloc((size_t)W * sizeof *first_epoch);
    int same_as_c = 0, in_order = 0;
    for (int j = 0; j < W; j++) {
        zt_data_next_train(a, x, y, 1);
        zt_data_next_train(b, xb, y, 1);
        zt_data_next_train(c, xc, y, 1);
        assert_memory_equal(x, xb, sizeof x);
        assert_int_equal(x[0] % SEQ, 0);
        for (int t = 0; t < SEQ; t++)
            assert_int_equal(y[t], xc[t] + 1); /* targets are the next ids */
        int w = x[0] / SEQ;
        assert_false(seen[w]);
        seen[w] = 1;
        first_epoch[j] = w;
        same_as_c += x[0] == xc[0];
        in_order += w == j;
    }
    assert_true(same_as_c < W / 10);
    assert_true(in_order < W / 10);
    int same_next = 0;
    for (int j = 0; j < W; j++) {
        zt_data_next_train(a, x, y, 1);
        same_next += x[0] / SEQ == first_epoch[j];
    }
    assert_true(same_next < W / 10);
    free(seen);
    free(first_epoch);
    zt_data_free(a);
    zt_data_free(b);
    zt_data_free(c);
    free(ids);
    unlink(path);
}

static void test_uint16_token_file_round_trip(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "u16.tok");
    uint32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (uint32_t)(65535 - i * 101 % 65536);
    ZO_ASSERT_OK(zt_data_write_tokens(path, ids, 300, 2, 65536));
    zt_data *d = NULL;
    ZO_ASSERT_OK(zt_data_open(&d, path, 10, 0.5, 1));
    zt_data_info in;
    zt_data_get_info(d, &in);
    assert_int_equal(in.binary, 1);
    assert_int_equal(in.id_bytes, 2);
    assert_int_equal(in.vocab, 65536);
    int32_t x[10], y[10];
    zt_data_val(d, 0, x, y, 1);
    for (int t = 0; t < 10; t++) {
        assert_int_equal(x[t], (int32_t)ids[150 + t]);
        assert_int_equal(y[t], (int32_t)ids[151 + t]);
    }
    zt_data_free(d);
    unlink(path);
}

/* Patch a valid token file's bytes and expect a refusal naming the problem. */
static void expect_corrupt(const char *name, size_t off, const void *patch, size_t n,
                           size_t truncate_to, const char *needle)
{
    char path[300];
    path_in_dir(path, sizeof path, name);
    uint32_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = (uint32_t)i;
    ZO_ASSERT_OK(zt_data_write_tokens(path, ids, 64, 2, 64));
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    assert_int_equal(fwrite(patch, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    if (truncate_to)
        assert_int_equal(truncate(path, (off_t)truncate_to), 0);
    zt_data *d = NULL;
    assert_int_equal(zt_data_open(&d, path, 4, 0.1, 1), ZO_ERR_CORRUPT);
    assert_null(d);
    if (!strstr(zt_last_error(), needle) || !strstr(zt_last_error(), path))
        fail_msg("message '%s' should name %s and say '%s'", zt_last_error(), path, needle);
    unlink(path);
}

static void test_bad_token_files_are_refused(void **state)
{
    const unsigned char v2[4] = {2, 0, 0, 0}, w3[4] = {3, 0, 0, 0}, big_id[2] = {0x40, 0};
    const unsigned char n_more[8] = {65, 0, 0, 0, 0, 0, 0, 0}, vocab0[4] = {0};
    expect_corrupt("version.tok", 8, v2, 4, 0, "version 2");
    expect_corrupt("width.tok", 12, w3, 4, 0, "3 bytes per id");
    expect_corrupt("count.tok", 16, n_more, 8, 0, "header says 65 ids");
    expect_corrupt("short.tok", 0, "Z", 1, ZT_TOKENS_HEADER_BYTES + 63, "header says 64 ids");
    expect_corrupt("vocab.tok", 24, vocab0, 4, 0, "vocabulary size 0");
    expect_corrupt("id.tok", ZT_TOKENS_HEADER_BYTES + 2 * 10, big_id, 2, 0, "id 64 at position 10");
    expect_corrupt("header.tok", 0, "Z", 1, 20, "shorter than its 32-byte header");
    /* a damaged magic was trained as text, the header's bytes as tokens */
    expect_corrupt("magic.tok", 7, "X", 1, 0, "damaged magic ('ZOTOKENX', expected 'ZOTOKENS')");
    expect_corrupt("magic2.tok", 0, "\x01\x02\x03", 3, 0, "damaged magic");
}

/* The order of every epoch is a permutation of the windows for window counts
 * around powers of 4 (the permutation's domain), different per epoch. */
static void test_order_is_a_permutation_of_any_size(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "sizes.txt");
    const int counts[] = {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 1000, 4097};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int W = counts[k], seq = 2;
        size_t bytes = (size_t)W * seq + 1;
        unsigned char *text = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            text[i] = (unsigned char)('a' + i % 26);
        write_file(path, text, bytes);
        free(text);
        zt_data *d = NULL;
        ZO_ASSERT_OK(zt_data_open(&d, path, seq, 0.0, 7));
        zt_data_info in;
        zt_data_get_info(d, &in);
        assert_int_equal(in.train_windows, (uint64_t)W);
        char *seen = calloc((size_t)W, 1);
        for (int epoch = 0; epoch < 2; epoch++) {
            memset(seen, 0, (size_t)W);
            for (int j = 0; j < W; j++) {
                int32_t x[2], y[2];
                zt_data_next_train(d, x, y, 1);
                /* windows alike in the text (w and w + 13) are interchangeable */
                int found = -1;
                for (int w = 0; w < W && found < 0; w++)
                    if (x[0] == 'a' + (w * seq) % 26 && x[1] == 'a' + (w * seq + 1) % 26 &&
                        !seen[w])
                        found = w;
                assert_true(found >= 0);
                seen[found] = 1;
            }
        }
        free(seen);
        zt_data_free(d);
    }
    unlink(path);
}

static int g_stop_calls, g_progress_calls;
static uint64_t g_progress_done, g_progress_total;

static int stop_after_a_second(void *ctx)
{
    if (g_stop_calls++ == 0)
        usleep(1100 * 1000); /* the next slice reports progress */
    return *(int *)ctx;
}

static void count_progress(void *ctx, uint64_t done, uint64_t total)
{
    g_progress_calls++;
    g_progress_done = done;
    g_progress_total = total;
}

/* The token file's id check reports progress and ends on a stop request
 * (a stop signal used to wait for the whole file). */
static void test_id_check_reports_progress_and_stops(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "hooks.tok");
    uint32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = (uint32_t)i;
    ZO_ASSERT_OK(zt_data_write_tokens(path, ids, 100, 2, 100));
    int stop = 0;
    zt_data_hooks h = {count_progress, stop_after_a_second, &stop};
    zt_data *d = NULL;
    ZO_ASSERT_OK(zt_data_open_with(&d, path, 4, 0.1, 1, &h));
    assert_int_equal(g_progress_calls, 1);
    assert_int_equal(g_progress_done, 100);
    assert_int_equal(g_progress_total, 100);
    zt_data_free(d);
    stop = 1;
    d = NULL;
    assert_int_equal(zt_data_open_with(&d, path, 4, 0.1, 1, &h), ZO_ERR_STATE);
    assert_null(d);
    assert_non_null(strstr(zt_last_error(), "stopped while checking its ids"));
    unlink(path);
}

static void test_too_short_or_missing(void **state)
{
    char path[300];
    path_in_dir(path, sizeof path, "short.txt");
    write_file(path, "hello world", 11);
    zt_data *d = NULL;
    assert_int_equal(zt_data_open(&d, path, 16, 0.05, 1), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "shorter --seq"));
    assert_int_equal(zt_data_open(&d, path, 4, 1.0, 1),
                     ZO_ERR_INVALID_ARG); /* fraction must be < 1 */
    unlink(path);
    assert_int_equal(zt_data_open(&d, path, 4, 0.05, 1), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zt_last_error(), path));
    path_in_dir(path, sizeof path, "empty.txt");
    write_file(path, "", 0);
    assert_int_equal(zt_data_open(&d, path, 4, 0.05, 1), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "empty"));
    unlink(path);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "%s/zt-data-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    return rmdir(g_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_windows_and_split),
        cmocka_unit_test(test_shuffle_is_a_seeded_permutation),
        cmocka_unit_test(test_uint16_token_file_round_trip),
        cmocka_unit_test(test_bad_token_files_are_refused),
        cmocka_unit_test(test_too_short_or_missing),
        cmocka_unit_test(test_order_is_a_permutation_of_any_size),
        cmocka_unit_test(test_id_check_reports_progress_and_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
