/* The model's shapes (model_shape.h): presets, checks, counts, the tensors
 * of each engine layer and their initial values, the activation arena's
 * layout. */
#include "model_shape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/checked.h"
#include "zt_error.h"

/* ---- presets ---- */

typedef struct preset {
    const char *name;
    zt_shape shape;
} preset;

/* Llama-2 shapes for 7b, 13b and 70b; the smaller ones keep head_dim 64..128 and
 * an ffn of about 8/3 dim rounded to a multiple of 64 or 256, as LLaMA does. */
static const preset presets[] = {
    {"tiny", {256, 256, 4, 4, 768, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0}}, /* 3.5M parameters,
                                                                                   byte-level */
    {"small", {32000, 640, 12, 10, 1728, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0}}, /* 100M */
    {"1b", {32000, 2048, 18, 16, 5632, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0}},   /* 1.06B */
    {"7b", {32000, 4096, 32, 32, 11008, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0}},  /* 6.74B */
    {"13b", {32000, 5120, 40, 40, 13824, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0}}, /* 13.0B */
    /* Llama-2-70B: grouped-query attention, 8 key/value heads of 128 */
    {"70b", {32000, 8192, 80, 64, 28672, 1e-5f, 10000.0f, 8, 0, 0, 0, {0}, 0, 0, 0}}, /* 69.0B */
};

const char *zt_preset_names(void)
{
    return "tiny, small, 1b, 7b, 13b, 70b";
}

zo_status zt_preset(const char *name, zt_shape *out)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (name && strcmp(name, presets[i].name) == 0) {
            *out = presets[i].shape;
            return ZO_OK;
        }
    return zt_fail(ZO_ERR_INVALID_ARG, "unknown preset '%s'; expected one of %s",
                   name ? name : "(null)", zt_preset_names());
}

void zt_shape_override(zt_shape *s, const int dims[5])
{
    int *dst[5] = {&s->vocab, &s->dim, &s->n_layers, &s->n_heads, &s->ffn_dim};
    for (int i = 0; i < 5; i++)
        if (dims[i])
            *dst[i] = dims[i];
}

int zt_kv_heads(const zt_shape *s)
{
    return s->n_kv_heads > 0 ? s->n_kv_heads : s->n_heads;
}

int zt_head_dim(const zt_shape *s)
{
    return s->head_dim > 0 ? s->head_dim : s->dim / s->n_heads;
}

int zt_q_dim(const zt_shape *s)
{
    return s->n_heads * zt_head_dim(s);
}

int zt_kv_dim(const zt_shape *s)
{
    return zt_kv_heads(s) * zt_head_dim(s);
}

/* The Hugging Face variants: kv heads, head_dim, RoPE scaling. */
static zo_status check_variants(const zt_shape *s)
{
    if (s->o_bias && !s->attn_bias)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "an o_proj bias without q/k/v biases: Llama's attention_bias has all four");
    if (s->n_kv_heads < 0 || s->n_kv_heads > s->n_heads || s->n_heads % zt_kv_heads(s))
        return zt_fail(ZO_ERR_INVALID_ARG, "key/value heads %d must divide heads %d", s->n_kv_heads,
                       s->n_heads);
    if (s->window < 0 || s->window_from < 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "sliding window %d (0: none) and its first layer %d must be >= 0", s->window,
                       s->window_from);
    if (s->head_dim < 0 || s->head_dim > 1 << 12 || s->head_dim % 2)
        return zt_fail(ZO_ERR_INVALID_ARG, "head dim %d must be even, 2..4096 (RoPE pairs)",
                       s->head_dim);
    if ((int64_t)s->n_heads * zt_head_dim(s) > 1 << 17)
        return zt_fail(ZO_ERR_INVALID_ARG, "heads %d x head dim %d is over %d", s->n_heads,
                       zt_head_dim(s), 1 << 17);
    const zo_rope_scaling *r = &s->rope_scaling;
    if (r->type != ZO_ROPE_SCALING_NONE && !(r->factor > 0.0f))
        return zt_fail(ZO_ERR_INVALID_ARG, "rope scaling factor %g must be > 0", (double)r->factor);
    if (r->type == ZO_ROPE_SCALING_LLAMA3 &&
        (!(r->low_freq_factor > 0.0f) || !(r->high_freq_factor > r->low_freq_factor) ||
         r->original_max_pos <= 0))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "llama3 rope scaling needs low_freq_factor %g > 0, high_freq_factor %g "
                       "above it and original_max_position_embeddings %d > 0",
                       (double)r->low_freq_factor, (double)r->high_freq_factor,
                       r->original_max_pos);
    if ((r->type == ZO_ROPE_SCALING_YARN || r->type == ZO_ROPE_SCALING_DYNAMIC) &&
        r->original_max_pos <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG, "%s rope scaling needs %s %d > 0",
                       r->type == ZO_ROPE_SCALING_YARN ? "yarn" : "dynamic",
                       r->type == ZO_ROPE_SCALING_YARN ? "original_max_position_embeddings"
                                                       : "max_position_embeddings",
                       r->original_max_pos);
    if (r->type == ZO_ROPE_SCALING_YARN &&
        !(r->beta_fast > 0.0f && r->beta_slow > 0.0f && r->attention_factor > 0.0f))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "yarn rope scaling needs beta_fast %g, beta_slow %g and attention_factor "
                       "%g > 0",
                       (double)r->beta_fast, (double)r->beta_slow, (double)r->attention_factor);
    if (r->type == ZO_ROPE_SCALING_DYNAMIC && zt_head_dim(s) <= 2)
        return zt_fail(ZO_ERR_INVALID_ARG, "dynamic rope scaling needs head dim %d > 2",
                       zt_head_dim(s));
    return ZO_OK;
}

zo_status zt_shape_check(const zt_shape *s)
{
    if (s->vocab <= 0 || s->dim <= 0 || s->n_layers <= 0 || s->n_heads <= 0 || s->ffn_dim <= 0)
        return zt_fail(
            ZO_ERR_INVALID_ARG,
            "model shape vocab %d, dim %d, layers %d, heads %d, ffn %d: every one must be > 0",
            s->vocab, s->dim, s->n_layers, s->n_heads, s->ffn_dim);
    /* Far above any real model (the largest have a vocabulary of 256K, width
     * 25K, 200 layers, 128 heads, ffn 100K): a typo such as --layers
     * 100000000 is refused instead of planned for minutes in gigabytes. */
    const int max[5] = {1 << 24, 1 << 17, 1 << 14, 1 << 12, 1 << 20};
    const int have[5] = {s->vocab, s->dim, s->n_layers, s->n_heads, s->ffn_dim};
    const char *what[5] = {"vocab", "dim", "layers", "heads", "ffn"};
    for (int i = 0; i < 5; i++)
        if (have[i] > max[i])
            return zt_fail(ZO_ERR_INVALID_ARG,
                           "model shape %s %d is over %d: no real model has that many", what[i],
                           have[i], max[i]);
    if (!s->head_dim && (s->dim % s->n_heads || (s->dim / s->n_heads) % 2))
        return zt_fail(
            ZO_ERR_INVALID_ARG,
            "dim %d must be a multiple of heads %d with an even head dimension (RoPE pairs)",
            s->dim, s->n_heads);
    ZT_TRY(check_variants(s));
    if (!(s->norm_eps > 0.0f) || !(s->rope_theta > 1.0f))
        return zt_fail(ZO_ERR_INVALID_ARG, "norm eps %g must be > 0 and rope theta %g > 1",
                       (double)s->norm_eps, (double)s->rope_theta);
    return ZO_OK;
}

/* q and o: d x q_dim each; k and v: d x kv_dim each. */
static uint64_t attn_matrix_params(const zt_shape *s)
{
    uint64_t d = (uint64_t)s->dim, q = (uint64_t)zt_q_dim(s), kv = (uint64_t)zt_kv_dim(s);
    return 2 * d * q + 2 * d * kv;
}

static uint64_t block_params(const zt_shape *s)
{
    uint64_t d = (uint64_t)s->dim, f = (uint64_t)s->ffn_dim;
    uint64_t bias = s->attn_bias ? (uint64_t)zt_q_dim(s) + 2 * (uint64_t)zt_kv_dim(s) : 0;
    bias += s->o_bias ? d : 0;
    return attn_matrix_params(s) + 3 * d * f + 2 * d + bias;
}

/* A tied head shares the embedding's matrix: counted once. */
uint64_t zt_shape_n_params(const zt_shape *s)
{
    uint64_t d = (uint64_t)s->dim, v = (uint64_t)s->vocab;
    return v * d + (uint64_t)s->n_layers * block_params(s) + d + (s->tied ? 0 : v * d);
}

double zt_window_density(int window, int seq)
{
    if (window <= 0 || window >= seq)
        return 1.0;
    double w = window, n = seq;
    double kept = w * (w + 1) / 2 + (n - w) * w; /* queries before w, then w keys each */
    return kept / (n * (n + 1) / 2);
}

double zt_block_attention_share(const zt_shape *s, int block, int seq)
{
    return zt_block_layout_share(s, NULL, block, seq);
}

static int has_layout(const zo_attn_layout *l)
{
    return l && l->struct_size;
}

/* Whether the window (> 0) reaches from query block r to key block c of
 * `block` tokens: the closest pair, r's first query and c's last key, is
 * less than window apart (a key block at or after the query block is). */
static int window_reaches(int window, int block, int r, int c)
{
    return c >= r || (int64_t)(r - c - 1) * block + 1 < window;
}

/* The mask's kept blocks that the window (0: none) reaches, over a causal
 * (or full) sweep's blocks: the builder's density when there is no window. */
static double mask_share(const zo_attn_layout *l, const uint8_t *m, int nb, int window)
{
    uint64_t kept = 0;
    for (int r = 0; r < nb; r++)
        for (int c = 0; c < nb; c++)
            kept += m[(size_t)r * nb + c] && (!window || window_reaches(window, l->block, r, c));
    double all = l->causal ? (double)nb * (nb + 1) / 2 : (double)nb * nb;
    return (double)kept / all;
}

static int same_layout(const zo_attn_layout *a, const zo_attn_layout *b)
{
    return a->struct_size == b->struct_size && a->kind == b->kind && a->block == b->block &&
           a->causal == b->causal && a->window_blocks == b->window_blocks &&
           a->global_blocks == b->global_blocks && a->random_blocks == b->random_blocks &&
           a->seed == b->seed;
}

static zo_status count_layout_share(const zo_attn_layout *l, int window, int seq, double *out)
{
    int nb;
    if (zo_attn_layout_build(l, seq, NULL, 0, &nb, NULL) < 0)
        return zt_fail(ZO_ERR_INVALID_ARG, "sparse_attention: %s", zt_lib_message());
    if (nb > ZT_LAYOUT_MAX_BLOCKS)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "sparse_attention: %d blocks of %d tokens a side at seq %d; its work is "
                       "counted up to %d a side: use a larger block",
                       nb, l->block, seq, (int)ZT_LAYOUT_MAX_BLOCKS);
    size_t n = (size_t)nb * nb;
    uint8_t *m = malloc(n);
    if (!m)
        return zt_fail(ZO_ERR_NO_MEMORY, "sparse_attention: a %zu-byte block mask", n);
    zo_status st = zo_attn_layout_build(l, seq, m, n, NULL, NULL);
    if (st >= 0)
        *out = mask_share(l, m, nb, window > 0 && window < seq ? window : 0);
    free(m);
    return st < 0 ? zt_fail(st, "sparse_attention: %s", zt_lib_message()) : ZO_OK;
}

zo_status zt_layout_share(const zo_attn_layout *l, int window, int seq, double *out)
{
    if (!has_layout(l)) {
        *out = zt_window_density(window, seq);
        return ZO_OK;
    }
    static _Thread_local struct {
        int valid;
        zo_attn_layout l;
        int window, seq;
        double share;
    } last;
    if (last.valid && same_layout(&last.l, l) && last.window == window && last.seq == seq) {
        *out = last.share;
        return ZO_OK;
    }
    ZT_TRY(count_layout_share(l, window, seq, out));
    last.valid = 1, last.l = *l, last.window = window, last.seq = seq, last.share = *out;
    return ZO_OK;
}

double zt_block_layout_share(const zt_shape *s, const zo_attn_layout *l, int block, int seq)
{
    int window = s->window > 0 && block >= s->window_from ? s->window : 0;
    double share;
    return zt_layout_share(l, window, seq, &share) < 0 ? NAN : share;
}

/* The blocks' attention in units of one full causal layer's. */
static double attention_layers(const zt_shape *s, const zo_attn_layout *l, int seq)
{
    double sum = 0;
    for (int b = 0; b < s->n_layers; b++)
        sum += zt_block_layout_share(s, l, b, seq);
    return sum;
}

double zt_shape_flops_per_token(const zt_shape *s, int seq)
{
    return zt_layout_flops_per_token(s, NULL, seq);
}

double zt_layout_flops_per_token(const zt_shape *s, const zo_attn_layout *l, int seq)
{
    double d = s->dim, f = s->ffn_dim, L = s->n_layers;
    double matmul = L * ((double)attn_matrix_params(s) + 3 * d * f) + (double)s->vocab * d;
    return 6.0 * matmul + 12.0 * attention_layers(s, l, seq) * (double)seq * zt_q_dim(s);
}

/* ---- parameter layout ---- */

static int is_norm(const zt_shape *s, int layer, int idx);

int zt_engine_layers(const zt_shape *s)
{
    return s->n_layers + (s->tied ? 1 : 2);
}

static int is_block(const zt_shape *s, int layer)
{
    return layer >= 1 && layer <= s->n_layers;
}
/* The head's own layer; none when tied (-1: no layer is it). */
static int head_layer(const zt_shape *s)
{
    return s->tied ? -1 : s->n_layers + 1;
}

static int is_tied_norm(const zt_shape *s, int layer, int idx)
{
    return s->tied && layer == 0 && idx == ZT_TIED_NORM;
}

int zt_layer_tensors(const zt_shape *s, int layer)
{
    if (layer == 0)
        return s->tied ? 2 : 1;
    if (is_block(s, layer))
        return s->o_bias      ? ZT_BLOCK_TENSORS_O_BIAS
               : s->attn_bias ? ZT_BLOCK_TENSORS_BIAS
                              : ZT_BLOCK_TENSORS;
    return layer == head_layer(s) ? 2 : 0;
}

int zt_tensor_embedding(const zt_shape *s, int layer, int idx)
{
    (void)s; /* layer 0 starts with it, tied or not */
    return layer == 0 && idx == ZT_EMBEDDING;
}

size_t zt_tensor_numel(const zt_shape *s, int layer, int idx)
{
    size_t d = (size_t)s->dim, f = (size_t)s->ffn_dim, v = (size_t)s->vocab;
    if (layer == 0)
        return is_tied_norm(s, layer, idx) ? d : v * d;
    if (layer == head_layer(s))
        return idx == ZT_HEAD_NORM ? d : v * d;
    switch (idx) {
    case ZT_ATTN_NORM:
    case ZT_MLP_NORM:
    case ZT_BO: return d;
    case ZT_WQ:
    case ZT_WO: return d * (size_t)zt_q_dim(s);
    case ZT_WK:
    case ZT_WV: return d * (size_t)zt_kv_dim(s);
    case ZT_BQ: return (size_t)zt_q_dim(s);
    case ZT_BK:
    case ZT_BV: return (size_t)zt_kv_dim(s);
    default: return d * f; /* gate, up, down */
    }
}

void zt_tensor_name(const zt_shape *s, int layer, int idx, char *name, size_t cap)
{
    static const char *const block_names[ZT_BLOCK_TENSORS_O_BIAS] = {
        "attn_norm", "wq",     "wk", "wv", "wo", "mlp_norm", "w_gate",
        "w_up",      "w_down", "bq", "bk", "bv", "bo"};
    if (is_tied_norm(s, layer, idx))
        snprintf(name, cap, "final_norm");
    else if (layer == 0)
        snprintf(name, cap, "tok_embedding");
    else if (layer == head_layer(s))
        snprintf(name, cap, "%s", idx == ZT_HEAD_NORM ? "final_norm" : "lm_head");
    else
        snprintf(name, cap, "blocks.%d.%s", layer - 1, block_names[idx]);
}

void zt_tensor_hf(const zt_shape *s, int layer, int idx, char *name, size_t cap, int *ndim,
                  int64_t shape[2])
{
    static const char *const block[ZT_BLOCK_TENSORS_O_BIAS] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
        "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
        "self_attn.o_proj.bias"};
    int64_t d = s->dim, n = (int64_t)zt_tensor_numel(s, layer, idx);
    if (is_tied_norm(s, layer, idx))
        snprintf(name, cap, "model.norm.weight");
    else if (layer == 0)
        snprintf(name, cap, "model.embed_tokens.weight");
    else if (layer == head_layer(s))
        snprintf(name, cap, "%s", idx == ZT_HEAD_NORM ? "model.norm.weight" : "lm_head.weight");
    else
        snprintf(name, cap, "model.layers.%d.%s", layer - 1, block[idx]);
    int vector = is_norm(s, layer, idx) || (is_block(s, layer) && idx >= ZT_BQ);
    *ndim = vector ? 1 : 2;
    /* [out, in]: in is d except for o_proj (q_dim) and down_proj (ffn) */
    int64_t in = !is_block(s, layer) ? d
                 : idx == ZT_WO      ? zt_q_dim(s)
                 : idx == ZT_WDOWN   ? s->ffn_dim
                                     : d;
    shape[0] = vector ? n : n / in;
    shape[1] = vector ? 0 : in;
}

static int is_norm(const zt_shape *s, int layer, int idx)
{
    if (layer == 0)
        return is_tied_norm(s, layer, idx);
    if (layer == head_layer(s))
        return idx == ZT_HEAD_NORM;
    return idx == ZT_ATTN_NORM || idx == ZT_MLP_NORM;
}

static uint64_t splitmix64(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform in (0, 1) from 53 random bits. */
static double uniform01(uint64_t *st)
{
    return ((double)(splitmix64(st) >> 11) + 0.5) / 9007199254740992.0;
}

void zt_tensor_init(const zt_shape *s, int layer, int idx, uint64_t seed, float init_std,
                    float *out)
{
    size_t n = zt_tensor_numel(s, layer, idx);
    if (is_norm(s, layer, idx) || (is_block(s, layer) && idx >= ZT_BQ)) {
        float v = is_norm(s, layer, idx) ? 1.0f : 0.0f; /* norms 1, biases 0 */
        for (size_t i = 0; i < n; i++)
            out[i] = v;
        return;
    }
    double std = init_std;
    if (is_block(s, layer) && (idx == ZT_WO || idx == ZT_WDOWN))
        std /= sqrt(2.0 * s->n_layers);
    uint64_t st = seed ^ ((uint64_t)(layer + 1) * 0x100000001B3ull) ^ ((uint64_t)(idx + 1) << 48);
    splitmix64(&st);
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller: two normals per pair of uniforms */
        double r = sqrt(-2.0 * log(uniform01(&st))), a = 2.0 * M_PI * uniform01(&st);
        out[i] = (float)(std * r * cos(a));
        if (i + 1 < n)
            out[i + 1] = (float)(std * r * sin(a));
    }
}

uint64_t zt_largest_tensor(const zt_shape *s)
{
    uint64_t mx = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++)
            if (zt_tensor_numel(s, l, i) > mx)
                mx = zt_tensor_numel(s, l, i);
    return mx;
}

uint64_t zt_default_chunk_bytes(const zt_shape *s)
{
    uint64_t cb = zt_largest_tensor(s) * 2; /* 16-bit */
    return (cb + 4095) / 4096 * 4096;
}

/* ---- the activation arena of a batch ---- */

zo_status zt_job_sizes_check(const zt_shape *s, int seq, int micro_batch, int grad_accum, int ranks)
{
    if (seq <= 0 || micro_batch <= 0 || grad_accum <= 0 || ranks <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--seq %d, --micro-batch %d, --grad-accum %d and ranks %d must be > 0", seq,
                       micro_batch, grad_accum, ranks);
    uint64_t wide = (uint64_t)(s->vocab > s->ffn_dim ? s->vocab : s->ffn_dim), micro, step, inputs;
    if (!zo_mul_u64((uint64_t)seq, (uint64_t)micro_batch, &micro) ||
        micro > (uint64_t)INT32_MAX / wide)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--seq %d x --micro-batch %d tokens is too many for one GEMM: at most %llu "
                       "tokens per micro-batch with a %llu-wide operand; lower --micro-batch or "
                       "--seq (raise --grad-accum for a larger batch)",
                       seq, micro_batch, (unsigned long long)(INT32_MAX / wide),
                       (unsigned long long)wide);
    if (!zo_mul4_u64(micro, (uint64_t)grad_accum, (uint64_t)ranks, 1, &step) || step > INT32_MAX)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--seq %d x --micro-batch %d x --grad-accum %d x %d ranks is more than %d "
                       "tokens per step; lower --grad-accum",
                       seq, micro_batch, grad_accum, ranks, INT32_MAX);
    if (!zo_mul4_u64(step, (uint64_t)s->dim, (uint64_t)s->n_layers + 1, 4, &inputs) ||
        inputs > 1ull << 62)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--grad-accum %d: a step's layer inputs (%llu tokens x dim %d x %d layers) "
                       "overflow a byte count; lower --grad-accum or --micro-batch",
                       grad_accum, (unsigned long long)step, s->dim, s->n_layers + 1);
    return ZO_OK;
}

zo_status zt_model_config_check(const zt_model_config *c)
{
    ZT_TRY(zt_shape_check(&c->shape));
    if (c->seq <= 0 || c->micro_batch <= 0 || c->n_micro <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "seq %d, micro-batch %d and micro-batches %d must be > 0", c->seq,
                       c->micro_batch, c->n_micro);
    ZT_TRY(zt_job_sizes_check(&c->shape, c->seq, c->micro_batch, 1, 1));
    if (c->layout.struct_size && !c->flash)
        return zt_fail(ZO_ERR_CONFIG, "sparse_attention is a block layout of the fused attention "
                                      "op: use --attention flash, not dense");
    if (c->layout.struct_size && zo_attn_layout_build(&c->layout, c->seq, NULL, 0, NULL, NULL) < 0)
        return zt_fail(ZO_ERR_CONFIG, "sparse_attention: %s", zt_lib_message());
    if (!c->flash && c->shape.window && c->shape.window < c->seq)
        return zt_fail(ZO_ERR_CONFIG,
                       "the model's sliding window %d is shorter than the sequence %d: the dense "
                       "attention op is full causal; use --attention flash (it applies the "
                       "window) or --seq %d or less",
                       c->shape.window, c->seq, c->shape.window);
    if (c->dt != ZO_DTYPE_F32 && c->dt != ZO_DTYPE_BF16 && c->dt != ZO_DTYPE_F16)
        return zt_fail(ZO_ERR_INVALID_ARG, "unknown activation dtype %d", (int)c->dt);
    if (c->seq_par > 1 && c->seq % c->seq_par != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--sequence-parallel splits each sequence over the %d tensor-parallel "
                       "ranks, but --seq %d is not a multiple of %d: use --seq %d or %d",
                       c->seq_par, c->seq, c->seq_par, c->seq / c->seq_par * c->seq_par,
                       (c->seq / c->seq_par + 1) * c->seq_par);
    return ZO_OK;
}

zo_status zt_act_group_check(const zt_act_group *g)
{
    if (g && (g->micro_group < 0 || (g->act_home != ZT_ACT_DEVICE && g->act_home != ZT_ACT_HOST &&
                                     g->act_home != ZT_ACT_NVME)))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "micro-group %d (expected >= 0) and activation home %d (expected device, "
                       "host or nvme)",
                       g->micro_group, g->act_home);
    return ZO_OK;
}

int zt_model_group(const zt_model_config *c, const zt_act_group *g)
{
    if (!g || g->micro_group <= 1 || c->n_micro <= 1)
        return 1;
    return g->micro_group < c->n_micro ? g->micro_group : c->n_micro;
}

/* The sets of layer inputs the arena holds: one per micro-batch of a group
 * when they stay on the device, else one. */
static int device_sets(const zt_model_config *c, const zt_act_group *g)
{
    return g && g->act_home == ZT_ACT_DEVICE ? zt_model_group(c, g) : 1;
}

uint64_t zt_model_res_rows(const zt_model_config *c)
{
    uint64_t T = (uint64_t)c->micro_batch * c->seq;
    return c->seq_par > 1 ? T / (uint64_t)c->seq_par : T;
}

static uint64_t ckpt_stride(const zt_model_config *c)
{
    uint64_t T = zt_model_res_rows(c);
    return (T * c->shape.dim * zo_dtype_size(c->dt) + 255) / 256 * 256;
}

uint64_t zt_head_grad_stride(const zt_model_config *c)
{
    if (!c->shape.tied)
        return 0;
    const uint64_t d = c->shape.dim, es = zo_dtype_size(c->dt);
    return ((uint64_t)c->shape.vocab * d * es + 255) / 256 * 256 + (d * es + 255) / 256 * 256;
}

uint64_t zt_model_act_stride(const zt_model_config *c)
{
    return ckpt_stride(c);
}

uint64_t zt_model_act_extent(const zt_model_config *c)
{
    uint64_t bytes = zt_model_res_rows(c) * c->shape.dim * zo_dtype_size(c->dt);
    return (bytes + 4095) / 4096 * 4096;
}

/* A group's layer inputs leave the device (act_home host or nvme). */
static int staged_group(const zt_model_config *c, const zt_act_group *g)
{
    return g && g->act_home != ZT_ACT_DEVICE && zt_model_group(c, g) > 1;
}

int zt_act_per_layer(const zt_model_config *c, const zt_act_group *g)
{
    return g && g->act_home == ZT_ACT_HOST && zt_model_group(c, g) == 1;
}

uint64_t zt_model_host_activation_bytes(const zt_model_config *c, const zt_act_group *g)
{
    if (zt_act_per_layer(c, g))
        return (uint64_t)c->shape.n_layers * ckpt_stride(c);
    if (!staged_group(c, g))
        return 0;
    if (g->act_home == ZT_ACT_NVME)
        return ZT_ACT_RING_SLOTS * ((ckpt_stride(c) + 4095) / 4096 * 4096);
    return (uint64_t)zt_model_group(c, g) *
           (((uint64_t)c->shape.n_layers + 2) * ckpt_stride(c) + zt_head_grad_stride(c));
}

uint64_t zt_model_act_carry_bytes(const zt_model_config *c, const zt_act_group *g)
{
    if (!staged_group(c, g) || g->act_home != ZT_ACT_NVME)
        return 0;
    return (uint64_t)zt_model_group(c, g) * ckpt_stride(c);
}

uint64_t zt_model_act_nvme_bytes(const zt_model_config *c, const zt_act_group *g)
{
    if (!staged_group(c, g) || g->act_home != ZT_ACT_NVME)
        return 0;
    return (uint64_t)zt_model_group(c, g) * (uint64_t)c->shape.n_layers * zt_model_act_extent(c);
}

/* ---- the arena: one region carved into named pieces ---- */

/* Carving walks the arena with a cursor, each piece 256-byte aligned. */
static uint64_t carve(uint64_t *off, uint64_t bytes)
{
    uint64_t at = *off;
    *off += (bytes + 255) / 256 * 256;
    return at;
}

/* The sparse layout's block mask: nb x nb bytes (a checked config's layout). */
static uint64_t mask_bytes(const zt_model_config *c)
{
    uint64_t nb = ((uint64_t)c->seq + (uint64_t)c->layout.block - 1) / (uint64_t)c->layout.block;
    return c->layout.block > 0 ? nb * nb : 0;
}

static void carve_block(uint64_t *off, const zt_model_config *c, zt_block_offsets *b, size_t es)
{
    const uint64_t T = (uint64_t)c->micro_batch * c->seq, d = c->shape.dim, f = c->shape.ffn_dim;
    /* The materialized op's probabilities (seq x seq per head), or the fused
     * op's log-sum-exp and delta (fp32, seq per head). */
    const uint64_t rows = (uint64_t)c->micro_batch * c->shape.n_heads * c->seq;
    const uint64_t att = c->flash ? rows * sizeof(float) : rows * c->seq * es;
    const uint64_t q = (uint64_t)zt_q_dim(&c->shape), kv = (uint64_t)zt_kv_dim(&c->shape);
    /* flash: d(attn_out) takes x2's piece, dead once the MLP half's backward is done */
    const uint64_t x2 = c->flash && q > d ? q : d;
    uint64_t *td[] = {&b->q, &b->attn_out, &b->x2, &b->dq};
    const uint64_t width[] = {q, q, x2, q};
    /* flash: the fused backward writes dq over attn_out (read only for its
     * delta, before) and dk, dv over k, v in place (zo_op_flash_attention_bwd) */
    const size_t n_td = c->flash ? 3 : 4;
    /* sequence parallel: x2 is the rank's rows of the residual stream, unless
     * it holds d(attn_out) (flash) */
    const uint64_t td_rows[] = {T, T, c->flash ? T : zt_model_res_rows(c), T};
    for (size_t i = 0; i < n_td; i++)
        *td[i] = carve(off, td_rows[i] * width[i] * es);
    b->dattn = c->flash ? b->x2 : 0;
    /* The key/value heads and their gradients; the materialized op under
     * grouped-query attention also needs them repeated to the query heads
     * (k, v, dk, dv; without GQA, or with the fused op, they are the same). */
    uint64_t *kvs[] = {&b->kc, &b->vc, &b->dkc, &b->dvc};
    for (size_t i = 0; i < (c->flash ? 2u : 4u); i++)
        *kvs[i] = carve(off, T * kv * es);
    if (c->flash) {
        b->dq = b->attn_out;
        b->dkc = b->kc;
        b->dvc = b->vc;
    }
    if (kv != q && !c->flash) {
        b->k = carve(off, T * q * es);
        b->v = carve(off, T * q * es);
        b->dk = carve(off, T * q * es);
        b->dv = carve(off, T * q * es);
    } else {
        b->k = b->kc, b->v = b->vc, b->dk = b->dkc, b->dv = b->dvc;
    }
    /* The norms' outputs (the attention half's h1, the MLP half's h2: never
     * live at once) and the MLP's ffn-wide buffers hold one chunk of rows. */
    const uint64_t C = zt_mlp_chunk_rows(c);
    b->h1 = b->h2 = carve(off, C * d * es);
    b->gate = carve(off, C * f * es);
    b->up = carve(off, C * f * es);
    b->act = carve(off, C * f * es);
    b->att = carve(off, att);
    b->datt = carve(off, att);
    b->rstd1 = carve(off, T * sizeof(float));
    b->rstd2 = carve(off, T * sizeof(float));
}

/* A chunk limit from the environment: a positive byte count, else the default. */
static uint64_t env_bytes(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long b = v ? strtoull(v, &end, 10) : 0;
    return v && *v && !*end && b > 0 ? (uint64_t)b : dflt;
}

/* The rows of a micro-batch's T whose `width` elements each fit in `bytes`: 1 to T. */
static uint64_t chunk_rows(const zt_model_config *c, uint64_t bytes, uint64_t width)
{
    const uint64_t T = (uint64_t)c->micro_batch * c->seq;
    uint64_t rows = bytes / (width * zo_dtype_size(c->dt));
    rows = rows ? rows : 1;
    return rows < T ? rows : T;
}

uint64_t zt_head_chunk_bytes(void)
{
    return env_bytes("ZO_HEAD_CHUNK_BYTES", ZT_HEAD_CHUNK_BYTES);
}

uint64_t zt_head_chunk_rows(const zt_model_config *c)
{
    return chunk_rows(c, zt_head_chunk_bytes(), (uint64_t)c->shape.vocab);
}

uint64_t zt_mlp_chunk_bytes(void)
{
    return env_bytes("ZO_MLP_CHUNK_BYTES", ZT_MLP_CHUNK_BYTES);
}

uint64_t zt_mlp_chunk_rows(const zt_model_config *c)
{
    uint64_t bytes = c->mlp_chunk_bytes ? c->mlp_chunk_bytes : zt_mlp_chunk_bytes();
    return chunk_rows(c, bytes, (uint64_t)c->shape.ffn_dim);
}

static void carve_head(uint64_t *off, const zt_model_config *c, zt_head_offsets *h, size_t es)
{
    const uint64_t T = (uint64_t)c->micro_batch * c->seq;
    h->hf = carve(off, T * c->shape.dim * es);
    h->logits = carve(off, zt_head_chunk_rows(c) * c->shape.vocab * es);
    h->rstd = carve(off, T * sizeof(float));
    h->row_loss = carve(off, T * sizeof(float));
}

/* The per-layer workspace is the largest of the block's, the head's and the
 * embedding gradient's, which are never live at the same time. */
void zt_activation_layout_of(const zt_model_config *c, zt_activation_layout *out)
{
    zt_activation_layout_group(c, NULL, out);
}

void zt_activation_layout_group(const zt_model_config *c, const zt_act_group *g,
                                zt_activation_layout *out)
{
    const uint64_t T = (uint64_t)c->micro_batch * c->seq, d = c->shape.dim;
    const size_t es = zo_dtype_size(c->dt);
    zt_activation_layout *a = out;
    uint64_t off = 0;
    a->tok_in = carve(&off, (uint64_t)c->n_micro * T * sizeof(int32_t));
    a->tok_tgt = carve(&off, (uint64_t)c->n_micro * T * sizeof(int32_t));
    a->losses = carve(&off, (uint64_t)c->n_micro * sizeof(float));
    a->rope = carve(&off, (uint64_t)c->seq * zt_head_dim(&c->shape) * sizeof(float));
    a->block_mask = c->layout.struct_size ? carve(&off, mask_bytes(c)) : 0;
    uint64_t ck0 = off, sets = (uint64_t)device_sets(c, g), L1 = (uint64_t)c->shape.n_layers + 1;
    a->ckpt_stride = ckpt_stride(c);
    /* a staged group computes on two pairs of slots taken from the one set
     * (ckpt 0..2 and dres): one layer's worth of depth is not always enough */
    if (staged_group(c, g) && L1 < 3)
        L1 = 3;
    /* per layer: two slots that a block's input and output alternate in */
    if (zt_act_per_layer(c, g))
        L1 = 2;
    /* set j's inputs at ckpt + j (L+1) strides, its residual gradient at dres + j strides */
    a->ckpt = carve(&off, a->ckpt_stride * L1 * sets);
    a->dres = carve(&off, a->ckpt_stride * (sets - 1) + zt_model_res_rows(c) * d * es);
    a->sp_all = a->sp_grad = a->sp_own = 0;
    if (c->seq_par > 1) {
        a->sp_all = carve(&off, T * d * es);
        a->sp_grad = carve(&off, T * d * es);
        a->sp_own = carve(&off, zt_model_res_rows(c) * d * es);
    }
    /* tied: the head's gradients wait for the embedding's backward, per set */
    a->head_stride = zt_head_grad_stride(c);
    a->head_grad = a->head_stride ? carve(&off, a->head_stride * sets) : 0;
    a->head_norm_grad =
        a->head_stride ? a->head_grad + ((uint64_t)c->shape.vocab * d * es + 255) / 256 * 256 : 0;
    uint64_t ws0 = off;
    carve_block(&off, c, &a->block, es);
    uint64_t end = off;
    off = ws0;
    carve_head(&off, c, &a->head, es);
    if (off > end)
        end = off;
    off = ws0;
    a->emb_grad = carve(&off, (uint64_t)c->shape.vocab * d * sizeof(float));
    if (off > end)
        end = off;
    a->parts = (zt_activation_parts){end, ck0, ws0 - ck0, end - ws0};
}

uint64_t zt_model_activation_bytes(const zt_model_config *c)
{
    zt_activation_layout a;
    zt_activation_layout_of(c, &a);
    return a.parts.total;
}

uint64_t zt_model_activation_bytes_group(const zt_model_config *c, const zt_act_group *g)
{
    zt_activation_layout a;
    zt_activation_layout_group(c, g, &a);
    return a.parts.total;
}

void zt_model_activation_parts_group(const zt_model_config *c, const zt_act_group *g,
                                     zt_activation_parts *out)
{
    zt_activation_layout a;
    zt_activation_layout_group(c, g, &a);
    *out = a.parts;
}

void zt_model_activation_parts(const zt_model_config *c, zt_activation_parts *out)
{
    zt_activation_layout a;
    zt_activation_layout_of(c, &a);
    *out = a.parts;
}
