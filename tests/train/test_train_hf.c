/* Hugging Face directories in and out of zo-train (hf_io.h): a model saved
 * with zt_hf_save and read back with zt_hf_read_shape and zt_hf_load_weights
 * is bitwise the same model (shape, every weight, the loss of the next step
 * on the same batch), in fp32 and bf16 (bf16: the weights rounded as the
 * engine's 16-bit parameters are, so the loss is still bitwise the same), in
 * one file and in shards with the index; a tied head is read from the
 * embedding; a missing tensor and a too-short sliding window are refused. */
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
static void round_trip(zo_dtype dt, uint64_t shard_bytes, int want_shards)
{
    char hf[300];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    zt_options o = variant_options(4);
    zt_trainer *a = trainer_of(&o);
    step(a);
    step(a);
    ZO_ASSERT_OK(zt_hf_save(a, hf, dt, shard_bytes));
    assert_int_equal(count_files(hf, "model"), want_shards + (want_shards > 1));
    zt_options ob = o;
    int tied = -1;
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape, &tied));
    assert_int_equal(tied, 0);
    assert_memory_equal(&ob.shape, &o.shape, sizeof o.shape);
    zt_trainer *b = trainer_of(&ob);
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf, 0));
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
    round_trip(ZO_DTYPE_F32, 5000000000ull, 1);
}

static void test_round_trip_bf16_shards(void **state)
{
    /* 8 KiB shards: 9 of them (the 16 KiB embedding and head each alone) */
    round_trip(ZO_DTYPE_BF16, 8192, 9);
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
    char hf[300], p[400];
    snprintf(hf, sizeof hf, "%s/hf-model", g_dir);
    zt_options o = zt_test_small_options(g_dir, 2);
    zt_trainer *a = trainer_of(&o);
    ZO_ASSERT_OK(zt_hf_save(a, hf, ZO_DTYPE_F32, 1u << 30));
    /* tied: an index that maps every tensor but lm_head.weight; the head is
     * then the embedding */
    json_t *map = json_object();
    const zt_shape *s = &o.shape;
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            char name[160];
            int ndim;
            int64_t shape[2];
            zt_tensor_hf(s, l, i, name, sizeof name, &ndim, shape);
            if (strcmp(name, "lm_head.weight") != 0)
                json_object_set_new(map, name, json_string("model.safetensors"));
        }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", hf);
    json_t *index = json_pack("{s:{},s:o}", "metadata", "weight_map", map);
    assert_int_equal(json_dump_file(index, p, 0), 0);
    json_decref(index);
    set_config(hf, "tie_word_embeddings", json_true());
    zt_options ob = o;
    int tied = 0;
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape, &tied));
    assert_int_equal(tied, 1);
    assert_int_equal(ob.shape.tied, 0); /* trained untied */
    zt_trainer *b = trainer_of(&ob);
    assert_int_equal(zt_hf_load_weights(b, hf, 0), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zt_last_error(), "'lm_head.weight'"));
    ZO_ASSERT_OK(zt_hf_load_weights(b, hf, tied));
    float *emb = weights(a, 0, 0), *head = weights(b, s->n_layers + 1, ZT_HEAD_OUT);
    assert_memory_equal(emb, head, zt_tensor_numel(s, 0, 0) * sizeof *emb);
    free(emb), free(head);
    unlink(p);
    /* a sliding window shorter than the sequence */
    set_config(hf, "model_type", json_string("mistral"));
    set_config(hf, "sliding_window", json_integer(8));
    assert_int_equal(zt_hf_read_shape(hf, o.seq, &ob.shape, &tied), ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "'sliding_window' 8 is shorter than the sequence 16"));
    set_config(hf, "sliding_window", json_integer(16));
    ZO_ASSERT_OK(zt_hf_read_shape(hf, o.seq, &ob.shape, &tied));
    /* a model file without a tensor the model needs */
    zt_options oc = o;
    oc.shape.attn_bias = 1;
    zt_trainer *c = trainer_of(&oc);
    assert_int_equal(zt_hf_load_weights(c, hf, 0), ZO_ERR_NOT_FOUND);
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
        cmocka_unit_test(test_tied_window_and_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
