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
static zt_trainer *trainer_of(const zt_options *o)
{
    static int k;
    static char dirs[8][300];
    zt_trainer *t = NULL;
    zt_options mine = *o;
    snprintf(dirs[k % 8], sizeof dirs[0], "%s/swap%d", g_dir, k);
    mkdir(dirs[k % 8], 0777);
    mine.default_nvme_dir = dirs[k++ % 8];
    if (zt_trainer_init(&t, &mine) < 0)
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
    o.shape.rope_scaling = (zo_rope_scaling){ZO_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 64};
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
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape));
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
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape));
    assert_int_equal(ob.shape.tied, 1);
    assert_int_equal(zt_engine_layers(&ob.shape), s->n_layers + 1);
    zt_trainer *b = trainer_of(&ob);
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf));
    float *emb = weights(a, 0, 0), *emb_b = weights(b, 0, ZT_EMBEDDING);
    assert_memory_equal(emb, emb_b, zt_tensor_numel(s, 0, 0) * sizeof *emb);
    float *norm = weights(a, s->n_layers + 1, ZT_HEAD_NORM), *norm_b = weights(b, 0, ZT_TIED_NORM);
    assert_memory_equal(norm, norm_b, (size_t)s->dim * sizeof *norm);
    free(emb), free(emb_b), free(norm), free(norm_b);
    /* a sliding window shorter than the sequence */
    set_config(hf, "model_type", json_string("mistral"));
    set_config(hf, "sliding_window", json_integer(8));
    assert_int_equal(zt_hf_read_shape(hf, o.seq, &ob.shape), ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "'sliding_window' 8 is shorter than the sequence 16"));
    set_config(hf, "sliding_window", json_integer(16));
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape));
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
