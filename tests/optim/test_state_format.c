/* Adam's moment formats as a table (zo_state_format, zo/optim.h): names and
 * dtypes found both ways and unknown ones refused; each format's bytes,
 * scales, fp32 room and small-tensor rule equal to the int8-specific
 * formulas they replaced (zo_adam_q8_*); each codec equal to the conversions
 * it stands for (bf16 rounding, zo_adam_q8_quantize/dequantize) bit for bit;
 * and the step through a format's codec and the fp32 kernel (the way a
 * format without a kernel of its own is updated) equal to the fused kernels
 * bit for bit, for every format of the table, partial last blocks
 * included. */
#include "adam_ref.h"
#include "zo/optim_testing.h"

static const size_t sizes[] = {1, 3, 255, 256, 257, 1000, 4095, 4096, 70001};
#define NSIZES (sizeof sizes / sizeof *sizes)

static void test_names_and_dtypes_both_ways(void **state)
{
    (void)state;
    size_t n = 0;
    for (const zo_state_format *f; (f = zo_state_format_at(n)) != NULL; n++) {
        assert_ptr_equal(zo_state_format_named(f->name), f);
        assert_ptr_equal(zo_state_format_of(f->dtype), f);
        assert_true(f->moment_bytes && f->encode && f->decode && f->summary);
    }
    assert_int_equal(n, 3);
    assert_null(zo_state_format_named("int4"));
    assert_null(zo_state_format_named(NULL));
    assert_null(zo_state_format_of(ZO_DTYPE_F16));
    char names[64];
    assert_int_equal(zo_state_format_names(names, sizeof names, ", "), strlen("fp32, bf16, int8"));
    assert_string_equal(names, "fp32, bf16, int8");
    char small[6]; /* snprintf's contract: cut, terminated, the length it needs returned */
    assert_int_equal(zo_state_format_names(small, sizeof small, "|"), strlen("fp32|bf16|int8"));
    assert_string_equal(small, "fp32|");
}

/* The formulas of before the table, written out. */
static void test_sizes_equal_the_int8_formulas(void **state)
{
    (void)state;
    const zo_state_format *f32 = zo_state_format_of(ZO_DTYPE_F32),
                          *bf = zo_state_format_of(ZO_DTYPE_BF16),
                          *q8 = zo_state_format_of(ZO_DTYPE_I8);
    static char moment[4 * 70001 + 4096];
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_F32, n), 4 * n);
        assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_BF16, n), 2 * n);
        assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_I8, n),
                         ((n + 3) & ~(size_t)3) + 4 * zo_adam_q8_blocks(n));
        assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_F16, n), 0);
        assert_ptr_equal(zo_state_format_scales(q8, moment, n), zo_adam_q8_scales(moment, n));
        assert_null(zo_state_format_scales(f32, moment, n));
        assert_null(zo_state_format_scales(bf, moment, n));
        assert_int_equal(zo_state_format_f32_room(q8, n), zo_adam_q8_small_room(n));
        assert_int_equal(zo_state_format_code_bytes(q8, n), n);
        assert_int_equal(zo_state_format_code_bytes(bf, n), 2 * n);
        for (int keep = 0; keep < 2; keep++) {
            assert_int_equal(zo_state_format_keeps_f32(q8, n, keep), zo_adam_q8_small(n) || keep);
            assert_false(zo_state_format_keeps_f32(f32, n, keep));
            assert_false(zo_state_format_keeps_f32(bf, n, keep));
        }
    }
}

static void fill_moment(float *x, size_t n, int is_signed, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        float r = (float)rand() / (float)RAND_MAX;
        x[i] = (is_signed ? 2.0f * r - 1.0f : r) * ldexpf(1.0f, (int)(i % 17) - 12);
    }
}

static void test_codecs_equal_the_conversions(void **state)
{
    (void)state;
    size_t n = 70001, nb = zo_adam_q8_blocks(n);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    uint8_t *c1 = malloc(4 * n), *c2 = malloc(4 * n);
    float *s1 = malloc(nb * sizeof *s1), *s2 = malloc(nb * sizeof *s2);
    assert_true(x && y && z && c1 && c2 && s1 && s2);
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        fill_moment(x, n, is_signed, 7u + (unsigned)is_signed);
        const zo_state_format *q8 = zo_state_format_of(ZO_DTYPE_I8);
        ZO_ASSERT_OK(q8->encode(x, n, is_signed, c1, s1));
        ZO_ASSERT_OK(zo_adam_q8_quantize(x, n, is_signed, c2, s2));
        assert_memory_equal(c1, c2, n);
        assert_memory_equal(s1, s2, nb * sizeof *s1);
        ZO_ASSERT_OK(q8->decode(c1, s1, n, is_signed, y));
        ZO_ASSERT_OK(zo_adam_q8_dequantize(c2, s2, n, is_signed, z));
        assert_memory_equal(y, z, n * sizeof *y);
        const zo_state_format *bf = zo_state_format_of(ZO_DTYPE_BF16);
        ZO_ASSERT_OK(bf->encode(x, n, is_signed, c1, NULL));
        for (size_t i = 0; i < n; i++)
            assert_int_equal(((uint16_t *)c1)[i], zo_f32_to_bf16(x[i]));
        ZO_ASSERT_OK(bf->decode(c1, NULL, n, is_signed, y));
        for (size_t i = 0; i < n; i++)
            assert_true(y[i] == zo_bf16_to_f32(((uint16_t *)c1)[i]));
        const zo_state_format *f32 = zo_state_format_of(ZO_DTYPE_F32);
        ZO_ASSERT_OK(f32->encode(x, n, is_signed, c1, NULL));
        ZO_ASSERT_OK(f32->decode(c1, NULL, n, is_signed, y));
        assert_memory_equal(x, y, n * sizeof *x);
    }
    free(x), free(y), free(z), free(c1), free(c2), free(s1), free(s2);
}

/* One problem's buffers in format st: the moments encoded from fp32 values
 * of Adam's range, with their scales when the format has them. */
typedef struct problem {
    size_t n;
    float *master, *mscale, *vscale;
    void *grad, *m, *v, *out;
} problem;

static void problem_make(problem *p, const zo_state_format *f, size_t n, unsigned seed)
{
    size_t nb = f->block ? (n + f->block - 1) / f->block : 0;
    p->n = n;
    p->master = malloc(n * sizeof(float));
    p->grad = malloc(n * sizeof(uint16_t));
    p->out = malloc(n * sizeof(uint16_t));
    p->m = malloc(f->moment_bytes(n));
    p->v = malloc(f->moment_bytes(n));
    p->mscale = nb ? malloc(nb * sizeof(float)) : NULL;
    p->vscale = nb ? malloc(nb * sizeof(float)) : NULL;
    float *tmp = malloc(n * sizeof(float));
    assert_true(p->master && p->grad && p->out && p->m && p->v && tmp &&
                (!nb || (p->mscale && p->vscale)));
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        p->master[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        ((uint16_t *)p->grad)[i] = zo_f32_to_bf16(((float)rand() / (float)RAND_MAX - 0.5f) * 0.01f);
    }
    fill_moment(tmp, n, 1, seed + 1);
    ZO_ASSERT_OK(f->encode(tmp, n, 1, p->m, p->mscale));
    fill_moment(tmp, n, 0, seed + 2);
    for (size_t i = 0; i < n; i++)
        tmp[i] *= tmp[i]; /* v: squares */
    ZO_ASSERT_OK(f->encode(tmp, n, 0, p->v, p->vscale));
    memset(p->out, 0, n * sizeof(uint16_t));
    free(tmp);
}

static problem problem_copy(const problem *a, const zo_state_format *f)
{
    size_t n = a->n, nb = f->block ? (n + f->block - 1) / f->block : 0;
    problem p = {n,
                 malloc(n * 4),
                 nb ? malloc(nb * 4) : NULL,
                 nb ? malloc(nb * 4) : NULL,
                 malloc(n * 2),
                 malloc(f->moment_bytes(n)),
                 malloc(f->moment_bytes(n)),
                 malloc(n * 2)};
    memcpy(p.master, a->master, n * 4);
    memcpy(p.grad, a->grad, n * 2);
    memcpy(p.out, a->out, n * 2);
    memcpy(p.m, a->m, f->moment_bytes(n));
    memcpy(p.v, a->v, f->moment_bytes(n));
    if (nb) {
        memcpy(p.mscale, a->mscale, nb * 4);
        memcpy(p.vscale, a->vscale, nb * 4);
    }
    return p;
}

static void problem_free(problem *p)
{
    free(p->master), free(p->grad), free(p->out), free(p->m), free(p->v), free(p->mscale),
        free(p->vscale);
}

static zo_adam_buffers buffers_of(const problem *p, const zo_state_format *f)
{
    zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
    b.n = p->n;
    b.grad = p->grad;
    b.grad_type = ZO_DTYPE_BF16;
    b.master = p->master;
    b.m = p->m;
    b.v = p->v;
    b.state_type = f->dtype;
    b.m_absmax = p->mscale;
    b.v_absmax = p->vscale;
    b.out = p->out;
    b.out_type = ZO_DTYPE_BF16;
    return b;
}

/* One format at one SIMD level, every size. */
static void step_both_ways(const zo_state_format *f, int level)
{
    for (size_t s = 0; s < NSIZES; s++) {
        problem a, b;
        problem_make(&a, f, sizes[s], 100u + (unsigned)s);
        b = problem_copy(&a, f);
        zo_adam_params p = ZO_ADAM_PARAMS_INIT;
        p.lr = 1e-3f;
        p.weight_decay = 0.01f;
        p.step = 3;
        p.simd_level = level;
        zo_adam_buffers ba = buffers_of(&a, f), bb = buffers_of(&b, f);
        ZO_ASSERT_OK(zo_adam_step(&p, &ba));
        ZO_ASSERT_OK(zo_test_adam_step_unfused(&p, &bb));
        size_t n = sizes[s], nb = f->block ? (n + f->block - 1) / f->block : 0;
        if (memcmp(a.master, b.master, n * 4) || memcmp(a.out, b.out, n * 2) ||
            memcmp(a.m, b.m, zo_state_format_code_bytes(f, n)) ||
            memcmp(a.v, b.v, zo_state_format_code_bytes(f, n)) ||
            (nb && (memcmp(a.mscale, b.mscale, nb * 4) || memcmp(a.vscale, b.vscale, nb * 4))))
            fail_msg("format %s, %zu elements, SIMD level %d: the step through the codec "
                     "differs from the fused kernel's",
                     f->name, n, level);
        problem_free(&a);
        problem_free(&b);
    }
}

static void test_step_through_codec_equals_fused_kernel(void **state)
{
    (void)state;
    const int levels[2] = {ZO_SIMD_SCALAR, -1}; /* -1: this CPU's, the library's choice */
    for (size_t i = 0; zo_state_format_at(i); i++)
        for (int l = 0; l < 2; l++)
            step_both_ways(zo_state_format_at(i), levels[l]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_dtypes_both_ways),
        cmocka_unit_test(test_sizes_equal_the_int8_formulas),
        cmocka_unit_test(test_codecs_equal_the_conversions),
        cmocka_unit_test(test_step_through_codec_equals_fused_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
