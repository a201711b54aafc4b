/* zo-train's checkpoints across the tensor-parallel degree (ckpt_tp.h): a
 * tensor's states gathered whole from its group's parts for a save, and a
 * rank's part cut from the whole for a load. */
#include "ckpt_tp.h"

#include <stdlib.h>
#include <string.h>

#include "tensor_parallel.h"
#include "zo/optim.h"
#include "zt_error.h"

int zt_ckpt_tp_slices(const zt_shape *full, int T, int layer, int idx, zo_dtype fmt)
{
    const zo_state_format *f = zo_state_format_of(fmt);
    if (T <= 1)
        return 1;
    if (!f || f->code_bits % 8) /* sub-byte codes share bytes across a part's edge */
        return 0;
    return !f->block || zt_tp_run(full, T, layer, idx) % f->block == 0;
}

zo_dtype zt_ckpt_part_format(const zt_options *o, int layer, int idx)
{
    const zo_state_format *f = zo_state_format_of(o->state_dtype);
    size_t n = zt_tp_numel(&o->shape, zt_options_tp_size(o), layer, idx);
    int keep = o->embedding_f32 && zt_tensor_embedding(&o->shape, layer, idx);
    return zo_state_format_keeps_f32(f, n, keep) ? ZO_DTYPE_F32 : o->state_dtype;
}

zo_dtype zt_ckpt_saved_format(const zt_options *o, int layer, int idx)
{
    zo_dtype pf = zt_ckpt_part_format(o, layer, idx);
    return zt_ckpt_tp_slices(&o->shape, zt_options_tp_size(o), layer, idx, pf) ? pf : ZO_DTYPE_F32;
}

static size_t up8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* A rank's block in the gather: its status (8 bytes), its part's master
 * weights (wb bytes), then m and v (mb bytes each) in the saved format. */
typedef struct tp_block {
    size_t n, wb, mb, bytes;
} tp_block;

static tp_block block_of(size_t n, const zo_state_format *f)
{
    tp_block b = {n, up8(n * sizeof(float)), up8(f->moment_bytes(n)), 0};
    b.bytes = 8 + b.wb + 2 * b.mb;
    return b;
}

/* This rank's part into its block: as the engine stores it when the saved
 * format is the part's, else decoded to fp32. */
static zo_status read_part(zt_trainer *t, int layer, int idx, zo_dtype saved, const tp_block *b,
                           char *mine, const char *name)
{
    const zt_options *o = zt_trainer_options(t);
    zo_engine_t eng = zt_trainer_engine(t);
    int id = zt_trainer_tensor_id(t, layer, idx);
    zo_dtype part = zt_ckpt_part_format(o, layer, idx);
    if (zo_engine_tensor_state_dtype(eng, id) != part)
        return zt_fail(ZO_ERR_INTERNAL, "tensor '%s': the engine keeps its moments in %s, not %s",
                       name, zo_dtype_name(zo_engine_tensor_state_dtype(eng, id)),
                       zo_dtype_name(part));
    float *w = (float *)(mine + 8);
    char *m = mine + 8 + b->wb, *v = m + b->mb;
    zo_status st = saved == part ? zo_engine_read_state_raw(eng, id, w, m, v)
                                 : zo_engine_read_state(eng, id, w, (float *)m, (float *)v);
    return st < 0 ? zt_fail(st, "reading this rank's part of '%s': %s", name, zt_lib_message())
                  : ZO_OK;
}

/* The group's blocks merged into the whole master weights and moments. */
static void merge_blocks(const zt_shape *s, int T, int layer, int idx, const zo_state_format *f,
                         const tp_block *b, const char *all, float *master, void *m, void *v)
{
    size_t N = zt_tensor_numel(s, layer, idx);
    zt_tp_merge_items(s, T, layer, idx, all + 8, b->bytes, master, sizeof(float), 1);
    for (int k = 0; k < 2; k++) {
        const char *parts = all + 8 + b->wb + (size_t)k * b->mb;
        void *whole = k ? v : m;
        zt_tp_merge_items(s, T, layer, idx, parts, b->bytes, whole, f->code_bits / 8, 1);
        if (!f->block)
            continue;
        size_t at = (size_t)((char *)zo_state_format_scales(f, (void *)parts, b->n) - parts);
        zt_tp_merge_items(s, T, layer, idx, parts + at, b->bytes,
                          zo_state_format_scales(f, whole, N), sizeof(float), f->block);
    }
}

/* Every rank's status from the blocks: the first failure names its rank. */
static zo_status peers_status(zo_comm_t comm, const char *all, const tp_block *b, const char *name)
{
    for (int r = 0; r < zo_comm_size(comm); r++) {
        int32_t st;
        memcpy(&st, all + (size_t)r * b->bytes, sizeof st);
        if (st < 0)
            return zt_fail((zo_status)st,
                           "rank %d could not read its tensor-parallel part of '%s' for the "
                           "checkpoint (its log says why)",
                           zo_comm_world_rank(comm, r), name);
    }
    return ZO_OK;
}

zo_status zt_ckpt_tp_gather(zt_trainer *t, int layer, int idx, int read, float *master, void *m,
                            void *v)
{
    const zt_options *o = zt_trainer_options(t);
    const zt_shape *s = &o->shape;
    const int T = zt_options_tp_size(o);
    zo_comm_t comm = zt_trainer_tp_comm(t);
    zo_dtype saved = zt_ckpt_saved_format(o, layer, idx);
    const zo_state_format *f = zo_state_format_of(saved);
    tp_block b = block_of(zt_tp_numel(s, T, layer, idx), f);
    char name[128];
    int ndim;
    int64_t shape[2];
    zt_tensor_hf(s, layer, idx, name, sizeof name, &ndim, shape);
    char *mine = calloc(1, b.bytes), *all = malloc((size_t)T * b.bytes);
    zo_status st = mine && all
                       ? ZO_OK
                       : zt_fail(ZO_ERR_NO_MEMORY, "the %d tensor-parallel parts of '%s'", T, name);
    if (st >= 0 && read)
        st = read_part(t, layer, idx, saved, &b, mine, name);
    int32_t mine_st = read ? st : ZO_ERR_STATE;
    if (mine)
        memcpy(mine, &mine_st, sizeof mine_st);
    /* every rank of the group joins the gather, even after its own read failed */
    zo_status gst = mine && all ? zt_trainer_tp_gather(t, mine, all, b.bytes) : ZO_OK;
    if (!read)
        st = ZO_ERR_STATE; /* the caller's earlier failure stands */
    else if (st >= 0 && gst < 0)
        st =
            zt_fail(gst, "gathering the tensor-parallel parts of '%s': %s", name, zt_lib_message());
    if (st >= 0 && zt_options_tp_rank(o) == 0) /* the writer: the others only give */
        st = peers_status(comm, all, &b, name);
    if (st >= 0 && zt_options_tp_rank(o) == 0)
        merge_blocks(s, T, layer, idx, f, &b, all, master, m, v);
    free(mine);
    free(all);
    return st;
}

void zt_ckpt_tp_slice(const zt_shape *full, int T, int r, int layer, int idx, zo_dtype fmt,
                      const float *master, const void *m, const void *v, float *part_master,
                      void *part_m, void *part_v)
{
    const zo_state_format *f = zo_state_format_of(fmt);
    size_t N = zt_tensor_numel(full, layer, idx), n = zt_tp_numel(full, T, layer, idx);
    zt_tp_slice(full, T, r, layer, idx, master, part_master);
    for (int k = 0; k < 2; k++) {
        const void *whole = k ? v : m;
        void *part = k ? part_v : part_m;
        zt_tp_slice_items(full, T, r, layer, idx, whole, part, f->code_bits / 8, 1);
        if (f->block)
            zt_tp_slice_items(full, T, r, layer, idx, zo_state_format_scales(f, (void *)whole, N),
                              zo_state_format_scales(f, part, n), sizeof(float), f->block);
    }
}
