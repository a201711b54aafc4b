/* zo-train's model: device-resident parameters for tests, the activation
 * arena (laid out by the shape part, model_shape.h) and the forward/backward
 * of each engine layer on the compute ops. */
#include "model.h"
#include "tp_shape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_store.h"
#include "zt_error.h"

/* ---- parameter sources ---- */

struct zt_resident {
    zo_device_t dev;
    zt_shape shape;
    zo_dtype dt;
    int n_layers;
    void **param, **grad; /* [layer * ZT_MAX_LAYER_TENSORS + idx] */
};

static size_t slot(int layer, int idx)
{
    return (size_t)layer * ZT_MAX_LAYER_TENSORS + (size_t)idx;
}

static zo_status res_fetch(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **p, void **g,
                           int n)
{
    zt_resident *r = ctx;
    if (layer < 0 || layer >= r->n_layers || n < zt_layer_tensors(&r->shape, layer))
        return zt_fail(ZO_ERR_INVALID_ARG, "resident fetch of layer %d with room for %d tensors",
                       layer, n);
    for (int i = 0; i < zt_layer_tensors(&r->shape, layer); i++) {
        p[i] = r->param[slot(layer, i)];
        if (g)
            g[i] = phase == ZO_PHASE_BACKWARD ? r->grad[slot(layer, i)] : NULL;
    }
    return ZO_OK;
}

static zo_status res_noop(void *ctx, int layer, zo_stream_t s)
{
    return ZO_OK;
}

zt_param_source zt_resident_source(zt_resident *r)
{
    zt_param_source src = {r, res_fetch, res_noop, res_noop};
    return src;
}

void zt_resident_free(zt_resident *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->param && i < slot(r->n_layers, 0); i++) {
        zo_device_mfree(r->dev, r->param[i]);
        zo_device_mfree(r->dev, r->grad[i]);
    }
    free(r->param);
    free(r->grad);
    free(r);
}

/* Host values -> dtype bits (or fp32 as is). */
static void host_to_dtype(void *dst, zo_dtype dt, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == ZO_DTYPE_F32)
            ((float *)dst)[i] = src[i];
        else
            ((uint16_t *)dst)[i] =
                dt == ZO_DTYPE_BF16 ? zo_f32_to_bf16(src[i]) : zo_f32_to_f16(src[i]);
    }
}

static void dtype_to_host(float *dst, const void *src, zo_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == ZO_DTYPE_F32)
            dst[i] = ((const float *)src)[i];
        else
            dst[i] = dt == ZO_DTYPE_BF16 ? zo_bf16_to_f32(((const uint16_t *)src)[i])
                                         : zo_f16_to_f32(((const uint16_t *)src)[i]);
    }
}

zo_status zt_resident_write(zt_resident *r, zo_stream_t s, int layer, int idx, const float *in)
{
    size_t n = zt_tensor_numel(&r->shape, layer, idx), es = zo_dtype_size(r->dt);
    void *tmp = malloc(n * es);
    if (!tmp)
        return zt_fail(ZO_ERR_NO_MEMORY, "host copy of %zu parameters", n);
    host_to_dtype(tmp, r->dt, in, n);
    zo_status st = zo_memcpy_h2d_async(s, r->param[slot(layer, idx)], tmp, n * es);
    if (st >= 0)
        st = zo_stream_synchronize(s);
    if (st < 0)
        zt_lib_fail(st, "resident parameter upload");
    free(tmp);
    return st;
}

zo_status zt_resident_read(zt_resident *r, zo_stream_t s, int layer, int idx, int grad, float *out)
{
    size_t n = zt_tensor_numel(&r->shape, layer, idx), es = zo_dtype_size(r->dt);
    void *tmp = malloc(n * es);
    if (!tmp)
        return zt_fail(ZO_ERR_NO_MEMORY, "host copy of %zu parameters", n);
    const void *src = grad ? r->grad[slot(layer, idx)] : r->param[slot(layer, idx)];
    zo_status st = zo_memcpy_d2h_async(s, tmp, src, n * es);
    if (st >= 0)
        st = zo_stream_synchronize(s);
    if (st >= 0)
        dtype_to_host(out, tmp, r->dt, n);
    if (st < 0)
        zt_lib_fail(st, "resident tensor download");
    free(tmp);
    return st;
}

zo_status zt_resident_zero_grads(zt_resident *r, zo_stream_t s)
{
    for (int l = 0; l < r->n_layers; l++)
        for (int i = 0; i < zt_layer_tensors(&r->shape, l); i++)
            ZT_LIB(zo_memset_async(s, r->grad[slot(l, i)], 0,
                                   zt_tensor_numel(&r->shape, l, i) * zo_dtype_size(r->dt)));
    return ZO_OK;
}

static zo_status resident_alloc(zt_resident *r, zo_stream_t s, uint64_t seed, float init_std)
{
    size_t es = zo_dtype_size(r->dt);
    for (int l = 0; l < r->n_layers; l++)
        for (int i = 0; i < zt_layer_tensors(&r->shape, l); i++) {
            size_t n = zt_tensor_numel(&r->shape, l, i);
            ZT_LIB(zo_device_malloc(r->dev, n * es, &r->param[slot(l, i)]));
            ZT_LIB(zo_device_malloc(r->dev, n * es, &r->grad[slot(l, i)]));
            float *init = malloc(n * sizeof *init);
            if (!init)
                return zt_fail(ZO_ERR_NO_MEMORY, "initial values of %zu parameters", n);
            zt_tensor_init(&r->shape, l, i, seed, init_std, init);
            zo_status st = zt_resident_write(r, s, l, i, init);
            free(init);
            ZT_TRY(st);
        }
    return ZO_OK;
}

zo_status zt_resident_init(zt_resident **out, zo_device_t dev, zo_stream_t stream,
                           const zt_shape *s, zo_dtype dt, uint64_t seed, float init_std)
{
    ZT_TRY(zt_shape_check(s));
    zt_resident *r = calloc(1, sizeof *r);
    if (!r)
        return zt_fail(ZO_ERR_NO_MEMORY, "resident parameters");
    r->dev = dev;
    r->shape = *s;
    r->dt = dt;
    r->n_layers = zt_engine_layers(s);
    r->param = calloc(slot(r->n_layers, 0), sizeof *r->param);
    r->grad = calloc(slot(r->n_layers, 0), sizeof *r->grad);
    zo_status st = r->param && r->grad ? resident_alloc(r, stream, seed, init_std)
                                       : zt_fail(ZO_ERR_NO_MEMORY, "resident parameter table");
    if (st < 0) {
        zt_resident_free(r);
        return st;
    }
    *out = r;
    return ZO_OK;
}

/* ---- activations: one device arena carved into named pieces ---- */

typedef struct block_ws { /* one block's forward intermediates and backward buffers */
    void *h1, *q, *k, *v, *att, *attn_out, *x2, *h2, *gate, *up, *act;
    void *dq, *dk, *dv, *datt;
    float *rstd1, *rstd2;
    void *kc, *vc, *dkc, *dvc; /* the key/value heads (k, v, dk, dv without GQA) */
    void *dattn;               /* flash: d(attn_out), x2's piece (att: lse, datt: delta) */
} block_ws;

typedef struct head_ws {
    void *hf, *logits;
    float *rstd, *row_loss;
} head_ws;

struct zt_model {
    zt_model_config c;
    zt_act_group grp; /* layer-major groups (micro_group 0: none) */
    zo_device_t dev;
    zo_stream_t s;
    int T, hd;           /* tokens per micro-batch, head dimension */
    int layer;           /* the block computing (1..n_layers): its attention's window */
    uint8_t *block_mask; /* in the arena: c.layout's mask (nb x nb bytes), or NULL */
    int head_rows;       /* the head's chunk (zt_head_chunk_rows, as the arena was carved) */
    int rows;            /* a block's position-wise chunk (zt_mlp_chunk_rows, likewise) */
    size_t es;           /* activation element size */
    void *arena;
    uint64_t arena_bytes;
    int32_t *tok_in, *tok_tgt; /* n_micro * T each */
    float *losses;             /* n_micro */
    float *rope;               /* seq x head_dim/2 x {cos, sin} */
    void **ckpt; /* n_layers + 1 block inputs: ckpt[l] feeds block l+1, ckpt[L] the head */
    void *dres;  /* the residual stream's gradient, carried layer to layer */
    /* Layer-major groups: ckpt and dres point at the set of the group's
     * micro-batch being computed; sets (device) of them in the arena, or a
     * pair of slots of the arena's one set, loaded and stored by the
     * layer-input store (act_home host or nvme). */
    int G, sets;
    void **ckpt_all, **dres_all; /* [set * (n_layers + 1) + l], [set] */
    zt_act_store *act;           /* act_home host or nvme */
    zt_act_layers *lay;          /* act_home host per layer (zt_act_per_layer): ckpt[l] is
                                    slot l & 1 of the two the arena keeps */
    void **stage_ckpt;           /* ckpt as a staged unit sees it: its pair of slots */
    uint64_t stride;
    block_ws b;      /* the workspace, shared by... */
    head_ws h;       /* ...the head's pieces and... */
    float *emb_grad; /* ...the embedding gradient's fp32 accumulator */
    /* Tied: the head's gradients of the embedding matrix and the final norm,
     * from the head's backward to the embedding's; per set like ckpt. */
    char *head_grad_all;
    uint64_t head_stride, head_norm_off;
    void *head_grad, *head_norm_grad; /* the current set's */
    int32_t *host_in, *host_tgt;      /* staging for set_batch */
    zo_comm_t tp;                     /* the tensor-parallel group (NULL: none) */
    int vocab, v0;                    /* tp: the whole vocabulary, the rank's first id */
    float *xstats, *xstats_all;       /* tp: a head chunk's stats, the group's (rank order) */
    /* Sequence parallel (c.seq_par > 1, over tp): ckpt, dres and x2 hold the
     * rank's nres rows of the tokens, from row r0res; sp_all and sp_grad
     * every token's rows (gathered, or partial sums before a reduce-scatter),
     * sp_own the rank's rows before a gather or after a reduce-scatter. */
    int sp, nres;
    void *sp_all, *sp_grad, *sp_own;
    zo_event_t staged; /* the staging copies are done */
};

/* Tied: set j's head gradients become the current ones. */
static void select_head_grads(zt_model *m, int set)
{
    if (!m->head_grad_all)
        return;
    m->head_grad = m->head_grad_all + (uint64_t)set * m->head_stride;
    m->head_norm_grad = (char *)m->head_grad + m->head_norm_off;
}

/* Point the model's pieces into its arena at the shape part's offsets. */
static void place(zt_model *m, char *base)
{
    zt_activation_layout a;
    zt_activation_layout_group(&m->c, &m->grp, &a);
    const zt_block_offsets *bo = &a.block;
    const zt_head_offsets *ho = &a.head;
    m->tok_in = (int32_t *)(base + a.tok_in);
    m->tok_tgt = (int32_t *)(base + a.tok_tgt);
    m->losses = (float *)(base + a.losses);
    m->rope = (float *)(base + a.rope);
    m->block_mask = m->c.layout.struct_size ? (uint8_t *)(base + a.block_mask) : NULL;
    const int L1 = m->c.shape.n_layers + 1, per_layer = zt_act_per_layer(&m->c, &m->grp);
    for (int j = 0; j < m->sets; j++) {
        for (int l = 0; l < L1; l++)
            m->ckpt_all[j * L1 + l] =
                base + a.ckpt +
                (per_layer ? (uint64_t)(l & 1) : (uint64_t)j * L1 + l) * a.ckpt_stride;
        m->dres_all[j] = base + a.dres + (uint64_t)j * a.ckpt_stride;
    }
    m->ckpt = m->ckpt_all;
    m->dres = m->dres_all[0];
    m->stride = a.ckpt_stride;
#define AT(off) ((void *)(base + (off)))
    m->b = (block_ws){.h1 = AT(bo->h1),
                      .q = AT(bo->q),
                      .k = AT(bo->k),
                      .v = AT(bo->v),
                      .att = AT(bo->att),
                      .attn_out = AT(bo->attn_out),
                      .x2 = AT(bo->x2),
                      .h2 = AT(bo->h2),
                      .gate = AT(bo->gate),
                      .up = AT(bo->up),
                      .act = AT(bo->act),
                      .dq = AT(bo->dq),
                      .dk = AT(bo->dk),
                      .dv = AT(bo->dv),
                      .datt = AT(bo->datt),
                      .rstd1 = AT(bo->rstd1),
                      .rstd2 = AT(bo->rstd2),
                      .kc = AT(bo->kc),
                      .vc = AT(bo->vc),
                      .dkc = AT(bo->dkc),
                      .dvc = AT(bo->dvc),
                      .dattn = m->c.flash ? AT(bo->dattn) : NULL};
    m->h = (head_ws){.hf = AT(ho->hf),
                     .logits = AT(ho->logits),
                     .rstd = AT(ho->rstd),
                     .row_loss = AT(ho->row_loss)};
#undef AT
    m->emb_grad = (float *)(base + a.emb_grad);
    m->nres = (int)zt_model_res_rows(&m->c);
    m->sp_all = a.sp_all ? base + a.sp_all : NULL;
    m->sp_grad = a.sp_grad ? base + a.sp_grad : NULL;
    m->sp_own = a.sp_own ? base + a.sp_own : NULL;
    m->head_stride = a.head_stride;
    m->head_norm_off = a.head_norm_grad - a.head_grad;
    m->head_grad_all = a.head_stride ? base + a.head_grad : NULL;
    select_head_grads(m, 0);
}

void zt_model_free(zt_model *m)
{
    if (!m)
        return;
    if (m->s)
        zo_stream_synchronize(m->s);
    zt_act_store_free(m->act);
    zt_act_layers_free(m->lay);
    zo_event_destroy(m->staged);
    zo_device_mfree(m->dev, m->arena);
    zo_device_mfree(m->dev, m->xstats);
    free(m->stage_ckpt);
    free(m->ckpt_all);
    free(m->dres_all);
    free(m->host_in);
    free(m->host_tgt);
    free(m);
}

/* act_home host or nvme with groups of several: the store, computing on a
 * pair of slots of the arena's one set (ckpt 0..2 and dres; the layout gives
 * a staged set at least three checkpoint strides). */
static zo_status act_alloc(zt_model *m, const zt_act_nvme *nv)
{
    if (zt_act_per_layer(&m->c, &m->grp)) {
        void *slot[2] = {m->ckpt_all[0], m->ckpt_all[1]};
        return zt_act_layers_init(&m->lay, m->dev, m->s, &m->c, slot);
    }
    if (m->grp.act_home == ZT_ACT_DEVICE || m->G == 1)
        return ZO_OK;
    m->stage_ckpt = calloc((size_t)m->c.shape.n_layers + 1, sizeof *m->stage_ckpt);
    if (!m->stage_ckpt)
        return zt_fail(ZO_ERR_NO_MEMORY, "model host buffers");
    void *slot[4] = {m->ckpt_all[0], (char *)m->ckpt_all[0] + m->stride,
                     (char *)m->ckpt_all[0] + 2 * m->stride, m->dres_all[0]};
    return zt_act_store_init(&m->act, m->dev, m->s, &m->c, &m->grp, nv, slot);
}

/* The layout's block mask into its place in the arena (nb^2 bytes), the
 * same for every block and head. */
static zo_status mask_upload(zt_model *m)
{
    const zo_attn_layout *l = &m->c.layout;
    int nb = 0;
    if (!l->struct_size)
        return ZO_OK;
    ZT_LIB(zo_attn_layout_build(l, m->c.seq, NULL, 0, &nb, NULL));
    size_t n = (size_t)nb * nb;
    uint8_t *host = malloc(n);
    if (!host)
        return zt_fail(ZO_ERR_NO_MEMORY, "a %zu-byte attention mask", n);
    zo_status st = zo_attn_layout_build(l, m->c.seq, host, n, &nb, NULL);
    if (st >= 0)
        st = zo_memcpy_h2d_async(m->s, m->block_mask, host, n);
    if (st >= 0)
        st = zo_stream_synchronize(m->s);
    free(host);
    return st < 0 ? zt_lib_fail(st, "the sparse attention mask") : ZO_OK;
}

static zo_status model_alloc(zt_model *m, const zt_act_nvme *nv)
{
    const zt_model_config *c = &m->c;
    m->G = zt_model_group(c, &m->grp);
    m->sets = m->grp.act_home == ZT_ACT_DEVICE ? m->G : 1;
    m->ckpt_all = calloc((size_t)m->sets * (c->shape.n_layers + 1), sizeof *m->ckpt_all);
    m->dres_all = calloc((size_t)m->sets, sizeof *m->dres_all);
    m->host_in = malloc((size_t)c->n_micro * m->T * sizeof(int32_t));
    m->host_tgt = malloc((size_t)c->n_micro * m->T * sizeof(int32_t));
    if (!m->ckpt_all || !m->dres_all || !m->host_in || !m->host_tgt)
        return zt_fail(ZO_ERR_NO_MEMORY, "model host buffers");
    m->arena_bytes = zt_model_activation_bytes_group(c, &m->grp);
    ZT_LIB(zo_device_malloc(m->dev, m->arena_bytes, &m->arena));
    place(m, m->arena);
    ZT_TRY(mask_upload(m));
    ZT_TRY(act_alloc(m, nv));
    ZT_LIB(zo_event_create(m->dev, &m->staged));
    ZT_LIB(zo_op_rope_table_scaled(m->s, m->rope, c->seq, m->hd, c->shape.rope_theta, 0,
                                   &c->shape.rope_scaling));
    return ZO_OK;
}

zo_status zt_model_init(zt_model **out, zo_device_t dev, zo_stream_t compute,
                        const zt_model_config *c)
{
    return zt_model_init_group(out, dev, compute, c, NULL);
}

zo_status zt_model_init_group(zt_model **out, zo_device_t dev, zo_stream_t compute,
                              const zt_model_config *c, const zt_act_group *g)
{
    return zt_model_init_act(out, dev, compute, c, g, NULL);
}

zo_status zt_model_init_act(zt_model **out, zo_device_t dev, zo_stream_t compute,
                            const zt_model_config *c, const zt_act_group *g, const zt_act_nvme *nv)
{
    ZT_TRY(zt_model_config_check(c));
    ZT_TRY(zt_act_group_check(g));
    zt_model *m = calloc(1, sizeof *m);
    if (!m)
        return zt_fail(ZO_ERR_NO_MEMORY, "model");
    m->c = *c;
    if (g)
        m->grp = *g;
    m->dev = dev;
    m->s = compute;
    m->T = c->micro_batch * c->seq;
    m->head_rows = (int)zt_head_chunk_rows(c);
    m->rows = (int)zt_mlp_chunk_rows(c);
    m->hd = zt_head_dim(&c->shape);
    m->es = zo_dtype_size(c->dt);
    m->vocab = c->shape.vocab;
    zo_status st = model_alloc(m, nv);
    if (st < 0) {
        zt_model_free(m);
        return st;
    }
    *out = m;
    return ZO_OK;
}

void zt_model_settle(zt_model *m)
{
    zo_stream_synchronize(m->s);
    if (m->act)
        zt_act_sync(m->act);
    if (m->lay)
        zt_act_layers_sync(m->lay);
}

zt_act_store *zt_model_act_store(zt_model *m)
{
    return m->act;
}

zo_status zt_model_set_batch(zt_model *m, const int32_t *inputs, const int32_t *targets,
                             int n_micro)
{
    if (n_micro <= 0 || n_micro > m->c.n_micro)
        return zt_fail(ZO_ERR_INVALID_ARG, "set_batch of %d micro-batches; the model holds 1..%d",
                       n_micro, m->c.n_micro);
    size_t bytes = (size_t)n_micro * m->T * sizeof(int32_t);
    ZT_LIB(zo_event_synchronize(m->staged)); /* the previous batch's copies have read the staging */
    memcpy(m->host_in, inputs, bytes);
    memcpy(m->host_tgt, targets, bytes);
    ZT_LIB(zo_memcpy_h2d_async(m->s, m->tok_in, m->host_in, bytes));
    ZT_LIB(zo_memcpy_h2d_async(m->s, m->tok_tgt, m->host_tgt, bytes));
    ZT_LIB(zo_event_record(m->staged, m->s));
    return ZO_OK;
}

zo_status zt_model_read_losses(zt_model *m, float *losses, int n)
{
    if (n <= 0 || n > m->c.n_micro)
        return zt_fail(ZO_ERR_INVALID_ARG, "read_losses of %d micro-batches; the model holds 1..%d",
                       n, m->c.n_micro);
    ZT_LIB(zo_memcpy_d2h_async(m->s, losses, m->losses, (size_t)n * sizeof(float)));
    zo_status st = zo_stream_synchronize(m->s);
    /* a failed load or store of layer inputs fails the step too (the gradients
     * computed from them are garbage) */
    zo_status ast = m->act ? zt_act_sync(m->act) : ZO_OK;
    if (ast < 0)
        return ast;
    if (st < 0)
        return zt_lib_fail(st, "zo_stream_synchronize");
    return ZO_OK;
}

/* ---- linear layers: y = x W^T with W stored [out, in] ---- */

static zo_gemm_desc gemm_desc(const zt_model *m)
{
    zo_gemm_desc g = ZO_GEMM_DESC_INIT;
    g.a_type = g.b_type = g.c_type = m->c.dt;
    return g;
}

/* y[rows, out] = x[rows, in] W^T */
static zo_status linear_fwd_rows(const zt_model *m, int rows, void *y, const void *x, const void *w,
                                 int in, int out)
{
    zo_gemm_desc g = gemm_desc(m);
    g.trans_b = 1;
    g.m = rows, g.n = out, g.k = in;
    g.a = x, g.lda = in;
    g.b = w, g.ldb = in;
    g.c = y, g.ldc = out;
    ZT_LIB(zo_op_gemm(m->s, &g));
    return ZO_OK;
}

static zo_status linear_fwd(const zt_model *m, void *y, const void *x, const void *w, int in,
                            int out)
{
    return linear_fwd_rows(m, m->T, y, x, w, in, out);
}

/* dx[rows, in] = (accumulate ? dx : 0) + dy[rows, out] W */
static zo_status linear_bwd_data_rows(const zt_model *m, int rows, void *dx, const void *dy,
                                      const void *w, int in, int out, int accumulate)
{
    zo_gemm_desc g = gemm_desc(m);
    g.m = rows, g.n = in, g.k = out;
    g.beta = accumulate ? 1.0f : 0.0f;
    g.a = dy, g.lda = out;
    g.b = w, g.ldb = in;
    g.c = dx, g.ldc = in;
    ZT_LIB(zo_op_gemm(m->s, &g));
    return ZO_OK;
}

static zo_status linear_bwd_data(const zt_model *m, void *dx, const void *dy, const void *w, int in,
                                 int out, int accumulate)
{
    return linear_bwd_data_rows(m, m->T, dx, dy, w, in, out, accumulate);
}

/* dW[out, in] += dy^T x over rows */
static zo_status linear_bwd_weight_rows(const zt_model *m, int rows, void *dw, const void *dy,
                                        const void *x, int in, int out)
{
    zo_gemm_desc g = gemm_desc(m);
    g.trans_a = 1;
    g.m = out, g.n = in, g.k = rows;
    g.beta = 1.0f;
    g.a = dy, g.lda = out;
    g.b = x, g.ldb = in;
    g.c = dw, g.ldc = in;
    ZT_LIB(zo_op_gemm(m->s, &g));
    return ZO_OK;
}

static zo_status linear_bwd_weight(const zt_model *m, void *dw, const void *dy, const void *x,
                                   int in, int out)
{
    return linear_bwd_weight_rows(m, m->T, dw, dy, x, in, out);
}

/* ---- a block ---- */

zo_status zt_model_set_tp(zt_model *m, zo_comm_t tp)
{
    m->tp = tp;
    m->vocab = m->c.shape.vocab;
    m->v0 = 0;
    m->sp = 0;
    if (!tp)
        return m->c.seq_par > 1 ? zt_fail(ZO_ERR_INVALID_ARG,
                                          "sequence parallelism over %d ranks without a "
                                          "tensor-parallel group: it needs --tensor-parallel",
                                          m->c.seq_par)
                                : ZO_OK;
    const int T = zo_comm_size(tp);
    if (m->c.seq_par > 1 && m->c.seq_par != T)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "sequence parallelism over %d ranks with a tensor-parallel group of %d: "
                       "they must be the same ranks",
                       m->c.seq_par, T);
    m->sp = m->c.seq_par > 1;
    m->vocab = m->c.shape.vocab * T;
    m->v0 = m->c.shape.vocab * zo_comm_rank(tp);
    ZT_LIB(zo_device_malloc(m->dev, zt_model_tp_bytes((uint64_t)m->head_rows, T),
                            (void **)&m->xstats));
    m->xstats_all = m->xstats + (size_t)m->head_rows * ZO_XENT_STATS;
    return ZO_OK;
}

/* With tensor parallelism, x (n elements) becomes its sum over the group:
 * the row-parallel layers' partial outputs, the column-parallel layers'
 * partial input gradients. The exact chain sums in rank order, so every
 * placement and mode at a given T computes the same bits. */
static zo_status tp_sum(const zt_model *m, void *x, size_t n)
{
    if (m->tp)
        ZT_LIB(zo_comm_all_reduce(m->tp, m->s, x, x, n, m->c.dt, ZO_REDUCE_EXACT));
    return ZO_OK;
}

/* Sequence parallel: the rank's rows own (nres x dim) from every rank of
 * the group into all (every token's rows, in rank order). */
static zo_status sp_gather(const zt_model *m, const void *own, void *all)
{
    ZT_LIB(zo_comm_all_gather(m->tp, m->s, own, all, (size_t)m->nres * m->c.shape.dim, m->c.dt));
    return ZO_OK;
}

/* Sequence parallel: the partial sums all (every token's rows) summed over
 * the group, the rank's rows into own. The exact chain adds the same
 * partials in the same rank order as tp_sum's all-reduce: the same bits. */
static zo_status sp_scatter(const zt_model *m, const void *all, void *own)
{
    ZT_LIB(zo_comm_reduce_scatter(m->tp, m->s, all, own, (size_t)m->nres * m->c.shape.dim, m->c.dt,
                                  ZO_REDUCE_EXACT));
    return ZO_OK;
}

/* Sequence parallel: the norm (weight w) of the rank's rows x, rstd of
 * them, gathered into sp_all: every token's norm output, the input of a
 * column-parallel layer. */
static zo_status sp_norm_gather(zt_model *m, const void *x, const void *w, float *rstd)
{
    const zt_shape *sh = &m->c.shape;
    ZT_LIB(zo_op_rmsnorm_fwd(m->s, m->sp_own, rstd, x, w, (size_t)m->nres, sh->dim, sh->norm_eps,
                             m->c.dt));
    return sp_gather(m, m->sp_own, m->sp_all);
}

static int32_t *tokens_of(const zt_model *m, int32_t *base, int i)
{
    return base + (size_t)i * m->T;
}

/* The chunk rows of a block's position-wise parts (zt_mlp_chunk_rows, as
 * the arena was carved) from row r0. */
static int chunk_rows(const zt_model *m, int r0)
{
    return m->rows < m->T - r0 ? m->rows : m->T - r0;
}

/* Row r0 of a tokens x width activation. */
static char *row_at(const zt_model *m, const void *base, int r0, int width)
{
    return (char *)base + (size_t)r0 * width * m->es;
}

/* The q, k, v projections with their biases of rows r0..r0+n-1 from h,
 * those rows' norm output. */
static zo_status attn_qkv_rows(zt_model *m, void *const *p, const void *h, int r0, int n)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, qd = zt_q_dim(sh), kvd = zt_kv_dim(sh);
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    char *q = row_at(m, b->q, r0, qd), *k = row_at(m, b->kc, r0, kvd),
         *v = row_at(m, b->vc, r0, kvd);
    ZT_TRY(linear_fwd_rows(m, n, q, h, p[ZT_WQ], d, qd));
    ZT_TRY(linear_fwd_rows(m, n, k, h, p[ZT_WK], d, kvd));
    ZT_TRY(linear_fwd_rows(m, n, v, h, p[ZT_WV], d, kvd));
    if (sh->attn_bias) {
        ZT_LIB(zo_op_bias_fwd(m->s, q, p[ZT_BQ], (size_t)n, qd, dt));
        ZT_LIB(zo_op_bias_fwd(m->s, k, p[ZT_BK], (size_t)n, kvd, dt));
        ZT_LIB(zo_op_bias_fwd(m->s, v, p[ZT_BV], (size_t)n, kvd, dt));
    }
    return ZO_OK;
}

/* The attention norm of x and the q, k, v projections with their biases,
 * over rows r0..r0+n-1: h1 holds the chunk's norm output, rstd1 its rows'. */
static zo_status attn_in_rows(zt_model *m, void *const *p, const void *x, int r0, int n)
{
    const zt_shape *sh = &m->c.shape;
    block_ws *b = &m->b;
    ZT_LIB(zo_op_rmsnorm_fwd(m->s, b->h1, b->rstd1 + r0, row_at(m, x, r0, sh->dim), p[ZT_ATTN_NORM],
                             (size_t)n, sh->dim, sh->norm_eps, m->c.dt));
    return attn_qkv_rows(m, p, b->h1, r0, n);
}

/* The attention's inputs from the block's input x, a chunk of rows at a
 * time: q (n_heads) and the key/value heads kc, vc with their biases, then
 * RoPE over the whole sequence, repeated to the query heads under GQA. */
static zo_status attn_project(zt_model *m, void *const *p, const void *x)
{
    const zt_shape *sh = &m->c.shape;
    const int B = m->c.micro_batch, S = m->c.seq, H = sh->n_heads, KV = zt_kv_heads(sh);
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    if (m->sp) { /* x is the rank's rows: their norm, gathered, feeds every token's */
        ZT_TRY(sp_norm_gather(m, x, p[ZT_ATTN_NORM], b->rstd1));
        for (int r0 = 0; r0 < m->T; r0 += m->rows)
            ZT_TRY(attn_qkv_rows(m, p, row_at(m, m->sp_all, r0, sh->dim), r0, chunk_rows(m, r0)));
    } else {
        for (int r0 = 0; r0 < m->T; r0 += m->rows)
            ZT_TRY(attn_in_rows(m, p, x, r0, chunk_rows(m, r0)));
    }
    ZT_LIB(zo_op_rope_fwd(m->s, b->q, b->q, m->rope, B, S, H, m->hd, dt));
    ZT_LIB(zo_op_rope_fwd(m->s, b->kc, b->kc, m->rope, B, S, KV, m->hd, dt));
    if (KV != H && !m->c.flash) { /* the fused op reads the key/value heads in place */
        ZT_LIB(zo_op_repeat_kv_fwd(m->s, b->k, b->kc, (size_t)m->T, KV, H / KV, m->hd, dt));
        ZT_LIB(zo_op_repeat_kv_fwd(m->s, b->v, b->vc, (size_t)m->T, KV, H / KV, m->hd, dt));
    }
    return ZO_OK;
}

/* The fused attention's descriptor for this model's block m->layer: causal,
 * GQA in place, the shape's sliding window where the block has it, the
 * sparse layout's block mask. */
static zo_flash_attn_desc flash_desc(const zt_model *m)
{
    const zt_shape *sh = &m->c.shape;
    zo_flash_attn_desc d = ZO_FLASH_ATTN_DESC_INIT;
    d.batch = m->c.micro_batch, d.seq = m->c.seq, d.heads = sh->n_heads;
    d.kv_heads = zt_kv_heads(sh), d.head_dim = m->hd, d.dt = m->c.dt;
    d.window = m->layer - 1 >= sh->window_from ? sh->window : 0;
    d.block_mask = m->block_mask;
    d.mask_block = m->block_mask ? m->c.layout.block : 0;
    return d;
}

/* attn_out from q and the key/value heads: fused (lse in att) or materialized. */
static zo_status attn_core_fwd(zt_model *m)
{
    block_ws *b = &m->b;
    if (m->c.flash) {
        zo_flash_attn_desc d = flash_desc(m);
        ZT_LIB(zo_op_flash_attention_fwd(m->s, &d, b->attn_out, b->att, b->q, b->kc, b->vc));
        return ZO_OK;
    }
    ZT_LIB(zo_op_attention_fwd(m->s, b->attn_out, b->att, b->q, b->k, b->v, m->c.micro_batch,
                               m->c.seq, m->c.shape.n_heads, m->hd, m->c.dt));
    return ZO_OK;
}

/* The MLP's gate, up and their product act of n rows from h, their norm
 * output (chunk rows in the workspace). */
static zo_status mlp_hidden_rows(zt_model *m, void *const *p, const void *h, int n)
{
    const int d = m->c.shape.dim, f = m->c.shape.ffn_dim;
    block_ws *b = &m->b;
    ZT_TRY(linear_fwd_rows(m, n, b->gate, h, p[ZT_WGATE], d, f));
    ZT_TRY(linear_fwd_rows(m, n, b->up, h, p[ZT_WUP], d, f));
    ZT_LIB(zo_op_swiglu_fwd(m->s, b->act, b->gate, b->up, (size_t)n * f, m->c.dt));
    return ZO_OK;
}

/* The MLP half's forward over rows r0..r0+n-1: the norm of x2 and rstd2
 * there, the chunk's gate, up and their product act (chunk rows in the
 * workspace), and with y the chunk's output rows, the residual added. */
static zo_status mlp_fwd_rows(zt_model *m, void *const *p, int r0, int n, void *y)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, f = sh->ffn_dim;
    const size_t nd = (size_t)n * d;
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    const char *x2 = row_at(m, b->x2, r0, d);
    ZT_LIB(zo_op_rmsnorm_fwd(m->s, b->h2, b->rstd2 + r0, x2, p[ZT_MLP_NORM], (size_t)n, d,
                             sh->norm_eps, dt));
    ZT_TRY(mlp_hidden_rows(m, p, b->h2, n));
    if (!y)
        return ZO_OK;
    char *yc = row_at(m, y, r0, d);
    ZT_TRY(linear_fwd_rows(m, n, yc, b->act, p[ZT_WDOWN], f, d));
    ZT_TRY(tp_sum(m, yc, nd)); /* down_proj is row-parallel */
    ZT_LIB(zo_op_add(m->s, yc, yc, x2, nd, dt));
    return ZO_OK;
}

/* Sequence parallel, block_fwd: x, x2 and y are the rank's rows. The
 * row-parallel outputs (o_proj's, down_proj's, every token's partial sums
 * in sp_all) are reduce-scattered where tp_sum all-reduces; the norms'
 * outputs are gathered before the column-parallel layers. The MLP's
 * chunks write down_proj's rows over their own norm output in sp_all. */
static zo_status block_fwd_sp(zt_model *m, void *const *p, const void *x, void *y)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, f = sh->ffn_dim;
    const size_t nd = (size_t)m->nres * d;
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    ZT_TRY(attn_project(m, p, x));
    ZT_TRY(attn_core_fwd(m));
    ZT_TRY(linear_fwd(m, m->sp_all, b->attn_out, p[ZT_WO], zt_q_dim(sh), d));
    ZT_TRY(sp_scatter(m, m->sp_all, b->x2));
    if (sh->o_bias)
        ZT_LIB(zo_op_bias_fwd(m->s, b->x2, p[ZT_BO], (size_t)m->nres, d, dt));
    ZT_LIB(zo_op_add(m->s, b->x2, b->x2, x, nd, dt));
    if (!y)
        return ZO_OK;
    ZT_TRY(sp_norm_gather(m, b->x2, p[ZT_MLP_NORM], b->rstd2));
    for (int r0 = 0; r0 < m->T; r0 += m->rows) {
        const int n = chunk_rows(m, r0);
        char *h = row_at(m, m->sp_all, r0, d);
        ZT_TRY(mlp_hidden_rows(m, p, h, n));
        ZT_TRY(linear_fwd_rows(m, n, h, b->act, p[ZT_WDOWN], f, d));
    }
    ZT_TRY(sp_scatter(m, m->sp_all, y));
    ZT_LIB(zo_op_add(m->s, y, y, b->x2, nd, dt));
    return ZO_OK;
}

/* The forward of a block from its input x, keeping what the backward needs
 * in the workspace; y (NULL in the recompute) receives the block's output.
 * The recompute stops at x2: the MLP half recomputes chunk by chunk in its
 * backward (block_bwd_mlp). */
static zo_status block_fwd(zt_model *m, void *const *p, const void *x, void *y)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim;
    const size_t Td = (size_t)m->T * d;
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    if (m->sp)
        return block_fwd_sp(m, p, x, y);
    ZT_TRY(attn_project(m, p, x));
    ZT_TRY(attn_core_fwd(m));
    ZT_TRY(linear_fwd(m, b->x2, b->attn_out, p[ZT_WO], zt_q_dim(sh), d));
    ZT_TRY(tp_sum(m, b->x2, Td)); /* o_proj is row-parallel: its bias once, after the sum */
    if (sh->o_bias)
        ZT_LIB(zo_op_bias_fwd(m->s, b->x2, p[ZT_BO], (size_t)m->T, d, dt));
    ZT_LIB(zo_op_add(m->s, b->x2, b->x2, x, Td, dt));
    for (int r0 = 0; y && r0 < m->T; r0 += m->rows)
        ZT_TRY(mlp_fwd_rows(m, p, r0, chunk_rows(m, r0), y));
    return ZO_OK;
}

/* Sequence parallel, block_bwd_mlp: dres (the rank's rows of dy) gathered
 * into sp_grad, the norm's output recomputed and gathered into sp_all, each
 * chunk's d(h2) written over its rows there, reduce-scattered into sp_own;
 * the norm's backward over the rank's rows. Its weight's gradient is the
 * rank's rows' share (tensor_parallel.c sums it over the group). */
static zo_status block_bwd_mlp_sp(zt_model *m, void *const *p, void *const *g)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, f = sh->ffn_dim;
    block_ws *b = &m->b;
    ZT_TRY(sp_gather(m, m->dres, m->sp_grad));
    ZT_TRY(sp_norm_gather(m, b->x2, p[ZT_MLP_NORM], b->rstd2));
    for (int r0 = 0; r0 < m->T; r0 += m->rows) {
        const int n = chunk_rows(m, r0);
        char *h = row_at(m, m->sp_all, r0, d), *dy = row_at(m, m->sp_grad, r0, d);
        ZT_TRY(mlp_hidden_rows(m, p, h, n));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WDOWN], dy, b->act, f, d));
        ZT_TRY(linear_bwd_data_rows(m, n, b->act, dy, p[ZT_WDOWN], f, d, 0)); /* d(act) */
        ZT_LIB(
            zo_op_swiglu_bwd(m->s, b->gate, b->up, b->act, b->gate, b->up, (size_t)n * f, m->c.dt));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WGATE], b->gate, h, d, f));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WUP], b->up, h, d, f));
        ZT_TRY(linear_bwd_data_rows(m, n, h, b->gate, p[ZT_WGATE], d, f, 0)); /* d(h2) */
        ZT_TRY(linear_bwd_data_rows(m, n, h, b->up, p[ZT_WUP], d, f, 1));
    }
    ZT_TRY(sp_scatter(m, m->sp_all, m->sp_own));
    ZT_LIB(zo_op_rmsnorm_bwd(m->s, m->dres, g[ZT_MLP_NORM], m->c.dt, m->sp_own, b->x2,
                             p[ZT_MLP_NORM], b->rstd2, (size_t)m->nres, d, 1, m->c.dt));
    return ZO_OK;
}

/* The MLP half's backward, a chunk of rows at a time, each recomputed from
 * x2 first: dres holds dy and becomes d(x2). With one chunk this is the
 * unchunked backward op for op; with more, every activation gradient keeps
 * its bits (each row's are its own) and the weights' and the norm's
 * gradients are summed chunk by chunk. */
static zo_status block_bwd_mlp(zt_model *m, void *const *p, void *const *g)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, f = sh->ffn_dim;
    block_ws *b = &m->b;
    if (m->sp)
        return block_bwd_mlp_sp(m, p, g);
    for (int r0 = 0; r0 < m->T; r0 += m->rows) {
        const int n = chunk_rows(m, r0);
        char *dy = row_at(m, m->dres, r0, d);
        ZT_TRY(mlp_fwd_rows(m, p, r0, n, NULL));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WDOWN], dy, b->act, f, d));
        ZT_TRY(linear_bwd_data_rows(m, n, b->act, dy, p[ZT_WDOWN], f, d, 0)); /* d(act) */
        ZT_LIB(
            zo_op_swiglu_bwd(m->s, b->gate, b->up, b->act, b->gate, b->up, (size_t)n * f, m->c.dt));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WGATE], b->gate, b->h2, d, f));
        ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WUP], b->up, b->h2, d, f));
        ZT_TRY(linear_bwd_data_rows(m, n, b->h2, b->gate, p[ZT_WGATE], d, f, 0)); /* d(h2) */
        ZT_TRY(linear_bwd_data_rows(m, n, b->h2, b->up, p[ZT_WUP], d, f, 1));
        ZT_TRY(tp_sum(m, b->h2, (size_t)n * d)); /* gate and up are column-parallel */
        ZT_LIB(zo_op_rmsnorm_bwd(m->s, dy, g[ZT_MLP_NORM], m->c.dt, b->h2, row_at(m, b->x2, r0, d),
                                 p[ZT_MLP_NORM], b->rstd2 + r0, (size_t)n, d, 1, m->c.dt));
    }
    return ZO_OK;
}

/* From dq, dk, dv of the query heads to the key/value heads' gradients
 * (summed over each group under GQA), through RoPE, with the biases'. */
static zo_status attn_project_bwd(zt_model *m, void *const *g)
{
    const zt_shape *sh = &m->c.shape;
    const int B = m->c.micro_batch, S = m->c.seq, H = sh->n_heads, KV = zt_kv_heads(sh);
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    ZT_LIB(zo_op_rope_bwd(m->s, b->dq, b->dq, m->rope, B, S, H, m->hd, dt));
    if (KV != H && !m->c.flash) {
        ZT_LIB(zo_op_repeat_kv_bwd(m->s, b->dkc, b->dk, (size_t)m->T, KV, H / KV, m->hd, dt));
        ZT_LIB(zo_op_repeat_kv_bwd(m->s, b->dvc, b->dv, (size_t)m->T, KV, H / KV, m->hd, dt));
    }
    ZT_LIB(zo_op_rope_bwd(m->s, b->dkc, b->dkc, m->rope, B, S, KV, m->hd, dt));
    if (sh->attn_bias) {
        const size_t T = (size_t)m->T;
        ZT_LIB(zo_op_bias_bwd(m->s, g[ZT_BQ], dt, b->dq, T, zt_q_dim(sh), dt));
        ZT_LIB(zo_op_bias_bwd(m->s, g[ZT_BK], dt, b->dkc, T, zt_kv_dim(sh), dt));
        ZT_LIB(zo_op_bias_bwd(m->s, g[ZT_BV], dt, b->dvc, T, zt_kv_dim(sh), dt));
    }
    return ZO_OK;
}

/* The q, k, v projections' backward over rows r0..r0+n-1 from h, their
 * norm output: the weights' gradients, then d(h) written over h. */
static zo_status attn_qkv_bwd_rows(zt_model *m, void *const *p, void *const *g, void *h, int r0,
                                   int n)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, qd = zt_q_dim(sh), kvd = zt_kv_dim(sh);
    block_ws *b = &m->b;
    char *dq = row_at(m, b->dq, r0, qd), *dk = row_at(m, b->dkc, r0, kvd);
    char *dv = row_at(m, b->dvc, r0, kvd);
    ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WQ], dq, h, d, qd));
    ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WK], dk, h, d, kvd));
    ZT_TRY(linear_bwd_weight_rows(m, n, g[ZT_WV], dv, h, d, kvd));
    ZT_TRY(linear_bwd_data_rows(m, n, h, dq, p[ZT_WQ], d, qd, 0));
    ZT_TRY(linear_bwd_data_rows(m, n, h, dk, p[ZT_WK], d, kvd, 1));
    ZT_TRY(linear_bwd_data_rows(m, n, h, dv, p[ZT_WV], d, kvd, 1));
    return ZO_OK;
}

/* The backward of the attention norm and the q, k, v projections over rows
 * r0..r0+n-1, their norm output recomputed from x first (h1 is the MLP
 * half's h2 too): dres's rows gain d(x) through the norm. */
static zo_status attn_in_bwd_rows(zt_model *m, void *const *p, void *const *g, const void *x,
                                  int r0, int n)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim;
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    const char *xr = row_at(m, x, r0, d);
    ZT_LIB(zo_op_rmsnorm_fwd(m->s, b->h1, b->rstd1 + r0, xr, p[ZT_ATTN_NORM], (size_t)n, d,
                             sh->norm_eps, dt));
    ZT_TRY(attn_qkv_bwd_rows(m, p, g, b->h1, r0, n)); /* h1 now holds d(h1) */
    ZT_TRY(tp_sum(m, b->h1, (size_t)n * d));          /* q, k and v are column-parallel */
    ZT_LIB(zo_op_rmsnorm_bwd(m->s, row_at(m, m->dres, r0, d), g[ZT_ATTN_NORM], dt, b->h1, xr,
                             p[ZT_ATTN_NORM], b->rstd1 + r0, (size_t)n, d, 1, dt));
    return ZO_OK;
}

/* Sequence parallel, the attention norm's backward: its output recomputed
 * from the rank's rows x and gathered, each chunk's d(h1) written over its
 * rows, reduce-scattered; dres (the rank's rows) gains d(x) through the
 * norm. */
static zo_status attn_in_bwd_sp(zt_model *m, void *const *p, void *const *g, const void *x)
{
    const int d = m->c.shape.dim;
    block_ws *b = &m->b;
    ZT_TRY(sp_norm_gather(m, x, p[ZT_ATTN_NORM], b->rstd1));
    for (int r0 = 0; r0 < m->T; r0 += m->rows)
        ZT_TRY(attn_qkv_bwd_rows(m, p, g, row_at(m, m->sp_all, r0, d), r0, chunk_rows(m, r0)));
    ZT_TRY(sp_scatter(m, m->sp_all, m->sp_own));
    ZT_LIB(zo_op_rmsnorm_bwd(m->s, m->dres, g[ZT_ATTN_NORM], m->c.dt, m->sp_own, x, p[ZT_ATTN_NORM],
                             b->rstd1, (size_t)m->nres, d, 1, m->c.dt));
    return ZO_OK;
}

/* The attention half's backward: dres holds d(x2) and becomes d(x)
 * (sequence parallel: every token's d(x2) gathered for o_proj's). */
static zo_status block_bwd_attn(zt_model *m, void *const *p, void *const *g, const void *x)
{
    const zt_shape *sh = &m->c.shape;
    const int d = sh->dim, B = m->c.micro_batch, S = m->c.seq, H = sh->n_heads;
    const int qd = zt_q_dim(sh);
    const zo_dtype dt = m->c.dt;
    block_ws *b = &m->b;
    const void *dy = m->dres;
    if (m->sp) {
        ZT_TRY(sp_gather(m, m->dres, m->sp_grad));
        dy = m->sp_grad;
    }
    if (sh->o_bias)
        ZT_LIB(zo_op_bias_bwd(m->s, g[ZT_BO], dt, dy, (size_t)m->T, d, dt));
    ZT_TRY(linear_bwd_weight(m, g[ZT_WO], dy, b->attn_out, qd, d));
    if (m->c.flash) { /* d(attn_out) beside attn_out (in x2's piece): the fused backward reads both
                       */
        zo_flash_attn_desc fd = flash_desc(m);
        ZT_TRY(linear_bwd_data(m, b->dattn, dy, p[ZT_WO], qd, d, 0));
        ZT_LIB(zo_op_flash_attention_bwd(m->s, &fd, b->dq, b->dkc, b->dvc, b->datt, b->dattn,
                                         b->attn_out, b->att, b->q, b->kc, b->vc));
    } else {
        ZT_TRY(linear_bwd_data(m, b->attn_out, dy, p[ZT_WO], qd, d, 0)); /* d(attn_out) */
        ZT_LIB(zo_op_attention_bwd(m->s, b->dq, b->dk, b->dv, b->datt, b->attn_out, b->att, b->q,
                                   b->k, b->v, B, S, H, m->hd, dt));
    }
    ZT_TRY(attn_project_bwd(m, g));
    if (m->sp)
        return attn_in_bwd_sp(m, p, g, x);
    for (int r0 = 0; r0 < m->T; r0 += m->rows)
        ZT_TRY(attn_in_bwd_rows(m, p, g, x, r0, chunk_rows(m, r0)));
    return ZO_OK;
}

/* ---- the head: final norm, logits, loss ---- */

/* The head's final norm and matrix and where their gradients go: the head
 * layer's, or a tied model's layer 0 tensors with the gradients kept in the
 * arena until the embedding's backward adds them to its own. */
typedef struct head_params {
    const void *norm, *w;
    void *gnorm, *gw;
} head_params;

static head_params head_of(const zt_model *m, void *const *p, void *const *g)
{
    if (m->c.shape.tied)
        return (head_params){p[ZT_TIED_NORM], p[ZT_EMBEDDING], m->head_norm_grad, m->head_grad};
    return (head_params){p[ZT_HEAD_NORM], p[ZT_HEAD_OUT], g[ZT_HEAD_NORM], g[ZT_HEAD_OUT]};
}

/* The loss of a chunk of n rows from r0 and, training, the logits' gradient
 * in their place. Tensor parallel, the logits are the rank's vocabulary
 * part: its stats are all-gathered and combined in rank order (the same
 * row losses on every rank). */
static zo_status chunk_loss(zt_model *m, int i, int r0, int n, int train, float grad_scale)
{
    head_ws *h = &m->h;
    const int V = m->c.shape.vocab, T = m->T;
    const int32_t *tgt = tokens_of(m, m->tok_tgt, i) + r0;
    float *loss = r0 + n == T ? m->losses + i : NULL;
    void *dl = train ? h->logits : NULL;
    if (!m->tp) {
        ZT_LIB(zo_op_cross_entropy_chunk(m->s, loss, h->row_loss + r0, dl, h->logits, tgt,
                                         (size_t)n, V, grad_scale, m->c.dt, (size_t)r0, (size_t)T));
        return ZO_OK;
    }
    float *all = m->xstats_all; /* n rows a rank, packed: what the combine reads */
    ZT_LIB(zo_op_cross_entropy_part_stats(m->s, m->xstats, h->logits, tgt, (size_t)n, m->vocab,
                                          m->v0, V, m->c.dt));
    ZT_LIB(
        zo_comm_all_gather(m->tp, m->s, m->xstats, all, (size_t)n * ZO_XENT_STATS, ZO_DTYPE_F32));
    ZT_LIB(zo_op_cross_entropy_part(m->s, loss, h->row_loss + r0, dl, h->logits, all,
                                    zo_comm_size(m->tp), tgt, (size_t)n, m->vocab, m->v0, V,
                                    grad_scale, m->c.dt, (size_t)r0, (size_t)T));
    return ZO_OK;
}

/* The head's logits and loss a chunk of rows at a time (zt_head_chunk_rows:
 * every row at once unless the logits of them all pass ZO_HEAD_CHUNK_BYTES),
 * so that no buffer is tokens x vocab. Training, each chunk's backward runs
 * before the next chunk's logits overwrite it: the weight's gradient summed
 * chunk by chunk, the chunk's d(hf) over its rows of hf. With one chunk this
 * is the unchunked head op for op; with more, the loss and d(hf) keep their
 * bits (each row's logits, loss and gradient are its own) and only the
 * head matrix's gradient is summed in another order. */
static zo_status head_chunks(zt_model *m, const head_params *hp, int i, int train, float grad_scale)
{
    const zt_shape *sh = &m->c.shape;
    head_ws *h = &m->h;
    const int d = sh->dim, V = sh->vocab, T = m->T;
    const int C = m->head_rows;
    const size_t row_bytes = (size_t)d * zo_dtype_size(m->c.dt);
    for (int r0 = 0; r0 < T; r0 += C) {
        const int n = C < T - r0 ? C : T - r0;
        char *hf = (char *)h->hf + (size_t)r0 * row_bytes;
        ZT_TRY(linear_fwd_rows(m, n, h->logits, hf, hp->w, d, V));
        ZT_TRY(chunk_loss(m, i, r0, n, train, grad_scale));
        if (!train)
            continue;
        ZT_TRY(linear_bwd_weight_rows(m, n, hp->gw, h->logits, hf, d, V));
        ZT_TRY(linear_bwd_data_rows(m, n, hf, h->logits, hp->w, d, V, 0)); /* d(hf) */
    }
    /* tensor parallel: each rank's d(hf) is over its vocabulary part (sequence
     * parallel: summed into the rank's rows, sp_own) */
    if (!train)
        return ZO_OK;
    return m->sp ? sp_scatter(m, h->hf, m->sp_own) : tp_sum(m, h->hf, (size_t)T * d);
}

static zo_status head_fwd_loss(zt_model *m, const head_params *hp, int i, int train,
                               float grad_scale)
{
    const zt_shape *sh = &m->c.shape;
    head_ws *h = &m->h;
    if (m->sp) { /* the rank's rows' norm, gathered: every token's hf */
        ZT_LIB(zo_op_rmsnorm_fwd(m->s, m->sp_own, h->rstd, m->ckpt[sh->n_layers], hp->norm,
                                 (size_t)m->nres, sh->dim, sh->norm_eps, m->c.dt));
        ZT_TRY(sp_gather(m, m->sp_own, h->hf));
    } else {
        ZT_LIB(zo_op_rmsnorm_fwd(m->s, h->hf, h->rstd, m->ckpt[sh->n_layers], hp->norm, m->T,
                                 sh->dim, sh->norm_eps, m->c.dt));
    }
    if (train &&
        m->c.shape.tied) /* the arena's buffers start from zero as a fetched gradient does */
        ZT_LIB(zo_memset_async(m->s, m->head_grad, 0, m->head_stride));
    return head_chunks(m, hp, i, train, grad_scale);
}

/* After head_fwd_loss with train: hf holds d(hf). */
static zo_status head_bwd(zt_model *m, const head_params *hp)
{
    const zt_shape *sh = &m->c.shape;
    head_ws *h = &m->h;
    if (m->sp) /* d(hf) of the rank's rows in sp_own */
        ZT_LIB(zo_op_rmsnorm_bwd(m->s, m->dres, hp->gnorm, m->c.dt, m->sp_own,
                                 m->ckpt[sh->n_layers], hp->norm, h->rstd, (size_t)m->nres, sh->dim,
                                 0, m->c.dt));
    else
        ZT_LIB(zo_op_rmsnorm_bwd(m->s, m->dres, hp->gnorm, m->c.dt, h->hf, m->ckpt[sh->n_layers],
                                 hp->norm, h->rstd, m->T, sh->dim, 0, m->c.dt));
    return ZO_OK;
}

/* A tied model's head gradients go into layer 0's first, as autograd sums a
 * tied weight's uses in transformers: the head's contribution (computed
 * first) plus the embedding's, added to it below. */
static zo_status tied_head_grads(zt_model *m, void *const *g)
{
    const zt_shape *sh = &m->c.shape;
    const zo_dtype dt = m->c.dt;
    ZT_LIB(
        zo_op_axpy(m->s, g[ZT_EMBEDDING], dt, 1.0f, m->head_grad, dt, (size_t)sh->vocab * sh->dim));
    ZT_LIB(zo_op_axpy(m->s, g[ZT_TIED_NORM], dt, 1.0f, m->head_norm_grad, dt, (size_t)sh->dim));
    return ZO_OK;
}

/* The embedding's gradient accumulates in fp32 (a frequent token's row sums
 * many rows; 16-bit sums would lose them) and is added to the 16-bit buffer. */
static zo_status embedding_bwd(zt_model *m, void *grad, int i)
{
    const zt_shape *sh = &m->c.shape;
    size_t n = (size_t)sh->vocab * sh->dim;
    const void *dout = m->dres;
    if (m->sp) { /* every token's rows */
        ZT_TRY(sp_gather(m, m->dres, m->sp_grad));
        dout = m->sp_grad;
    }
    ZT_LIB(zo_memset_async(m->s, m->emb_grad, 0, n * sizeof(float)));
    ZT_LIB(zo_op_embedding_part_bwd(m->s, m->emb_grad, ZO_DTYPE_F32, dout,
                                    tokens_of(m, m->tok_in, i), (size_t)m->T, sh->dim, m->vocab,
                                    m->v0, sh->vocab, m->c.dt));
    ZT_LIB(zo_op_axpy(m->s, grad, m->c.dt, 1.0f, m->emb_grad, ZO_DTYPE_F32, n));
    return ZO_OK;
}

/* ---- one layer under one fetch ---- */

typedef zo_status (*layer_fn)(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale);

/* The source's layer and phase a model layer runs under: a tied model's
 * head (layer L+1) computes under layer 0's forward fetch, which holds its
 * matrix and the final norm; its gradients wait in the arena for the
 * embedding's backward. */
static int source_layer(const zt_model *m, int layer, zo_phase *phase)
{
    if (!m->c.shape.tied || layer != m->c.shape.n_layers + 1)
        return layer;
    *phase = ZO_PHASE_FORWARD;
    return 0;
}

/* Release after the layer's work: st, the work's outcome, wins. After a
 * failure release may fail too (the engine abandoned the step); that is a
 * consequence, and its message must not replace the cause's. */
static zo_status release_after(const zt_param_source *src, int layer, zo_stream_t s, zo_status st)
{
    if (st >= 0)
        return src->release(src->ctx, layer, s);
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", zt_last_error());
    src->release(src->ctx, layer, s);
    return zt_fail(st, "%s", cause);
}

/* fetch, compute, (grads_ready,) release; release also follows a failed
 * compute so the engine's bookkeeping stays balanced. */
static zo_status run_layer(zt_model *m, const zt_param_source *src, int layer, zo_phase phase,
                           layer_fn fn, int i, float scale)
{
    void *p[ZT_MAX_LAYER_TENSORS] = {0}, *g[ZT_MAX_LAYER_TENSORS] = {0};
    zo_phase sp = phase;
    int sl = source_layer(m, layer, &sp);
    ZT_TRY(src->fetch(src->ctx, sl, sp, m->s, p, g, ZT_MAX_LAYER_TENSORS));
    zo_status st = fn(m, layer, p, g, i, scale);
    if (st >= 0 && sp == ZO_PHASE_BACKWARD)
        st = src->grads_ready(src->ctx, sl, m->s);
    return release_after(src, sl, m->s, st);
}

static zo_status embed_fwd_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale)
{
    const zt_shape *sh = &m->c.shape;
    void *out = m->sp ? m->sp_all : m->ckpt[0];
    ZT_LIB(zo_op_embedding_part_fwd(m->s, out, p[0], tokens_of(m, m->tok_in, i), (size_t)m->T,
                                    sh->dim, m->vocab, m->v0, sh->vocab, m->c.dt));
    /* tensor parallel: zero rows where another rank holds the token, so the sum is the lookup
     * (sequence parallel: the rank's rows of it) */
    if (m->sp)
        return sp_scatter(m, out, m->ckpt[0]);
    return tp_sum(m, m->ckpt[0], (size_t)m->T * sh->dim);
}

static zo_status block_fwd_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale)
{
    m->layer = layer;
    return block_fwd(m, p, m->ckpt[layer - 1], m->ckpt[layer]);
}

static zo_status head_eval_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale)
{
    head_params hp = head_of(m, p, g);
    return head_fwd_loss(m, &hp, i, 0, 0.0f);
}

static zo_status head_train_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                               float scale)
{
    head_params hp = head_of(m, p, g);
    ZT_TRY(head_fwd_loss(m, &hp, i, 1, scale));
    return head_bwd(m, &hp);
}

static zo_status block_bwd_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale)
{
    const void *x = m->ckpt[layer - 1];
    m->layer = layer;
    ZT_TRY(block_fwd(m, p, x, NULL)); /* recompute from the checkpoint */
    ZT_TRY(block_bwd_mlp(m, p, g));
    return block_bwd_attn(m, p, g, x);
}

static zo_status embed_bwd_fn(zt_model *m, int layer, void *const *p, void *const *g, int i,
                              float scale)
{
    if (m->c.shape.tied)
        ZT_TRY(tied_head_grads(m, g));
    return embedding_bwd(m, g[ZT_EMBEDDING], i);
}

static zo_status check_micro(const zt_model *m, int i)
{
    if (i < 0 || i >= m->c.n_micro)
        return zt_fail(ZO_ERR_INVALID_ARG, "micro-batch %d outside 0..%d", i, m->c.n_micro - 1);
    return ZO_OK;
}

static zo_status forward_blocks(zt_model *m, const zt_param_source *src, int i)
{
    m->ckpt = m->ckpt_all;
    m->dres = m->dres_all[0];
    for (int l = 0; l <= m->c.shape.n_layers; l++) {
        if (m->lay) /* the slot's last record has left (no new ones: no backward follows) */
            ZT_TRY(zt_act_layers_forward(m->lay, l));
        ZT_TRY(run_layer(m, src, l, ZO_PHASE_FORWARD, l ? block_fwd_fn : embed_fwd_fn, i, 0.0f));
    }
    return ZO_OK;
}

zo_status zt_model_train_micro(zt_model *m, const zt_param_source *src, int i, float grad_scale)
{
    return zt_model_train_group(m, src, i, 1, grad_scale);
}

/* ---- layer-major groups ---- */

/* act_home host or nvme, a group of several: each unit computes on a pair
 * of slots the layer-input store loads and stores (act_store.h). */
static int staged(const zt_model *m, int n)
{
    return m->act && n > 1;
}

/* Before micro-batch j of a group (of n) runs layer `layer` in `phase`: its
 * set of layer inputs and residual gradient becomes the current one (on the
 * device), or its inputs are loaded into a pair of slots that ckpt and dres
 * then point at. */
static zo_status stage_in(zt_model *m, int j, int layer, zo_phase phase, int n)
{
    const int L = m->c.shape.n_layers;
    if (!staged(m, n)) {
        int set = m->sets > 1 ? j : 0;
        m->ckpt = m->ckpt_all + (size_t)set * (L + 1);
        m->dres = m->dres_all[set];
        select_head_grads(m, set);
        if (m->lay && phase == ZO_PHASE_FORWARD)
            return zt_act_layers_forward(m->lay, layer);
        if (m->lay && layer >= 1 && layer <= L)
            return zt_act_layers_backward(m->lay, layer);
        return ZO_OK;
    }
    void *x, *y;
    ZT_TRY(zt_act_begin(m->act, j, layer, phase, &x, &y));
    m->ckpt = m->stage_ckpt;
    if (phase == ZO_PHASE_FORWARD) {
        if (layer >= 1)
            m->ckpt[layer - 1] = x;
        m->ckpt[layer] = y;
    } else {
        m->ckpt[layer == L + 1 ? L : (layer >= 1 ? layer - 1 : 0)] = x;
        m->dres = y;
    }
    select_head_grads(m, 0);
    if (phase == ZO_PHASE_BACKWARD && layer == 0 && m->head_stride) /* tied: the head's */
        ZT_LIB(
            zo_memcpy_h2d_async(m->s, m->head_grad, zt_act_head_grad(m->act, j), m->head_stride));
    return ZO_OK;
}

/* After it: what it produced goes to the store (a tied head's gradients on
 * the compute stream, to the store's host memory: act_home host only). */
static zo_status stage_out(zt_model *m, int j, int layer, zo_phase phase, int n)
{
    if (m->lay && phase == ZO_PHASE_FORWARD && layer < m->c.shape.n_layers)
        return zt_act_layers_store(m->lay, layer); /* the next block's input, to the host */
    if (!staged(m, n))
        return ZO_OK;
    if (phase == ZO_PHASE_BACKWARD && layer == m->c.shape.n_layers + 1 && m->head_stride)
        ZT_LIB(
            zo_memcpy_d2h_async(m->s, zt_act_head_grad(m->act, j), m->head_grad, m->head_stride));
    return zt_act_end(m->act, j, layer, phase);
}

/* The arena's set changes hands between staged groups and direct use. */
static zo_status switch_use(zt_model *m, int n)
{
    if (!m->act)
        return ZO_OK;
    return staged(m, n) ? zt_act_enter(m->act) : zt_act_fence(m->act);
}

/* One fetch of the layer for micro-batches first..first+n-1, each in turn
 * (grads_ready after each one's backward); release also follows a failure. */
static zo_status run_group(zt_model *m, const zt_param_source *src, int layer, zo_phase phase,
                           layer_fn fn, int first, int n, float scale)
{
    void *p[ZT_MAX_LAYER_TENSORS] = {0}, *g[ZT_MAX_LAYER_TENSORS] = {0};
    zo_phase sp = phase;
    int sl = source_layer(m, layer, &sp);
    ZT_TRY(src->fetch(src->ctx, sl, sp, m->s, p, g, ZT_MAX_LAYER_TENSORS));
    zo_status st = ZO_OK;
    for (int j = 0; st >= 0 && j < n; j++) {
        st = stage_in(m, j, layer, phase, n);
        if (st >= 0)
            st = fn(m, layer, p, g, first + j, scale);
        if (st >= 0 && sp == ZO_PHASE_BACKWARD)
            st = src->grads_ready(src->ctx, sl, m->s);
        if (st >= 0)
            st = stage_out(m, j, layer, phase, n);
    }
    return release_after(src, sl, m->s, st);
}

zo_status zt_model_train_group(zt_model *m, const zt_param_source *src, int first, int n,
                               float grad_scale)
{
    if (n < 1 || n > m->G || first < 0 || first + n > m->c.n_micro)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "a group of %d micro-batches from %d: the model holds groups of 1..%d "
                       "within 0..%d",
                       n, first, m->G, m->c.n_micro - 1);
    const int L = m->c.shape.n_layers;
    ZT_TRY(switch_use(m, n));
    ZT_TRY(run_group(m, src, 0, ZO_PHASE_FORWARD, embed_fwd_fn, first, n, 0.0f));
    for (int l = 1; l <= L; l++)
        ZT_TRY(run_group(m, src, l, ZO_PHASE_FORWARD, block_fwd_fn, first, n, 0.0f));
    ZT_TRY(run_group(m, src, L + 1, ZO_PHASE_BACKWARD, head_train_fn, first, n, grad_scale));
    for (int l = L; l >= 1; l--)
        ZT_TRY(run_group(m, src, l, ZO_PHASE_BACKWARD, block_bwd_fn, first, n, 0.0f));
    return run_group(m, src, 0, ZO_PHASE_BACKWARD, embed_bwd_fn, first, n, 0.0f);
}

zo_status zt_model_eval_micro(zt_model *m, const zt_param_source *src, int i)
{
    ZT_TRY(check_micro(m, i));
    ZT_TRY(switch_use(m, 1));
    m->ckpt = m->ckpt_all;
    ZT_TRY(forward_blocks(m, src, i));
    return run_layer(m, src, m->c.shape.n_layers + 1, ZO_PHASE_FORWARD, head_eval_fn, i, 0.0f);
}

/* ---- pipeline stages: engine layers first..last of one micro-batch ---- */

static zo_status check_stage(const zt_model *m, int first, int last, int i, int set)
{
    const int top = zt_engine_layers(&m->c.shape) - 1;
    if (first < 0 || last < first || last > top || set < 0 || set >= m->sets)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "a stage of layers %d..%d on set %d: expected 0 <= first <= last <= %d and "
                       "a set below %d",
                       first, last, set, top, m->sets);
    return check_micro(m, i);
}

/* The last engine layer's stage computes the head (a tied model's too:
 * under layer 0's parameters, which its source hands out). */
static int holds_head(const zt_model *m, int last)
{
    return last == zt_engine_layers(&m->c.shape) - 1;
}

static void select_set(zt_model *m, int set)
{
    const int L1 = m->c.shape.n_layers + 1;
    m->ckpt = m->ckpt_all + (size_t)set * L1;
    m->dres = m->dres_all[set];
    select_head_grads(m, set);
}

uint64_t zt_model_stage_head_bytes(const zt_model *m)
{
    return m->head_stride;
}

void *zt_model_stage_head_grads(zt_model *m, int set)
{
    return m->head_grad_all ? m->head_grad_all + (uint64_t)set * m->head_stride : NULL;
}

size_t zt_model_stage_elems(const zt_model *m)
{
    return (size_t)m->nres * m->c.shape.dim;
}

void *zt_model_stage_input(zt_model *m, int set, int first)
{
    return first >= 1 ? m->ckpt_all[(size_t)set * (m->c.shape.n_layers + 1) + first - 1] : NULL;
}

void *zt_model_stage_output(zt_model *m, int set, int last)
{
    return last <= m->c.shape.n_layers ? m->ckpt_all[(size_t)set * (m->c.shape.n_layers + 1) + last]
                                       : NULL;
}

void *zt_model_stage_grad(zt_model *m, int set)
{
    return m->dres_all[set];
}

zo_status zt_model_stage_forward(zt_model *m, const zt_param_source *src, int first, int last,
                                 int i, int set)
{
    ZT_TRY(check_stage(m, first, last, i, set));
    select_set(m, set);
    const int top = last <= m->c.shape.n_layers ? last : m->c.shape.n_layers;
    for (int l = first; l <= top; l++)
        ZT_TRY(
            run_layer(m, src, l, ZO_PHASE_FORWARD, l == 0 ? embed_fwd_fn : block_fwd_fn, i, 0.0f));
    return ZO_OK;
}

zo_status zt_model_stage_backward(zt_model *m, const zt_param_source *src, int first, int last,
                                  int i, int set, float grad_scale)
{
    ZT_TRY(check_stage(m, first, last, i, set));
    select_set(m, set);
    const int L = m->c.shape.n_layers;
    if (holds_head(m, last)) /* the head: its forward, the loss and its backward, one fetch */
        ZT_TRY(run_layer(m, src, L + 1, ZO_PHASE_BACKWARD, head_train_fn, i, grad_scale));
    for (int l = last <= L ? last : L; l >= 1 && l >= first; l--)
        ZT_TRY(run_layer(m, src, l, ZO_PHASE_BACKWARD, block_bwd_fn, i, 0.0f));
    if (first == 0)
        ZT_TRY(run_layer(m, src, 0, ZO_PHASE_BACKWARD, embed_bwd_fn, i, 0.0f));
    return ZO_OK;
}

zo_status zt_model_stage_eval(zt_model *m, const zt_param_source *src, int first, int last, int i,
                              int set)
{
    ZT_TRY(zt_model_stage_forward(m, src, first, last, i, set));
    if (!holds_head(m, last))
        return ZO_OK;
    return run_layer(m, src, m->c.shape.n_layers + 1, ZO_PHASE_FORWARD, head_eval_fn, i, 0.0f);
}
