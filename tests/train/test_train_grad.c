/* zo-train's model: the whole-model gradient against finite differences.
 *
 * The model runs in fp32 on the cpu device with device-resident parameters
 * (no engine: the engine's parameters are 16-bit). The reference is this
 * file's own double-precision implementation of the same model (embedding,
 * RMSNorm, RoPE, causal attention, SwiGLU, final norm, head, cross-entropy),
 * written from the math, not from the ops: its loss must match the fp32
 * model's, and central differences of its loss (h = 1e-5 |w| + 1e-6, error
 * ~1e-9 relative) are the gradient reference. Tolerance: every sampled
 * gradient entry g of a tensor satisfies |g - ref| <= 1e-4 * max(|ref|,
 * rms(tensor's gradient)) + 1e-7 — fp32 forward/backward through ~40
 * dependent ops rounds at ~1e-7 relative per op (the largest error measured
 * is ~4e-6 relative); 1e-4 leaves a 25x margin while a wrong term (a
 * missing transpose, a sign, a missing accumulation) is off by O(1). Also checked: the loss of eval
 * equals the loss of train, two micro-batches at grad_scale 1/2 accumulate to the one-pass gradient
 * bitwise, and the bf16 model's gradient points the same way (cosine >= 0.99
 * per tensor). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "zo/device.h"
#include "zo_test.h"
#include "zt_error.h"

#define VOCAB    61
#define DIM      32
#define LAYERS   2
#define HEADS    4
#define FFN      48
#define SEQ      16
#define MB       2
#define T        (MB * SEQ)
#define HD       (DIM / HEADS)
#define SEED     7u
#define INIT_STD 0.25f

#define WMAX 64 /* the widest q or k/v projection of the shapes tested */

static const zt_shape k_llama2 = {VOCAB, DIM, LAYERS, HEADS, FFN, 1e-5f, 10000.0f, 0,
                                  0,     0,   0,      {0},   0,   0,     0};
/* The shape under test: the Llama-2 layout, or a Hugging Face variant. */
static zt_shape g_shape = {VOCAB, DIM, LAYERS, HEADS, FFN, 1e-5f, 10000.0f, 0,
                           0,     0,   0,      {0},   0,   0,     0};

/* ---- the double-precision reference model ---- */

typedef struct ref_params {
    double *t[LAYERS + 2][ZT_MAX_LAYER_TENSORS];
} ref_params;

static void rmsnorm(double *y, const double *x, const double *w, int rows, int d)
{
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < d; j++)
            ss += x[r * d + j] * x[r * d + j];
        double rs = 1.0 / sqrt(ss / d + (double)g_shape.norm_eps);
        for (int j = 0; j < d; j++)
            y[r * d + j] = x[r * d + j] * rs * w[j];
    }
}

/* y[rows, out] = x[rows, in] W^T, W stored [out, in] */
static void linear(double *y, const double *x, const double *w, int rows, int in, int out)
{
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double acc = 0;
            for (int i = 0; i < in; i++)
                acc += x[r * in + i] * w[o * in + i];
            y[r * out + o] = acc;
        }
}

/* Pair i's RoPE frequency with the shape's scaling (transformers' linear
 * and llama3 rules, written from their definitions). */
static double ref_freq(int i, int hd)
{
    const zo_rope_scaling *sc = &g_shape.rope_scaling;
    double f = pow((double)g_shape.rope_theta, -2.0 * i / hd);
    if (sc->type == ZO_ROPE_SCALING_LINEAR)
        return f / sc->factor;
    if (sc->type != ZO_ROPE_SCALING_LLAMA3)
        return f;
    double wl = 2 * M_PI / f, old = sc->original_max_pos;
    if (wl < old / sc->high_freq_factor)
        return f;
    if (wl > old / sc->low_freq_factor)
        return f / sc->factor;
    double a = (old / wl - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
    return (1 - a) * f / sc->factor + a * f;
}

static void rope(double *x, int heads)
{
    const int hd = zt_head_dim(&g_shape), half = hd / 2, w = heads * hd;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                double ang = (double)(t % SEQ) * ref_freq(i, hd);
                double *v = x + t * w + h * hd, a = v[i], b = v[i + half];
                v[i] = a * cos(ang) - b * sin(ang);
                v[i + half] = b * cos(ang) + a * sin(ang);
            }
}

/* 1: the model under test runs the fused attention op (the sliding window). */
static int g_flash;

/* Query head h reads key/value head h / (heads / kv heads); block `block`
 * (0-based) with the shape's sliding window sees keys j > t - window. */
static void attention(double *out, const double *q, const double *k, const double *v, int block)
{
    const int window = block >= g_shape.window_from ? g_shape.window : 0;
    const int hd = zt_head_dim(&g_shape), qd = zt_q_dim(&g_shape), kvd = zt_kv_dim(&g_shape);
    const int group = HEADS / zt_kv_heads(&g_shape);
    double p[SEQ];
    for (int b = 0; b < MB; b++)
        for (int h = 0; h < HEADS; h++)
            for (int t = 0; t < SEQ; t++) {
                const double *qt = q + (b * SEQ + t) * qd + h * hd;
                const int kh = h / group;
                double mx = -INFINITY, sum = 0;
                const int j0 = window && t - window + 1 > 0 ? t - window + 1 : 0;
                for (int j = j0; j <= t; j++) {
                    const double *kj = k + (b * SEQ + j) * kvd + kh * hd;
                    double s = 0;
                    for (int i = 0; i < hd; i++)
                        s += qt[i] * kj[i];
                    p[j] = s / sqrt((double)hd);
                    mx = fmax(mx, p[j]);
                }
                for (int j = j0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                double *ot = out + (b * SEQ + t) * qd + h * hd;
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int j = j0; j <= t; j++)
                        acc += p[j] / sum * v[(b * SEQ + j) * kvd + kh * hd + i];
                    ot[i] = acc;
                }
            }
}

static void add_bias(double *y, const double *b, int width)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < width; i++)
            y[t * width + i] += b[i];
}

static void ref_block(double *x, double *const *w, int block)
{
    static double h[T * DIM], q[T * WMAX], k[T * WMAX], v[T * WMAX], a[T * WMAX], o[T * DIM];
    static double g[T * FFN], u[T * FFN];
    const int qd = zt_q_dim(&g_shape), kvd = zt_kv_dim(&g_shape);
    rmsnorm(h, x, w[ZT_ATTN_NORM], T, DIM);
    linear(q, h, w[ZT_WQ], T, DIM, qd);
    linear(k, h, w[ZT_WK], T, DIM, kvd);
    linear(v, h, w[ZT_WV], T, DIM, kvd);
    if (g_shape.attn_bias) {
        add_bias(q, w[ZT_BQ], qd);
        add_bias(k, w[ZT_BK], kvd);
        add_bias(v, w[ZT_BV], kvd);
    }
    rope(q, HEADS);
    rope(k, zt_kv_heads(&g_shape));
    attention(a, q, k, v, block);
    linear(o, a, w[ZT_WO], T, qd, DIM);
    if (g_shape.o_bias)
        add_bias(o, w[ZT_BO], DIM);
    for (int i = 0; i < T * DIM; i++)
        x[i] += o[i];
    rmsnorm(h, x, w[ZT_MLP_NORM], T, DIM);
    linear(g, h, w[ZT_WGATE], T, DIM, FFN);
    linear(u, h, w[ZT_WUP], T, DIM, FFN);
    for (int i = 0; i < T * FFN; i++)
        g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    linear(o, g, w[ZT_WDOWN], T, FFN, DIM);
    for (int i = 0; i < T * DIM; i++)
        x[i] += o[i];
}

static double ref_loss(const ref_params *p, const int32_t *in, const int32_t *tgt)
{
    static double x[T * DIM], hf[T * DIM], logits[T * VOCAB];
    for (int t = 0; t < T; t++)
        memcpy(x + t * DIM, p->t[0][0] + in[t] * DIM, DIM * sizeof(double));
    for (int l = 1; l <= LAYERS; l++)
        ref_block(x, p->t[l], l - 1);
    rmsnorm(hf, x, p->t[LAYERS + 1][ZT_HEAD_NORM], T, DIM);
    linear(logits, hf, p->t[LAYERS + 1][ZT_HEAD_OUT], T, DIM, VOCAB);
    double total = 0;
    for (int t = 0; t < T; t++) {
        const double *lr = logits + t * VOCAB;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < VOCAB; j++)
            mx = fmax(mx, lr[j]);
        for (int j = 0; j < VOCAB; j++)
            sum += exp(lr[j] - mx);
        total += mx + log(sum) - lr[tgt[t]];
    }
    return total / T;
}

static void ref_init(ref_params *p)
{
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            size_t n = zt_tensor_numel(&g_shape, l, i);
            float *f = malloc(n * sizeof *f);
            p->t[l][i] = malloc(n * sizeof(double));
            assert_non_null(f);
            assert_non_null(p->t[l][i]);
            zt_tensor_init(&g_shape, l, i, SEED, INIT_STD, f);
            for (size_t j = 0; j < n; j++)
                p->t[l][i][j] = f[j];
            free(f);
        }
}

static void ref_free(ref_params *p)
{
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++)
            free(p->t[l][i]);
}

/* ---- the model under test ---- */

typedef struct fixture {
    zo_device_t dev;
    zo_stream_t s;
    zt_model *m;
    zt_resident *r;
    zt_param_source src;
    int32_t in[2 * T], tgt[2 * T];
} fixture;

static void fixture_open(fixture *f, zo_dtype dt)
{
    memset(f, 0, sizeof *f);
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    ZO_ASSERT_OK(zo_device_init(&f->dev, &dc));
    ZO_ASSERT_OK(zo_stream_create(f->dev, &f->s));
    zt_model_config mc = {g_shape, SEQ, MB, 2, dt, g_flash, {0}, 0, 0};
    ZO_ASSERT_OK(zt_model_init(&f->m, f->dev, f->s, &mc));
    ZO_ASSERT_OK(zt_resident_init(&f->r, f->dev, f->s, &g_shape, dt, SEED, INIT_STD));
    f->src = zt_resident_source(f->r);
    uint64_t rng = 99;
    for (int i = 0; i < 2 * T; i++) {
        f->in[i] = (int32_t)(zo_test_rand(&rng) % VOCAB);
        f->tgt[i] = (int32_t)(zo_test_rand(&rng) % VOCAB);
    }
    memcpy(f->in + T, f->in, T * sizeof *f->in); /* micro-batch 1 repeats 0 */
    memcpy(f->tgt + T, f->tgt, T * sizeof *f->tgt);
    ZO_ASSERT_OK(zt_model_set_batch(f->m, f->in, f->tgt, 2));
}

static void fixture_close(fixture *f)
{
    zt_model_free(f->m);
    zt_resident_free(f->r);
    zo_stream_destroy(f->s);
    zo_device_free(f->dev);
}

/* Zero the gradients, run micro-batch 0 (scale 1), return its loss. */
static float train_once(fixture *f)
{
    float loss;
    ZO_ASSERT_OK(zt_resident_zero_grads(f->r, f->s));
    ZO_ASSERT_OK(zt_model_train_micro(f->m, &f->src, 0, 1.0f));
    ZO_ASSERT_OK(zt_model_read_losses(f->m, &loss, 1));
    return loss;
}

static float *read_tensor(fixture *f, int l, int i, int grad)
{
    float *out = malloc(zt_tensor_numel(&g_shape, l, i) * sizeof *out);
    assert_non_null(out);
    ZO_ASSERT_OK(zt_resident_read(f->r, f->s, l, i, grad, out));
    return out;
}

static double rms(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s / n);
}

/* Central difference of the reference loss in entry j of tensor (l, i). */
static double fd_grad(ref_params *p, int l, int i, size_t j, const int32_t *in, const int32_t *tgt)
{
    double *w = &p->t[l][i][j], w0 = *w, h = 1e-5 * fabs(w0) + 1e-6;
    *w = w0 + h;
    double up = ref_loss(p, in, tgt);
    *w = w0 - h;
    double down = ref_loss(p, in, tgt);
    *w = w0;
    return (up - down) / (2 * h);
}

static void check_tensor_grad(fixture *f, ref_params *p, int l, int i, uint64_t *rng)
{
    size_t n = zt_tensor_numel(&g_shape, l, i);
    float *g = read_tensor(f, l, i, 1);
    double scale = rms(g, n);
    char name[64];
    zt_tensor_name(&g_shape, l, i, name, sizeof name);
    assert_true(scale > 0); /* every tensor gets a gradient */
    for (int k = 0; k < 12; k++) {
        size_t j = k == 0 ? 0 : k == 1 ? n - 1 : (size_t)(zo_test_rand(rng) % n);
        if (l == 0)
            j = (size_t)f->in[k % T] * DIM + (size_t)k % DIM; /* rows that are used */
        double ref = fd_grad(p, l, i, j, f->in, f->tgt);
        double tol = 1e-4 * fmax(fabs(ref), scale) + 1e-7;
        if (fabs(g[j] - ref) > tol)
            fail_msg("%s[%zu]: gradient %.9g, finite difference %.9g (tolerance %.3g)", name, j,
                     (double)g[j], ref, tol);
    }
    free(g);
}

static void check_gradient(void)
{
    fixture f;
    fixture_open(&f, ZO_DTYPE_F32);
    ref_params p;
    ref_init(&p);
    float loss = train_once(&f);
    double ref = ref_loss(&p, f.in, f.tgt);
    assert_true(fabs(loss - ref) <= 1e-5 * fabs(ref));
    assert_true(ref > 3.0 && ref < 6.0); /* near ln(61) = 4.11: a sane untrained model */
    uint64_t rng = 5;
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++)
            check_tensor_grad(&f, &p, l, i, &rng);
    ref_free(&p);
    fixture_close(&f);
}

static void test_gradient_matches_finite_differences(void **state)
{
    g_shape = k_llama2;
    check_gradient();
}

/* Biases start at 0 (zt_tensor_init); random ones make their use visible. */
static void randomize_biases(fixture *f, ref_params *p)
{
    uint64_t rng = 31;
    for (int l = 1; l <= LAYERS; l++)
        for (int i = ZT_BQ; i < zt_layer_tensors(&g_shape, l); i++) {
            size_t n = zt_tensor_numel(&g_shape, l, i);
            float *b = malloc(n * sizeof *b);
            assert_non_null(b);
            for (size_t j = 0; j < n; j++)
                p->t[l][i][j] = b[j] = (float)((double)(zo_test_rand(&rng) % 2001) / 1000.0 - 1.0);
            ZO_ASSERT_OK(zt_resident_write(f->r, f->s, l, i, b));
            free(b);
        }
}

/* The Hugging Face variants against the reference: grouped-query attention
 * (4 query heads on 2, then 1 key/value heads), a head_dim other than
 * dim / heads, q/k/v biases (and o_proj's), llama3 and linear RoPE scaling (an original
 * length of 64 puts the 6 frequencies of head_dim 12 in all three of
 * llama3's ranges). */
static void check_variant(const zt_shape *s)
{
    g_shape = *s;
    fixture f;
    fixture_open(&f, ZO_DTYPE_F32);
    ref_params p;
    ref_init(&p);
    if (g_shape.attn_bias)
        randomize_biases(&f, &p);
    float loss = train_once(&f);
    double ref = ref_loss(&p, f.in, f.tgt);
    if (!(fabs(loss - ref) <= 1e-5 * fabs(ref)))
        fail_msg("loss %.9g, reference %.9g", (double)loss, ref);
    uint64_t rng = 6;
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++)
            check_tensor_grad(&f, &p, l, i, &rng);
    ref_free(&p);
    fixture_close(&f);
    g_shape = k_llama2;
}

static void test_variants_match_the_reference(void **state)
{
    zt_shape gqa = k_llama2;
    gqa.n_kv_heads = 2;
    gqa.head_dim = 12;
    gqa.attn_bias = 1;
    gqa.rope_scaling = (zo_rope_scaling){.type = ZO_ROPE_SCALING_LLAMA3,
                                         .factor = 8.0f,
                                         .low_freq_factor = 1.0f,
                                         .high_freq_factor = 4.0f,
                                         .original_max_pos = 64};
    check_variant(&gqa);
    zt_shape mqa = k_llama2;
    mqa.n_kv_heads = 1;
    mqa.rope_scaling = (zo_rope_scaling){.type = ZO_ROPE_SCALING_LINEAR, .factor = 2.0f};
    check_variant(&mqa);
    zt_shape o_bias = k_llama2; /* Llama's attention_bias: q, k, v and o_proj */
    o_bias.attn_bias = o_bias.o_bias = 1;
    check_variant(&o_bias);
}

/* Hugging Face's sliding window through the fused op, shorter than the
 * sequence (5 of 16): Mistral's on every block, Qwen2's from block 1
 * (max_window_layers 1) with grouped-query attention. The dense op refuses
 * it, naming the fused one. */
static void test_sliding_window_matches_the_reference(void **state)
{
    zt_shape mistral = k_llama2;
    mistral.window = 5;
    zt_model_config mc = {mistral, SEQ, MB, 1, ZO_DTYPE_F32, 0, {0}, 0, 0};
    assert_int_equal(zt_model_config_check(&mc), ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "use --attention flash"));
    g_flash = 1;
    check_variant(&mistral);
    zt_shape qwen2 = k_llama2;
    qwen2.n_kv_heads = 2;
    qwen2.attn_bias = 1;
    qwen2.window = 5;
    qwen2.window_from = 1;
    check_variant(&qwen2);
    g_flash = 0;
}

/* The fused attention op in the model against the same reference: the
 * Llama-2 layout and the variants (GQA reads the key/value heads in place,
 * d(attn_out) takes x2's piece), in one chunk and in chunks of 5 rows. */
static void test_flash_variants_match_the_reference(void **state)
{
    g_flash = 1;
    for (int chunked = 0; chunked < 2; chunked++) {
        if (chunked)
            setenv("ZO_MLP_CHUNK_BYTES", "960", 1); /* 5 rows of 48 fp32 */
        check_variant(&k_llama2);
        test_variants_match_the_reference(state);
        unsetenv("ZO_MLP_CHUNK_BYTES");
    }
    g_flash = 0;
}

/* key/value heads = heads and head_dim = dim / heads, given explicitly, is
 * today's multi-head model bitwise: loss and every gradient. */
static void test_explicit_mha_is_bitwise_llama2(void **state)
{
    fixture a, b;
    g_shape = k_llama2;
    fixture_open(&a, ZO_DTYPE_BF16);
    float la = train_once(&a);
    g_shape.n_kv_heads = HEADS;
    g_shape.head_dim = HD;
    fixture_open(&b, ZO_DTYPE_BF16);
    float lb = train_once(&b);
    assert_memory_equal(&la, &lb, sizeof la);
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            float *ga = read_tensor(&a, l, i, 1), *gb = read_tensor(&b, l, i, 1);
            assert_memory_equal(ga, gb, zt_tensor_numel(&g_shape, l, i) * sizeof(float));
            free(ga), free(gb);
        }
    fixture_close(&a);
    fixture_close(&b);
    g_shape = k_llama2;
}

/* A fixture whose model was made with the environment's var set to bytes
 * (the chunk limits are read when the model carves its arena). */
static void fixture_open_with(fixture *f, const char *var, int bytes)
{
    char v[32];
    snprintf(v, sizeof v, "%d", bytes);
    setenv(var, v, 1);
    fixture_open(f, ZO_DTYPE_F32);
    unsetenv(var);
}

/* The head and loss in chunks of 3 rows (ZO_HEAD_CHUNK_BYTES; the last of
 * the 32 rows 2): the loss keeps its bits, in training and in eval (each
 * row's logits and loss are its own, the mean in row order); the gradients
 * are within 1e-6 (relative L2, fp32) of the one-chunk ones: the head
 * matrix's is summed chunk by chunk, and d(hf) of 3 rows is a GEMM of
 * another shape, whose sums the cpu device may split otherwise. */
static void test_head_chunks_keep_the_loss(void **state)
{
    fixture a, b;
    g_shape = k_llama2;
    fixture_open(&a, ZO_DTYPE_F32);
    float la = train_once(&a), ea, eb;
    setenv("ZO_HEAD_CHUNK_BYTES", "732", 1); /* 3 rows of 61 fp32 logits */
    zt_model_config mc = {g_shape, SEQ, MB, 2, ZO_DTYPE_F32, 0, {0}, 0, 0};
    assert_int_equal(zt_head_chunk_rows(&mc), 3);
    fixture_open_with(&b, "ZO_HEAD_CHUNK_BYTES", 3 * VOCAB * 4);
    float lb = train_once(&b);
    assert_memory_equal(&la, &lb, sizeof la);
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            size_t n = zt_tensor_numel(&g_shape, l, i);
            float *ga = read_tensor(&a, l, i, 1), *gb = read_tensor(&b, l, i, 1);
            double diff = 0, norm = 0;
            for (size_t j = 0; j < n; j++)
                diff += ((double)ga[j] - gb[j]) * ((double)ga[j] - gb[j]),
                    norm += (double)ga[j] * ga[j];
            if (!(sqrt(diff) <= 1e-6 * sqrt(norm)))
                fail_msg("layer %d tensor %d: gradient relative L2 %.3g", l, i, sqrt(diff / norm));
            free(ga), free(gb);
        }
    ZO_ASSERT_OK(zt_model_eval_micro(a.m, &a.src, 1));
    ZO_ASSERT_OK(zt_model_eval_micro(b.m, &b.src, 1));
    float losses[2];
    ZO_ASSERT_OK(zt_model_read_losses(a.m, losses, 2));
    ea = losses[1];
    ZO_ASSERT_OK(zt_model_read_losses(b.m, losses, 2));
    eb = losses[1];
    assert_memory_equal(&ea, &eb, sizeof ea);
    fixture_close(&a);
    fixture_close(&b);
}

/* The relative L2 distance of two gradients. */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t j = 0; j < n; j++)
        diff += ((double)a[j] - b[j]) * ((double)a[j] - b[j]), norm += (double)a[j] * a[j];
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* A block's position-wise parts in chunks of 5 rows (ZO_MLP_CHUNK_BYTES;
 * the last of the 32 rows 2), fp32, against one chunk: the MLP half and the
 * attention norm with the q, k, v projections. Each row's norms,
 * projections, gate, up, product and down are its own, and those weights'
 * and norms' gradients are summed chunk by chunk; but the cpu device's GEMM (OpenBLAS) picks its
 * kernel by the block's shape, so a row of a 5-row product is not bitwise that row of the 32-row
 * one: the loss (train and eval) within 1e-6 relative, every gradient within 1e-5 relative L2
 * (measured: 7.2e-7 at most; a chunk read at the wrong rows is off by O(1)). */
static void test_mlp_chunks_follow_one_chunk(void **state)
{
    fixture a, b;
    g_shape = k_llama2;
    fixture_open(&a, ZO_DTYPE_F32);
    float la = train_once(&a);
    setenv("ZO_MLP_CHUNK_BYTES", "960", 1); /* 5 rows of 48 fp32 */
    zt_model_config mc = {g_shape, SEQ, MB, 2, ZO_DTYPE_F32, 0, {0}, 0, 0};
    assert_int_equal(zt_mlp_chunk_rows(&mc), 5);
    fixture_open_with(&b, "ZO_MLP_CHUNK_BYTES", 5 * FFN * 4);
    assert_int_equal(zt_mlp_chunk_rows(&mc), T);
    float lb = train_once(&b);
    if (!(fabsf(la - lb) <= 1e-6f * fabsf(la)))
        fail_msg("loss %.9g in chunks, %.9g in one", (double)lb, (double)la);
    double worst = 0;
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            size_t n = zt_tensor_numel(&g_shape, l, i);
            float *ga = read_tensor(&a, l, i, 1), *gb = read_tensor(&b, l, i, 1);
            double e = rel_l2(ga, gb, n);
            if (!(e <= 1e-5))
                fail_msg("layer %d tensor %d: gradient relative L2 %.3g", l, i, e);
            worst = e > worst ? e : worst;
            free(ga), free(gb);
        }
    printf("blocks in 5-row chunks: gradients within %.3g relative L2 of one chunk\n", worst);
    float losses[2], ea, eb;
    ZO_ASSERT_OK(zt_model_eval_micro(a.m, &a.src, 1));
    ZO_ASSERT_OK(zt_model_read_losses(a.m, losses, 2));
    ea = losses[1];
    ZO_ASSERT_OK(zt_model_eval_micro(b.m, &b.src, 1));
    ZO_ASSERT_OK(zt_model_read_losses(b.m, losses, 2));
    eb = losses[1];
    if (!(fabsf(ea - eb) <= 1e-6f * fabsf(ea)))
        fail_msg("eval loss %.9g in chunks, %.9g in one", (double)eb, (double)ea);
    fixture_close(&a);
    fixture_close(&b);
}

/* The arena with chunks holds one chunk's norm output (h1 and h2 share it),
 * gate, up and product, not the micro-batch's: exactly that much smaller. */
static void test_mlp_chunks_shrink_the_arena(void **state)
{
    zt_model_config mc = {g_shape, SEQ, MB, 2, ZO_DTYPE_BF16, 0, {0}, 0, 0};
    uint64_t whole = zt_model_activation_bytes(&mc);
    setenv("ZO_MLP_CHUNK_BYTES", "512", 1); /* 512 / (48 x 2) = 5 rows */
    uint64_t chunked = zt_model_activation_bytes(&mc);
    unsetenv("ZO_MLP_CHUNK_BYTES");
#define UP256(x) (((uint64_t)(x) + 255) / 256 * 256) /* each piece is 256-aligned */
    const uint64_t h2 = UP256(T * DIM * 2) - UP256(5 * DIM * 2);
    const uint64_t ffn = UP256(T * FFN * 2) - UP256(5 * FFN * 2); /* gate, up, act */
#undef UP256
    assert_int_equal(whole - chunked, h2 + 3 * ffn);
}

/* The same loss from the eval path; two half-scaled micro-batches (the
 * same tokens) accumulate exactly the one-pass gradient. */
static void test_eval_and_accumulation(void **state)
{
    fixture f;
    fixture_open(&f, ZO_DTYPE_F32);
    float loss = train_once(&f), losses[2];
    float *once[LAYERS + 2][ZT_MAX_LAYER_TENSORS];
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++)
            once[l][i] = read_tensor(&f, l, i, 1);
    ZO_ASSERT_OK(zt_model_eval_micro(f.m, &f.src, 1));
    ZO_ASSERT_OK(zt_model_read_losses(f.m, losses, 2));
    assert_memory_equal(&losses[1], &loss, sizeof loss);
    ZO_ASSERT_OK(zt_resident_zero_grads(f.r, f.s));
    ZO_ASSERT_OK(zt_model_train_micro(f.m, &f.src, 0, 0.5f));
    ZO_ASSERT_OK(zt_model_train_micro(f.m, &f.src, 1, 0.5f));
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            float *acc = read_tensor(&f, l, i, 1);
            assert_memory_equal(acc, once[l][i], zt_tensor_numel(&g_shape, l, i) * sizeof(float));
            free(acc);
            free(once[l][i]);
        }
    fixture_close(&f);
}

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

static void test_bf16_gradient_follows_fp32(void **state)
{
    fixture f32, f16;
    fixture_open(&f32, ZO_DTYPE_F32);
    fixture_open(&f16, ZO_DTYPE_BF16);
    float l32 = train_once(&f32), l16 = train_once(&f16);
    assert_true(fabsf(l32 - l16) < 0.02f * l32);
    for (int l = 0; l < LAYERS + 2; l++)
        for (int i = 0; i < zt_layer_tensors(&g_shape, l); i++) {
            float *a = read_tensor(&f32, l, i, 1), *b = read_tensor(&f16, l, i, 1);
            double c = cosine(a, b, zt_tensor_numel(&g_shape, l, i));
            if (!(c >= 0.99))
                fail_msg("layer %d tensor %d: bf16 vs fp32 gradient cosine %.4f", l, i, c);
            free(a);
            free(b);
        }
    fixture_close(&f16);
    fixture_close(&f32);
}

static void test_activation_bytes_are_what_init_allocates(void **state)
{
    fixture f;
    fixture_open(&f, ZO_DTYPE_BF16);
    zo_device_mem_stats before, after;
    ZO_ASSERT_OK(zo_device_mem_get_stats(f.dev, &before));
    zt_model_config mc = {g_shape, SEQ, MB, 3, ZO_DTYPE_BF16, 0, {0}, 0, 0};
    zt_model *m2 = NULL;
    ZO_ASSERT_OK(zt_model_init(&m2, f.dev, f.s, &mc));
    ZO_ASSERT_OK(zo_device_mem_get_stats(f.dev, &after));
    assert_int_equal(after.in_use - before.in_use, zt_model_activation_bytes(&mc));
    zt_model_free(m2);
    /* a budget one byte short is refused, and nothing is held */
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = zt_model_activation_bytes(&mc) - 1;
    zo_device_t small;
    zo_stream_t s;
    ZO_ASSERT_OK(zo_device_init(&small, &dc));
    ZO_ASSERT_OK(zo_stream_create(small, &s));
    assert_int_equal(zt_model_init(&m2, small, s, &mc), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    ZO_ASSERT_OK(zo_device_mem_get_stats(small, &after));
    assert_int_equal(after.in_use, 0);
    zo_stream_destroy(s);
    zo_device_free(small);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_matches_finite_differences),
        cmocka_unit_test(test_variants_match_the_reference),
        cmocka_unit_test(test_flash_variants_match_the_reference),
        cmocka_unit_test(test_explicit_mha_is_bitwise_llama2),
        cmocka_unit_test(test_sliding_window_matches_the_reference),
        cmocka_unit_test(test_eval_and_accumulation),
        cmocka_unit_test(test_head_chunks_keep_the_loss),
        cmocka_unit_test(test_mlp_chunks_follow_one_chunk),
        cmocka_unit_test(test_mlp_chunks_shrink_the_arena),
        cmocka_unit_test(test_bf16_gradient_follows_fp32),
        cmocka_unit_test(test_activation_bytes_are_what_init_allocates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
