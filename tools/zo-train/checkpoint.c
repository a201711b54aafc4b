/* zo-train's checkpoints (see checkpoint.h): Hugging Face-named safetensors
 * streamed tensor by tensor from the engine, the training state as JSON, and
 * the crash-safe directory protocol. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_sums.h"
#include "ckpt_tp.h"
#include "hf_io.h"
#include "ranks.h"
#include "zo/atomic_file.h"
#include "zo/file.h"
#include "zo/half.h"
#include "zo/optim.h"
#include "zo/safetensors.h"
#include "zt_error.h"
#include "zt_json.h"

#define ZT_CKPT_FORMAT "zoffload-checkpoint"
enum { ZT_CKPT_VERSION = 1, ZT_PATH = 4096 };

/* ---- names ---- */

zo_status zt_ckpt_tensor(const zt_shape *s, int layer, int idx, char *name, size_t cap, int *ndim,
                         int64_t shape[2])
{
    /* the shape part names them (GQA, head_dim and biases included) */
    zt_tensor_hf(s, layer, idx, name, cap, ndim, shape);
    return ZO_OK;
}

typedef struct tensor_ref {
    int layer, idx, id, ndim;
    int64_t shape[2];
    size_t numel;
    char name[128];
} tensor_ref;

/* Every tensor of the model, in registration order. */
static zo_status model_tensors(const zt_trainer *t, tensor_ref **out, int *n)
{
    const zt_shape *s = &zt_trainer_options(t)->shape;
    int total = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        total += zt_layer_tensors(s, l);
    tensor_ref *r = calloc((size_t)total, sizeof *r);
    if (!r)
        return zt_fail(ZO_ERR_NO_MEMORY, "the tensor list");
    int k = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++, k++) {
            tensor_ref *x = &r[k];
            x->layer = l;
            x->idx = i;
            x->id = zt_trainer_tensor_id(t, l, i);
            x->numel = zt_tensor_numel(s, l, i);
            zo_status st = zt_ckpt_tensor(s, l, i, x->name, sizeof x->name, &x->ndim, x->shape);
            if (st < 0) {
                free(r);
                return st;
            }
        }
    *out = r;
    *n = total;
    return ZO_OK;
}

static size_t largest(const tensor_ref *r, int n)
{
    size_t mx = 0;
    for (int i = 0; i < n; i++)
        mx = r[i].numel > mx ? r[i].numel : mx;
    return mx;
}

/* ---- paths ---- */

static zo_status join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, ZT_PATH, "%s/%s", dir, name);
    if (n < 0 || n >= ZT_PATH)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/%s", dir, name);
    return ZO_OK;
}

/* This process's world rank (0 with one rank): world rank 0 prepares and
 * completes a checkpoint's directory. */
static int world_rank(const zt_trainer *t)
{
    const zt_options *o = zt_trainer_options(t);
    return o->world_size > 1 ? o->rank : 0;
}

/* The shard this rank's tensor-parallel group writes and reads, and the
 * run's shards: one a rank (0 of 1 with one rank), and with
 * --tensor-parallel T one a group of T ranks, numbered as the ranks of a run
 * at T = 1 with the same stages and data-parallel ranks (ckpt_tp.h). */
static int rank_of(const zt_trainer *t)
{
    return world_rank(t) / zt_options_tp_size(zt_trainer_options(t));
}

static int ranks_of(const zt_trainer *t)
{
    const zt_options *o = zt_trainer_options(t);
    return o->world_size > 1 ? o->world_size / zt_options_tp_size(o) : 1;
}

/* The shard holding tensor (layer, idx): its owner's group's. */
static int shard_of(const zt_trainer *t, int layer, int idx)
{
    return zt_trainer_tensor_owner(t, layer, idx) / zt_options_tp_size(zt_trainer_options(t));
}

/* Tensor parallel: whether this rank writes its group's shard (its first
 * rank) or only gives its parts. */
static int writes_shard(const zt_trainer *t)
{
    return zt_options_tp_rank(zt_trainer_options(t)) == 0;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Remove a checkpoint directory (it holds only files). */
static zo_status remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? ZO_OK
                               : zt_fail(ZO_ERR_SYSTEM, "cannot open %s: %s", dir, strerror(errno));
    struct dirent *e;
    char p[ZT_PATH];
    zo_status st = ZO_OK;
    while (st >= 0 && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (st = join(p, dir, e->d_name)) >= 0 && unlink(p) != 0)
            st = zt_fail(ZO_ERR_SYSTEM, "cannot remove %s: %s", p, strerror(errno));
    closedir(d);
    ZT_TRY(st);
    if (rmdir(dir) != 0)
        return zt_fail(ZO_ERR_SYSTEM, "cannot remove %s: %s", dir, strerror(errno));
    return ZO_OK;
}

/* Checkpoints a crash left half written. */
static zo_status remove_stale_tmps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return zt_fail(ZO_ERR_SYSTEM, "cannot open %s: %s", dir, strerror(errno));
    struct dirent *e;
    char p[ZT_PATH];
    zo_status st = ZO_OK;
    while (st >= 0 && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) == 0 && n > 4 &&
            strcmp(e->d_name + n - 4, ".tmp") == 0 && (st = join(p, dir, e->d_name)) >= 0)
            st = remove_tree(p);
    }
    closedir(d);
    return st;
}

/* DIR/latest's checkpoint name ("" when there is none). */
static zo_status read_latest(const char *dir, char *name, size_t cap)
{
    char p[ZT_PATH];
    ZT_TRY(join(p, dir, ZT_CKPT_LATEST));
    name[0] = 0;
    FILE *f = NULL;
    zo_status st = zo_file_fopen_read(p, &f);
    if (st < 0)
        return st == ZO_ERR_NOT_FOUND ? ZO_OK : zt_lib_fail(st, "the checkpoint's 'latest'");
    int ok = fgets(name, (int)cap, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || !name[0] || strchr(name, '/') || name[0] == '.')
        return zt_fail(ZO_ERR_CORRUPT, "%s does not name a checkpoint directory ('%s')", p, name);
    return ZO_OK;
}

int zt_ckpt_has_latest(const char *dir)
{
    char p[ZT_PATH];
    return join(p, dir, ZT_CKPT_LATEST) >= 0 && exists(p);
}

/* ---- saving ---- */

typedef struct writers {
    zo_st_writer_t model, optim;
    char model_path[ZT_PATH], optim_path[ZT_PATH];
    char model_name[128], optim_name[128]; /* the files' base names */
    zt_sums *sums;                         /* what was written, hashed */
} writers;

static zo_status writer_fail(zo_status st, const char *path)
{
    return zt_fail(st, "writing checkpoint file %s: %s", path, zt_lib_message());
}

/* A whole tensor into the model file (optim 0) or the optimizer's, its
 * checksum recorded. */
static zo_status put_tensor(writers *w, int optim, const char *name, const void *data, size_t n)
{
    zo_status st = zo_st_writer_write(optim ? w->optim : w->model, name, data, n);
    if (st < 0)
        return writer_fail(st, optim ? w->optim_path : w->model_path);
    return zt_sums_add(w->sums, optim ? w->optim_name : w->model_name, name, data, n);
}

/* ---- the moments' formats ----
 * The optimizer file keeps m and v as the engine stores them, in the
 * format's code dtype and the weights' shape (zo_state_format, zo/optim.h:
 * fp32, bf16, or int8's u8 codes), plus for a block-scaled format
 * NAME.absmax, one fp32 scale per block (fp32, no scales, for the tensors
 * the engine keeps in fp32: those below the format's min_numel and the
 * embedding, zo_engine_tensor_state_dtype). Its metadata names the format
 * ("optimizer_state_dtype"; none: fp32). */
#define ZT_STATE_DTYPE_KEY "optimizer_state_dtype"

/* A tensor's moments as this run's engine keeps them. */
static zo_dtype tensor_fmt(zt_trainer *t, const tensor_ref *x)
{
    return zo_engine_tensor_state_dtype(zt_trainer_engine(t), x->id);
}

/* ... and as this run's checkpoint stores them (the engine's format, or
 * fp32 where int8 blocks straddle tensor-parallel parts: ckpt_tp.h). */
static zo_dtype saved_fmt(zt_trainer *t, const tensor_ref *x)
{
    return zt_ckpt_saved_format(zt_trainer_options(t), x->layer, x->idx);
}

/* The safetensors dtype of a moment stored in state format fmt. */
static zo_dtype moment_file_dtype(zo_dtype fmt)
{
    return zo_state_format_of(fmt)->code_dtype;
}

/* The scales of a moment of numel elements in format fmt (0: it has none). */
static size_t moment_scales(zo_dtype fmt, size_t numel)
{
    size_t block = zo_state_format_of(fmt)->block;
    return block ? (numel + block - 1) / block : 0;
}

static void moment_name(char *nm, size_t cap, const char *tensor, int k, int scales)
{
    snprintf(nm, cap, "%s.%s%s", tensor, k ? "exp_avg_sq" : "exp_avg", scales ? ".absmax" : "");
}

static zo_status declare_all(zt_trainer *t, writers *w, const tensor_ref *r, int n, zo_dtype fmt)
{
    char nm[160];
    zo_status st =
        zo_st_writer_set_metadata(w->optim, ZT_STATE_DTYPE_KEY, zt_state_dtype_name(fmt));
    if (st < 0)
        return writer_fail(st, w->optim_path);
    for (int i = 0; i < n; i++) {
        if ((st = zo_st_writer_declare(w->model, r[i].name, ZO_DTYPE_F32, r[i].ndim, r[i].shape)) <
            0)
            return writer_fail(st, w->model_path);
        zo_dtype tf = saved_fmt(t, &r[i]);
        int64_t blocks = (int64_t)moment_scales(tf, r[i].numel);
        for (int k = 0; k < 2; k++) {
            moment_name(nm, sizeof nm, r[i].name, k, 0);
            if ((st = zo_st_writer_declare(w->optim, nm, moment_file_dtype(tf), r[i].ndim,
                                           r[i].shape)) < 0)
                return writer_fail(st, w->optim_path);
            moment_name(nm, sizeof nm, r[i].name, k, 1);
            if (blocks && (st = zo_st_writer_declare(w->optim, nm, ZO_DTYPE_F32, 1, &blocks)) < 0)
                return writer_fail(st, w->optim_path);
        }
    }
    return ZO_OK;
}

/* Moment k (m, v) of tensor x as stored (raw: zo_engine_read_state_raw's layout). */
static zo_status write_moment(writers *w, const tensor_ref *x, int k, zo_dtype fmt, void *raw)
{
    char nm[160];
    moment_name(nm, sizeof nm, x->name, k, 0);
    ZT_TRY(
        put_tensor(w, 1, nm, raw, zo_state_format_code_bytes(zo_state_format_of(fmt), x->numel)));
    size_t scales = moment_scales(fmt, x->numel);
    if (!scales)
        return ZO_OK;
    moment_name(nm, sizeof nm, x->name, k, 1);
    return put_tensor(w, 1, nm, zo_state_format_scales(zo_state_format_of(fmt), raw, x->numel),
                      scales * sizeof(float));
}

/* The index of the first NaN or Inf in x[0..n), or n. */
static size_t first_nonfinite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return n;
}

static zo_status refuse_nonfinite(const char *name, const char *where, const float *x, size_t i)
{
    return zt_fail(ZO_ERR_INVALID_ARG, "tensor '%s'%s has %s at index %zu: training diverged", name,
                   where, isnan(x[i]) ? "NaN" : "Inf", i);
}

/* Tensor x's whole master weights and moments (in saved_fmt's raw layout)
 * into buf, m and v: from the engine, or with --tensor-parallel gathered
 * from the group's parts (every rank of the group joins; read 0: without
 * reading, after this rank failed). */
static zo_status read_whole(zt_trainer *t, const tensor_ref *x, int read, float *buf, void *m,
                            void *v)
{
    if (zt_trainer_tp_comm(t))
        return zt_ckpt_tp_gather(t, x->layer, x->idx, read, buf, m, v);
    ZT_LIB(zo_engine_read_state_raw(zt_trainer_engine(t), x->id, buf, m, v));
    return ZO_OK;
}

/* Weights that are not finite are not saved: the save fails before
 * `latest` moves, so the last good checkpoint stays. */
static zo_status put_whole(zt_trainer *t, writers *w, const tensor_ref *x, const float *buf,
                           void *m, void *v)
{
    size_t bad = first_nonfinite(buf, x->numel);
    if (bad < x->numel)
        return refuse_nonfinite(x->name, " (the weights to save)", buf, bad);
    ZT_TRY(put_tensor(w, 0, x->name, buf, x->numel * sizeof(float)));
    for (int k = 0; k < 2; k++)
        ZT_TRY(write_moment(w, x, k, saved_fmt(t, x), k ? v : m));
    return ZO_OK;
}

/* One tensor at a time: master into the model file, m and v into the
 * optimizer's (w NULL: a tensor-parallel rank that only gives its parts).
 * st: how the save went so far; a tensor-parallel group's ranks go through
 * every gather whatever failed, so that none waits for a peer that left. */
static zo_status stream_all(zt_trainer *t, writers *w, const tensor_ref *r, int n, float *buf,
                            zo_status st)
{
    const size_t cap = largest(r, n) + 2; /* see write_tensors */
    float *m = buf ? buf + cap : NULL, *v = buf ? buf + 2 * cap : NULL;
    const int group = zt_trainer_tp_comm(t) != NULL;
    for (int i = 0; i < n && (st >= 0 || group); i++) {
        zo_status rs = read_whole(t, &r[i], st >= 0, buf, m, v);
        if (st >= 0)
            st = rs;
        if (st >= 0 && w)
            st = put_whole(t, w, &r[i], buf, m, v);
    }
    if (st < 0 || !w)
        return st;
    if ((st = zo_st_writer_commit(w->model)) < 0)
        return writer_fail(st, w->model_path);
    if ((st = zo_st_writer_commit(w->optim)) < 0)
        return writer_fail(st, w->optim_path);
    return ZO_OK;
}

/* The tensors of shard `shard` (every tensor with one rank), compacted in
 * place: the tensors a rank (with --tensor-parallel, its group) holds. */
static int owned_only(zt_trainer *t, tensor_ref *r, int n, int shard)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (shard_of(t, r[i].layer, r[i].idx) == shard)
            r[k++] = r[i];
    return k;
}

/* The shard's two files open, their metadata and tensors declared. */
static zo_status open_writers(zt_trainer *t, writers *w, const char *dir, const tensor_ref *r,
                              int n, int rank, int ranks)
{
    zt_st_shard_name(w->model_name, sizeof w->model_name, ZT_CKPT_MODEL_BASE, rank, ranks);
    zt_st_shard_name(w->optim_name, sizeof w->optim_name, ZT_CKPT_OPTIM_BASE, rank, ranks);
    ZT_TRY(zt_sums_new(&w->sums));
    ZT_TRY(join(w->model_path, dir, w->model_name));
    ZT_TRY(join(w->optim_path, dir, w->optim_name));
    zo_status st;
    if ((st = zo_st_writer_init(&w->model, w->model_path)) < 0)
        return writer_fail(st, w->model_path);
    if ((st = zo_st_writer_init(&w->optim, w->optim_path)) < 0)
        return writer_fail(st, w->optim_path);
    if ((st = zo_st_writer_set_metadata(w->model, "zoffload", "fp32 master weights")) < 0)
        return writer_fail(st, w->model_path);
    return declare_all(t, w, r, n, zo_engine_state_dtype(zt_trainer_engine(t)));
}

/* This rank's tensors into DIR/model and DIR/optimizer (.safetensors with
 * one shard, else shard -0000{rank+1}-of-0000{ranks}), and their checksums
 * into DIR/checksums (the same naming, ckpt_sums.h). With --tensor-parallel
 * the group's first rank writes the group's shard of whole tensors and the
 * others give their parts. */
static zo_status write_tensors(zt_trainer *t, const char *dir, int rank, int ranks)
{
    tensor_ref *r = NULL;
    int n = 0;
    ZT_TRY(model_tensors(t, &r, &n));
    n = owned_only(t, r, n, rank);
    writers w = {0};
    const int writes = writes_shard(t);
    /* master, m, v: a moment as stored takes at most 4 bytes an element and
     * 8 more (int8: codes padded to 4 bytes, then 4 bytes a block) */
    float *buf = malloc(3 * (largest(r, n) + 2) * sizeof *buf);
    zo_status st = buf ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "a tensor buffer");
    if (st >= 0 && writes)
        st = open_writers(t, &w, dir, r, n, rank, ranks);
    st = stream_all(t, writes ? &w : NULL, r, n, buf, st);
    if (st >= 0 && writes)
        st = zt_sums_write(w.sums, dir, rank, ranks);
    zt_sums_free(w.sums);
    zo_st_writer_free(w.model);
    zo_st_writer_free(w.optim);
    free(buf);
    free(r);
    return st;
}

/* ---- the indices of a sharded checkpoint (rank 0) ---- */

typedef struct index_list {
    const char **names;
    char (*store)[160];
    int *shard;
    size_t n;
    uint64_t bytes;
} index_list;

static void index_add(index_list *x, const char *name, int shard, uint64_t bytes)
{
    snprintf(x->store[x->n], sizeof x->store[x->n], "%s", name);
    x->names[x->n] = x->store[x->n];
    x->shard[x->n++] = shard;
    x->bytes += bytes;
}

static zo_status index_alloc(index_list *x, size_t cap)
{
    memset(x, 0, sizeof *x);
    x->names = calloc(cap, sizeof *x->names);
    x->store = calloc(cap, sizeof *x->store);
    x->shard = calloc(cap, sizeof *x->shard);
    if (!x->names || !x->store || !x->shard)
        return zt_fail(ZO_ERR_NO_MEMORY, "a checkpoint index");
    return ZO_OK;
}

static void index_free(index_list *x)
{
    free(x->names);
    free(x->store);
    free(x->shard);
}

/* Every tensor under its owner's shard: the weights' index and the
 * optimizer's (its metadata naming the moments' format). */
static zo_status fill_indices(zt_trainer *t, const tensor_ref *r, int n, index_list *mi,
                              index_list *oi)
{
    char nm[160];
    for (int i = 0; i < n; i++) {
        int owner = shard_of(t, r[i].layer, r[i].idx);
        index_add(mi, r[i].name, owner, r[i].numel * sizeof(float));
        zo_dtype tf = saved_fmt(t, &r[i]);
        for (int k = 0; k < 2; k++) {
            moment_name(nm, sizeof nm, r[i].name, k, 0);
            index_add(oi, nm, owner,
                      zo_state_format_code_bytes(zo_state_format_of(tf), r[i].numel));
            moment_name(nm, sizeof nm, r[i].name, k, 1);
            if (moment_scales(tf, r[i].numel))
                index_add(oi, nm, owner, moment_scales(tf, r[i].numel) * sizeof(float));
        }
    }
    return ZO_OK;
}

static zo_status write_indices(zt_trainer *t, const char *dir, int ranks)
{
    tensor_ref *r = NULL;
    int n = 0;
    ZT_TRY(model_tensors(t, &r, &n));
    index_list mi, oi;
    char p[ZT_PATH];
    zo_dtype fmt = zo_engine_state_dtype(zt_trainer_engine(t));
    zo_status st = index_alloc(&mi, (size_t)n);
    if (st >= 0)
        st = index_alloc(&oi, 4 * (size_t)n);
    if (st >= 0)
        st = fill_indices(t, r, n, &mi, &oi);
    if (st >= 0 && (st = join(p, dir, ZT_CKPT_MODEL_INDEX)) >= 0)
        st = zt_st_write_index(p, json_pack("{s:I}", "total_size", (json_int_t)mi.bytes), mi.names,
                               mi.shard, mi.n, ZT_CKPT_MODEL_BASE, ranks);
    if (st >= 0 && (st = join(p, dir, ZT_CKPT_OPTIM_INDEX)) >= 0)
        st = zt_st_write_index(p,
                               json_pack("{s:I,s:s,s:i}", "total_size", (json_int_t)oi.bytes,
                                         ZT_STATE_DTYPE_KEY, zt_state_dtype_name(fmt), "world_size",
                                         ranks),
                               oi.names, oi.shard, oi.n, ZT_CKPT_OPTIM_BASE, ranks);
    index_free(&mi);
    index_free(&oi);
    free(r);
    return st;
}

static json_t *state_json(const zt_trainer *t, const zt_train_state *ts,
                          const zo_engine_step_state *es)
{
    const zt_options *o = zt_trainer_options(t);
    const zt_shape *s = &o->shape;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)ts->data.seed);
    return json_pack(
        "{s:s,s:i,s:I,s:{s:I,s:I,s:f,s:I,s:I,s:i},s:{s:s,s:I,s:f},s:{s:s,s:I,s:I,s:i},"
        "s:{s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:s,s:b},s:{s:i,s:i}}",
        "format", ZT_CKPT_FORMAT, "version", ZT_CKPT_VERSION, "step", (json_int_t)ts->step,
        "engine", "updates", (json_int_t)es->updates, "steps", (json_int_t)es->steps, "loss_scale",
        es->loss_scale, "scaler_iter", (json_int_t)es->scaler_iter, "scaler_last_overflow_iter",
        (json_int_t)es->scaler_last_overflow_iter, "scaler_hysteresis", es->scaler_hysteresis,
        "scheduler", "type", zo_scheduler_type_name(o->sched.type), "last_batch_iteration",
        (json_int_t)ts->sched_it, "lr", ts->lr, "data", "seed", seed, "epoch",
        (json_int_t)ts->data.epoch, "cursor", (json_int_t)ts->data.cursor, "seq", o->seq, "model",
        "vocab", s->vocab, "dim", s->dim, "layers", s->n_layers, "heads", s->n_heads, "ffn",
        s->ffn_dim, "norm_eps", (double)s->norm_eps, "rope_theta", (double)s->rope_theta, "dtype",
        zo_dtype_name(o->dtype), "tied", s->tied, "batch", "micro_batch", o->micro_batch,
        "grad_accum", o->grad_accum);
}

/* The data file (its absolute path and size), which a resumed run must
 * share: another file is another run. */
static void add_data_identity(json_t *root, const char *data_path)
{
    char real[PATH_MAX];
    struct stat sb;
    json_t *data = json_object_get(root, "data");
    if (!data || !realpath(data_path, real) || stat(real, &sb) != 0)
        return;
    json_object_set_new(data, "file", json_string(real));
    json_object_set_new(data, "bytes", json_integer((json_int_t)sb.st_size));
}

/* The windows a step reads over all ranks. */
static int64_t batch_windows(const zt_options *o)
{
    return (int64_t)o->micro_batch * o->grad_accum * zt_options_dp_size(o);
}

/* What a resumed run cross-checks (the data position against the steps)
 * and names when it changes (the optimizer's hyper-parameters). */
static void add_cross_checks(json_t *root, const zt_options *o, const zt_train_state *ts)
{
    json_t *data = json_object_get(root, "data");
    json_t *opt =
        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:s}", "lr", (double)o->lr, "beta1", (double)o->beta1,
                  "beta2", (double)o->beta2, "eps", (double)o->eps, "weight_decay",
                  (double)o->weight_decay, "max_grad_norm", (double)o->max_grad_norm, "state_dtype",
                  zt_state_dtype_name(o->state_dtype));
    if (data) {
        json_object_set_new(data, "batch_windows", json_integer((json_int_t)batch_windows(o)));
        json_object_set_new(data, "origin_step", json_integer((json_int_t)ts->origin_step));
        json_object_set_new(data, "origin_windows", json_integer((json_int_t)ts->origin_windows));
    }
    if (opt)
        json_object_set_new(root, "optimizer", opt);
    if (o->hf_model)
        json_object_set_new(json_object_get(root, "model"), "hf_model", json_string(o->hf_model));
}

static zo_status write_state_file(zt_trainer *t, const char *dir, const zt_train_state *ts)
{
    zo_engine_step_state es = ZO_ENGINE_STEP_STATE_INIT;
    ZT_LIB(zo_engine_get_step_state(zt_trainer_engine(t), &es));
    json_t *root = state_json(t, ts, &es);
    if (root) {
        add_cross_checks(root, zt_trainer_options(t), ts);
        add_data_identity(root, zt_trainer_options(t)->data_path);
        json_object_set_new(json_object_get(root, "batch"), "world_size", /* the batch's ranks */
                            json_integer(zt_options_dp_size(zt_trainer_options(t))));
    }
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    if (!text)
        return zt_fail(ZO_ERR_NO_MEMORY, "the training state's JSON");
    char p[ZT_PATH];
    zo_status st = join(p, dir, ZT_CKPT_STATE);
    if (st >= 0 && (st = zo_atomic_write_file(p, text, strlen(text))) < 0)
        writer_fail(st, p);
    free(text);
    return st;
}

typedef struct save_names {
    char name[64], final[ZT_PATH], tmp[ZT_PATH], latest[ZT_PATH];
} save_names;

static zo_status name_save(const char *dir, int64_t step, save_names *n)
{
    char tmp_name[80];
    snprintf(n->name, sizeof n->name, "step-%08lld", (long long)step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", n->name);
    ZT_TRY(join(n->final, dir, n->name));
    ZT_TRY(join(n->tmp, dir, tmp_name));
    return join(n->latest, dir, ZT_CKPT_LATEST);
}

/* DIR/step-N.tmp, empty, and what a crash left cleared away. */
static zo_status begin_save(const char *dir, const save_names *n)
{
    char latest[256];
    ZT_TRY(zt_make_dir(dir));
    ZT_TRY(read_latest(dir, latest, sizeof latest));
    if (strcmp(latest, n->name) == 0)
        return zt_fail(ZO_ERR_STATE, "%s/%s already names %s: not replacing the latest checkpoint",
                       dir, ZT_CKPT_LATEST, n->name);
    ZT_TRY(remove_stale_tmps(dir));
    ZT_TRY(
        remove_tree(n->final)); /* a checkpoint latest never named (a crash, or an abandoned run) */
    if (mkdir(n->tmp, 0755) != 0)
        return zt_fail(ZO_ERR_SYSTEM, "cannot create %s: %s", n->tmp, strerror(errno));
    return ZO_OK;
}

/* The complete DIR/step-N.tmp becomes DIR/step-N, then latest names it. */
static zo_status end_save(const save_names *n)
{
    if (rename(n->tmp, n->final) != 0)
        return zt_fail(ZO_ERR_SYSTEM, "cannot rename %s to %s: %s", n->tmp, n->final,
                       strerror(errno));
    ZT_LIB(zo_fsync_parent_dir(n->final));
    char text[80];
    int len = snprintf(text, sizeof text, "%s\n", n->name);
    zo_status st = zo_atomic_write_file(n->latest, text, (size_t)len);
    return st < 0 ? writer_fail(st, n->latest) : ZO_OK;
}

/* Rank 0's part after the shards: the indices and the training state. */
static zo_status finish_shards(zt_trainer *t, const save_names *n, const zt_train_state *ts)
{
    if (ranks_of(t) > 1)
        ZT_TRY(write_indices(t, n->tmp, ranks_of(t)));
    ZT_TRY(write_state_file(t, n->tmp, ts));
    return end_save(n);
}

/* Across ranks every stage ends with the ranks agreeing (zt_ranks_agree):
 * rank 0 prepares the directory, every rank writes its shard (with
 * --tensor-parallel, every group its shard), rank 0 writes the indices and
 * the state and moves latest; one rank failing fails all. */
zo_status zt_ckpt_save(zt_trainer *t, const char *dir, char *path, size_t cap)
{
    ZT_LIB(zo_engine_flush(zt_trainer_engine(t)));
    zo_comm_t comm = zt_trainer_comm(t);
    zo_stream_t s = zt_trainer_stream(t);
    const int rank = rank_of(t), ranks = ranks_of(t), first = world_rank(t) == 0;
    zt_train_state ts;
    zt_trainer_get_state(t, &ts);
    save_names n;
    zo_status st = name_save(dir, ts.step, &n);
    if (st >= 0 && first)
        st = begin_save(dir, &n);
    ZT_TRY(zt_ranks_agree(comm, s, st, "preparing the checkpoint directory"));
    st = write_tensors(t, n.tmp, rank, ranks);
    ZT_TRY(zt_ranks_agree(comm, s, st, "writing the checkpoint's shards"));
    st = first ? finish_shards(t, &n, &ts) : ZO_OK;
    ZT_TRY(zt_ranks_agree(comm, s, st, "completing the checkpoint"));
    if (path)
        snprintf(path, cap, "%s", n.final);
    return ZO_OK;
}

zo_status zt_ckpt_save_hf(zt_trainer *t, const char *dir, zo_dtype dt, uint64_t shard_bytes)
{
    zo_comm_t comm = zt_trainer_comm(t);
    if (!comm)
        return zt_hf_save(t, dir, dt, shard_bytes);
    zo_stream_t s = zt_trainer_stream(t);
    const int rank = rank_of(t), ranks = ranks_of(t), first = world_rank(t) == 0;
    char tmp[ZT_PATH];
    zo_status st = snprintf(tmp, sizeof tmp, "%s.tmp", dir) < (int)sizeof tmp
                       ? ZO_OK
                       : zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s", dir);
    if (st >= 0 && first)
        st = zt_hf_save_begin(dir, tmp, sizeof tmp);
    ZT_TRY(zt_ranks_agree(comm, s, st, "preparing the Hugging Face directory"));
    st = zt_hf_save_shard(t, tmp, dt, rank, ranks);
    ZT_TRY(zt_ranks_agree(comm, s, st, "writing the Hugging Face shards"));
    st = first ? zt_hf_save_end(t, tmp, dir, dt, ranks) : ZO_OK;
    return zt_ranks_agree(comm, s, st, "completing the Hugging Face directory");
}

/* ---- loading ---- */

zo_status zt_ckpt_resolve(const char *path, char *out, size_t cap)
{
    char p[ZT_PATH], name[256];
    ZT_TRY(join(p, path, ZT_CKPT_STATE));
    if (exists(p)) {
        snprintf(out, cap, "%s", path);
        return ZO_OK;
    }
    ZT_TRY(read_latest(path, name, sizeof name));
    if (!name[0])
        return zt_fail(ZO_ERR_NOT_FOUND,
                       "%s holds neither a checkpoint (%s) nor a '%s' pointer to one", path,
                       ZT_CKPT_STATE, ZT_CKPT_LATEST);
    int n = snprintf(out, cap, "%s/%s", path, name);
    if (n < 0 || (size_t)n >= cap)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/%s", path, name);
    ZT_TRY(join(p, out, ZT_CKPT_STATE));
    if (!exists(p))
        return zt_fail(ZO_ERR_CORRUPT, "%s/%s names %s, which holds no %s", path, ZT_CKPT_LATEST,
                       name, ZT_CKPT_STATE);
    return ZO_OK;
}

/* A member of the state JSON by dotted path. */
static json_t *at(json_t *root, const char *path)
{
    char key[64];
    json_t *v = root;
    while (v && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        v = json_object_get(v, key);
        path += n + (path[n] == '.');
    }
    return v;
}

typedef struct state_doc {
    json_t *root;
    const char *file;
} state_doc;

static zo_status get_int(const state_doc *d, const char *path, int64_t *out)
{
    json_t *v = at(d->root, path);
    if (!json_is_integer(v))
        return zt_fail(ZO_ERR_CORRUPT, "%s: '%s' is missing or not an integer", d->file, path);
    *out = json_integer_value(v);
    return ZO_OK;
}

static zo_status get_num(const state_doc *d, const char *path, double *out)
{
    json_t *v = at(d->root, path);
    if (!json_is_number(v))
        return zt_fail(ZO_ERR_CORRUPT, "%s: '%s' is missing or not a number", d->file, path);
    *out = json_number_value(v);
    return ZO_OK;
}

/* The model the checkpoint was saved from must be this run's: every
 * difference named at once, and a checkpoint of a Hugging Face model
 * resumed without --hf-model told to pass it. */
static zo_status check_model(const state_doc *d, const zt_options *o)
{
    const zt_shape *s = &o->shape;
    const char *keys[5] = {"model.vocab", "model.dim", "model.layers", "model.heads", "model.ffn"};
    const char *flags[5] = {"--vocab", "--dim", "--layers", "--heads", "--ffn"};
    const int mine[5] = {s->vocab, s->dim, s->n_layers, s->n_heads, s->ffn_dim};
    char diff[1024] = "";
    size_t len = 0;
    for (int i = 0; i < 5; i++) {
        int64_t v;
        ZT_TRY(get_int(d, keys[i], &v));
        if (v != mine[i] && len < sizeof diff)
            len += (size_t)snprintf(diff + len, sizeof diff - len,
                                    "%s%s %lld; this run's is %d (pass %s %lld)", len ? "; " : "",
                                    keys[i] + 6, (long long)v, mine[i], flags[i], (long long)v);
    }
    /* a checkpoint from before tied heads were one tensor has no key: untied */
    int tied = json_is_true(at(d->root, "model.tied"));
    if (tied != (s->tied != 0) && len < sizeof diff)
        snprintf(diff + len, sizeof diff - len,
                 "%sa head %s; this run's is %s (the Hugging Face config's tie_word_embeddings)",
                 len ? "; " : "", tied ? "tied to the embedding" : "of its own",
                 s->tied ? "tied" : "its own");
    if (!diff[0])
        return ZO_OK;
    const char *hf = json_string_value(at(d->root, "model.hf_model"));
    if (hf && !o->hf_model)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "%s was saved from a run of the Hugging Face model in %s: pass --hf-model "
                       "%s (its shape is the checkpoint's; this run's differs: %s)",
                       d->file, hf, hf, diff);
    return zt_fail(ZO_ERR_INVALID_ARG, "%s was saved from a model with %s", d->file, diff);
}

/* "step-00000120" as 120; -1 for any other name. */
static int64_t step_of_name(const char *ckpt_dir)
{
    char name[ZT_PATH];
    snprintf(name, sizeof name, "%s", ckpt_dir);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/')
        name[--n] = 0;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    char *end = NULL;
    if (strncmp(base, "step-", 5) != 0 || !base[5])
        return -1;
    errno = 0;
    long long v = strtoll(base + 5, &end, 10);
    return errno || *end || v < 0 ? -1 : (int64_t)v;
}

/* trainer_state.json's step agrees with its directory's name and the
 * engine's counters (an edited or misplaced state is refused), and this
 * run's --steps reaches it. */
static zo_status check_step(const state_doc *d, const char *ckpt_dir, const zt_options *o)
{
    int64_t step, steps, updates;
    ZT_TRY(get_int(d, "step", &step));
    ZT_TRY(get_int(d, "engine.steps", &steps));
    ZT_TRY(get_int(d, "engine.updates", &updates));
    if (step < 0 || step > INT_MAX)
        return zt_fail(ZO_ERR_CORRUPT, "%s: 'step' is %lld: expected a step count, 0 to %d",
                       d->file, (long long)step, INT_MAX);
    int64_t named = step_of_name(ckpt_dir);
    if (named >= 0 && named != step)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s says step %lld, but its directory is step %lld's: the state was edited "
                       "or moved from another checkpoint; resume from another checkpoint",
                       d->file, (long long)step, (long long)named);
    if (steps != step || updates < 0 || updates > steps)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s says step %lld, but its engine counters say %lld steps and %lld "
                       "updates (expected %lld steps, at most as many updates): the state was "
                       "edited or is corrupted; resume from another checkpoint",
                       d->file, (long long)step, (long long)steps, (long long)updates,
                       (long long)step);
    if (o->steps < step)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--steps %d is below the checkpoint's step %lld (%s): --steps counts every "
                       "step since the first run began; pass --steps above %lld to train on",
                       o->steps, (long long)step, d->file, (long long)step);
    return ZO_OK;
}

/* One setting a resumed run must share, as this run has it and as the
 * checkpoint recorded it ("" when not recorded: not compared). */
typedef struct setting {
    const char *flag;
    char mine[PATH_MAX], saved[PATH_MAX];
} setting;

static void saved_value(const state_doc *d, const char *path, char *out, size_t cap)
{
    json_t *v = at(d->root, path);
    if (json_is_integer(v))
        snprintf(out, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_string(v))
        snprintf(out, cap, "%s", json_string_value(v));
    else
        out[0] = 0;
}

/* The micro-batches of a step over all ranks: a run resumed at another world
 * size keeps the global batch (4 ranks with --grad-accum 1 continue as 1 rank
 * with --grad-accum 4). Named --grad-accum when neither run had ranks. */
static void global_batch(const state_doc *d, const zt_options *o, setting *set)
{
    json_t *w = at(d->root, "batch.world_size");
    json_t *ga = at(d->root, "batch.grad_accum");
    long long saved_w = json_is_integer(w) ? (long long)json_integer_value(w) : 1;
    long long mine_w = zt_options_dp_size(o);
    if (!json_is_integer(ga))
        return; /* not recorded: not compared */
    long long saved_ga = (long long)json_integer_value(ga);
    if (saved_w == 1 && mine_w == 1) {
        snprintf(set->mine, sizeof set->mine, "%d", o->grad_accum);
        return;
    }
    set->flag = "--grad-accum x ranks";
    snprintf(set->saved, sizeof set->saved, "%lld (%lld x %lld)", saved_ga * saved_w, saved_ga,
             saved_w);
    if (saved_ga * saved_w == (long long)o->grad_accum * mine_w)
        snprintf(set->mine, sizeof set->mine, "%s", set->saved); /* the same global batch */
    else
        snprintf(set->mine, sizeof set->mine, "%lld (%d x %lld)", (long long)o->grad_accum * mine_w,
                 o->grad_accum, mine_w);
}

static int settings_of(const state_doc *d, const zt_options *o, setting *set)
{
    char real[PATH_MAX];
    struct stat sb;
    int have_data = realpath(o->data_path, real) && stat(real, &sb) == 0;
    const char *flags[6] = {"--seq",   "--micro-batch", "--grad-accum",
                            "--dtype", "--data",        "--data"};
    const char *keys[6] = {"data.seq",    "batch.micro_batch", "batch.grad_accum",
                           "model.dtype", "data.file",         "data.bytes"};
    for (int i = 0; i < 6; i++) {
        set[i].flag = flags[i];
        saved_value(d, keys[i], set[i].saved, sizeof set[i].saved);
    }
    snprintf(set[0].mine, sizeof set[0].mine, "%d", o->seq);
    snprintf(set[1].mine, sizeof set[1].mine, "%d", o->micro_batch);
    global_batch(d, o, &set[2]);
    snprintf(set[3].mine, sizeof set[3].mine, "%s", zo_dtype_name(o->dtype));
    snprintf(set[4].mine, sizeof set[4].mine, "%s", have_data ? real : o->data_path);
    snprintf(set[5].mine, sizeof set[5].mine, "%lld", have_data ? (long long)sb.st_size : -1ll);
    return 6;
}

/* The settings of the run a checkpoint continues must be this run's, else
 * the continuation is another run (other batches, other rounding): each
 * change is named, and refused unless allowed (then logged). */
static zo_status check_settings(const state_doc *d, const zt_options *o)
{
    setting set[6];
    int n = settings_of(d, o, set);
    char changes[2048] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof changes; i++) {
        if (!set[i].saved[0] || !strcmp(set[i].saved, set[i].mine))
            continue;
        if (i == 5 && strcmp(set[4].saved, set[4].mine) != 0)
            continue; /* the file changed: named once */
        int w = i == 5
                    ? snprintf(changes + len, sizeof changes - len, "%s%s: %s bytes, now %s bytes",
                               len ? "; " : "", set[i].flag, set[i].saved, set[i].mine)
                    : snprintf(changes + len, sizeof changes - len, "%s%s %s, now %s",
                               len ? "; " : "", set[i].flag, set[i].saved, set[i].mine);
        len += w > 0 ? (size_t)w : 0;
    }
    if (!changes[0])
        return ZO_OK;
    if (o->resume_allow_changes) {
        fprintf(stderr, "zo-train: continuing %s with changed settings (%s)\n", d->file, changes);
        return ZO_OK;
    }
    return zt_fail(ZO_ERR_INVALID_ARG,
                   "%s was saved by a run with other settings (%s): a resumed run with them "
                   "changed is another run; pass the checkpoint's values, or "
                   "--resume-allow-changes to continue anyway",
                   d->file, changes);
}

zo_status zt_ckpt_check_settings(const char *ckpt_dir, const zt_options *o)
{
    char p[ZT_PATH];
    ZT_TRY(join(p, ckpt_dir, ZT_CKPT_STATE));
    state_doc d = {NULL, p};
    ZT_TRY(zt_json_read(p, 0, &d.root));
    zo_status st = check_model(&d, o);
    if (st >= 0)
        st = check_step(&d, ckpt_dir, o);
    if (st >= 0)
        st = check_settings(&d, o);
    json_decref(d.root);
    return st;
}

static zo_status read_engine_state(const state_doc *d, zo_engine_step_state *es)
{
    int64_t hyst;
    ZT_TRY(get_int(d, "engine.updates", &es->updates));
    ZT_TRY(get_int(d, "engine.steps", &es->steps));
    ZT_TRY(get_num(d, "engine.loss_scale", &es->loss_scale));
    ZT_TRY(get_int(d, "engine.scaler_iter", &es->scaler_iter));
    ZT_TRY(get_int(d, "engine.scaler_last_overflow_iter", &es->scaler_last_overflow_iter));
    ZT_TRY(get_int(d, "engine.scaler_hysteresis", &hyst));
    es->scaler_hysteresis = (int)hyst;
    return ZO_OK;
}

static zo_status read_train_state(const state_doc *d, zt_train_state *ts)
{
    int64_t epoch, cursor;
    ZT_TRY(get_int(d, "step", &ts->step));
    ZT_TRY(get_int(d, "scheduler.last_batch_iteration", &ts->sched_it));
    ZT_TRY(get_num(d, "scheduler.lr", &ts->lr));
    ZT_TRY(get_int(d, "data.epoch", &epoch));
    ZT_TRY(get_int(d, "data.cursor", &cursor));
    const char *seed = json_string_value(at(d->root, "data.seed"));
    char *end = NULL;
    errno = 0;
    unsigned long long sv = seed ? strtoull(seed, &end, 10) : 0;
    if (!seed || errno || end == seed || *end || epoch < 0 || cursor < 0)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s: 'data.seed', 'data.epoch' or 'data.cursor' is not valid", d->file);
    ts->data = (zt_data_position){sv, (uint64_t)epoch, (uint64_t)cursor};
    return ZO_OK;
}

static zo_status open_files(zt_st_files **f, const char *dir, const char *base, const char *index)
{
    char single[128];
    zt_st_shard_name(single, sizeof single, base, 0, 1);
    return zt_st_files_open(f, dir, single, index);
}

static zo_status expect_in(zo_st_reader_t rd, const char *name, zo_dtype dt, const tensor_ref *x,
                           zo_st_tensor_info *info)
{
    *info = (zo_st_tensor_info)ZO_ST_TENSOR_INFO_INIT;
    zo_status st = zo_st_reader_expect(rd, name, dt, x->ndim, x->shape, info);
    if (st < 0)
        return zt_fail(st, "%s", zt_lib_message());
    return ZO_OK;
}

/* Tensor `name` (x's shape, dtype dt) from whichever file of f holds it. */
static zo_status expect(zt_st_files *f, const char *name, zo_dtype dt, const tensor_ref *x,
                        zo_st_tensor_info *info)
{
    zo_st_reader_t rd = NULL;
    const char *file = NULL;
    ZT_TRY(zt_st_files_find(f, name, &rd, &file));
    if (!rd)
        return zt_fail(ZO_ERR_NOT_FOUND, "no tensor '%s' in %s", name, file);
    return expect_in(rd, name, dt, x, info);
}

/* A file holding other tensors than the model's is another model's. */
static zo_status check_count(zt_st_files *f, const char *file, size_t want)
{
    size_t have = 0;
    ZT_TRY(zt_st_files_count(f, &have));
    if (have == want)
        return ZO_OK;
    return zt_fail(ZO_ERR_INVALID_ARG,
                   "%s holds %zu tensors, not the %zu of this model's checkpoint: it is "
                   "another model's",
                   file, have, want);
}

/* The format the optimizer file's moments are in (see "the moments' formats"). */
static zo_status file_state_dtype(zt_st_files *orr, zo_dtype *out)
{
    const char *name = NULL;
    ZT_TRY(zt_st_files_metadata(orr, ZT_STATE_DTYPE_KEY, &name));
    *out = ZO_DTYPE_F32;
    if (name && zt_parse_state_dtype(name, out) < 0) {
        char names[128];
        zo_state_format_names(names, sizeof names, ", ");
        return zt_fail(ZO_ERR_CORRUPT, "%s: metadata %s is '%s': expected one of %s", ZT_CKPT_OPTIM,
                       ZT_STATE_DTYPE_KEY, name, names);
    }
    return ZO_OK;
}

/* A tensor's moments in a file of format fmt: a block-scaled format with
 * fp32 small tensors (int8) holds them as codes with scales
 * (NAME.exp_avg.absmax) or, where the saving engine kept them fp32
 * (zo_engine_tensor_state_dtype), as fp32 without scales. */
static zo_status file_tensor_fmt(zt_st_files *orr, zo_dtype fmt, const tensor_ref *x, zo_dtype *out)
{
    *out = fmt;
    const zo_state_format *f = zo_state_format_of(fmt);
    if (!f->block || !f->min_numel)
        return ZO_OK;
    char nm[160];
    zo_st_reader_t rd = NULL;
    const char *file = NULL;
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
    moment_name(nm, sizeof nm, x->name, 0, 1);
    ZT_TRY(zt_st_files_find(orr, nm, &rd, &file));
    *out = rd && zo_st_reader_find(rd, nm, &info) >= 0 ? fmt : ZO_DTYPE_F32;
    return ZO_OK;
}

/* Tensor x's master and moments in the two file sets, checked by name, dtype
 * and shape: info[0] the master, info[1 + k] moment k, info[3 + k] its
 * int8 scales. */
static zo_status find_states(zt_st_files *mr, zt_st_files *orr, zo_dtype fmt, const tensor_ref *x,
                             zo_st_tensor_info info[5])
{
    char nm[160];
    ZT_TRY(expect(mr, x->name, ZO_DTYPE_F32, x, &info[0]));
    ZT_TRY(file_tensor_fmt(orr, fmt, x, &fmt));
    for (int k = 0; k < 2; k++) {
        moment_name(nm, sizeof nm, x->name, k, 0);
        ZT_TRY(expect(orr, nm, moment_file_dtype(fmt), x, &info[1 + k]));
        int64_t blocks = (int64_t)moment_scales(fmt, x->numel);
        if (!blocks)
            continue;
        tensor_ref sc = *x;
        sc.ndim = 1;
        sc.shape[0] = blocks;
        moment_name(nm, sizeof nm, x->name, k, 1);
        ZT_TRY(expect(orr, nm, ZO_DTYPE_F32, &sc, &info[3 + k]));
    }
    return ZO_OK;
}

/* Moment k of x from the file into buf: as the engine stores it (raw) when
 * the file has the engine's format, else decoded to fp32 (the engine then
 * encodes it in its own). */
static void moment_from_file(const zo_st_tensor_info info[5], int k, zo_dtype file_fmt, int raw,
                             size_t numel, void *buf)
{
    const void *d = info[1 + k].data;
    const zo_state_format *f = zo_state_format_of(file_fmt);
    const float *scales = f->block ? (const float *)info[3 + k].data : NULL;
    if (!raw) {
        f->decode(d, scales, numel, !k, buf);
        return;
    }
    memcpy(buf, d, zo_state_format_code_bytes(f, numel));
    if (scales)
        memcpy(zo_state_format_scales(f, buf, numel), scales,
               moment_scales(file_fmt, numel) * sizeof(float));
}

/* Tensor x's states into the engine, converted when the formats differ;
 * with --tensor-parallel this rank's part of them (cut in the stored format
 * where its blocks allow, else from the decoded values: ckpt_tp.h), part
 * holding 3 cap floats for it. */
static zo_status restore_tensor(zt_trainer *t, zt_st_files *orr, const tensor_ref *x,
                                zo_dtype file_fmt, const zo_st_tensor_info info[5], float *m,
                                float *v, float *part, size_t cap)
{
    zo_engine_t eng = zt_trainer_engine(t);
    const zt_options *o = zt_trainer_options(t);
    const int T = zt_options_tp_size(o);
    ZT_TRY(file_tensor_fmt(orr, file_fmt, x, &file_fmt));
    int raw =
        file_fmt == tensor_fmt(t, x) && zt_ckpt_tp_slices(&o->shape, T, x->layer, x->idx, file_fmt);
    moment_from_file(info, 0, file_fmt, raw, x->numel, m);
    moment_from_file(info, 1, file_fmt, raw, x->numel, v);
    const float *w = info[0].data;
    void *pm = m, *pv = v;
    if (T > 1) {
        pm = part + cap;
        pv = part + 2 * cap;
        zt_ckpt_tp_slice(&o->shape, T, zt_options_tp_rank(o), x->layer, x->idx,
                         raw ? file_fmt : ZO_DTYPE_F32, w, m, v, part, pm, pv);
        w = part;
    }
    zo_status st = raw ? zo_engine_write_state_raw(eng, x->id, w, pm, pv)
                       : zo_engine_write_state(eng, x->id, w, pm, pv);
    return st < 0 ? zt_fail(st, "restoring %s: %s", x->name, zt_lib_message()) : ZO_OK;
}

/* ---- what a loaded tensor must be ---- */

/* The largest moments a training run makes: m averages the gradients and v
 * their squares, so a gradient of 1e10 (long past divergence) bounds them.
 * Larger is a corrupted file, not a state to continue from. */
static const double moment_limit[2] = {1e10, 1e20};

static zo_status bad_value(const char *dir, const char *file, const char *name, size_t i, double v,
                           const char *why)
{
    return zt_fail(ZO_ERR_CORRUPT,
                   "checkpoint %s: tensor '%s' in %s has %g at index %zu (%s): the checkpoint is "
                   "corrupted or was saved from a diverged run; resume from another checkpoint",
                   dir, name, file, v, i, why);
}

/* Values of one tensor (n fp32 values, or bf16 when bf16): finite, and for
 * moment k (-1: weights) within its limit, v not negative. */
static zo_status check_range(const char *dir, const char *file, const char *name, const void *data,
                             size_t n, int bf16, int k)
{
    for (size_t i = 0; i < n; i++) {
        float x;
        if (bf16)
            x = zo_bf16_to_f32(((const uint16_t *)data)[i]);
        else
            memcpy(&x, (const char *)data + 4 * i, 4);
        if (!isfinite(x))
            return bad_value(dir, file, name, i, x, "not finite");
        if (k == 1 && x < 0)
            return bad_value(dir, file, name, i, x, "second moments are squares, never negative");
        if (k >= 0 && fabs(x) > moment_limit[k])
            return bad_value(dir, file, name, i, x, k ? "above 1e20" : "beyond +-1e10");
    }
    return ZO_OK;
}

/* One stored tensor of file set f: its checksum (a corrupted file is named
 * as such before its values are judged), then its n values (see
 * check_range). */
static zo_status check_one(const char *dir, const zt_sums *sums, zt_st_files *f, const char *name,
                           const zo_st_tensor_info *info, size_t n, int bf16, int k)
{
    zo_st_reader_t rd = NULL;
    const char *file = NULL;
    ZT_TRY(zt_st_files_find(f, name, &rd, &file));
    if (sums)
        ZT_TRY(zt_sums_verify(sums, dir, file, name, info->data, (size_t)info->nbytes));
    return check_range(dir, file, name, info->data, n, bf16, k);
}

/* Tensor x's states as found (find_states' info, in file format fmt):
 * checksums first (a corrupted file is named as such), then values. */
static zo_status check_states(const char *dir, const zt_sums *sums, zt_st_files *mr,
                              zt_st_files *orr, zo_dtype fmt, const tensor_ref *x,
                              const zo_st_tensor_info info[5])
{
    char nm[160];
    ZT_TRY(file_tensor_fmt(orr, fmt, x, &fmt));
    ZT_TRY(check_one(dir, sums, mr, x->name, &info[0], x->numel, 0, -1));
    for (int k = 0; k < 2; k++) {
        moment_name(nm, sizeof nm, x->name, k, 0);
        size_t scales = moment_scales(fmt, x->numel);
        if (!scales) {
            ZT_TRY(check_one(dir, sums, orr, nm, &info[1 + k], x->numel,
                             moment_file_dtype(fmt) == ZO_DTYPE_BF16, k));
            continue;
        }
        /* codes: any byte is a value; a block's scale is its largest
         * magnitude, held to the moment's limit */
        ZT_TRY(check_one(dir, sums, orr, nm, &info[1 + k], 0, 0, k));
        moment_name(nm, sizeof nm, x->name, k, 1);
        ZT_TRY(check_one(dir, sums, orr, nm, &info[3 + k], scales, 0, k));
    }
    return ZO_OK;
}

/* The checkpoint's checksum lists (NULL, with a warning, for a checkpoint
 * saved before there were any). */
static zo_status read_sums(const zt_trainer *t, const char *dir, zt_sums **sums)
{
    ZT_TRY(zt_sums_read(dir, sums));
    if (!*sums && world_rank(t) == 0)
        fprintf(stderr,
                "zo-train: warning: %s has no %s.json (saved before checkpoints carried "
                "checksums): loading it unverified\n",
                dir, ZT_SUMS_BASE);
    return ZO_OK;
}

/* The optimizer file's tensors: m and v of each, and their scales where int8. */
static zo_status optim_count(zt_st_files *orr, const tensor_ref *r, int n, zo_dtype fmt,
                             size_t *count)
{
    *count = 0;
    for (int i = 0; i < n; i++) {
        zo_dtype tf;
        ZT_TRY(file_tensor_fmt(orr, fmt, &r[i], &tf));
        *count += zo_state_format_of(tf)->block ? 4 : 2; /* with their scales */
    }
    return ZO_OK;
}

/* Everything is checked before the engine is touched (the structure, then
 * the checksums and values); each rank reads the tensors it owns (all of
 * them with one rank). */
static zo_status load_tensors(zt_trainer *t, const char *dir)
{
    tensor_ref *r = NULL;
    int n = 0;
    ZT_TRY(model_tensors(t, &r, &n));
    const int all = n;
    zt_st_files *mr = NULL, *orr = NULL;
    zt_sums *sums = NULL;
    zo_st_tensor_info info[5];
    zo_dtype fmt = ZO_DTYPE_F32;
    size_t cap = largest(r, n) + 2; /* as write_tensors' */
    /* the whole moments, then with --tensor-parallel the rank's part of all three */
    float *m = malloc((zt_options_tp_size(zt_trainer_options(t)) > 1 ? 5 : 2) * cap * sizeof *m),
          *v = m + cap;
    zo_status st = m ? read_sums(t, dir, &sums) : zt_fail(ZO_ERR_NO_MEMORY, "buffers");
    if (st >= 0)
        st = open_files(&mr, dir, ZT_CKPT_MODEL_BASE, ZT_CKPT_MODEL_INDEX);
    if (st >= 0)
        st = open_files(&orr, dir, ZT_CKPT_OPTIM_BASE, ZT_CKPT_OPTIM_INDEX);
    if (st >= 0)
        st = file_state_dtype(orr, &fmt);
    size_t optim_all = 0; /* every rank's, as the files hold */
    if (st >= 0)
        st = optim_count(orr, r, all, fmt, &optim_all);
    n = owned_only(t, r, n, rank_of(t));
    /* names, dtypes and shapes; then checksums and values; then the engine */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; st >= 0 && i < n; i++)
            if ((st = find_states(mr, orr, fmt, &r[i], info)) >= 0 && pass > 0)
                st = pass == 1 ? check_states(dir, sums, mr, orr, fmt, &r[i], info)
                               : restore_tensor(t, orr, &r[i], fmt, info, m, v, m + 2 * cap, cap);
        if (st >= 0 && pass == 0 &&
            (st = check_count(mr, zt_st_files_sharded(mr) ? ZT_CKPT_MODEL_INDEX : ZT_CKPT_MODEL,
                              (size_t)all)) >= 0)
            st = check_count(orr, zt_st_files_sharded(orr) ? ZT_CKPT_OPTIM_INDEX : ZT_CKPT_OPTIM,
                             optim_all);
    }
    zt_st_files_free(mr);
    zt_st_files_free(orr);
    zt_sums_free(sums);
    free(m);
    free(r);
    return st;
}

/* Across ranks: every rank's tensors loaded (or all fail), then every rank
 * takes the 16-bit parameters of the chunks others own from them. */
static zo_status load_all_ranks(zt_trainer *t, const char *dir)
{
    zo_status st = load_tensors(t, dir);
    ZT_TRY(zt_ranks_agree(zt_trainer_comm(t), zt_trainer_stream(t), st, "loading the checkpoint"));
    if (zt_trainer_comm(t))
        ZT_LIB(zo_engine_share_params(zt_trainer_engine(t)));
    return ZO_OK;
}

/* The data position must be where the steps leave it: the windows read
 * since the global batch's origin (data.origin_step, origin_windows,
 * batch_windows; a checkpoint without them is not checked). This run's
 * origin is the checkpoint's, or the checkpoint itself when this run's
 * batch differs (or the data may: --resume-allow-changes). */
static zo_status check_position(const state_doc *d, zt_trainer *t, zt_train_state *ts)
{
    const zt_options *o = zt_trainer_options(t);
    uint64_t tw = zt_trainer_setup(t)->data.train_windows, have, span, want;
    json_t *b = at(d->root, "data.batch_windows"), *s0 = at(d->root, "data.origin_step"),
           *w0 = at(d->root, "data.origin_windows");
    int known = json_is_integer(b) && json_is_integer(s0) && json_is_integer(w0);
    if (__builtin_mul_overflow(ts->data.epoch, tw, &have) ||
        __builtin_add_overflow(have, ts->data.cursor, &have))
        return zt_fail(ZO_ERR_CORRUPT, "%s: data epoch %llu is not one a run reaches", d->file,
                       (unsigned long long)ts->data.epoch);
    ts->origin_step = ts->step;
    ts->origin_windows = have;
    if (!known || o->resume_allow_changes)
        return ZO_OK;
    int64_t bw = json_integer_value(b), os = json_integer_value(s0), ow = json_integer_value(w0);
    if (bw <= 0 || os < 0 || os > ts->step || ow < 0 ||
        __builtin_mul_overflow((uint64_t)(ts->step - os), (uint64_t)bw, &span) ||
        __builtin_add_overflow(span, (uint64_t)ow, &want) || want != have)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s: the data position (epoch %llu, window %llu of %llu) is not where "
                       "step %lld leaves the run (%lld windows a step since step %lld at window "
                       "%lld): the state was edited; resume from another checkpoint",
                       d->file, (unsigned long long)ts->data.epoch,
                       (unsigned long long)ts->data.cursor, (unsigned long long)tw,
                       (long long)ts->step, (long long)bw, (long long)os, (long long)ow);
    if (bw == batch_windows(o)) {
        ts->origin_step = os;
        ts->origin_windows = (uint64_t)ow;
    }
    return ZO_OK;
}

/* The rate of this run's next step at the checkpoint's schedule state:
 * this run's --lr and schedule apply on resume. */
static double next_rate(const zt_options *o, int64_t sched_it)
{
    if (sched_it == o->sched.last_batch_iteration) /* no update applied yet */
        return zt_schedule_first_lr(&o->sched, o->lr);
    return zt_schedule_lr_at(&o->sched, o->lr, sched_it);
}

/* One hyper-parameter as saved and as this run has it: "name a → b". */
static void note_change(char *out, size_t cap, size_t *len, const char *name, const char *was,
                        const char *now)
{
    if (!strcmp(was, now) || *len >= cap)
        return;
    int w = snprintf(out + *len, cap - *len, "%s%s %s \u2192 %s", *len ? ", " : "", name, was, now);
    *len += w > 0 ? (size_t)w : 0;
}

/* The hyper-parameters this run changes (they apply), named on rank 0. */
static void report_changes(const state_doc *d, const zt_trainer *t, double saved_lr, double lr)
{
    const zt_options *o = zt_trainer_options(t);
    const char *keys[5] = {"beta1", "beta2", "eps", "weight_decay", "max_grad_norm"};
    const double mine[5] = {o->beta1, o->beta2, o->eps, o->weight_decay, o->max_grad_norm};
    char out[1024] = "", was[64], now[64];
    size_t len = 0;
    snprintf(was, sizeof was, "%g", saved_lr);
    snprintf(now, sizeof now, "%g", lr);
    if (saved_lr != lr)
        note_change(out, sizeof out, &len, "lr", was, now);
    for (int i = 0; i < 5; i++) {
        char path[64];
        snprintf(path, sizeof path, "optimizer.%s", keys[i]);
        json_t *v = at(d->root, path);
        if (!json_is_number(v))
            continue;
        snprintf(was, sizeof was, "%g", (double)(float)json_number_value(v));
        snprintf(now, sizeof now, "%g", mine[i]);
        note_change(out, sizeof out, &len, keys[i], was, now);
    }
    const char *fmt = json_string_value(at(d->root, "optimizer.state_dtype"));
    if (fmt)
        note_change(out, sizeof out, &len, "state_dtype", fmt, zt_state_dtype_name(o->state_dtype));
    if (out[0] && world_rank(t) == 0)
        fprintf(stderr, "zo-train: resuming with changed hyper-parameters (they apply): %s\n", out);
}

static zo_status restore_steps(zt_trainer *t, const state_doc *d)
{
    zo_engine_step_state es = ZO_ENGINE_STEP_STATE_INIT, now = ZO_ENGINE_STEP_STATE_INIT;
    zo_engine_t eng = zt_trainer_engine(t);
    ZT_LIB(zo_engine_get_step_state(eng, &now));
    ZT_TRY(read_engine_state(d, &es));
    const char *dtype = json_string_value(at(d->root, "model.dtype"));
    int fp16 = zt_trainer_options(t)->dtype == ZO_DTYPE_F16;
    if (!dtype || strcmp(dtype, fp16 ? "fp16" : "bf16") != 0) { /* another dtype: a fresh scaler */
        es.loss_scale = now.loss_scale;
        es.scaler_iter = now.scaler_iter;
        es.scaler_last_overflow_iter = now.scaler_last_overflow_iter;
        es.scaler_hysteresis = now.scaler_hysteresis;
    }
    zo_status st = zo_engine_set_step_state(eng, &es);
    if (st < 0)
        return zt_fail(st, "%s: %s", d->file, zt_lib_message());
    zt_train_state ts;
    ZT_TRY(read_train_state(d, &ts));
    ZT_TRY(check_position(d, t, &ts));
    double saved_lr = ts.lr;
    ts.lr = next_rate(zt_trainer_options(t), ts.sched_it);
    report_changes(d, t, saved_lr, ts.lr);
    return zt_trainer_set_state(t, &ts);
}

zo_status zt_ckpt_load(zt_trainer *t, const char *ckpt_dir)
{
    char p[ZT_PATH];
    ZT_TRY(join(p, ckpt_dir, ZT_CKPT_STATE));
    state_doc d = {NULL, p};
    ZT_TRY(zt_json_read(p, 0, &d.root));
    const char *fmt = json_string_value(at(d.root, "format"));
    int64_t version = 0;
    zo_status st = ZO_OK;
    if (!fmt || strcmp(fmt, ZT_CKPT_FORMAT) != 0 || get_int(&d, "version", &version) < 0 ||
        version != ZT_CKPT_VERSION)
        st = zt_fail(ZO_ERR_CORRUPT, "%s is not a %s version %d file", p, ZT_CKPT_FORMAT,
                     ZT_CKPT_VERSION);
    if (st >= 0)
        st = check_model(&d, zt_trainer_options(t));
    if (st >= 0)
        st = check_step(&d, ckpt_dir, zt_trainer_options(t));
    if (st >= 0)
        st = check_settings(&d, zt_trainer_options(t));
    /* across ranks every rank reaches the load: a refusal above is every rank's */
    if (st >= 0)
        st = load_all_ranks(t, ckpt_dir);
    if (st >= 0)
        st = restore_steps(t, &d);
    json_decref(d.root);
    return st;
}

/* ---- initial weights ---- */

static void to_f32(const zo_st_tensor_info *in, float *out, size_t n)
{
    const unsigned char *p = in->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (in->dtype) {
        case ZO_DTYPE_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case ZO_DTYPE_BF16:
            memcpy(&h, p + 2 * i, 2);
            out[i] = zo_bf16_to_f32(h);
            break;
        default:
            memcpy(&h, p + 2 * i, 2);
            out[i] = zo_f16_to_f32(h);
            break;
        }
    }
}

/* --init-weights of a file of our own checkpoints: its checksums, from the
 * lists beside it (NULL for any other file). */
typedef struct init_sums {
    zt_sums *sums;
    char dir[ZT_PATH];
    const char *base;
} init_sums;

static zo_status init_sums_read(const char *file, init_sums *is)
{
    const char *slash = strrchr(file, '/');
    is->sums = NULL;
    is->base = slash ? slash + 1 : file;
    if (!slash)
        snprintf(is->dir, sizeof is->dir, ".");
    else
        snprintf(is->dir, sizeof is->dir, "%.*s", slash == file ? 1 : (int)(slash - file), file);
    ZT_TRY(zt_sums_read(is->dir, &is->sums));
    if (!zt_sums_has_file(is->sums, is->base)) {
        zt_sums_free(is->sums);
        is->sums = NULL;
    }
    return ZO_OK;
}

static zo_status init_one(zt_trainer *t, zo_st_reader_t rd, const char *file, const tensor_ref *x,
                          float *buf, const init_sums *is)
{
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
    zo_status st = zo_st_reader_find(rd, x->name, &info);
    if (st < 0)
        return zt_fail(st, "%s", zt_lib_message());
    if (is->sums)
        ZT_TRY(
            zt_sums_verify(is->sums, is->dir, is->base, x->name, info.data, (size_t)info.nbytes));
    if (info.dtype != ZO_DTYPE_F32 && info.dtype != ZO_DTYPE_BF16 && info.dtype != ZO_DTYPE_F16)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "tensor '%s' in '%s': expected dtype F32, BF16 or F16, found %s", x->name,
                       file, zo_st_dtype_name(info.dtype));
    ZT_TRY(expect_in(rd, x->name, info.dtype, x, &info));
    to_f32(&info, buf, x->numel);
    size_t bad = first_nonfinite(buf, x->numel);
    if (bad < x->numel)
        return zt_fail(ZO_ERR_INVALID_ARG, "tensor '%s' in '%s' has %s at index %zu", x->name, file,
                       isnan(buf[bad]) ? "NaN" : "Inf", bad);
    if (zt_trainer_tp_comm(t)) /* this rank's part */
        return zt_trainer_write_tp_master(t, x->layer, x->idx, buf);
    st = zo_engine_write_state(zt_trainer_engine(t), x->id, buf, NULL, NULL);
    if (st < 0)
        return zt_fail(st, "setting %s: %s", x->name, zt_lib_message());
    return ZO_OK;
}

zo_status zt_ckpt_init_weights(zt_trainer *t, const char *file)
{
    tensor_ref *r = NULL;
    int n = 0;
    ZT_TRY(model_tensors(t, &r, &n));
    const int all = n;
    n = owned_only(t, r, n, rank_of(t)); /* across ranks each its own, then shared */
    zo_st_reader_t rd = NULL;
    init_sums is = {0};
    float *buf = malloc((largest(r, n) + 1) * sizeof *buf);
    zo_status st =
        buf ? zo_st_reader_open(&rd, file) : zt_fail(ZO_ERR_NO_MEMORY, "a tensor buffer");
    if (buf && st < 0)
        zt_fail(st, "--init-weights: %s", zt_lib_message());
    if (st >= 0)
        st = init_sums_read(file, &is);
    for (int i = 0; st >= 0 && i < n; i++)
        st = init_one(t, rd, file, &r[i], buf, &is);
    zt_sums_free(is.sums);
    if (st >= 0 && world_rank(t) == 0 && zo_st_reader_count(rd) > (size_t)all)
        fprintf(stderr, "zo-train: %s holds %zu tensors; the model uses %d of them\n", file,
                zo_st_reader_count(rd), all);
    zo_st_reader_free(rd);
    free(buf);
    free(r);
    ZT_TRY(zt_ranks_agree(zt_trainer_comm(t), zt_trainer_stream(t), st, "--init-weights"));
    if (zt_trainer_comm(t))
        ZT_LIB(zo_engine_share_params(zt_trainer_engine(t)));
    return ZO_OK;
}
