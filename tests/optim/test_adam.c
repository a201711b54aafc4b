/* The fused Adam/AdamW step and the gradient pass, every SIMD variant this
 * CPU runs, against a double-precision reference.
 *
 * Tolerance (fp32 results): |x - ref| <= 1e-6 * S + 1e-44, where S is the
 * sum of the magnitudes of the terms that make x (for m: |b1 m0| +
 * |(1-b1) g|; for v: |v|; for w: |w0 decay| + step_size * S_m / denom), i.e.
 * about 16 fp32 ulps of the largest term, so cancellation cannot hide an
 * error nor fail a correct result; 1e-44 covers subnormal flushes of
 * underflowing squares. bf16 moments add 2^-8 |ref| + 2^-133 (their
 * rounding). A reference inf or NaN must be matched exactly.
 * 16-bit weight copies must equal the conversion of the fp32 weight bit for
 * bit (fp32 copies the weight's own bits), and every variant must equal the scalar variant bit for
 * bit (the AVX512_BF16 instruction flushes fp32 subnormals to zero in bf16 stores: the one allowed
 * difference). */
#include "adam_ref.h"

static const zo_simd_level all_levels[] = {ZO_SIMD_SCALAR, ZO_SIMD_AVX2, ZO_SIMD_AVX512,
                                           ZO_SIMD_AVX512_BF16, ZO_SIMD_NEON};
#define NLEVELS ((int)(sizeof all_levels / sizeof *all_levels))

static int level_runs(zo_simd_level l)
{
    if (zo_cpu_simd_supported(l))
        return 1;
    print_message("  variant %s: skipped, this CPU (%s) cannot run it\n", zo_simd_level_name(l),
                  zo_simd_level_name(zo_cpu_simd_detected()));
    return 0;
}

/* Saved inputs, so each variant starts from the same data. */
typedef struct snapshot {
    void *grad, *master, *m, *v;
    size_t gbytes, sbytes, n;
} snapshot;

static snapshot snap_take(const adam_case *c)
{
    snapshot s = {NULL, NULL, NULL, NULL, c->n * zo_dtype_size(c->gt), c->n * zo_dtype_size(c->st),
                  c->n};
    s.grad = xcalloc(1, s.gbytes);
    s.master = xcalloc(c->n, 4);
    s.m = xcalloc(1, s.sbytes);
    s.v = xcalloc(1, s.sbytes);
    memcpy(s.grad, c->grad, s.gbytes);
    memcpy(s.master, c->master, c->n * 4);
    memcpy(s.m, c->m, s.sbytes);
    memcpy(s.v, c->v, s.sbytes);
    return s;
}

static void snap_restore(const snapshot *s, adam_case *c)
{
    memcpy(c->grad, s->grad, s->gbytes);
    memcpy(c->master, s->master, s->n * 4);
    memcpy(c->m, s->m, s->sbytes);
    memcpy(c->v, s->v, s->sbytes);
    if (c->out)
        memset(c->out, 0, s->n * zo_dtype_size(c->ot));
}

static void snap_free(snapshot *s)
{
    free(s->grad);
    free(s->master);
    free(s->m);
    free(s->v);
}

static void check_close(double got, double ref, double terms, double extra_rel, double atol,
                        const char *what, size_t i, const char *label)
{
    double tol = 1e-6 * terms + extra_rel * fabs(ref) + atol;
    int ok = isfinite(ref) ? fabs(got - ref) <= tol : isnan(ref) ? isnan(got) : got == ref;
    if (!ok)
        fail_msg("%s: %s[%zu] = %.9g, reference %.17g (|diff| %.3g > tol %.3g)", label, what, i,
                 got, ref, fabs(got - ref), tol);
}

/* 16-bit stores of the native-bf16 variant vs the scalar rounding. */
static int bf16_native_equiv(uint16_t native, uint16_t scalar)
{
    if (native == scalar)
        return 1;
    int tiny = (scalar & 0x7f80) == 0 || (scalar & 0x7fff) == 0x0080; /* from an fp32 subnormal */
    return tiny && native == (scalar & 0x8000);
}

static void check_out_matches_master(const adam_case *c, zo_simd_level l, const char *label)
{
    if (!c->out)
        return;
    if (c->ot == ZO_DTYPE_F32) { /* fp32 parameters: the master's own bits */
        for (size_t i = 0; i < c->n; i++)
            if (memcmp((const float *)c->out + i, c->master + i, 4) != 0)
                fail_msg("%s: out[%zu] = %a, master %a", label, i, ((const float *)c->out)[i],
                         c->master[i]);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        uint16_t o = ((const uint16_t *)c->out)[i];
        uint16_t want =
            c->ot == ZO_DTYPE_BF16 ? zo_f32_to_bf16(c->master[i]) : zo_f32_to_f16(c->master[i]);
        int ok = o == want ||
                 (l == ZO_SIMD_AVX512_BF16 && c->ot == ZO_DTYPE_BF16 && bf16_native_equiv(o, want));
        if (!ok)
            fail_msg("%s: out[%zu] = 0x%04x, conversion of master %a is 0x%04x", label, i, o,
                     c->master[i], want);
    }
}

/* Compares a case against the reference; `before` holds the inputs. */
static void check_against_reference(const adam_case *c, const snapshot *before,
                                    const zo_adam_params *p, zo_simd_level l, const char *label)
{
    double b1 = p->beta1, lr = p->lr, wd = p->weight_decay;
    double bc1 = p->bias_correction ? 1.0 - pow(b1, (double)p->step) : 1.0;
    double bc2 = p->bias_correction ? 1.0 - pow(p->beta2, (double)p->step) : 1.0;
    double decay = p->adamw ? 1.0 - lr * wd : 1.0;
    /* bf16 moments: their rounding, and one bf16 subnormal step (2^-133). */
    double extra = c->st == ZO_DTYPE_BF16 ? 0x1p-8 : 0.0,
           atol = c->st == ZO_DTYPE_BF16 ? 0x1p-133 : 1e-44;
    for (size_t i = 0; i < c->n; i++) {
        double w0 = ((const float *)before->master)[i];
        double m0 = ref_load(before->m, c->st, i),
               g = ref_load(before->grad, c->gt, i) * (double)p->grad_scale;
        int l2 = !p->adamw && wd != 0.0; /* as the reference: no 0 * w */
        if (l2)
            g += wd * w0;
        double sm = fabs(b1 * m0) + fabs((1.0 - b1) * g) + (l2 ? fabs(wd * w0) : 0.0);
        double denom = sqrt(c->rv[i]) / sqrt(bc2) + (double)p->eps;
        double sw = fabs(w0 * decay) + lr / bc1 * sm / denom;
        check_close(ref_load(c->m, c->st, i), c->rm[i], sm, extra, atol, "m", i, label);
        check_close(ref_load(c->v, c->st, i), c->rv[i], fabs(c->rv[i]), extra, atol, "v", i, label);
        check_close(c->master[i], c->rp[i], sw, 0.0, 1e-44, "master", i, label);
    }
    check_out_matches_master(c, l, label);
}

static void assert_bitwise(const void *a, const void *b, size_t n, size_t esize, int native_bf16,
                           const char *what, const char *label)
{
    for (size_t i = 0; i < n; i++) {
        if (esize == 4) {
            uint32_t x, y;
            memcpy(&x, (const char *)a + 4 * i, 4);
            memcpy(&y, (const char *)b + 4 * i, 4);
            if (x != y)
                fail_msg("%s: %s[%zu] 0x%08x differs from scalar 0x%08x", label, what, i, x, y);
        } else {
            uint16_t x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
            if (x != y && !(native_bf16 && bf16_native_equiv(x, y)))
                fail_msg("%s: %s[%zu] 0x%04x differs from scalar 0x%04x", label, what, i, x, y);
        }
    }
}

typedef struct results {
    float *master;
    void *m, *v, *out;
} results;

static results results_copy(const adam_case *c)
{
    size_t sb = c->n * zo_dtype_size(c->st);
    size_t ob = c->out ? c->n * zo_dtype_size(c->ot) : 0;
    results r = {xcalloc(c->n, 4), xcalloc(1, sb), xcalloc(1, sb), c->out ? xcalloc(1, ob) : NULL};
    memcpy(r.master, c->master, c->n * 4);
    memcpy(r.m, c->m, sb);
    memcpy(r.v, c->v, sb);
    if (c->out)
        memcpy(r.out, c->out, ob);
    return r;
}

static void results_free(results *r)
{
    free(r->master);
    free(r->m);
    free(r->v);
    free(r->out);
}

static void compare_to_scalar(const adam_case *c, const results *scalar, zo_simd_level l,
                              const char *label)
{
    int native = l == ZO_SIMD_AVX512_BF16;
    size_t ss = zo_dtype_size(c->st);
    assert_bitwise(c->master, scalar->master, c->n, 4, 0, "master", label);
    assert_bitwise(c->m, scalar->m, c->n, ss, native, "m", label);
    assert_bitwise(c->v, scalar->v, c->n, ss, native, "v", label);
    if (c->out)
        assert_bitwise(c->out, scalar->out, c->n, zo_dtype_size(c->ot),
                       native && c->ot == ZO_DTYPE_BF16, "out", label);
}

static void run_one_config(zo_dtype gt, zo_dtype st, zo_dtype ot, int adamw, uint64_t seed)
{
    adam_case c;
    size_t n = 1037; /* not a multiple of any vector width: the tails run too */
    case_alloc(&c, n, gt, st, ot);
    uint64_t s = seed;
    case_fill_grads(&c, &s);
    case_fill_state(&c, &s);
    snapshot before = snap_take(&c);
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 1e-3f;
    p.weight_decay = 0.01f;
    p.adamw = adamw;
    p.step = 3;
    p.grad_scale = 1.0f / 1024.0f;
    ref_adam_step(&c, &p);
    results scalar = {0};
    for (int k = 0; k < NLEVELS; k++) {
        zo_simd_level l = all_levels[k];
        if (!zo_cpu_simd_supported(l))
            continue;
        char label[160];
        snprintf(label, sizeof label, "%s grad %s state %s out %s %s", zo_simd_level_name(l),
                 zo_dtype_name(gt), zo_dtype_name(st), zo_dtype_name(ot), adamw ? "adamw" : "adam");
        snap_restore(&before, &c);
        p.simd_level = (int)l;
        ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
        check_against_reference(&c, &before, &p, l, label);
        if (l == ZO_SIMD_SCALAR)
            scalar = results_copy(&c);
        else
            compare_to_scalar(&c, &scalar, l, label);
    }
    results_free(&scalar);
    snap_free(&before);
    case_free(&c);
}

static void test_every_variant_and_precision(void **state)
{
    for (int k = 0; k < NLEVELS; k++)
        level_runs(all_levels[k]);
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    static const zo_dtype sts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16};
    static const zo_dtype ots[] = {ZO_DTYPE_NONE, ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    uint64_t seed = 100;
    for (int g = 0; g < 3; g++)
        for (int s = 0; s < 2; s++)
            for (int o = 0; o < 4; o++)
                for (int w = 0; w < 2; w++)
                    run_one_config(gts[g], sts[s], ots[o], w, seed++);
}

/* No bias correction, no decay, betas and eps 0: the update is lr * g/|g|. */
static void test_plain_settings(void **state)
{
    adam_case c;
    case_alloc(&c, 100, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    uint64_t s = 7;
    for (size_t i = 0; i < c.n; i++) {
        ((float *)c.grad)[i] = (float)((rand_unit(&s) + 0.5) * (i & 1 ? 1 : -1));
        c.master[i] = 1.0f;
    }
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.bias_correction = 0;
    p.beta1 = 0.0f;
    p.beta2 = 0.0f;
    p.eps = 0.0f;
    ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
    for (size_t i = 0; i < c.n; i++) {
        /* g / sqrt(g^2) is exactly +-1, and the fma rounds once. */
        float want = ((float *)c.grad)[i] > 0 ? 1.0f - 1e-3f : 1.0f + 1e-3f;
        assert_true(c.master[i] == want);
    }
    case_free(&c);
}

static void put_nonfinite(adam_case *c, size_t i, int which)
{
    static const float vals[3] = {INFINITY, -INFINITY, NAN};
    case_store(c->grad, c->gt, i, vals[which % 3]);
}

static void test_nonfinite_gradients(void **state)
{
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    for (int g = 0; g < 3; g++) {
        adam_case c;
        case_alloc(&c, 999, gts[g], ZO_DTYPE_F32, ZO_DTYPE_BF16);
        uint64_t s = 11 + (uint64_t)g;
        case_fill_grads(&c, &s);
        case_fill_state(&c, &s);
        static const size_t bad[] = {0, 17, 500, 998};
        for (size_t k = 0; k < 4; k++)
            put_nonfinite(&c, bad[k], (int)k);
        snapshot before = snap_take(&c);
        zo_adam_params p = ZO_ADAM_PARAMS_INIT;
        p.adamw = 1;
        p.weight_decay = 0.1f;
        ref_adam_step(&c, &p);
        for (int k = 0; k < NLEVELS; k++) {
            zo_simd_level l = all_levels[k];
            if (!zo_cpu_simd_supported(l))
                continue;
            zo_grad_stats st;
            ZO_ASSERT_OK(zo_grad_stats_compute(c.grad, c.gt, c.n, (int)l, &st));
            assert_int_equal(st.nonfinite, 1);
            snap_restore(&before, &c);
            p.simd_level = (int)l;
            ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
            for (size_t j = 0; j < 4; j++) {
                assert_true(isnan(c.master[bad[j]]));
                assert_true(isnan(zo_bf16_to_f32(((uint16_t *)c.out)[bad[j]])));
            }
            check_against_reference(&c, &before, &p, l, zo_simd_level_name(l));
        }
        snap_free(&before);
        case_free(&c);
    }
}

/* An infinite master weight (a diverged run, or one set by hand), every
 * level, fp32 and bf16 moments: AdamW and Adam without weight decay keep
 * it infinite and its moments finite, as PyTorch and the reference do (no
 * 0 * inf); Adam with an L2 term makes it NaN (its moments inf, inf/inf).
 * The other elements are updated as usual. */
static void test_infinite_master_weight(void **state)
{
    static const zo_dtype sts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16};
    static const struct {
        int adamw;
        float wd;
    } modes[] = {{1, 0.1f}, {1, 0.0f}, {0, 0.0f}, {0, 0.1f}};
    static const size_t bad[] = {0, 17, 500, 998};
    for (int si = 0; si < 2; si++)
        for (int mi = 0; mi < 4; mi++) {
            adam_case c;
            case_alloc(&c, 999, ZO_DTYPE_F32, sts[si], ZO_DTYPE_BF16);
            uint64_t s = 21 + (uint64_t)(si * 4 + mi);
            case_fill_grads(&c, &s);
            case_fill_state(&c, &s);
            for (size_t k = 0; k < 4; k++)
                c.master[bad[k]] = c.rp[bad[k]] = k & 1 ? -INFINITY : INFINITY;
            snapshot before = snap_take(&c);
            zo_adam_params p = ZO_ADAM_PARAMS_INIT;
            p.adamw = modes[mi].adamw;
            p.weight_decay = modes[mi].wd;
            ref_adam_step(&c, &p);
            int l2 = !p.adamw && p.weight_decay != 0.0f;
            for (int k = 0; k < NLEVELS; k++) {
                zo_simd_level l = all_levels[k];
                if (!zo_cpu_simd_supported(l))
                    continue;
                char label[96];
                snprintf(label, sizeof label, "%s state %s %s wd %g", zo_simd_level_name(l),
                         zo_dtype_name(sts[si]), p.adamw ? "adamw" : "adam", p.weight_decay);
                snap_restore(&before, &c);
                p.simd_level = (int)l;
                ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
                for (size_t j = 0; j < 4; j++) {
                    float w = c.master[bad[j]];
                    if (l2 ? !isnan(w) : w != c.rp[bad[j]])
                        fail_msg("%s: master[%zu] = %g, want %s", label, bad[j], w,
                                 l2      ? "NaN"
                                 : j & 1 ? "-inf"
                                         : "inf");
                    assert_true(l2 || isfinite(ref_load(c.m, c.st, bad[j])));
                    assert_true(l2 || isfinite(ref_load(c.v, c.st, bad[j])));
                }
                check_against_reference(&c, &before, &p, l, label);
            }
            snap_free(&before);
            case_free(&c);
        }
}

static void test_grad_stats(void **state)
{
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    for (int g = 0; g < 3; g++) {
        adam_case c;
        case_alloc(&c, 4099, gts[g], ZO_DTYPE_F32, ZO_DTYPE_NONE);
        uint64_t s = 21 + (uint64_t)g;
        case_fill_grads(&c, &s);
        /* The reference sum in long double, in index order. */
        long double ref = 0;
        for (size_t i = 0; i < c.n; i++)
            ref += (long double)ref_load(c.grad, c.gt, i) * ref_load(c.grad, c.gt, i);
        for (int k = 0; k < NLEVELS; k++) {
            zo_simd_level l = all_levels[k];
            if (!zo_cpu_simd_supported(l))
                continue;
            zo_grad_stats st = {-1, -1};
            ZO_ASSERT_OK(zo_grad_stats_compute(c.grad, c.gt, c.n, (int)l, &st));
            assert_int_equal(st.nonfinite, 0);
            if (!(fabsl(st.sum_sq - ref) <= 1e-13L * ref))
                fail_msg("%s %s: sum_sq %.17g, reference %.17Lg", zo_simd_level_name(l),
                         zo_dtype_name(c.gt), st.sum_sq, ref);
            /* Prefixes of every length up to a few vectors: each tail path. */
            for (size_t len = 0; len < 70; len++) {
                long double r = 0;
                for (size_t i = 0; i < len; i++)
                    r += (long double)ref_load(c.grad, c.gt, i) * ref_load(c.grad, c.gt, i);
                ZO_ASSERT_OK(zo_grad_stats_compute(c.grad, c.gt, len, (int)l, &st));
                assert_true(fabsl(st.sum_sq - r) <= 1e-13L * r);
            }
        }
        case_free(&c);
    }
}

/* Many steps in a row follow the double trajectory (bias correction and
 * step counts included): |w - w_ref| <= 1e-5 * (|w_ref| + lr * t) at every
 * step of 300 (the drift measured here is about 2e-6). */
#define TRAJECTORY_TOL 1e-5
static void run_trajectory(zo_dtype gt, zo_dtype ot, int adamw, zo_simd_level l)
{
    adam_case c;
    case_alloc(&c, 515, gt, ZO_DTYPE_F32, ot);
    uint64_t s = 31;
    for (size_t i = 0; i < c.n; i++) {
        c.master[i] = (float)(rand_unit(&s) - 0.5);
        c.rp[i] = c.master[i];
    }
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 1e-2f;
    p.weight_decay = 0.05f;
    p.adamw = adamw;
    p.simd_level = (int)l;
    p.grad_scale = 0.5f;
    int steps = 300;
    double drift = 0;
    for (int t = 1; t <= steps; t++) {
        for (size_t i = 0; i < c.n; i++)
            case_store(c.grad, gt, i, (float)((rand_unit(&s) - 0.3) * 0.01));
        p.step = t;
        ref_adam_step(&c, &p);
        ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
        double worst = 0;
        for (size_t i = 0; i < c.n; i++) {
            double err = fabs(c.master[i] - c.rp[i]) / (fabs(c.rp[i]) + p.lr * t);
            worst = err > worst ? err : worst;
        }
        if (!(worst <= TRAJECTORY_TOL))
            fail_msg("%s grad %s: step %d drifted %.3g from the reference", zo_simd_level_name(l),
                     zo_dtype_name(gt), t, worst);
        drift = worst > drift ? worst : drift;
    }
    print_message("  %s grad %s out %s %s: largest drift over %d steps %.3g (bound %.0e)\n",
                  zo_simd_level_name(l), zo_dtype_name(gt), zo_dtype_name(ot),
                  adamw ? "adamw" : "adam", steps, drift, TRAJECTORY_TOL);
    check_out_matches_master(&c, l, "trajectory");
    case_free(&c);
}

static void test_trajectory(void **state)
{
    for (int k = 0; k < NLEVELS; k++) {
        zo_simd_level l = all_levels[k];
        if (!zo_cpu_simd_supported(l))
            continue;
        run_trajectory(ZO_DTYPE_F32, ZO_DTYPE_NONE, 1, l);
        run_trajectory(ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, l);
        run_trajectory(ZO_DTYPE_F16, ZO_DTYPE_F16, 0, l);
    }
}

static void test_invalid_arguments(void **state)
{
    adam_case c;
    case_alloc(&c, 64, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    ZO_ASSERT_OK(zo_adam_step(&p, &c.b));
    zo_adam_params q = p;
    q.lr = -1;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_INVALID_ARG);
    q = p;
    q.beta1 = 1.0f;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_INVALID_ARG);
    q = p;
    q.step = 0;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_INVALID_ARG);
    q = p;
    q.grad_scale = INFINITY;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_INVALID_ARG);
    q = p;
    q.struct_size = 0;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_adam_step(NULL, &c.b), ZO_ERR_INVALID_ARG);
    q = p;
    q.simd_level = zo_cpu_simd_detected() == ZO_SIMD_NEON ? ZO_SIMD_AVX2 : ZO_SIMD_NEON;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_UNSUPPORTED);
    q.simd_level = 99;
    ZO_ASSERT_ST(zo_adam_step(&q, &c.b), ZO_ERR_UNSUPPORTED);

    zo_adam_buffers b = c.b;
    b.master = NULL;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    assert_true(strstr(zo_last_error(), "master") != NULL);
    b = c.b;
    b.m = (char *)c.m + 1;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    assert_true(strstr(zo_last_error(), "aligned") != NULL);
    b = c.b;
    b.out_type = ZO_DTYPE_NONE;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    b = c.b;
    b.out_type = ZO_DTYPE_I8;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    assert_true(strstr(zo_last_error(), "out type") != NULL);
    b = c.b;
    b.state_type = ZO_DTYPE_F16;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    b = c.b;
    b.grad_type = ZO_DTYPE_NONE;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    b = c.b;
    b.struct_size = 1;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_adam_roofline(&b, -1), ZO_ERR_INVALID_ARG);
    zo_grad_stats st;
    ZO_ASSERT_ST(zo_grad_stats_compute(NULL, ZO_DTYPE_F32, 4, -1, &st), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_grad_stats_compute(c.grad, ZO_DTYPE_F32, 4, -1, NULL), ZO_ERR_INVALID_ARG);
    /* Zero elements is valid and touches nothing. */
    b = c.b;
    b.n = 0;
    ZO_ASSERT_OK(zo_adam_step(&p, &b));
    case_free(&c);
}

/* The roofline kernel changes no state and copies gradient bits to out. */
static void test_roofline_moves_bits(void **state)
{
    adam_case c;
    case_alloc(&c, 1031, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    uint64_t s = 41;
    case_fill_grads(&c, &s);
    case_fill_state(&c, &s);
    snapshot before = snap_take(&c);
    for (int k = 0; k < NLEVELS; k++) {
        if (!zo_cpu_simd_supported(all_levels[k]))
            continue;
        snap_restore(&before, &c);
        ZO_ASSERT_OK(zo_adam_roofline(&c.b, (int)all_levels[k]));
        assert_memory_equal(c.master, before.master, c.n * 4);
        assert_memory_equal(c.m, before.m, before.sbytes);
        assert_memory_equal(c.out, c.grad, c.n * 2);
    }
    snap_free(&before);
    case_free(&c);
    /* fp32 parameters: out gets the master's bits */
    static const zo_dtype sts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16};
    for (int si = 0; si < 2; si++) {
        case_alloc(&c, 1031, ZO_DTYPE_BF16, sts[si], ZO_DTYPE_F32);
        uint64_t seed = 43;
        case_fill_grads(&c, &seed);
        case_fill_state(&c, &seed);
        for (int k = 0; k < NLEVELS; k++) {
            if (!zo_cpu_simd_supported(all_levels[k]))
                continue;
            memset(c.out, 0, c.n * 4);
            ZO_ASSERT_OK(zo_adam_roofline(&c.b, (int)all_levels[k]));
            assert_memory_equal(c.out, c.master, c.n * 4);
        }
        case_free(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_variant_and_precision),
        cmocka_unit_test(test_plain_settings),
        cmocka_unit_test(test_nonfinite_gradients),
        cmocka_unit_test(test_infinite_master_weight),
        cmocka_unit_test(test_grad_stats),
        cmocka_unit_test(test_trajectory),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_roofline_moves_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
