/* The keys of a Hugging Face LLaMA-family config.json that shape the model
 * (hf_config.h). */
#include "hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_error.h"
#include "zt_json.h"

static zo_status int_key(json_t *root, const char *path, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 30)
        return zt_fail(ZO_ERR_CONFIG, "%s: '%s' must be a positive integer", path, key);
    *out = (int)json_integer_value(v);
    return ZO_OK;
}

/* An optional positive integer: absent or null leaves *out. */
static zo_status optional_int(json_t *root, const char *path, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? int_key(root, path, key, out) : ZO_OK;
}

/* Grouped-query attention shares each key/value head among heads / kv
 * heads query heads: kv heads must divide the heads. */
static zo_status read_kv_heads(json_t *root, const char *path, zt_shape *s)
{
    json_t *v = json_object_get(root, "num_key_value_heads");
    if (!v || json_is_null(v))
        return ZO_OK;
    json_int_t kv = json_is_integer(v) ? json_integer_value(v) : 0;
    if (kv <= 0 || kv > s->n_heads || s->n_heads % kv)
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'num_key_value_heads' %lld must divide 'num_attention_heads' %d", path,
                       (long long)kv, s->n_heads);
    s->n_kv_heads = (int)kv == s->n_heads ? 0 : (int)kv;
    return ZO_OK;
}

/* An optional real number in (lo, hi): absent or null leaves *out (the
 * model's default); anything else present must be valid, never replaced by
 * the default in silence (a bad eps trained like the unmodified model). */
static zo_status optional_real(json_t *root, const char *path, const char *key, double lo,
                               double hi, const char *valid, float *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return ZO_OK;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (isfinite(x) && x > lo && x < hi && isfinite((float)x) && (float)x > 0) {
        *out = (float)x;
        return ZO_OK;
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    zo_status st = zt_fail(ZO_ERR_CONFIG, "%s: '%s' is %.64s: expected %s", path, key,
                           text ? text : "(unprintable)", valid);
    free(text);
    return st;
}

/* An optional boolean: absent or null is false; anything but true or false
 * is refused ("yes" used to mean false). */
static zo_status optional_bool(json_t *root, const char *path, const char *key)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_boolean(v))
        return ZO_OK;
    return zt_fail(ZO_ERR_CONFIG, "%s: '%s' must be true or false", path, key);
}

#define EPS_VALID   "a number > 0 and < 1 (1e-5 or 1e-6 in Llama models)"
#define THETA_VALID "a number > 1 (10000 in Llama 2, 500000 in Llama 3)"

static int string_in(json_t *v, const char *const *names, int n)
{
    for (int i = 0; json_is_string(v) && i < n; i++)
        if (strcmp(json_string_value(v), names[i]) == 0)
            return 1;
    return 0;
}

/* The family: model_type and architectures, when present, must be ours;
 * *llama when they say Llama or nothing. */
static zo_status check_family(json_t *root, const char *path, int *qwen2, int *llama)
{
    static const char *const types[] = {"llama", "mistral", "qwen2"};
    static const char *const archs[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                        "Qwen2ForCausalLM"};
    json_t *t = json_object_get(root, "model_type"), *a = json_object_get(root, "architectures");
    if (t && !string_in(t, types, 3))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'model_type' %s is not one of llama, mistral, qwen2",
                       path, json_is_string(t) ? json_string_value(t) : "(not a string)");
    json_t *a0 = json_array_get(a, 0);
    if (a && (json_array_size(a) != 1 || !string_in(a0, archs, 3)))
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'architectures' must be one of LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM",
                       path);
    *qwen2 = (t && strcmp(json_string_value(t), "qwen2") == 0) ||
             (a0 && strcmp(json_string_value(a0), "Qwen2ForCausalLM") == 0);
    *llama = (!t || strcmp(json_string_value(t), "llama") == 0) &&
             (!a0 || strcmp(json_string_value(a0), "LlamaForCausalLM") == 0);
    return ZO_OK;
}

/* Keys that would make another model than ours. */
static zo_status check_refused(json_t *root, const char *path, int qwen2, int llama)
{
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'hidden_act' must be silu (SwiGLU)", path);
    if (json_is_true(json_object_get(root, "mlp_bias")))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'mlp_bias' true: MLP biases are not supported", path);
    if (!qwen2 && !llama && json_is_true(json_object_get(root, "attention_bias")))
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'attention_bias' true is Llama's (q, k, v and o_proj biases); this "
                       "model_type has none: remove it or use model_type llama",
                       path);
    json_t *prf = json_object_get(root, "partial_rotary_factor");
    if (prf && !(json_is_number(prf) && json_number_value(prf) == 1.0))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'partial_rotary_factor' must be 1 (RoPE on every pair)",
                       path);
    return ZO_OK;
}

static zo_status real_in(json_t *obj, const char *path, const char *key, float *out)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'rope_scaling.%s' must be a positive number", path, key);
    *out = (float)json_number_value(v);
    return ZO_OK;
}

/* An optional positive number in the rope_scaling object: absent, null or 0
 * leaves *out (transformers reads beta_fast and beta_slow with `or`). */
static zo_status optional_real_in(json_t *obj, const char *path, const char *key, float *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || (json_is_number(v) && json_number_value(v) == 0))
        return ZO_OK;
    return real_in(obj, path, key, out);
}

/* The model's max_position_embeddings, which dynamic scaling grows theta
 * past and YaRN falls back on. */
static zo_status max_positions(json_t *root, const char *path, const char *type, int *out)
{
    json_t *v = json_object_get(root, "max_position_embeddings");
    if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= 1 << 30) {
        *out = (int)json_integer_value(v);
        return ZO_OK;
    }
    return zt_fail(ZO_ERR_CONFIG,
                   "%s: 'rope_scaling' type '%s' needs 'max_position_embeddings', a positive "
                   "integer",
                   path, type);
}

/* transformers' get_mscale: 0.1 m ln(scale) + 1 above scale 1. */
static double yarn_mscale(double scale, double m)
{
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* YaRN as transformers' _compute_yarn_parameters reads it: the pretraining
 * length from rope_scaling (else the model's top-level
 * original_max_position_embeddings, as Phi-3 keeps it, else
 * max_position_embeddings), factor from it or their ratio, the attention
 * factor given or from factor, mscale and mscale_all_dim. */
static zo_status read_yarn(json_t *root, json_t *r, const char *path, zo_rope_scaling *sc)
{
    sc->type = ZO_ROPE_SCALING_YARN;
    int max = 0;
    float omp = 0, mscale = 0, mscale_all = 0;
    json_t *top = json_object_get(root, "original_max_position_embeddings");
    if (json_object_get(r, "original_max_position_embeddings"))
        ZT_TRY(real_in(r, path, "original_max_position_embeddings", &omp));
    else if (json_is_integer(top) && json_integer_value(top) > 0)
        omp = (float)json_integer_value(top);
    if (!(omp > 0) || !json_object_get(r, "factor"))
        ZT_TRY(max_positions(root, path, "yarn", &max));
    sc->original_max_pos = omp > 0 ? (int)omp : max;
    if (json_object_get(r, "factor"))
        ZT_TRY(real_in(r, path, "factor", &sc->factor));
    else
        sc->factor = (float)max / (float)sc->original_max_pos;
    sc->beta_fast = 32.0f, sc->beta_slow = 1.0f;
    ZT_TRY(optional_real_in(r, path, "beta_fast", &sc->beta_fast));
    ZT_TRY(optional_real_in(r, path, "beta_slow", &sc->beta_slow));
    ZT_TRY(optional_real_in(r, path, "mscale", &mscale));
    ZT_TRY(optional_real_in(r, path, "mscale_all_dim", &mscale_all));
    sc->attention_factor =
        mscale > 0 && mscale_all > 0
            ? (float)(yarn_mscale(sc->factor, mscale) / yarn_mscale(sc->factor, mscale_all))
            : (float)yarn_mscale(sc->factor, 1.0);
    json_t *af = json_object_get(r, "attention_factor");
    if (af && !json_is_null(af))
        ZT_TRY(real_in(r, path, "attention_factor", &sc->attention_factor));
    json_t *tr = json_object_get(r, "truncate");
    if (tr && !json_is_boolean(tr))
        return zt_fail(ZO_ERR_CONFIG, "%s: 'rope_scaling.truncate' must be true or false", path);
    sc->no_truncate = json_is_false(tr);
    return ZO_OK;
}

/* rope_scaling: null, or {"rope_type" (or "type"): "default", "linear", "llama3", "yarn" or
 * "dynamic", ...}; transformers 5 writes rope_parameters instead, the same keys with rope_theta. */
static zo_status read_rope_scaling(json_t *root, const char *path, zo_rope_scaling *sc,
                                   float *theta)
{
    json_t *r = json_object_get(root, "rope_scaling");
    json_t *params = json_object_get(root, "rope_parameters");
    if ((!r || json_is_null(r)) && json_is_object(params)) {
        r = params;
        ZT_TRY(optional_real(params, path, "rope_theta", 1, 1e30, THETA_VALID, theta));
    }
    if (!r || json_is_null(r))
        return ZO_OK;
    json_t *t = json_object_get(r, "rope_type");
    if (!t)
        t = json_object_get(r, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    if (strcmp(type, "default") == 0)
        return ZO_OK;
    if (strcmp(type, "linear") == 0) {
        sc->type = ZO_ROPE_SCALING_LINEAR;
        return real_in(r, path, "factor", &sc->factor);
    }
    if (strcmp(type, "yarn") == 0)
        return read_yarn(root, r, path, sc);
    if (strcmp(type, "dynamic") == 0) {
        sc->type = ZO_ROPE_SCALING_DYNAMIC;
        ZT_TRY(max_positions(root, path, type, &sc->original_max_pos));
        return real_in(r, path, "factor", &sc->factor);
    }
    if (strcmp(type, "llama3") != 0)
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'rope_scaling' type '%s' is not supported; expected llama3, yarn, "
                       "dynamic or linear",
                       path, type);
    sc->type = ZO_ROPE_SCALING_LLAMA3;
    float omp = 0;
    ZT_TRY(real_in(r, path, "factor", &sc->factor));
    ZT_TRY(real_in(r, path, "low_freq_factor", &sc->low_freq_factor));
    ZT_TRY(real_in(r, path, "high_freq_factor", &sc->high_freq_factor));
    ZT_TRY(real_in(r, path, "original_max_position_embeddings", &omp));
    sc->original_max_pos = (int)omp;
    return ZO_OK;
}

/* Qwen2's windowed layers: layer_types as written (full_attention layers
 * then sliding_attention ones, the only order one first layer can say), else
 * transformers' default, the layers from max_window_layers (28) on. */
static zo_status qwen2_window_from(json_t *root, const char *path, int n_layers, int *from)
{
    json_t *types = json_object_get(root, "layer_types");
    *from = 28;
    if (!types || json_is_null(types)) {
        json_t *m = json_object_get(root, "max_window_layers");
        if (!m || json_is_null(m))
            return ZO_OK;
        if (!json_is_integer(m) || json_integer_value(m) < 0 || json_integer_value(m) > 1 << 30)
            return zt_fail(ZO_ERR_CONFIG, "%s: 'max_window_layers' must be an integer >= 0", path);
        *from = (int)json_integer_value(m);
        return ZO_OK;
    }
    size_t i, n = json_array_size(types);
    for (i = 0; i < n && json_is_string(json_array_get(types, i)) &&
                strcmp(json_string_value(json_array_get(types, i)), "full_attention") == 0;
         i++)
        ;
    *from = (int)i;
    for (; i < n && json_is_string(json_array_get(types, i)) &&
           strcmp(json_string_value(json_array_get(types, i)), "sliding_attention") == 0;
         i++)
        ;
    if (!json_is_array(types) || n != (size_t)n_layers || i != n)
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'layer_types' must list %d layers, full_attention ones then "
                       "sliding_attention ones",
                       path, n_layers);
    return ZO_OK;
}

/* Mistral's sliding_window (every layer), Qwen2's only with
 * use_sliding_window (the layers from s->window_from on); Llama has none
 * (transformers ignores the key there). */
static zo_status read_window(json_t *root, const char *path, int qwen2, int llama, zt_shape *s,
                             int *window)
{
    *window = 0;
    json_t *w = json_object_get(root, "sliding_window");
    if (!w || json_is_null(w) || llama ||
        (qwen2 && !json_is_true(json_object_get(root, "use_sliding_window"))))
        return ZO_OK;
    ZT_TRY(int_key(root, path, "sliding_window", window));
    if (qwen2)
        ZT_TRY(qwen2_window_from(root, path, s->n_layers, &s->window_from));
    if (s->window_from < s->n_layers)
        s->window = *window;
    else
        s->window_from = 0; /* no layer has the window */
    return ZO_OK;
}

static zo_status read_shape(json_t *root, const char *path, zt_shape *s, int *window)
{
    int qwen2 = 0, llama = 0;
    ZT_TRY(check_family(root, path, &qwen2, &llama));
    ZT_TRY(check_refused(root, path, qwen2, llama));
    ZT_TRY(int_key(root, path, "hidden_size", &s->dim));
    ZT_TRY(int_key(root, path, "num_hidden_layers", &s->n_layers));
    ZT_TRY(int_key(root, path, "num_attention_heads", &s->n_heads));
    ZT_TRY(int_key(root, path, "intermediate_size", &s->ffn_dim));
    ZT_TRY(read_kv_heads(root, path, s));
    ZT_TRY(int_key(root, path, "vocab_size", &s->vocab));
    ZT_TRY(optional_int(root, path, "head_dim", &s->head_dim));
    if (s->head_dim && s->head_dim * s->n_heads == s->dim)
        s->head_dim = 0; /* the default: the Llama-2 layout */
    ZT_TRY(optional_real(root, path, "rms_norm_eps", 0, 1, EPS_VALID, &s->norm_eps));
    ZT_TRY(optional_real(root, path, "rope_theta", 1, 1e30, THETA_VALID, &s->rope_theta));
    static const char *const flags[] = {"tie_word_embeddings", "use_sliding_window", "mlp_bias",
                                        "attention_bias"};
    for (int i = 0; i < 4; i++)
        ZT_TRY(optional_bool(root, path, flags[i]));
    ZT_TRY(read_rope_scaling(root, path, &s->rope_scaling, &s->rope_theta));
    ZT_TRY(read_window(root, path, qwen2, llama, s, window));
    /* Qwen2: q, k and v biases; Llama's attention_bias: o_proj's too */
    s->o_bias = !qwen2 && json_is_true(json_object_get(root, "attention_bias"));
    s->attn_bias = qwen2 || s->o_bias;
    s->tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    return ZO_OK;
}

zo_status zt_read_hf_config_window(const char *path, zt_shape *out, int *window, char *note,
                                   size_t cap)
{
    json_t *root;
    ZT_TRY(zt_json_read(path, 0, &root));
    zt_shape s = {0};
    s.norm_eps = 1e-5f;
    s.rope_theta = 10000.0f;
    int w = 0;
    zo_status st =
        json_is_object(root) ? ZO_OK : zt_fail(ZO_ERR_CONFIG, "%s: not a JSON object", path);
    if (st >= 0)
        st = read_shape(root, path, &s, &w);
    if (st >= 0) {
        note[0] = 0;
        if (s.tied)
            snprintf(note, cap,
                     "tied output head: the embedding's matrix, one tensor, counted and trained "
                     "once");
        *out = s;
        if (window)
            *window = w;
    }
    json_decref(root);
    return st;
}

zo_status zt_read_hf_config(const char *path, zt_shape *out, char *note, size_t cap)
{
    return zt_read_hf_config_window(path, out, NULL, note, cap);
}
