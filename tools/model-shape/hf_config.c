/* The keys of a LLaMA config.json that size the model (hf_config.h). */
#include "hf_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "zt_error.h"

static zo_status int_key(json_t *root, const char *path, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 30)
        return zt_fail(ZO_ERR_CONFIG, "%s: '%s' must be a positive integer", path, key);
    *out = (int)json_integer_value(v);
    return ZO_OK;
}

/* Grouped-query attention shares each key/value head among heads / kv
 * heads query heads: kv heads must divide the heads. */
static zo_status check_kv_heads(json_t *root, const char *path, int heads)
{
    json_t *v = json_object_get(root, "num_key_value_heads");
    if (!v || json_is_null(v))
        return ZO_OK;
    json_int_t kv = json_is_integer(v) ? json_integer_value(v) : 0;
    if (kv <= 0 || kv > heads || heads % kv)
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: 'num_key_value_heads' %lld must divide 'num_attention_heads' %d", path,
                       (long long)kv, heads);
    return ZO_OK;
}

static void optional_real(json_t *root, const char *key, float *out)
{
    json_t *v = json_object_get(root, key);
    if (json_is_number(v) && json_number_value(v) > 0)
        *out = (float)json_number_value(v);
}

static void describe_differences(json_t *root, const zt_shape *s, char *note, size_t cap)
{
    note[0] = 0;
    json_t *kv = json_object_get(root, "num_key_value_heads");
    int gqa =
        json_is_integer(kv) && json_integer_value(kv) > 0 && json_integer_value(kv) < s->n_heads;
    int tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    if (gqa || tied)
        snprintf(note, cap,
                 "zo-train's model has %s: planned with %s (more parameters than the original)",
                 gqa && tied ? "neither grouped-query attention nor a tied output head"
                 : gqa       ? "no grouped-query attention"
                             : "no tied output head",
                 gqa && tied ? "full multi-head attention and an untied head"
                 : gqa       ? "full multi-head attention"
                             : "an untied head");
}

zo_status zt_read_hf_config(const char *path, zt_shape *out, char *note, size_t cap)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return zt_fail(ZO_ERR_CONFIG, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    zt_shape s = {0};
    s.norm_eps = 1e-5f;
    s.rope_theta = 10000.0f;
    zo_status st =
        json_is_object(root) ? ZO_OK : zt_fail(ZO_ERR_CONFIG, "%s: not a JSON object", path);
    if (st >= 0)
        st = int_key(root, path, "hidden_size", &s.dim);
    if (st >= 0)
        st = int_key(root, path, "num_hidden_layers", &s.n_layers);
    if (st >= 0)
        st = int_key(root, path, "num_attention_heads", &s.n_heads);
    if (st >= 0)
        st = int_key(root, path, "intermediate_size", &s.ffn_dim);
    if (st >= 0)
        st = check_kv_heads(root, path, s.n_heads);
    if (st >= 0)
        st = int_key(root, path, "vocab_size", &s.vocab);
    if (st >= 0) {
        optional_real(root, "rms_norm_eps", &s.norm_eps);
        optional_real(root, "rope_theta", &s.rope_theta);
        describe_differences(root, &s, note, cap);
        *out = s;
    }
    json_decref(root);
    return st;
}
