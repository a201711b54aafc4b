/* Hugging Face config.json as the model's shape: the published models'
 * parameter counts exactly (Llama-2-70B 68,976,648,192; Llama-3-8B
 * 8,030,261,248, from their config.json files), the variants' keys, and
 * every refused key named in the error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf_config.h"
#include "zo_test.h"
#include "zt_error.h"

static char g_path[256];

static zo_status read_json(const char *json, zt_shape *s, int *window, char *note)
{
    FILE *f = fopen(g_path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    return zt_read_hf_config_window(g_path, s, window, note, 256);
}

#define LLAMA2_70B                                                                                 \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": "     \
    "8192, \"intermediate_size\": 28672, \"num_attention_heads\": 64, \"num_hidden_layers\": 80, " \
    "\"num_key_value_heads\": 8, \"vocab_size\": 32000, \"rms_norm_eps\": 1e-05, "                 \
    "\"hidden_act\": \"silu\", \"pretraining_tp\": 1, \"rope_scaling\": null, "                    \
    "\"tie_word_embeddings\": false}"

#define LLAMA31_8B                                                                                 \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": "     \
    "4096, \"intermediate_size\": 14336, \"num_attention_heads\": 32, \"num_hidden_layers\": 32, " \
    "\"num_key_value_heads\": 8, \"vocab_size\": 128256, \"rms_norm_eps\": 1e-05, "                \
    "\"rope_theta\": 500000.0, \"attention_bias\": false, \"mlp_bias\": false, "                   \
    "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "    \
    "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "                     \
    "\"tie_word_embeddings\": false}"

static void test_published_counts(void **state)
{
    zt_shape s;
    char note[256];
    int w = -1;
    ZO_ASSERT_OK(read_json(LLAMA2_70B, &s, &w, note));
    ZO_ASSERT_OK(zt_shape_check(&s));
    assert_int_equal(zt_shape_n_params(&s), 68976648192ull); /* 68.98B */
    assert_int_equal(zt_kv_heads(&s), 8);
    assert_int_equal(zt_kv_dim(&s), 1024);
    assert_int_equal(w, 0);
    assert_string_equal(note, "");
    ZO_ASSERT_OK(read_json(LLAMA31_8B, &s, &w, note)); /* Llama 3 and 3.1 8B: the same count */
    ZO_ASSERT_OK(zt_shape_check(&s));
    assert_int_equal(zt_shape_n_params(&s), 8030261248ull); /* 8.03B */
    assert_int_equal(s.rope_scaling.type, ZO_ROPE_SCALING_LLAMA3);
    assert_true(s.rope_scaling.factor == 8.0f && s.rope_scaling.high_freq_factor == 4.0f);
    assert_int_equal(s.rope_scaling.original_max_pos, 8192);
    assert_true(s.rope_theta == 500000.0f);
}

/* Qwen2: q/k/v biases, tied head counted once, head_dim, the window only with
 * use_sliding_window. */
static void test_qwen2_and_tied(void **state)
{
    zt_shape s;
    char note[256];
    int w = -1;
    ZO_ASSERT_OK(read_json("{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
                           "\"hidden_size\": 896, \"intermediate_size\": 4864, "
                           "\"num_attention_heads\": 14, \"num_hidden_layers\": 24, "
                           "\"num_key_value_heads\": 2, \"vocab_size\": 151936, "
                           "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
                           "\"sliding_window\": 32768, \"use_sliding_window\": false, "
                           "\"tie_word_embeddings\": true}",
                           &s, &w, note));
    ZO_ASSERT_OK(zt_shape_check(&s));
    assert_true(s.attn_bias && s.tied);
    assert_int_equal(w, 0);
    /* Qwen2.5-0.5B: 494,032,768 parameters */
    assert_int_equal(zt_shape_n_params(&s), 494032768ull);
    assert_non_null(strstr(note, "tied"));
    /* the engine's tensors: the head is the embedding's, one tensor in layer 0
     * beside the final norm; no layer of its own, no lm_head.weight; they add
     * up to the count */
    assert_int_equal(zt_engine_layers(&s), s.n_layers + 1);
    assert_int_equal(zt_layer_tensors(&s, 0), 2);
    uint64_t sum = 0;
    for (int l = 0; l < zt_engine_layers(&s); l++)
        for (int i = 0; i < zt_layer_tensors(&s, l); i++) {
            char name[160];
            int ndim;
            int64_t shape[2];
            zt_tensor_hf(&s, l, i, name, sizeof name, &ndim, shape);
            assert_null(strstr(name, "lm_head"));
            sum += zt_tensor_numel(&s, l, i);
        }
    assert_int_equal(sum, 494032768ull);
    char name[160];
    int ndim;
    int64_t shape[2];
    zt_tensor_hf(&s, 0, ZT_TIED_NORM, name, sizeof name, &ndim, shape);
    assert_string_equal(name, "model.norm.weight");
    assert_int_equal(ndim, 1);
    assert_int_equal(shape[0], 896);
    ZO_ASSERT_OK(read_json("{\"model_type\": \"mistral\", \"hidden_size\": 64, "
                           "\"intermediate_size\": 96, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 50, \"head_dim\": 32, "
                           "\"sliding_window\": 4096}",
                           &s, &w, note));
    assert_int_equal(zt_head_dim(&s), 32);
    assert_int_equal(zt_q_dim(&s), 128);
    assert_int_equal(w, 4096);
    assert_int_equal(s.window, 4096);
    assert_int_equal(s.window_from, 0);
}

#define QWEN2_WINDOW(extra)                                                                        \
    "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 96, "                 \
    "\"num_attention_heads\": 4, \"num_hidden_layers\": 3, \"vocab_size\": 50, "                   \
    "\"sliding_window\": 8, \"use_sliding_window\": true" extra "}"

/* Qwen2's window on the layers from max_window_layers (default 28), or as
 * layer_types lists them (full_attention layers first); Llama has none. */
static void test_qwen2_window_layers(void **state)
{
    zt_shape s;
    char note[256];
    int w = -1;
    ZO_ASSERT_OK(read_json(QWEN2_WINDOW(""), &s, &w, note)); /* 28 of 3: no layer */
    assert_int_equal(w, 8);
    assert_true(s.window == 0 && s.window_from == 0);
    ZO_ASSERT_OK(read_json(QWEN2_WINDOW(", \"max_window_layers\": 0"), &s, &w, note));
    assert_true(s.window == 8 && s.window_from == 0);
    ZO_ASSERT_OK(read_json(QWEN2_WINDOW(", \"max_window_layers\": 2"), &s, &w, note));
    assert_true(s.window == 8 && s.window_from == 2);
    ZO_ASSERT_OK(read_json(QWEN2_WINDOW(", \"max_window_layers\": 28, \"layer_types\": "
                                        "[\"full_attention\", \"sliding_attention\", "
                                        "\"sliding_attention\"]"),
                           &s, &w, note));
    assert_true(s.window == 8 && s.window_from == 1);
    const char *bad[] = {", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                         "\"sliding_attention\"]",
                         ", \"layer_types\": [\"full_attention\"]",
                         ", \"layer_types\": \"sliding_attention\""};
    char json[600];
    for (int i = 0; i < 3; i++) {
        snprintf(json, sizeof json, QWEN2_WINDOW("%s"), bad[i]);
        assert_int_equal(read_json(json, &s, &w, note), ZO_ERR_CONFIG);
        assert_non_null(strstr(zt_last_error(), "'layer_types' must list 3 layers, full_attention "
                                                "ones then sliding_attention ones"));
    }
    assert_int_equal(read_json(QWEN2_WINDOW(", \"max_window_layers\": -1"), &s, &w, note),
                     ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "'max_window_layers' must be an integer >= 0"));
    ZO_ASSERT_OK(read_json("{\"model_type\": \"llama\", \"hidden_size\": 64, "
                           "\"intermediate_size\": 96, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 50, "
                           "\"sliding_window\": 8}",
                           &s, &w, note));
    assert_true(w == 0 && s.window == 0);
}

/* transformers 5 writes rope_parameters (rope_theta inside) instead of
 * rope_theta and rope_scaling. */
static void test_rope_parameters(void **state)
{
    zt_shape s;
    char note[256];
    ZO_ASSERT_OK(read_json("{\"hidden_size\": 64, \"intermediate_size\": 96, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                           "\"vocab_size\": 50, \"rope_parameters\": {\"rope_type\": \"llama3\", "
                           "\"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                           "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}}",
                           &s, NULL, note));
    assert_true(s.rope_theta == 500000.0f);
    assert_int_equal(s.rope_scaling.type, ZO_ROPE_SCALING_LLAMA3);
    assert_int_equal(s.rope_scaling.original_max_pos, 16);
    ZO_ASSERT_OK(read_json("{\"hidden_size\": 64, \"intermediate_size\": 96, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                           "\"vocab_size\": 50, \"rope_parameters\": {\"rope_type\": \"default\", "
                           "\"rope_theta\": 20000.0}}",
                           &s, NULL, note));
    assert_true(s.rope_theta == 20000.0f);
    assert_int_equal(s.rope_scaling.type, ZO_ROPE_SCALING_NONE);
}

/* Qwen2.5's long-context setting (its README's rope_scaling, the old "type"
 * key) and DeepSeek-style mscale: the values transformers' YaRN derives. */
static void test_yarn_and_dynamic(void **state)
{
    zt_shape s;
    char note[256];
    /* Llama's attention_bias: q, k, v and o_proj biases, 4 x 64 + 64 parameters a block */
    ZO_ASSERT_OK(
        read_json("{\"model_type\": \"llama\", \"hidden_size\": 64, "
                  "\"intermediate_size\": 96, \"num_attention_heads\": 4, "
                  "\"num_hidden_layers\": 1, \"vocab_size\": 50, \"attention_bias\": true}",
                  &s, NULL, note));
    assert_true(s.attn_bias && s.o_bias);
    assert_int_equal(zt_layer_tensors(&s, 1), ZT_BLOCK_TENSORS_O_BIAS);
    zt_shape plain = s;
    plain.attn_bias = plain.o_bias = 0;
    assert_int_equal(zt_shape_n_params(&s) - zt_shape_n_params(&plain), 4 * 64);
    ZO_ASSERT_OK(read_json("{\"model_type\": \"qwen2\", \"hidden_size\": 64, "
                           "\"intermediate_size\": 96, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 50, \"rope_theta\": "
                           "1000000.0, \"max_position_embeddings\": 32768, \"rope_scaling\": "
                           "{\"factor\": 4.0, \"original_max_position_embeddings\": 32768, "
                           "\"type\": \"yarn\"}}",
                           &s, NULL, note));
    const zo_rope_scaling *sc = &s.rope_scaling;
    assert_int_equal(sc->type, ZO_ROPE_SCALING_YARN);
    assert_true(sc->factor == 4.0f && sc->original_max_pos == 32768);
    assert_true(sc->beta_fast == 32.0f && sc->beta_slow == 1.0f && !sc->no_truncate);
    assert_true(sc->attention_factor == (float)(0.1 * log(4.0) + 1.0));
    ZO_ASSERT_OK(zt_shape_check(&s));
    ZO_ASSERT_OK(read_json("{\"hidden_size\": 64, \"intermediate_size\": 96, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                           "\"vocab_size\": 50, \"max_position_embeddings\": 4096, "
                           "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40, "
                           "\"mscale\": 1.0, \"mscale_all_dim\": 0.5, \"beta_fast\": 16, "
                           "\"truncate\": false, \"original_max_position_embeddings\": 1024}}",
                           &s, NULL, note));
    assert_true(sc->attention_factor ==
                (float)((0.1 * log(40.0) + 1.0) / (0.1 * 0.5 * log(40.0) + 1.0)));
    assert_true(sc->beta_fast == 16.0f && sc->no_truncate == 1 && sc->original_max_pos == 1024);
    /* no factor: max_position_embeddings over the pretraining length */
    ZO_ASSERT_OK(read_json("{\"hidden_size\": 64, \"intermediate_size\": 96, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                           "\"vocab_size\": 50, \"max_position_embeddings\": 4096, "
                           "\"rope_scaling\": {\"rope_type\": \"yarn\", "
                           "\"original_max_position_embeddings\": 1024}}",
                           &s, NULL, note));
    assert_true(sc->factor == 4.0f);
    ZO_ASSERT_OK(read_json("{\"hidden_size\": 64, \"intermediate_size\": 96, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                           "\"vocab_size\": 50, \"max_position_embeddings\": 2048, "
                           "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}",
                           &s, NULL, note));
    assert_int_equal(sc->type, ZO_ROPE_SCALING_DYNAMIC);
    assert_true(sc->factor == 2.0f && sc->original_max_pos == 2048);
    ZO_ASSERT_OK(zt_shape_check(&s));
}

static void expect_refused(const char *extra, const char *key)
{
    char json[1024], note[256];
    snprintf(json, sizeof json,
             "{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_attention_heads\": 4, "
             "\"num_hidden_layers\": 1, \"vocab_size\": 50, %s}",
             extra);
    zt_shape s;
    assert_int_equal(read_json(json, &s, NULL, note), ZO_ERR_CONFIG);
    if (!strstr(zt_last_error(), key))
        fail_msg("refusing %s: the error '%s' does not name %s", extra, zt_last_error(), key);
}

static void test_refusals_name_the_key(void **state)
{
    expect_refused("\"model_type\": \"gpt2\"", "'model_type'");
    expect_refused("\"architectures\": [\"GemmaForCausalLM\"]", "'architectures'");
    expect_refused("\"hidden_act\": \"gelu\"", "'hidden_act'");
    expect_refused("\"mlp_bias\": true", "'mlp_bias'");
    expect_refused("\"model_type\": \"mistral\", \"attention_bias\": true", "'attention_bias'");
    expect_refused("\"partial_rotary_factor\": 0.5", "'partial_rotary_factor'");
    expect_refused("\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4}",
                   "'rope_scaling' type 'longrope'");
    expect_refused("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
                   "'max_position_embeddings'"); /* no pretraining length anywhere */
    expect_refused("\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2}",
                   "'max_position_embeddings'");
    expect_refused("\"max_position_embeddings\": 64, \"rope_scaling\": {\"rope_type\": "
                   "\"yarn\", \"factor\": 4, \"truncate\": 1}",
                   "'rope_scaling.truncate'");
    expect_refused("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}",
                   "'rope_scaling.low_freq_factor'");
    expect_refused("\"num_key_value_heads\": 3", "'num_key_value_heads'");
    expect_refused("\"head_dim\": -2", "'head_dim'");
}

int main(void)
{
    snprintf(g_path, sizeof g_path, "/tmp/zo_test_hf_config_%d.json", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),    cmocka_unit_test(test_qwen2_and_tied),
        cmocka_unit_test(test_qwen2_window_layers), cmocka_unit_test(test_rope_parameters),
        cmocka_unit_test(test_yarn_and_dynamic),    cmocka_unit_test(test_refusals_name_the_key),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_path);
    return rc;
}
