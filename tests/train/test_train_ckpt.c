/* zo-train's checkpoints, in process:
 * - resume is bitwise: N steps, save, N more, against a fresh trainer that
 *   loads the checkpoint and runs the last N: same losses, same weights, in
 *   sync, overlap and dpu modes, states on the host, on NVMe, parameters on
 *   NVMe, and fp16 with a schedule and gradient accumulation;
 * - the files are what other tools read: an independent minimal safetensors
 *   reader here (header length, JSON header, dtypes, shapes, offsets) finds
 *   every Hugging Face LLaMA name with the trainer's weights;
 * - a checkpoint with a missing tensor, a wrong shape or a wrong dtype, or
 *   from another model shape, fails naming it;
 * - --init-weights takes F32, BF16 and F16 tensors and refuses others;
 * - every tensor of a checkpoint carries its xxh64 (checksums.json): one
 *   flipped bit is refused naming the file and the tensor, on load and by
 *   --init-weights of the checkpoint's model file; values a run cannot make
 *   (NaN, a negative second moment, an int8 block scale of 1e30) are refused
 *   even where the checksum was rewritten to match; a checkpoint without
 *   checksums (an old one) still loads. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint.h"
#include "train_fs_util.h"
#include "train_test_util.h"
#include "zo/half.h"
#include "zo/safetensors.h"
#include "zo_test.h"
#include "zt_error.h"

#define N 4

static char g_dir[256], g_swap[300];

static zt_options base_options(void)
{
    zt_options o = zt_test_small_options(g_swap, 2 * N);
    o.chunk_bytes = 16u << 10;
    return o;
}

static zt_trainer *open_trainer(const zt_options *o)
{
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    return t;
}

static void steps(zt_trainer *t, int n, float *losses)
{
    for (int i = 0; i < n; i++) {
        zo_step_stats s;
        if (zt_trainer_step(t, &losses[i], &s) < 0)
            fail_msg("step %d: %s", i, zt_last_error());
    }
}

/* Every tensor's master weights, concatenated. */
static float *all_weights(zt_trainer *t, const zt_shape *s, size_t *total)
{
    size_t n = zt_shape_n_params(s), at = 0;
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            ZO_ASSERT_OK(zt_trainer_read_weights(t, l, i, w + at));
            at += zt_tensor_numel(s, l, i);
        }
    assert_int_equal(at, n);
    *total = n;
    return w;
}

static void save_to(zt_trainer *t, const char *dir)
{
    if (zt_ckpt_save(t, dir, NULL, 0) < 0)
        fail_msg("zt_ckpt_save: %s", zt_last_error());
}

static void load_from(zt_trainer *t, const char *dir)
{
    char ck[4096];
    if (zt_ckpt_resolve(dir, ck, sizeof ck) < 0 || zt_ckpt_load(t, ck) < 0)
        fail_msg("loading %s: %s", dir, zt_last_error());
}

/* N steps under o, save, N steps; against load + N steps under r (the same
 * run placed otherwise). */
static void check_resume_as(const zt_options *o, const zt_options *r, const char *what)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/resume", g_dir);
    rm_rf(dir);
    float ref[2 * N], got[N];
    zt_trainer *a = open_trainer(o);
    steps(a, N, ref);
    save_to(a, dir);
    steps(a, N, ref + N);
    size_t n;
    float *wa = all_weights(a, &o->shape, &n);
    zt_trainer_free(a);

    zt_trainer *b = open_trainer(r);
    load_from(b, dir);
    zt_train_state ts;
    zt_trainer_get_state(b, &ts);
    assert_int_equal(ts.step, N);
    steps(b, N, got);
    float *wb = all_weights(b, &o->shape, &n);
    zt_trainer_free(b);
    for (int i = 0; i < N; i++)
        if (memcmp(&got[i], &ref[N + i], sizeof(float)) != 0)
            fail_msg("%s: resumed step %d loss %.9g, uninterrupted %.9g", what, N + i + 1,
                     (double)got[i], (double)ref[N + i]);
    if (memcmp(wa, wb, n * sizeof(float)) != 0)
        fail_msg("%s: the resumed run's final weights differ", what);
    free(wa);
    free(wb);
}

/* N steps, save, N steps; against load + N steps. */
static void check_resume(const zt_options *o, const char *what)
{
    check_resume_as(o, o, what);
}

static void test_resume_is_bitwise(void **state)
{
    zt_options o = base_options();
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_NVME;
    check_resume(&o, "host params, NVMe states, sync");
    o.param_home = ZO_TIER_NVME;
    o.mode = ZO_OPTIM_OVERLAP;
    check_resume(&o, "NVMe params and states, overlap");
    o.param_home = o.optim_home = ZO_TIER_DEVICE;
    o.mode = ZO_OPTIM_DPU;
    check_resume(&o, "device, dpu");
    o = base_options();
    o.param_home = o.optim_home = ZO_TIER_HOST;
    o.dtype = ZO_DTYPE_F16;
    o.loss_scaler.initial_scale_power = 20; /* overflows first, the scaler adapts */
    o.grad_accum = 2;
    o.sched.type = ZO_SCHEDULER_WARMUP_DECAY_LR;
    o.sched.warmup_num_steps = 3;
    o.sched.total_num_steps = 2 * N;
    o.sched.warmup_max_lr = 1e-2;
    check_resume(&o, "fp16, WarmupDecayLR, accumulation");
}

/* A checkpoint saved under one per-chunk split resumes bitwise under
 * another, and under one home per state. */
static void test_resume_on_another_split(void **state)
{
    (void)state;
    zt_options a = base_options();
    a.param_home = a.optim_home = ZO_TIER_NVME;
    a.mode = ZO_OPTIM_OVERLAP;
    a.optim_caps.bytes[ZO_TIER_HOST] = 6 * 3 * a.chunk_bytes; /* three chunks' states in RAM */
    zt_options b = a;
    b.optim_caps.bytes[ZO_TIER_HOST] = 6 * 7 * a.chunk_bytes;
    b.param_caps.bytes[ZO_TIER_HOST] = 9 * a.chunk_bytes;
    check_resume_as(&a, &b, "3 chunks' states on the host, resumed with 7 and 9 chunks' params");
    zt_options c = a;
    c.optim_caps.bytes[ZO_TIER_HOST] = 0;
    check_resume_as(&b, &c, "split, resumed all on NVMe");
}

/* ---- an independent minimal safetensors reader ---- */

typedef struct mini_st {
    unsigned char *bytes;
    size_t size, data_at;
    json_t *header;
} mini_st;

static void mini_open(mini_st *m, const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    m->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    m->bytes = malloc(m->size);
    assert_int_equal(fread(m->bytes, 1, m->size, f), m->size);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | m->bytes[i];
    assert_true(8 + hlen <= m->size);
    m->data_at = 8 + (size_t)hlen;
    json_error_t e;
    m->header = json_loadb((const char *)m->bytes + 8, (size_t)hlen, 0, &e);
    if (!m->header)
        fail_msg("%s: header is not JSON: %s", path, e.text);
}

/* Checks the entry's dtype and shape; returns its data. */
static const float *mini_tensor(const mini_st *m, const char *name, int64_t d0, int64_t d1,
                                size_t *end)
{
    json_t *t = json_object_get(m->header, name);
    if (!t)
        fail_msg("no tensor '%s'", name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
    json_t *shape = json_object_get(t, "shape"), *off = json_object_get(t, "data_offsets");
    assert_int_equal(json_array_size(shape), d1 ? 2 : 1);
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), d0);
    if (d1)
        assert_int_equal(json_integer_value(json_array_get(shape, 1)), d1);
    size_t b = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
    assert_int_equal(e - b, (size_t)(d0 * (d1 ? d1 : 1)) * sizeof(float));
    assert_true(m->data_at + e <= m->size);
    *end = e > *end ? e : *end;
    return (const float *)(m->bytes + m->data_at + b);
}

static void mini_close(mini_st *m)
{
    free(m->bytes);
    json_decref(m->header);
}

static void test_files_read_by_an_independent_reader(void **state)
{
    zt_options o = base_options();
    o.steps = 2;
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/files", g_dir);
    rm_rf(dir);
    zt_trainer *t = open_trainer(&o);
    float losses[2];
    steps(t, 2, losses);
    save_to(t, dir);
    const zt_shape *s = &o.shape;
    const int64_t V = s->vocab, D = s->dim, F = s->ffn_dim;
    /* (our layer, index) -> the Hugging Face name and shape, written out independently */
    struct {
        int layer, idx;
        const char *fmt;
        int64_t d0, d1;
    } map[] = {{0, 0, "model.embed_tokens.weight", V, D},
               {-1, ZT_ATTN_NORM, "model.layers.%d.input_layernorm.weight", D, 0},
               {-1, ZT_WQ, "model.layers.%d.self_attn.q_proj.weight", D, D},
               {-1, ZT_WK, "model.layers.%d.self_attn.k_proj.weight", D, D},
               {-1, ZT_WV, "model.layers.%d.self_attn.v_proj.weight", D, D},
               {-1, ZT_WO, "model.layers.%d.self_attn.o_proj.weight", D, D},
               {-1, ZT_MLP_NORM, "model.layers.%d.post_attention_layernorm.weight", D, 0},
               {-1, ZT_WGATE, "model.layers.%d.mlp.gate_proj.weight", F, D},
               {-1, ZT_WUP, "model.layers.%d.mlp.up_proj.weight", F, D},
               {-1, ZT_WDOWN, "model.layers.%d.mlp.down_proj.weight", D, F},
               {-2, ZT_HEAD_NORM, "model.norm.weight", D, 0},
               {-2, ZT_HEAD_OUT, "lm_head.weight", V, D}};
    mini_st m, opt;
    snprintf(path, sizeof path, "%s/step-00000002/%s", dir, ZT_CKPT_MODEL);
    mini_open(&m, path);
    snprintf(path, sizeof path, "%s/step-00000002/%s", dir, ZT_CKPT_OPTIM);
    mini_open(&opt, path);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(m.header, "__metadata__"), "format")),
        "pt");
    size_t end = 0, oend = 0, count = 0;
    float *w = malloc((size_t)V * D * sizeof *w);
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
        for (int b = 0; b < (map[k].layer == -1 ? s->n_layers : 1); b++) {
            char name[128], mname[160];
            snprintf(name, sizeof name, map[k].fmt, b);
            int layer = map[k].layer == -1 ? b + 1 : map[k].layer == -2 ? s->n_layers + 1 : 0;
            const float *data = mini_tensor(&m, name, map[k].d0, map[k].d1, &end);
            ZO_ASSERT_OK(zt_trainer_read_weights(t, layer, map[k].idx, w));
            assert_memory_equal(data, w, zt_tensor_numel(s, layer, map[k].idx) * sizeof(float));
            snprintf(mname, sizeof mname, "%s.exp_avg", name);
            mini_tensor(&opt, mname, map[k].d0, map[k].d1, &oend);
            snprintf(mname, sizeof mname, "%s.exp_avg_sq", name);
            const float *v = mini_tensor(&opt, mname, map[k].d0, map[k].d1, &oend);
            assert_true(v[0] > 0.0f || map[k].idx != ZT_WQ); /* a second moment after two steps */
            count++;
        }
    /* every tensor found, the data section exactly covered */
    assert_int_equal(json_object_size(m.header), count + 1);
    assert_int_equal(m.data_at + end, m.size);
    assert_int_equal(opt.data_at + oend, opt.size);
    assert_int_equal(m.data_at % 8, 0);
    free(w);
    mini_close(&m);
    mini_close(&opt);
    zt_trainer_free(t);
}

/* ---- refusals ---- */

/* A model.safetensors with the trainer's tensors, except: skip (left out),
 * bad_shape (transposed), bad_dtype (written as dt) for the tensor named
 * `which`; every other tensor in dt. Values: 0.25 * (i % 7) - 0.5. */
static void write_model_file(const char *path, const zt_shape *s, zo_dtype dt, const char *which,
                             int how)
{
    zo_st_writer_t w;
    ZO_ASSERT_OK(zo_st_writer_init(&w, path));
    char name[128];
    int ndim;
    int64_t shape[2];
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < zt_engine_layers(s); l++)
            for (int i = 0; i < zt_layer_tensors(s, l); i++) {
                ZO_ASSERT_OK(zt_ckpt_tensor(s, l, i, name, sizeof name, &ndim, shape));
                int hit = strcmp(name, which) == 0;
                if (hit && how == 0)
                    continue;
                zo_dtype d = hit && how == 2 ? ZO_DTYPE_I32 : dt;
                if (hit && how == 1 && ndim == 2) {
                    int64_t x = shape[0];
                    shape[0] = shape[1];
                    shape[1] = x;
                }
                size_t n = zt_tensor_numel(s, l, i), es = zo_dtype_size(d);
                if (pass == 0) {
                    ZO_ASSERT_OK(zo_st_writer_declare(w, name, d, ndim, shape));
                    continue;
                }
                unsigned char *buf = malloc(n * es);
                for (size_t k = 0; k < n; k++) {
                    float f = 0.25f * (float)(k % 7) - 0.5f;
                    uint16_t h = d == ZO_DTYPE_BF16 ? zo_f32_to_bf16(f) : zo_f32_to_f16(f);
                    int32_t iv = (int32_t)k;
                    memcpy(buf + k * es,
                           d == ZO_DTYPE_F32   ? (void *)&f
                           : d == ZO_DTYPE_I32 ? (void *)&iv
                                               : &h,
                           es);
                }
                ZO_ASSERT_OK(zo_st_writer_write(w, name, buf, n * es));
                free(buf);
            }
    ZO_ASSERT_OK(zo_st_writer_commit(w));
    zo_st_writer_free(w);
}

static void expect_load_error(zt_trainer *t, const char *dir, const char *needle)
{
    char ck[4096];
    zo_status st = zt_ckpt_resolve(dir, ck, sizeof ck);
    if (st >= 0)
        st = zt_ckpt_load(t, ck);
    assert_true(st < 0);
    if (!strstr(zt_last_error(), needle))
        fail_msg("loading %s: '%s' lacks '%s'", dir, zt_last_error(), needle);
}

static void test_bad_checkpoints_are_refused(void **state)
{
    zt_options o = base_options();
    char dir[400], model[500];
    snprintf(dir, sizeof dir, "%s/bad", g_dir);
    rm_rf(dir);
    zt_trainer *t = open_trainer(&o);
    save_to(t, dir);
    snprintf(model, sizeof model, "%s/step-00000000/%s", dir, ZT_CKPT_MODEL);
    const char *up = "model.layers.1.mlp.up_proj.weight";
    char want[600];
    write_model_file(model, &o.shape, ZO_DTYPE_F32, up, 0);
    snprintf(want, sizeof want, "tensor '%s' not found in '%s' (20 tensors; nearest: ", up, model);
    expect_load_error(t, dir, want);
    /* the reader's own messages, naming the tensor and the file */
    write_model_file(model, &o.shape, ZO_DTYPE_F32, up, 1);
    snprintf(want, sizeof want, "tensor '%s' in '%s': expected shape [64, 32], found [32, 64]", up,
             model);
    expect_load_error(t, dir, want);
    write_model_file(model, &o.shape, ZO_DTYPE_BF16, "", 0);
    snprintf(want, sizeof want,
             "tensor 'model.embed_tokens.weight' in '%s': expected dtype F32, found BF16", model);
    expect_load_error(t, dir, want);
    zt_trainer_free(t);
    /* another model shape */
    zt_options o2 = base_options();
    o2.shape.dim = 64;
    t = open_trainer(&o2);
    expect_load_error(t, dir,
                      "was saved from a model with dim 32; this run's is 64 (pass --dim 32)");
    expect_load_error(t, g_dir, "holds neither a checkpoint (trainer_state.json) nor a 'latest'");
    zt_trainer_free(t);
}

/* ---- --init-weights ---- */

static void test_init_weights(void **state)
{
    zt_options o = base_options();
    char path[400];
    snprintf(path, sizeof path, "%s/hf.safetensors", g_dir);
    const zo_dtype dts[3] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        write_model_file(path, &o.shape, dts[d], "", 0);
        zt_trainer *t = open_trainer(&o);
        if (zt_ckpt_init_weights(t, path) < 0)
            fail_msg("init from %s: %s", zo_st_dtype_name(dts[d]), zt_last_error());
        size_t n = zt_tensor_numel(&o.shape, 2, ZT_WUP);
        float *w = malloc(n * sizeof *w);
        ZO_ASSERT_OK(zt_trainer_read_weights(t, 2, ZT_WUP, w));
        for (size_t k = 0; k < n; k++) /* the values are exact in all three dtypes */
            assert_true(w[k] == 0.25f * (float)(k % 7) - 0.5f);
        free(w);
        float loss;
        steps(t, 1, &loss);
        assert_true(isfinite(loss));
        zt_trainer_free(t);
    }
    zt_trainer *t = open_trainer(&o);
    write_model_file(path, &o.shape, ZO_DTYPE_BF16, "lm_head.weight", 0);
    assert_true(zt_ckpt_init_weights(t, path) < 0);
    assert_non_null(strstr(zt_last_error(), "tensor 'lm_head.weight' not found in"));
    write_model_file(path, &o.shape, ZO_DTYPE_BF16, "model.norm.weight", 2);
    assert_true(zt_ckpt_init_weights(t, path) < 0);
    char want[600];
    snprintf(want, sizeof want,
             "tensor 'model.norm.weight' in '%s': expected dtype F32, BF16 or F16, found I32",
             path);
    assert_non_null(strstr(zt_last_error(), want));
    write_model_file(path, &o.shape, ZO_DTYPE_F16, "model.layers.0.mlp.down_proj.weight", 1);
    assert_true(zt_ckpt_init_weights(t, path) < 0);
    assert_non_null(strstr(zt_last_error(), "expected shape [32, 64], found [64, 32]"));
    zt_trainer_free(t);
}

/* Compact optimizer states: saved in their format (bf16 tensors, or int8
 * codes with their block scales) and resumed bitwise, on another placement
 * too; a checkpoint of one format resumes in another (converted on load,
 * so not bitwise: the run goes on with finite losses and the saved
 * weights); --init-weights starts fresh states in every format. */
static void test_compact_states_checkpoints(void **state)
{
    (void)state;
    static const zo_dtype fmts[] = {ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 2; f++) {
        zt_options o = base_options();
        o.state_dtype = fmts[f];
        o.param_home = ZO_TIER_HOST;
        o.optim_home = ZO_TIER_NVME;
        check_resume(&o, zo_dtype_name(fmts[f]));
        zt_options r = o;
        r.optim_home = ZO_TIER_HOST;
        r.mode = ZO_OPTIM_OVERLAP;
        check_resume_as(&o, &r, "compact states, resumed on the host in overlap mode");
    }
    char dir[400];
    snprintf(dir, sizeof dir, "%s/formats", g_dir);
    static const zo_dtype all[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 3; f++)
        for (int g = 0; g < 3; g++) {
            if (f == g)
                continue;
            zt_options o = base_options(), r;
            o.state_dtype = all[f];
            r = o;
            r.state_dtype = all[g];
            rm_rf(dir);
            zt_trainer *a = open_trainer(&o);
            float losses[N];
            steps(a, N, losses);
            save_to(a, dir);
            size_t n;
            float *wa = all_weights(a, &o.shape, &n);
            zt_trainer_free(a);
            zt_trainer *b = open_trainer(&r);
            load_from(b, dir);
            float *wb = all_weights(b, &o.shape, &n);
            assert_memory_equal(wa, wb, n * sizeof(float)); /* the master is fp32 in all */
            steps(b, N, losses);
            for (int i = 0; i < N; i++)
                assert_true(isfinite(losses[i]));
            zt_trainer_free(b);
            free(wa);
            free(wb);
        }
    char path[400];
    snprintf(path, sizeof path, "%s/hf.safetensors", g_dir);
    for (int f = 0; f < 3; f++) {
        zt_options o = base_options();
        o.state_dtype = all[f];
        write_model_file(path, &o.shape, ZO_DTYPE_BF16, "", 0);
        zt_trainer *t = open_trainer(&o);
        if (zt_ckpt_init_weights(t, path) < 0)
            fail_msg("init weights with %s states: %s", zo_dtype_name(all[f]), zt_last_error());
        float loss;
        steps(t, 1, &loss);
        assert_true(isfinite(loss));
        zt_trainer_free(t);
    }
}

/* The dtype the optimizer file of dir's step-N holds tensor `name` in ("" when absent). */
static const char *optim_dtype(const char *dir, int step, const char *name, char *out, size_t cap)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step-%08d/%s", dir, step, ZT_CKPT_OPTIM);
    mini_st m;
    mini_open(&m, path);
    json_t *t = json_object_get(m.header, name);
    snprintf(out, cap, "%s", t ? json_string_value(json_object_get(t, "dtype")) : "");
    mini_close(&m);
    return out;
}

/* int8 states with the token embedding's moments fp32
 * (zoffload.embedding_f32_states): the checkpoint stores them as F32
 * tensors without scales while the untied head's are U8 codes with their
 * scales, and resumes bitwise; a checkpoint with the embedding's moments in
 * int8 (the rule off) resumes under the rule and the other way round
 * (converted: the weights as saved, finite losses after). */
static void test_int8_embedding_keeps_fp32_in_checkpoints(void **state)
{
    (void)state;
    zt_options on = base_options(), off;
    on.state_dtype = ZO_DTYPE_I8;
    off = on;
    on.embedding_f32 = 1;
    check_resume(&on, "int8 states, fp32 embedding moments");
    char dir[400], dt[32];
    snprintf(dir, sizeof dir, "%s/embedding", g_dir);
    const zt_options *cases[2][2] = {{&on, &off}, {&off, &on}};
    for (int c = 0; c < 2; c++) {
        const zt_options *o = cases[c][0], *r = cases[c][1];
        rm_rf(dir);
        zt_trainer *a = open_trainer(o);
        float losses[N];
        steps(a, N, losses);
        save_to(a, dir);
        size_t n;
        float *wa = all_weights(a, &o->shape, &n);
        zt_trainer_free(a);
        const char *emb = o->embedding_f32 ? "F32" : "U8";
        assert_string_equal(optim_dtype(dir, N, "model.embed_tokens.weight.exp_avg", dt, sizeof dt),
                            emb);
        assert_string_equal(
            optim_dtype(dir, N, "model.embed_tokens.weight.exp_avg_sq.absmax", dt, sizeof dt),
            o->embedding_f32 ? "" : "F32");
        assert_string_equal(optim_dtype(dir, N, "lm_head.weight.exp_avg", dt, sizeof dt), "U8");
        zt_trainer *b = open_trainer(r);
        load_from(b, dir);
        float *wb = all_weights(b, &o->shape, &n);
        assert_memory_equal(wa, wb, n * sizeof(float));
        steps(b, N, losses);
        for (int i = 0; i < N; i++)
            assert_true(isfinite(losses[i]));
        zt_trainer_free(b);
        free(wa);
        free(wb);
    }
}

/* ---- checksums and value checks ---- */

/* Tensor `name` of DIR/step-N/file: its bytes' offset in the file and size. */
static void locate(const char *path, const char *name, uint64_t *at, uint64_t *bytes)
{
    zo_st_reader_t rd = NULL;
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
    ZO_ASSERT_OK(zo_st_reader_open(&rd, path));
    ZO_ASSERT_OK(zo_st_reader_find(rd, name, &info));
    *at = info.file_offset;
    *bytes = info.nbytes;
    zo_st_reader_free(rd);
}

/* Overwrite n bytes at element idx (of size es) of tensor name in path; when
 * resum, record the tensor's new xxh64 in the checksums beside it (a file
 * whose checksum matches: what the value checks alone must catch). */
static void poke(const char *path, const char *name, size_t idx, const void *v, size_t es,
                 int resum)
{
    uint64_t at, bytes;
    locate(path, name, &at, &bytes);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)(at + idx * es), SEEK_SET), 0);
    assert_int_equal(fwrite(v, 1, es, f), es);
    fclose(f);
    if (!resum)
        return;
    size_t n;
    char *all = slurp(path, &n), sums[600], hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(all + at, bytes, 0));
    free(all);
    snprintf(sums, sizeof sums, "%.*s/checksums.json", (int)(strrchr(path, '/') - path), path);
    json_t *root = json_load_file(sums, 0, NULL);
    assert_non_null(root);
    json_t *files = json_object_get(root, "files");
    json_object_set_new(json_object_get(files, strrchr(path, '/') + 1), name, json_string(hex));
    assert_int_equal(json_dump_file(root, sums, 0), 0);
    json_decref(root);
}

/* Save N steps of o into dir (fresh). */
static void save_fresh(const zt_options *o, const char *dir)
{
    rm_rf(dir);
    zt_trainer *a = open_trainer(o);
    float losses[N];
    steps(a, N, losses);
    save_to(a, dir);
    zt_trainer_free(a);
}

/* A fresh trainer of o refuses to load dir with a message holding want. */
static void refused(const zt_options *o, const char *dir, const char *want)
{
    zt_trainer *t = open_trainer(o);
    expect_load_error(t, dir, want);
    zt_trainer_free(t);
}

static void test_corrupted_checkpoints_are_refused(void **state)
{
    (void)state;
    zt_options o = base_options();
    char dir[400], model[500], optim[500], want[700];
    snprintf(dir, sizeof dir, "%s/corrupt", g_dir);
    snprintf(model, sizeof model, "%s/step-%08d/%s", dir, N, ZT_CKPT_MODEL);
    snprintf(optim, sizeof optim, "%s/step-%08d/%s", dir, N, ZT_CKPT_OPTIM);
    const char *q = "model.layers.1.self_attn.q_proj.weight";
    /* one flipped exponent bit: refused on load and by --init-weights */
    save_fresh(&o, dir);
    unsigned char byte;
    uint64_t at, bytes;
    locate(model, q, &at, &bytes);
    FILE *f = fopen(model, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)at + 3, SEEK_SET), 0);
    assert_int_equal(fread(&byte, 1, 1, f), 1);
    byte ^= 0x40;
    assert_int_equal(fseek(f, (long)at + 3, SEEK_SET), 0);
    assert_int_equal(fwrite(&byte, 1, 1, f), 1);
    fclose(f);
    snprintf(want, sizeof want, "%s/step-%08d/%s: tensor '%s' does not match its checksum", dir, N,
             ZT_CKPT_MODEL, q);
    refused(&o, dir, want);
    zt_trainer *t = open_trainer(&o);
    assert_true(zt_ckpt_init_weights(t, model) < 0);
    if (!strstr(zt_last_error(), want))
        fail_msg("--init-weights: '%s' lacks '%s'", zt_last_error(), want);
    zt_trainer_free(t);
    /* values no run makes, their checksums rewritten to match */
    static const struct {
        int optim, int8; /* the file (0 the model's), int8 states */
        const char *tensor;
        size_t index;
        float value;
        const char *want;
    } bad[] = {
        {1, 0, "model.norm.weight.exp_avg_sq", 3, NAN,
         "tensor 'model.norm.weight.exp_avg_sq' in optimizer.safetensors has nan at index 3 "
         "(not finite)"},
        {1, 0, "model.norm.weight.exp_avg_sq", 2, -1.0f,
         "has -1 at index 2 (second moments are squares, never negative)"},
        {0, 0, "model.layers.1.self_attn.q_proj.weight", 5, NAN,
         "tensor 'model.layers.1.self_attn.q_proj.weight' in model.safetensors has nan at index "
         "5"},
        {1, 1, "lm_head.weight.exp_avg.absmax", 0, 1e30f,
         "tensor 'lm_head.weight.exp_avg.absmax' in optimizer.safetensors has 1e+30 at index 0 "
         "(beyond +-1e10)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.state_dtype = bad[i].int8 ? ZO_DTYPE_I8 : ZO_DTYPE_F32;
        save_fresh(&o, dir);
        poke(bad[i].optim ? optim : model, bad[i].tensor, bad[i].index, &bad[i].value, 4, 1);
        refused(&o, dir, bad[i].want);
    }
    /* an old checkpoint without checksums loads (with a warning) */
    save_fresh(&o, dir);
    char sums[600];
    snprintf(sums, sizeof sums, "%s/step-%08d/checksums.json", dir, N);
    assert_int_equal(unlink(sums), 0);
    t = open_trainer(&o);
    load_from(t, dir);
    zt_trainer_free(t);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-ckpt-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_swap, sizeof g_swap, "%s/swap", g_dir);
    return 0;
}

static int teardown(void **state)
{
    rm_rf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_is_bitwise),
        cmocka_unit_test(test_resume_on_another_split),
        cmocka_unit_test(test_compact_states_checkpoints),
        cmocka_unit_test(test_int8_embedding_keeps_fp32_in_checkpoints),
        cmocka_unit_test(test_files_read_by_an_independent_reader),
        cmocka_unit_test(test_bad_checkpoints_are_refused),
        cmocka_unit_test(test_init_weights),
        cmocka_unit_test(test_corrupted_checkpoints_are_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
