/* The split master's claim (zo_master_split, zo/half.h): for every fp32
 * pattern but a NaN, the bf16 rounding p is the high half hi or hi + 1, so
 * the low half and one bit rebuild the value; checked with zo_f32_to_bf16
 * and with the 16-bit values the Adam kernels write (a step with lr 0 leaves
 * the master as it was and rounds it), at every SIMD level this CPU runs.
 * `all` covers the 2^32 patterns (label slow); without it, every 4099th
 * pattern and every pattern whose high half is an edge: zero, the smallest
 * normals, the largest finite values, the infinities and NaNs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/cpu.h"
#include "zo/half.h"
#include "zo/optim.h"
#include "zo_test.h"

#define BATCH ((size_t)1 << 22)

static int all_patterns;

static int is_nan(uint32_t u)
{
    return (u & 0x7fffffffu) > 0x7f800000u;
}

typedef struct batch {
    float *master, *m, *v;
    uint16_t *grad, *out;
    size_t n;
    uint64_t splits, nans, flushed; /* elements split; NaNs and flushed subnormals refused */
} batch;

/* Every element split against p and joined back: the value, bit for bit;
 * a refusal only for a NaN, or a subnormal the kernel flushed to zero. */
static void check_split(batch *b, const uint32_t *u, const uint16_t *p)
{
    for (size_t i = 0; i < b->n; i++) {
        uint16_t lo;
        unsigned up;
        if (zo_master_split(u[i], p[i], &lo, &up)) {
            if (zo_master_join(p[i], lo, up) != u[i])
                fail_msg("0x%08x: joined back as 0x%08x", u[i], zo_master_join(p[i], lo, up));
            b->splits++;
        } else if (is_nan(u[i])) {
            b->nans++;
        } else if ((u[i] & 0x7f800000u) == 0 && (p[i] & 0x7fffu) == 0) {
            b->flushed++;
        } else {
            fail_msg("0x%08x rounded to 0x%04x: neither the high half nor one above", u[i], p[i]);
        }
    }
}

/* The scalar reference (zo_f32_to_bf16, the same at every level: checked at
 * level 0 only), then the kernel's rounding at this level. */
static void run_batch(batch *b, int level)
{
    if (level == ZO_SIMD_SCALAR) {
        uint16_t *ref = b->out;
        for (size_t i = 0; i < b->n; i++)
            ref[i] = zo_f32_to_bf16(b->master[i]);
        check_split(b, (const uint32_t *)(void *)b->master, ref);
    }
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 0.0f;
    p.weight_decay = 0.0f;
    p.simd_level = level;
    zo_adam_buffers bu = ZO_ADAM_BUFFERS_INIT;
    bu.n = b->n;
    bu.grad = b->grad;
    bu.grad_type = ZO_DTYPE_BF16;
    bu.master = b->master;
    bu.m = b->m;
    bu.v = b->v;
    bu.out = b->out;
    bu.out_type = ZO_DTYPE_BF16;
    memset(b->m, 0, b->n * 4);
    memset(b->v, 0, b->n * 4);
    ZO_ASSERT_OK(zo_adam_step(&p, &bu));
    check_split(b, (const uint32_t *)(void *)b->master, b->out); /* a signalling NaN is quieted */
}

/* Patterns [first, first + n * stride) by stride into the batch. */
static void fill(batch *b, uint64_t first, uint64_t stride, size_t n)
{
    uint32_t *u = (uint32_t *)(void *)b->master;
    for (size_t i = 0; i < n; i++)
        u[i] = (uint32_t)(first + i * stride);
    b->n = n;
}

static void cover(batch *b, int level)
{
    if (all_patterns) {
        for (uint64_t first = 0; first < (1ull << 32); first += BATCH) {
            fill(b, first, 1, BATCH);
            run_batch(b, level);
        }
        return;
    }
    fill(b, 0, 4099, (size_t)((1ull << 32) / 4099));
    run_batch(b, level);
    static const uint32_t edges[] = {0x0000, 0x0080, 0x7f7f, 0x7f80, 0x7fc0, 0xff7f, 0xff80};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (uint32_t s = 0; s < 2; s++) {
            uint64_t hi = (edges[e] | (s << 15)) & 0xffffu;
            uint64_t lo_hi = hi > 0 ? hi - 1 : hi;
            fill(b, lo_hi << 16, 1, 3u << 16 > BATCH ? BATCH : 3u << 16);
            run_batch(b, level);
        }
}

static void test_split_every_rounding(void **state)
{
    (void)state;
    batch b = {0};
    size_t cap = BATCH > (1ull << 32) / 4099 ? BATCH : (size_t)((1ull << 32) / 4099);
    b.master = malloc(cap * 4);
    b.m = malloc(cap * 4);
    b.v = malloc(cap * 4);
    b.grad = calloc(cap, 2);
    b.out = malloc(cap * 2);
    assert_non_null(b.master && b.m && b.v && b.grad && b.out);
    int top = zo_cpu_simd_detected();
    for (int level = 0; level <= top; level++) {
        if (level == ZO_SIMD_NEON && top != ZO_SIMD_NEON)
            continue;
        batch c = b;
        cover(&c, level);
        /* NaNs refused by the scalar rounding (the kernels' quieted ones may split) */
        assert_true(c.splits > 0 && (level != ZO_SIMD_SCALAR || c.nans > 0));
        if (level != ZO_SIMD_AVX512_BF16) /* the others keep subnormals */
            assert_int_equal(c.flushed, 0);
        if (all_patterns)
            printf("level %d: %llu split, %llu NaN, %llu flushed%s\n", level,
                   (unsigned long long)c.splits, (unsigned long long)c.nans,
                   (unsigned long long)c.flushed,
                   level == ZO_SIMD_SCALAR ? " (scalar and kernel roundings)" : " (the kernel's)");
    }
    free(b.master);
    free(b.m);
    free(b.v);
    free(b.grad);
    free(b.out);
}

int main(int argc, char **argv)
{
    all_patterns = argc > 1 && strcmp(argv[1], "all") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_every_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
