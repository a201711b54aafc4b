/* Hugging Face directories in and out of zo-train (hf_io.h): a model saved
 * with zt_hf_save and read back with zt_hf_read_shape and zt_hf_load_weights
 * is bitwise the same model (shape, every weight, the loss of the next step
 * on the same batch), in fp32 and bf16 (bf16: the weights rounded as the
 * engine's 16-bit parameters are, so the loss is still bitwise the same), in
 * one file and in shards with the index, tied or not (a tied model is saved
 * as transformers saves one: tie_word_embeddings true, no lm_head.weight);
 * a tied config over weights that have lm_head.weight ignores it; a missing
 * tensor and a too-short sliding window are refused. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_io.h"
#include "train_test_util.h"
#include "zo_test.h"
#include "zt_error.h"

static char g_dir[256];

/* Each trainer with its own swap directory (two are open at once). */
/* The trainer of o, or NULL where zt_trainer_init refuses it (zt_last_error). */
static zt_trainer *trainer_or_null(const zt_options *o)
{
    static int k;
    static char dirs[8][300];
    zt_trainer *t = NULL;
    zt_options mine = *o;
    snprintf(dirs[k % 8], sizeof dirs[0], "%s/swap%d", g_dir, k);
    mkdir(dirs[k % 8], 0777);
    mine.default_nvme_dir = dirs[k++ % 8];
    return zt_trainer_init(&t, &mine) < 0 ? NULL : t;
}

static zt_trainer *trainer_of(const zt_options *o)
{
    zt_trainer *t = trainer_or_null(o);
    if (!t)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    return t;
}

/* The Hugging Face variants: GQA (4 heads on 2), head_dim 12, q/k/v biases,
 * llama3 RoPE scaling. */
static zt_options variant_options(int steps)
{
    zt_options o = zt_test_small_options(g_dir, steps);
    o.shape.n_kv_heads = 2;
    o.shape.head_dim = 12;
    o.shape.attn_bias = 1;
    o.shape.rope_scaling = (zo_rope_scaling){.type = ZO_ROPE_SCALING_LLAMA3,
                                             .factor = 8.0f,
                                             .low_freq_factor = 1.0f,
                                             .high_freq_factor = 4.0f,
                                             .original_max_pos = 64};
    return o;
}

static float step(zt_trainer *t)
{
    float loss;
    zo_step_stats st;
    ZO_ASSERT_OK(zt_trainer_step(t, &loss, &st));
    return loss;
}

static float *weights(zt_trainer *t, int l, int i)
{
    const zt_shape *s = &zt_trainer_options(t)->shape;
    float *w = malloc(zt_tensor_numel(s, l, i) * sizeof *w);
    assert_non_null(w);
    ZO_ASSERT_OK(zt_trainer_read_weights(t, l, i, w));
    return w;
}

static void round_bf16(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = zo_bf16_to_f32(zo_f32_to_bf16(w[i]));
}

static int count_files(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Train a, save it, load b from the directory, compare, step both on the same batch. */
static void round_trip(zo_dtype dt, uint64_t shard_bytes, int want_shards, int tied)
{
    char hf[300];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    zt_options o = variant_options(4);
    o.shape.tied = tied;
    zt_trainer *a = trainer_of(&o);
    step(a);
    step(a);
    ZO_ASSERT_OK(zt_hf_save(a, hf, dt, shard_bytes));
    assert_int_equal(count_files(hf, "model"), want_shards + (want_shards > 1));
    zt_options ob = o;
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_memory_equal(&ob.shape, &o.shape, sizeof o.shape);
    zt_trainer *b = trainer_of(&ob);
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf));
    const zt_shape *s = &o.shape;
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            float *wa = weights(a, l, i), *wb = weights(b, l, i);
            if (dt == ZO_DTYPE_BF16)
                round_bf16(wa, zt_tensor_numel(s, l, i));
            assert_memory_equal(wa, wb, zt_tensor_numel(s, l, i) * sizeof *wa);
            free(wa), free(wb);
        }
    zt_train_state ts;
    zt_trainer_get_state(a, &ts);
    ZO_ASSERT_OK(zt_trainer_set_state(b, &ts));
    float la = step(a), lb = step(b);
    assert_memory_equal(&la, &lb, sizeof la);
    zt_trainer_free(a);
    zt_trainer_free(b);
}

static void test_round_trip_fp32_one_file(void **state)
{
    round_trip(ZO_DTYPE_F32, 5000000000ull, 1, 0);
}

static void test_round_trip_bf16_shards(void **state)
{
    /* 8 KiB shards: 9 of them (the 16 KiB embedding and head each alone) */
    round_trip(ZO_DTYPE_BF16, 8192, 9, 0);
}

/* A tied model: saved with tie_word_embeddings true and no lm_head.weight
 * (8 shards: the head's is gone), read back tied, bitwise. */
static void test_round_trip_tied(void **state)
{
    round_trip(ZO_DTYPE_BF16, 8192, 8, 1);
    char p[400];
    snprintf(p, sizeof p, "%s/hf-model/config.json", g_dir);
    json_t *c = json_load_file(p, 0, NULL);
    assert_non_null(c);
    assert_true(json_is_true(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
    snprintf(p, sizeof p, "%s/hf-model/model.safetensors.index.json", g_dir);
    json_t *index = json_load_file(p, 0, NULL);
    assert_non_null(index);
    json_t *map = json_object_get(index, "weight_map");
    assert_non_null(json_object_get(map, "model.embed_tokens.weight"));
    assert_non_null(json_object_get(map, "model.norm.weight"));
    assert_null(json_object_get(map, "lm_head.weight"));
    json_decref(index);
}

/* Edit config.json: key set to a raw JSON value. */
static void set_config(const char *hf, const char *key, json_t *v)
{
    char p[400];
    snprintf(p, sizeof p, "%s/config.json", hf);
    json_t *c = json_load_file(p, 0, NULL);
    assert_non_null(c);
    json_object_set_new(c, key, v);
    assert_int_equal(json_dump_file(c, p, 0), 0);
    json_decref(c);
}

static void test_tied_window_and_missing(void **state)
{
    char hf[300];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    zt_options o = zt_test_small_options(g_dir, 2);
    zt_trainer *a = trainer_of(&o);
    ZO_ASSERT_OK(zt_hf_save(a, hf, ZO_DTYPE_F32, 1u << 30));
    /* tied over weights that have lm_head.weight: one tensor, the
     * embedding's; the head's file tensor ignored, the final norm read */
    set_config(hf, "tie_word_embeddings", json_true());
    zt_options ob = o;
    const zt_shape *s = &o.shape;
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_int_equal(ob.shape.tied, 1);
    assert_int_equal(zt_engine_layers(&ob.shape), s->n_layers + 1);
    zt_trainer *b = trainer_of(&ob);
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf));
    float *emb = weights(a, 0, 0), *emb_b = weights(b, 0, ZT_EMBEDDING);
    assert_memory_equal(emb, emb_b, zt_tensor_numel(s, 0, 0) * sizeof *emb);
    float *norm = weights(a, s->n_layers + 1, ZT_HEAD_NORM), *norm_b = weights(b, 0, ZT_TIED_NORM);
    assert_memory_equal(norm, norm_b, (size_t)s->dim * sizeof *norm);
    free(emb), free(emb_b), free(norm), free(norm_b);
    /* a sliding window shorter than the sequence: read, and trained with
     * the fused op; the dense op refuses it naming --attention flash */
    set_config(hf, "model_type", json_string("mistral"));
    set_config(hf, "sliding_window", json_integer(8));
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_int_equal(ob.shape.window, 8);
    assert_int_equal(ob.shape.window_from, 0);
    ob.flash_attention = 0;
    assert_null(trainer_or_null(&ob));
    assert_non_null(
        strstr(zt_last_error(), "sliding window 8 is shorter than the sequence 16: the dense"));
    assert_non_null(strstr(zt_last_error(), "use --attention flash"));
    ob.flash_attention = 1;
    zt_trainer_free(trainer_of(&ob));
    /* Qwen2's from max_window_layers on; none past the last layer */
    set_config(hf, "model_type", json_string("qwen2"));
    set_config(hf, "use_sliding_window", json_true());
    set_config(hf, "max_window_layers", json_integer(1));
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_int_equal(ob.shape.window, 8);
    assert_int_equal(ob.shape.window_from, 1);
    set_config(hf, "max_window_layers", json_integer(s->n_layers));
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_int_equal(ob.shape.window, 0);
    set_config(hf, "model_type", json_string("mistral"));
    /* a model file without a tensor the model needs */
    zt_options oc = o;
    oc.shape.attn_bias = 1;
    zt_trainer *c = trainer_of(&oc);
    assert_int_equal(zt_hf_load_weights(c, hf), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zt_last_error(), "'model.layers.0.self_attn.q_proj.bias'"));
    zt_trainer_free(a);
    zt_trainer_free(b);
    zt_trainer_free(c);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* A model read from --hf-model (Mistral, Qwen2) comes back from --save with
 * its config.json as it was (the architecture, the sliding window, the positions, the token
 * ids, a real of 15 digits: every key but the dtype) and its
 * generation_config.json and tokenizer files copied byte for byte. */
static void check_save_carries_the_input_config(int qwen2)
{
    char hf[300], out[300], p[400], q[400];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    snprintf(out, sizeof out, "%s/hf-saved", g_dir);
    zt_options o = zt_test_small_options(g_dir, 2);
    o.shape.attn_bias = qwen2; /* Qwen2's q/k/v biases */
    zt_trainer *a = trainer_of(&o);
    ZO_ASSERT_OK(zt_hf_save(a, hf, ZO_DTYPE_F32, 1u << 30));
    set_config(hf, "model_type", json_string(qwen2 ? "qwen2" : "mistral"));
    set_config(hf, "architectures",
               json_pack("[s]", qwen2 ? "Qwen2ForCausalLM" : "MistralForCausalLM"));
    set_config(hf, "sliding_window", json_integer(4096));
    if (qwen2) {
        set_config(hf, "use_sliding_window", json_true());
        set_config(hf, "max_window_layers", json_integer(1));
    }
    set_config(hf, "max_position_embeddings", json_integer(32768));
    set_config(hf, "bos_token_id", json_integer(1));
    set_config(hf, "eos_token_id", json_pack("[i,i]", 2, 7));
    set_config(hf, "initializer_range", json_real(0.123456789012345));
    snprintf(p, sizeof p, "%s/generation_config.json", hf);
    write_text(p, "{\"bos_token_id\": 1, \"eos_token_id\": [2, 7], \"temperature\": 0.7}\n");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", hf);
    write_text(p, "{\"model_max_length\": 32768}\n");
    zt_options ob = o;
    ob.hf_model = hf;
    ZO_ASSERT_OK(zt_hf_read_shape(hf, &ob.shape));
    assert_int_equal(ob.shape.window, 4096);
    assert_int_equal(ob.shape.window_from, qwen2);
    zt_trainer *b = trainer_of(&ob);
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf));
    step(b);
    ZO_ASSERT_OK(zt_hf_save(b, out, ZO_DTYPE_BF16, 1u << 30));
    snprintf(p, sizeof p, "%s/config.json", hf);
    snprintf(q, sizeof q, "%s/config.json", out);
    json_t *in = json_load_file(p, 0, NULL), *saved = json_load_file(q, 0, NULL);
    assert_non_null(in);
    assert_non_null(saved);
    assert_string_equal(json_string_value(json_object_get(saved, "torch_dtype")), "bfloat16");
    json_object_set_new(in, "torch_dtype", json_string("bfloat16"));
    assert_true(json_equal(in, saved));
    json_decref(in), json_decref(saved);
    const char *copied[] = {"generation_config.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", hf, copied[i]);
        snprintf(q, sizeof q, "%s/%s", out, copied[i]);
        char *want = strdup(read_text(p));
        assert_string_equal(read_text(q), want);
        free(want);
    }
    zt_trainer_free(a);
    zt_trainer_free(b);
}

static void test_save_carries_the_input_config(void **state)
{
    check_save_carries_the_input_config(0); /* MistralForCausalLM */
    check_save_carries_the_input_config(1); /* Qwen2ForCausalLM */
}

/* YaRN and dynamic scaling saved from the shape read back as the same shape. */
static void test_round_trip_yarn_and_dynamic(void **state)
{
    char hf[300];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    const zo_rope_scaling scs[] = {
        {.type = ZO_ROPE_SCALING_YARN,
         .factor = 4.0f,
         .original_max_pos = 8,
         .beta_fast = 32.0f,
         .beta_slow = 1.0f,
         .attention_factor = 1.25f,
         .no_truncate = 1},
        {.type = ZO_ROPE_SCALING_DYNAMIC, .factor = 2.0f, .original_max_pos = 8}};
    for (int i = 0; i < 2; i++) {
        zt_options o = zt_test_small_options(g_dir, 2);
        o.shape.rope_scaling = scs[i];
        zt_trainer *a = trainer_of(&o);
        ZO_ASSERT_OK(zt_hf_save(a, hf, ZO_DTYPE_F32, 1u << 30));
        zt_shape back;
        ZO_ASSERT_OK(zt_hf_read_shape(hf, &back));
        assert_memory_equal(&back, &o.shape, sizeof back);
        zt_trainer_free(a);
    }
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char p[600];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "%s/zt-hf-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    remove_tree(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_fp32_one_file),
        cmocka_unit_test(test_round_trip_bf16_shards),
        cmocka_unit_test(test_round_trip_tied),
        cmocka_unit_test(test_tied_window_and_missing),
        cmocka_unit_test(test_save_carries_the_input_config),
        cmocka_unit_test(test_round_trip_yarn_and_dynamic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
