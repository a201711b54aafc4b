/* Hugging Face model directories (hf_io.h): config.json through the shape
 * part, the weights through the library's safetensors reader. */
#include "hf_io.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_config.h"
#include "ranks.h"
#include "zo/atomic_file.h"
#include "zo/half.h"
#include "zo/safetensors.h"
#include "zt_error.h"
#include "zt_json.h"

enum { HF_PATH = 4096, HF_NAME = 4096, HF_MAX_SHARDS = 1024 };

static zo_status join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, HF_PATH, "%s/%s", dir, name);
    if (n < 0 || n >= HF_PATH)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/%s", dir, name);
    return ZO_OK;
}

zo_status zt_hf_read_shape(const char *dir, zt_shape *out)
{
    char path[HF_PATH], note[256];
    ZT_TRY(join(path, dir, "config.json"));
    ZT_TRY(zt_read_hf_config(path, out, note, sizeof note));
    return zt_shape_check(out);
}

/* ---- the files holding the weights ---- */

/* One file, or the shards of an index, opened as they are first needed. */
typedef struct zt_st_files {
    const char *dir, *single, *index; /* the directory, the one file's name, the index's */
    json_t *map;                      /* the index's weight_map (NULL: the one file) */
    json_t *meta;                     /* the index's metadata object, or NULL */
    int n;
    char *names[HF_MAX_SHARDS];
    zo_st_reader_t readers[HF_MAX_SHARDS];
    char names_buf[3][HF_NAME]; /* zt_st_files_open's copies of single, index, dir */
} hf_files;

static void files_close(hf_files *f)
{
    for (int i = 0; i < f->n; i++) {
        zo_st_reader_free(f->readers[i]);
        free(f->names[i]);
    }
    json_decref(f->map);
    json_decref(f->meta);
}

static zo_status files_open_as(hf_files *f, const char *dir, const char *single, const char *index)
{
    char path[HF_PATH];
    struct stat st;
    f->map = f->meta = NULL; /* the rest is read up to n */
    f->n = 0;
    f->dir = dir;
    f->single = single;
    f->index = index;
    ZT_TRY(join(path, dir, index));
    if (stat(path, &st) != 0)
        return ZO_OK;
    json_t *root;
    ZT_TRY(zt_json_read(path, 0, &root));
    f->map = json_incref(json_object_get(root, "weight_map"));
    f->meta = json_incref(json_object_get(root, "metadata"));
    json_decref(root);
    if (!json_is_object(f->map))
        return zt_fail(ZO_ERR_CORRUPT, "%s: no 'weight_map' object", path);
    return ZO_OK;
}

static zo_status files_open(hf_files *f, const char *dir)
{
    return files_open_as(f, dir, "model.safetensors", "model.safetensors.index.json");
}

/* The reader holding tensor name, or NULL (absent; *file names where it was looked for). */
static zo_status files_find(hf_files *f, const char *name, zo_st_reader_t *out, const char **file)
{
    const char *shard = f->single;
    if (f->map) {
        json_t *v = json_object_get(f->map, name);
        *file = f->index;
        if (!v) {
            *out = NULL;
            return ZO_OK;
        }
        if (!json_is_string(v) || strchr(json_string_value(v), '/'))
            return zt_fail(ZO_ERR_CORRUPT, "%s/%s: weight_map['%s'] is not a file name", f->dir,
                           *file, name);
        shard = json_string_value(v);
    }
    *file = shard;
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->names[i], shard) == 0) {
            *out = f->readers[i];
            return ZO_OK;
        }
    if (f->n == HF_MAX_SHARDS)
        return zt_fail(ZO_ERR_INVALID_ARG, "%s: more than %d shards", f->dir, HF_MAX_SHARDS);
    char path[HF_PATH];
    ZT_TRY(join(path, f->dir, shard));
    zo_status st = zo_st_reader_open(&f->readers[f->n], path);
    if (st < 0)
        return zt_fail(st, "loading %s: %s", path, zt_lib_message());
    if (!(f->names[f->n] = strdup(shard)))
        return zt_fail(ZO_ERR_NO_MEMORY, "a shard name");
    *out = f->readers[f->n++];
    return ZO_OK;
}

/* ---- the same for other callers (checkpoints) ---- */

zo_status zt_st_files_open(zt_st_files **out, const char *dir, const char *single,
                           const char *index)
{
    hf_files *f = calloc(1, sizeof *f);
    if (!f)
        return zt_fail(ZO_ERR_NO_MEMORY, "a safetensors file set");
    zo_status st = ZO_OK;
    if (snprintf(f->names_buf[0], sizeof f->names_buf[0], "%s", single) >= HF_NAME ||
        snprintf(f->names_buf[1], sizeof f->names_buf[1], "%s", index) >= HF_NAME ||
        snprintf(f->names_buf[2], sizeof f->names_buf[2], "%s", dir) >= HF_NAME)
        st = zt_fail(ZO_ERR_INVALID_ARG, "a name too long: %s/%s", dir, index);
    if (st >= 0)
        st = files_open_as(f, f->names_buf[2], f->names_buf[0], f->names_buf[1]);
    if (st < 0) {
        files_close(f);
        free(f);
        return st;
    }
    *out = f;
    return ZO_OK;
}

zo_status zt_st_files_find(zt_st_files *f, const char *name, zo_st_reader_t *rd, const char **file)
{
    return files_find(f, name, rd, file);
}

int zt_st_files_sharded(const zt_st_files *f)
{
    return f->map != NULL;
}

zo_status zt_st_files_count(zt_st_files *f, size_t *n)
{
    if (f->map) {
        *n = json_object_size(f->map);
        return ZO_OK;
    }
    zo_st_reader_t rd;
    const char *file;
    ZT_TRY(files_find(f, "", &rd, &file));
    *n = zo_st_reader_count(rd);
    return ZO_OK;
}

zo_status zt_st_files_metadata(zt_st_files *f, const char *key, const char **value)
{
    *value = NULL;
    if (f->map) {
        *value = json_string_value(json_object_get(f->meta, key));
        return ZO_OK;
    }
    zo_st_reader_t rd;
    const char *file;
    ZT_TRY(files_find(f, "", &rd, &file));
    *value = zo_st_reader_metadata(rd, key);
    return ZO_OK;
}

void zt_st_files_free(zt_st_files *f)
{
    if (!f)
        return;
    files_close(f);
    free(f);
}

void zt_st_shard_name(char *out, size_t cap, const char *base, int shard, int shards)
{
    if (shards == 1)
        snprintf(out, cap, "%s.safetensors", base);
    else
        snprintf(out, cap, "%s-%05d-of-%05d.safetensors", base, shard + 1, shards);
}

zo_status zt_st_write_index(const char *path, json_t *metadata, const char *const *names,
                            const int *shard, size_t n, const char *base, int shards)
{
    json_t *map = json_object(), *root = NULL;
    for (size_t i = 0; map && i < n; i++) {
        char file[128];
        zt_st_shard_name(file, sizeof file, base, shard[i], shards);
        json_object_set_new(map, names[i], json_string(file));
    }
    if (map && metadata)
        root = json_pack("{s:o,s:o}", "metadata", metadata, "weight_map", map);
    else {
        json_decref(map);
        json_decref(metadata);
    }
    char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(root);
    if (!text)
        return zt_fail(ZO_ERR_NO_MEMORY, "the safetensors index %s", path);
    zo_status st = zo_atomic_write_file(path, text, strlen(text));
    free(text);
    if (st < 0)
        return zt_fail(st, "writing %s: %s", path, zt_lib_message());
    return ZO_OK;
}

/* ---- reading one tensor ---- */

static void to_f32(const zo_st_tensor_info *in, float *out, size_t n)
{
    const unsigned char *p = in->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        if (in->dtype == ZO_DTYPE_F32) {
            memcpy(&out[i], p + 4 * i, 4);
            continue;
        }
        memcpy(&h, p + 2 * i, 2);
        out[i] = in->dtype == ZO_DTYPE_BF16 ? zo_bf16_to_f32(h) : zo_f16_to_f32(h);
    }
}

/* Tensor name (shape ndim/shape) into buf as fp32; *found 0 when absent. */
static zo_status read_tensor(hf_files *f, const char *name, int ndim, const int64_t *shape,
                             size_t numel, float *buf, int *found)
{
    zo_st_reader_t rd = NULL;
    const char *file = NULL;
    ZT_TRY(files_find(f, name, &rd, &file));
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
    if (!rd || zo_st_reader_find(rd, name, &info) < 0) {
        *found = 0;
        return ZO_OK;
    }
    *found = 1;
    if (info.dtype != ZO_DTYPE_F32 && info.dtype != ZO_DTYPE_BF16 && info.dtype != ZO_DTYPE_F16)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "tensor '%s' in %s/%s: expected dtype F32, BF16 or F16, found %s", name,
                       f->dir, file, zo_st_dtype_name(info.dtype));
    zo_status st = zo_st_reader_expect(rd, name, info.dtype, ndim, shape, &info);
    if (st < 0)
        return zt_fail(st, "%s/%s: %s", f->dir, file, zt_lib_message());
    to_f32(&info, buf, numel);
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(buf[i]))
            return zt_fail(ZO_ERR_INVALID_ARG, "tensor '%s' in %s/%s has %s at index %zu", name,
                           f->dir, file, isnan(buf[i]) ? "NaN" : "Inf", i);
    return ZO_OK;
}

/* Tensor (layer, idx) from the files. */
static zo_status load_one(hf_files *f, const zt_shape *s, int layer, int idx, float *buf,
                          zt_hf_put_fn put, void *ctx)
{
    char name[160];
    int ndim, found = 0;
    int64_t shape[2];
    zt_tensor_hf(s, layer, idx, name, sizeof name, &ndim, shape);
    size_t numel = zt_tensor_numel(s, layer, idx);
    ZT_TRY(read_tensor(f, name, ndim, shape, numel, buf, &found));
    if (!found)
        return zt_fail(ZO_ERR_NOT_FOUND, "%s: no tensor '%s' in the model's weights", f->dir, name);
    return put(ctx, layer, idx, name, buf);
}

zo_status zt_hf_read_weights(const char *dir, const zt_shape *s, zt_hf_put_fn put, void *ctx)
{
    float *buf = malloc(zt_largest_tensor(s) * sizeof *buf);
    if (!buf)
        return zt_fail(ZO_ERR_NO_MEMORY, "a tensor buffer");
    hf_files f;
    zo_status st = files_open(&f, dir);
    for (int l = 0; st >= 0 && l < zt_engine_layers(s); l++)
        for (int i = 0; st >= 0 && i < zt_layer_tensors(s, l); i++)
            st = load_one(&f, s, l, i, buf, put, ctx);
    files_close(&f);
    free(buf);
    return st;
}

/* Across ranks each rank sets the tensors it owns (the others' come from
 * their owners: zo_engine_share_params). */
static zo_status put_master(void *ctx, int layer, int idx, const char *name, const float *w)
{
    zt_trainer *t = ctx;
    const zt_options *o = zt_trainer_options(t);
    int id = zt_trainer_tensor_id(t, layer, idx);
    if (o->tensor_parallel > 1) /* each rank its part */
        return zt_trainer_write_tp_master(t, layer, idx, w);
    if (zt_trainer_tensor_owner(t, layer, idx) != (o->world_size > 1 ? o->rank : 0))
        return ZO_OK;
    zo_status st = zo_engine_write_state(zt_trainer_engine(t), id, w, NULL, NULL);
    if (st < 0)
        return zt_fail(st, "setting %s: %s", name, zt_lib_message());
    return ZO_OK;
}

zo_status zt_hf_load_weights(zt_trainer *t, const char *dir)
{
    zo_status st = zt_hf_read_weights(dir, &zt_trainer_options(t)->shape, put_master, t);
    ZT_TRY(zt_ranks_agree(zt_trainer_comm(t), zt_trainer_stream(t), st, "--hf-model"));
    if (zt_trainer_comm(t))
        ZT_LIB(zo_engine_share_params(zt_trainer_engine(t)));
    return ZO_OK;
}

/* ---- saving ---- */

/* The shortest decimal that reads back as the same float (1e-05, not
 * 9.99999975e-06). */
static json_t *real_of(float v)
{
    char buf[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if ((float)strtod(buf, NULL) == v)
            break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *rope_scaling_json(const zo_rope_scaling *sc)
{
    switch (sc->type) {
    case ZO_ROPE_SCALING_NONE: return json_null();
    case ZO_ROPE_SCALING_LINEAR:
    case ZO_ROPE_SCALING_DYNAMIC:
        return json_pack("{s:s,s:o}", "rope_type",
                         sc->type == ZO_ROPE_SCALING_LINEAR ? "linear" : "dynamic", "factor",
                         real_of(sc->factor));
    case ZO_ROPE_SCALING_YARN:
        return json_pack("{s:s,s:o,s:i,s:o,s:o,s:o,s:b}", "rope_type", "yarn", "factor",
                         real_of(sc->factor), "original_max_position_embeddings",
                         sc->original_max_pos, "beta_fast", real_of(sc->beta_fast), "beta_slow",
                         real_of(sc->beta_slow), "attention_factor", real_of(sc->attention_factor),
                         "truncate", !sc->no_truncate);
    default:
        return json_pack("{s:s,s:o,s:o,s:o,s:i}", "rope_type", "llama3", "factor",
                         real_of(sc->factor), "low_freq_factor", real_of(sc->low_freq_factor),
                         "high_freq_factor", real_of(sc->high_freq_factor),
                         "original_max_position_embeddings", sc->original_max_pos);
    }
}

/* A model made here (a preset): every key written from the shape. Dynamic
 * scaling's max_position_embeddings is the one its theta grows past. */
static json_t *config_of_shape(const zt_options *o, zo_dtype dt)
{
    const zt_shape *s = &o->shape;
    int qwen2 = s->attn_bias && !s->o_bias;
    int max_pos = s->rope_scaling.type == ZO_ROPE_SCALING_DYNAMIC ? s->rope_scaling.original_max_pos
                  : o->seq > 2048                                 ? o->seq
                                                                  : 2048;
    return json_pack(
        "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:b,s:s,s:i,s:s,s:b}", "architectures",
        qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", "model_type", qwen2 ? "qwen2" : "llama",
        "hidden_size", s->dim, "intermediate_size", s->ffn_dim, "num_attention_heads", s->n_heads,
        "num_hidden_layers", s->n_layers, "num_key_value_heads", zt_kv_heads(s), "head_dim",
        zt_head_dim(s), "vocab_size", s->vocab, "rms_norm_eps", real_of(s->norm_eps), "rope_theta",
        real_of(s->rope_theta), "rope_scaling", rope_scaling_json(&s->rope_scaling),
        "tie_word_embeddings", s->tied, "hidden_act", "silu", "max_position_embeddings", max_pos,
        "torch_dtype", dt == ZO_DTYPE_F32 ? "float32" : "bfloat16",
        qwen2 ? "use_sliding_window" : "attention_bias", qwen2 ? 0 : s->o_bias);
}

/* A model read from --hf-model: its config.json as it was, every key kept
 * (architecture, positions, token ids, sliding window, RoPE scaling as
 * written), since the shape was read from it and training changes only the
 * weights; only the dtype of the saved weights is set ("dtype" where
 * transformers 5 wrote it, else "torch_dtype"). */
static zo_status config_carried(const char *hf_model, zo_dtype dt, json_t **out)
{
    char path[HF_PATH];
    ZT_TRY(join(path, hf_model, "config.json"));
    json_t *c;
    ZT_TRY(zt_json_read(path, 0, &c));
    if (!json_is_object(c)) {
        json_decref(c);
        return zt_fail(ZO_ERR_CONFIG, "%s: not a JSON object", path);
    }
    const char *key = json_object_get(c, "dtype") ? "dtype" : "torch_dtype";
    json_object_set_new(c, key, json_string(dt == ZO_DTYPE_F32 ? "float32" : "bfloat16"));
    *out = c;
    return ZO_OK;
}

/* The files of a Hugging Face directory beside the weights that training
 * leaves as they were: copied so that the saved directory loads (and
 * generates, and tokenizes) as the input did. */
static const char *const side_files[] = {"generation_config.json",
                                         "tokenizer.json",
                                         "tokenizer_config.json",
                                         "tokenizer.model",
                                         "special_tokens_map.json",
                                         "vocab.json",
                                         "merges.txt",
                                         "added_tokens.json"};

static zo_status read_whole(const char *path, char **buf, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zt_fail(ZO_ERR_IO, "reading %s: %s", path, strerror(errno));
    zo_status st = ZO_OK;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    *buf = len >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)len + 1) : NULL;
    if (!*buf || fread(*buf, 1, (size_t)len, f) != (size_t)len)
        st = zt_fail(ZO_ERR_IO, "reading %s", path);
    fclose(f);
    *n = (size_t)len;
    return st;
}

static zo_status copy_side_files(const char *hf_model, const char *dir)
{
    for (size_t i = 0; i < sizeof side_files / sizeof *side_files; i++) {
        char from[HF_PATH], to[HF_PATH], *buf = NULL;
        size_t n = 0;
        struct stat st;
        ZT_TRY(join(from, hf_model, side_files[i]));
        ZT_TRY(join(to, dir, side_files[i]));
        if (stat(from, &st) != 0)
            continue;
        zo_status rc = read_whole(from, &buf, &n);
        if (rc >= 0 && (rc = zo_atomic_write_file(to, buf, n)) < 0)
            zt_fail(rc, "writing %s: %s", to, zt_lib_message());
        free(buf);
        ZT_TRY(rc);
    }
    return ZO_OK;
}

/* The fewest significant digits that read every real of v back as itself:
 * 0.1 stays 0.1 (jansson's default of 17 writes 0.10000000000000001) and no
 * value the input wrote is rounded (a fixed 9 would cut 0.123456789012). */
static int real_digits(json_t *v)
{
    int p = 6; /* at least: 10000.0, not 1e4 */
    if (json_is_real(v)) {
        char buf[40];
        double x = json_real_value(v);
        for (; p < 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, x);
            if (strtod(buf, NULL) == x)
                break;
        }
    }
    const char *key;
    json_t *e;
    size_t i;
    if (json_is_object(v))
        json_object_foreach(v, key, e)
        {
            int q = real_digits(e);
            p = q > p ? q : p;
        }
    if (json_is_array(v))
        json_array_foreach(v, i, e)
        {
            int q = real_digits(e);
            p = q > p ? q : p;
        }
    return p;
}

static zo_status write_config(const zt_trainer *t, const char *dir, zo_dtype dt)
{
    const zt_options *o = zt_trainer_options(t);
    json_t *c = NULL;
    if (o->hf_model)
        ZT_TRY(config_carried(o->hf_model, dt, &c));
    else
        c = config_of_shape(o, dt);
    if (!c)
        return zt_fail(ZO_ERR_NO_MEMORY, "config.json");
    char path[HF_PATH];
    zo_status st = join(path, dir, "config.json");
    int digits = real_digits(c);
    if (st >= 0 &&
        json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits)) != 0)
        st = zt_fail(ZO_ERR_IO, "writing %s", path);
    json_decref(c);
    if (st >= 0 && o->hf_model)
        st = copy_side_files(o->hf_model, dir);
    return st;
}

typedef struct hf_tensor {
    int layer, idx, ndim, shard;
    int64_t shape[2];
    size_t numel;
    char name[160];
} hf_tensor;

/* Every tensor with its shard: in order, a new shard when the next would
 * pass shard_bytes. Returns the number of shards. */
static int assign_shards(const zt_shape *s, hf_tensor *x, int n, size_t es, uint64_t shard_bytes)
{
    int k = 0, shard = 0;
    uint64_t used = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++, k++) {
            x[k] = (hf_tensor){.layer = l, .idx = i, .numel = zt_tensor_numel(s, l, i)};
            zt_tensor_hf(s, l, i, x[k].name, sizeof x[k].name, &x[k].ndim, x[k].shape);
            uint64_t b = x[k].numel * es;
            if (used && used + b > shard_bytes)
                shard++, used = 0;
            x[k].shard = shard;
            used += b;
        }
    return n ? shard + 1 : 0;
}

static void shard_name(char *out, size_t cap, int shard, int shards)
{
    zt_st_shard_name(out, cap, "model", shard, shards);
}

static void from_f32(void *dst, zo_dtype dt, const float *src, size_t n)
{
    if (dt == ZO_DTYPE_F32) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    for (size_t i = 0; i < n; i++)
        ((uint16_t *)dst)[i] = zo_f32_to_bf16(src[i]);
}

/* With --tensor-parallel the group's first rank writes its shard and the
 * others give their parts: every rank of the group reads every tensor (a
 * gather), whatever failed before, so that none waits for a peer that left. */
static zo_status write_shard(zt_trainer *t, const char *dir, const hf_tensor *x, int n, int shard,
                             int shards, zo_dtype dt, void *buf, float *f32)
{
    const zt_options *o = zt_trainer_options(t);
    const int group = o->tensor_parallel > 1, writes = zt_options_tp_rank(o) == 0;
    char name[64], path[HF_PATH];
    shard_name(name, sizeof name, shard, shards);
    ZT_TRY(join(path, dir, name));
    zo_st_writer_t w = NULL;
    zo_status st = writes ? zo_st_writer_init(&w, path) : ZO_OK;
    for (int i = 0; st >= 0 && writes && i < n; i++)
        if (x[i].shard == shard)
            st = zo_st_writer_declare(w, x[i].name, dt, x[i].ndim, x[i].shape);
    for (int i = 0; (st >= 0 || group) && i < n; i++) {
        if (x[i].shard != shard)
            continue;
        zo_status rs = zt_trainer_read_weights(t, x[i].layer, x[i].idx, f32);
        if (st >= 0)
            st = rs;
        if (st < 0 || !writes)
            continue;
        from_f32(buf, dt, f32, x[i].numel);
        st = zo_st_writer_write(w, x[i].name, buf, x[i].numel * zo_dtype_size(dt));
    }
    if (!writes)
        return st;
    if (st >= 0)
        st = zo_st_writer_commit(w);
    zo_st_writer_free(w);
    if (st < 0 && !strstr(zt_last_error(), path))
        zt_fail(st, "writing %s: %s", path, zt_lib_message());
    return st;
}

static zo_status write_index(const char *dir, const hf_tensor *x, int n, int shards, size_t es)
{
    json_t *map = json_object(), *root = NULL;
    uint64_t total = 0;
    for (int i = 0; map && i < n; i++) {
        char name[64];
        shard_name(name, sizeof name, x[i].shard, shards);
        json_object_set_new(map, x[i].name, json_string(name));
        total += x[i].numel * es;
    }
    if (map)
        root = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map",
                         map);
    if (!root)
        return zt_fail(ZO_ERR_NO_MEMORY, "the safetensors index");
    char path[HF_PATH];
    zo_status st = join(path, dir, "model.safetensors.index.json");
    if (st >= 0 && json_dump_file(root, path, JSON_INDENT(2)) != 0)
        st = zt_fail(ZO_ERR_IO, "writing %s", path);
    json_decref(root);
    return st;
}

static zo_status write_weights(zt_trainer *t, const char *dir, zo_dtype dt, uint64_t shard_bytes)
{
    const zt_shape *s = &zt_trainer_options(t)->shape;
    int n = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        n += zt_layer_tensors(s, l);
    size_t es = zo_dtype_size(dt), big = zt_largest_tensor(s);
    hf_tensor *x = calloc((size_t)n, sizeof *x);
    float *f32 = malloc(big * sizeof *f32);
    void *buf = malloc(big * es);
    zo_status st = x && f32 && buf ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "the save buffers");
    int shards = st >= 0 ? assign_shards(s, x, n, es, shard_bytes) : 0;
    for (int k = 0; st >= 0 && k < shards; k++)
        st = write_shard(t, dir, x, n, k, shards, dt, buf, f32);
    if (st >= 0 && shards > 1)
        st = write_index(dir, x, n, shards, es);
    free(x);
    free(f32);
    free(buf);
    return st;
}

static zo_status remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return ZO_OK;
    struct dirent *e;
    char path[HF_PATH];
    zo_status st = ZO_OK;
    while (st >= 0 && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (st = join(path, dir, e->d_name)) >= 0 && unlink(path) != 0)
            st = zt_fail(ZO_ERR_IO, "removing %s: %s", path, strerror(errno));
    closedir(d);
    if (st >= 0 && rmdir(dir) != 0)
        st = zt_fail(ZO_ERR_IO, "removing %s: %s", dir, strerror(errno));
    return st;
}

static zo_status check_dtype(zo_dtype dt)
{
    if (dt != ZO_DTYPE_BF16 && dt != ZO_DTYPE_F32)
        return zt_fail(ZO_ERR_INVALID_ARG, "Hugging Face weights in %s: expected bf16 or fp32",
                       zo_dtype_name(dt));
    return ZO_OK;
}

zo_status zt_hf_save_begin(const char *dir, char *tmp, size_t cap)
{
    if (snprintf(tmp, cap, "%s.tmp", dir) >= (int)cap)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s", dir);
    ZT_TRY(remove_dir(tmp));
    if (mkdir(tmp, 0777) != 0)
        return zt_fail(ZO_ERR_IO, "creating %s: %s", tmp, strerror(errno));
    return ZO_OK;
}

static zo_status save_end(const char *tmp, const char *dir)
{
    ZT_TRY(remove_dir(dir));
    if (rename(tmp, dir) != 0)
        return zt_fail(ZO_ERR_IO, "renaming %s to %s: %s", tmp, dir, strerror(errno));
    return ZO_OK;
}

/* Every tensor with its owner's shard (one shard a rank). */
static zo_status owner_shards(zt_trainer *t, hf_tensor **out, int *n)
{
    const zt_shape *s = &zt_trainer_options(t)->shape;
    int total = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        total += zt_layer_tensors(s, l);
    hf_tensor *x = calloc((size_t)total, sizeof *x);
    if (!x)
        return zt_fail(ZO_ERR_NO_MEMORY, "the tensor list");
    assign_shards(s, x, total, 1, UINT64_MAX);
    for (int k = 0; k < total; k++) /* with --tensor-parallel its owner's group's */
        x[k].shard = zt_trainer_tensor_owner(t, x[k].layer, x[k].idx) /
                     zt_options_tp_size(zt_trainer_options(t));
    *out = x;
    *n = total;
    return ZO_OK;
}

zo_status zt_hf_save_shard(zt_trainer *t, const char *tmp, zo_dtype dt, int rank, int ranks)
{
    ZT_TRY(check_dtype(dt));
    const zt_shape *s = &zt_trainer_options(t)->shape;
    size_t big = zt_largest_tensor(s);
    hf_tensor *x = NULL;
    int n = 0;
    ZT_TRY(owner_shards(t, &x, &n));
    float *f32 = malloc(big * sizeof *f32);
    void *buf = malloc(big * zo_dtype_size(dt));
    zo_status st = f32 && buf ? write_shard(t, tmp, x, n, rank, ranks, dt, buf, f32)
                              : zt_fail(ZO_ERR_NO_MEMORY, "the save buffers");
    free(x);
    free(f32);
    free(buf);
    return st;
}

zo_status zt_hf_save_end(zt_trainer *t, const char *tmp, const char *dir, zo_dtype dt, int ranks)
{
    hf_tensor *x = NULL;
    int n = 0;
    ZT_TRY(owner_shards(t, &x, &n));
    zo_status st = write_config(t, tmp, dt);
    if (st >= 0 && ranks > 1)
        st = write_index(tmp, x, n, ranks, zo_dtype_size(dt));
    free(x);
    return st < 0 ? st : save_end(tmp, dir);
}

zo_status zt_hf_save(zt_trainer *t, const char *dir, zo_dtype dt, uint64_t shard_bytes)
{
    ZT_TRY(check_dtype(dt));
    if (shard_bytes == 0)
        return zt_fail(ZO_ERR_INVALID_ARG, "a shard size of 0 bytes");
    char tmp[HF_PATH];
    ZT_TRY(zt_hf_save_begin(dir, tmp, sizeof tmp));
    ZT_TRY(write_config(t, tmp, dt));
    ZT_TRY(write_weights(t, tmp, dt, shard_bytes));
    return save_end(tmp, dir);
}
