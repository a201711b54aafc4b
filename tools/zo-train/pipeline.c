/* zo-train's pipeline stages: the split of the engine layers, and the 1F1B
 * schedule with its transfers between neighbouring stages (pipeline.h). */
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/units.h"
#include "zt_error.h"

/* ---- the split ---- */

static uint64_t layer_params(const zt_shape *s, int l)
{
    uint64_t n = 0;
    for (int i = 0; i < zt_layer_tensors(s, l); i++)
        n += zt_tensor_numel(s, l, i);
    return n;
}

static zo_status parse_split(const char *spec, int S, int n, zt_pipe_split *out)
{
    const char *p = spec;
    out->first[0] = 0;
    for (int k = 1; k < S; k++) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || (k < S - 1 && *end != ',') || (k == S - 1 && *end != 0) ||
            v <= out->first[k - 1] || v >= n)
            return zt_fail(ZO_ERR_INVALID_ARG,
                           "--pipeline-split '%s': expected parameters, uniform or %d increasing "
                           "engine layers in 1..%d separated by commas (the first layer of stages "
                           "1..%d; layer 0 is the embedding, %d the head)",
                           spec, S - 1, n - 1, S - 1, n - 1);
        out->first[k] = (int)v;
        p = end + 1;
    }
    out->first[S] = n;
    return ZO_OK;
}

/* Contiguous stages whose largest parameter count is the smallest: best[k][i]
 * is the best largest stage of layers 0..i-1 in k stages; ties keep the
 * earliest boundary. */
static zo_status balance_split(const zt_shape *s, int S, int n, zt_pipe_split *out)
{
    uint64_t *pre = calloc((size_t)n + 1, sizeof *pre);
    uint64_t *best = calloc((size_t)(S + 1) * (n + 1), sizeof *best);
    int *cut = calloc((size_t)(S + 1) * (n + 1), sizeof *cut);
    if (!pre || !best || !cut) {
        free(pre), free(best), free(cut);
        return zt_fail(ZO_ERR_NO_MEMORY, "the pipeline split");
    }
    for (int l = 0; l < n; l++)
        pre[l + 1] = pre[l] + layer_params(s, l);
#define AT(k, i) ((size_t)(k) * (n + 1) + (i))
    for (int i = 1; i <= n; i++)
        best[AT(1, i)] = pre[i];
    for (int k = 2; k <= S; k++)
        for (int i = k; i <= n; i++) {
            best[AT(k, i)] = UINT64_MAX;
            for (int j = k - 1; j < i; j++) {
                uint64_t last = pre[i] - pre[j], m = best[AT(k - 1, j)];
                uint64_t v = m > last ? m : last;
                if (v < best[AT(k, i)])
                    best[AT(k, i)] = v, cut[AT(k, i)] = j;
            }
        }
    out->first[S] = n;
    for (int k = S, i = n; k >= 1; k--)
        i = out->first[k - 1] = k > 1 ? cut[AT(k, i)] : 0;
#undef AT
    free(pre), free(best), free(cut);
    return ZO_OK;
}

/* As many layers a stage as counts go, the first n % S stages one more
 * (DeepSpeed's partition_method "uniform"). */
static zo_status uniform_split(int S, int n, zt_pipe_split *out)
{
    for (int k = 0; k <= S; k++)
        out->first[k] = k * (n / S) + (k < n % S ? k : n % S);
    return ZO_OK;
}

zo_status zt_pipe_split_make(const zt_shape *s, int S, const char *spec, zt_pipe_split *out)
{
    const int n = zt_engine_layers(s);
    if (S < 1 || S > ZT_MAX_STAGES)
        return zt_fail(ZO_ERR_INVALID_ARG, "--pipeline-stages %d: expected 1..%d", S,
                       ZT_MAX_STAGES);
    if (S > n)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--pipeline-stages %d: the model has %d layers to split (the embedding, %d "
                       "blocks%s), so at most %d stages",
                       S, n, s->n_layers,
                       s->tied ? "; its tied head is the embedding" : " and the head", n);
    out->stages = S;
    if (!spec || strcmp(spec, "parameters") == 0)
        return balance_split(s, S, n, out);
    if (strcmp(spec, "uniform") == 0)
        return uniform_split(S, n, out);
    return parse_split(spec, S, n, out);
}

void zt_pipe_split_format(const zt_pipe_split *p, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k < p->stages && at < cap; k++) {
        int n =
            snprintf(buf + at, cap - at, "%s%d-%d", k ? "," : "", p->first[k], p->first[k + 1] - 1);
        at += n > 0 ? (size_t)n : 0;
    }
}

int zt_pipe_sets(int S, int r, int M)
{
    int warm = S - r - 1 < M ? S - r - 1 : M;
    return warm + 2 < M ? warm + 2 : M; /* one more than in flight: a receive runs beside
                                           the op before its use */
}

/* ---- the stage at run time ---- */

/* Per set of layer inputs: a micro-batch's input received, its output-side
 * gradient received, its forward done, its output sent, its backward done,
 * its input's gradient sent. */
enum {
    EV_GOT_ACT,
    EV_GOT_GRAD,
    EV_FWD_DONE,
    EV_SENT_ACT,
    EV_BWD_DONE,
    EV_SENT_GRAD,
    EV_GOT_HEAD,  /* tied: the head's gradients received (first stage) */
    EV_SENT_HEAD, /* ... sent (last stage) */
    N_EV
};
enum { N_STREAMS = 6 };

enum { OP_FWD = 0, OP_BWD = 1, TRACE_NAMES = 512 };

struct zt_pipe {
    zt_pipe_config c;
    int S, r, K;   /* stages, this stage, sets */
    int n_ops;     /* 2M */
    int *op_kind;  /* OP_FWD or OP_BWD ... */
    int *op_micro; /* ... of which micro-batch, in this stage's 1F1B order */
    zo_stream_t recv_act, recv_grad, send_act, send_grad, recv_head, send_head;
    zo_event_t *ev[N_EV]; /* K each */
    uint64_t span_t0;     /* the compute stream's current micro-batch began (trace) */
    /* Tied embeddings: layer 0's parameters copied to the last stage for its
     * head, the head's gradients sent back, on a communicator of their own
     * (with 2 stages the same pair of ranks carries the residual gradients) */
    zo_comm_t tcomm;
    int n_tied; /* layer 0's tensors */
    size_t tied_numel[ZT_MAX_LAYER_TENSORS];
    void *tied_copy[ZT_MAX_LAYER_TENSORS]; /* last stage: device buffers */
    zt_param_source inner, src;            /* the caller's source, and the one the model sees */
    /* Staged (the communicator needs host buffers, or zt_pipe_test_staged):
     * one pinned buffer per transfer stream and one for the compute
     * stream, each as large as the stream's largest message; a stream's copy, send
     * or receive and copy run in its order, so its buffer is reused only
     * once the transfer before is done. */
    int staged;
    size_t pin_bytes; /* all of them */
    void *pin[N_STREAMS + 1];
};

/* Static names for the trace's spans ("F3", "B3"): the callback keeps the
 * pointer. Written once, before any stage runs. */
static char span_names[2][TRACE_NAMES][8];

static void name_spans(void)
{
    for (int i = 0; i < TRACE_NAMES; i++) {
        snprintf(span_names[OP_FWD][i], sizeof span_names[0][0], "F%d", i);
        snprintf(span_names[OP_BWD][i], sizeof span_names[0][0], "B%d", i);
    }
}

/* PipeDream-Flush: the warm-up forwards, one forward and one backward in
 * turn, the cool-down backwards. */
static void make_schedule(zt_pipe *p)
{
    const int M = p->c.n_micro, warm = p->S - p->r - 1 < M ? p->S - p->r - 1 : M;
    int k = 0, f = 0, b = 0;
    while (f < warm)
        p->op_kind[k] = OP_FWD, p->op_micro[k++] = f++;
    while (f < M) {
        p->op_kind[k] = OP_FWD, p->op_micro[k++] = f++;
        p->op_kind[k] = OP_BWD, p->op_micro[k++] = b++;
    }
    while (b < M)
        p->op_kind[k] = OP_BWD, p->op_micro[k++] = b++;
}

static int first_stage(const zt_pipe *p)
{
    return p->r == 0;
}
static int last_stage(const zt_pipe *p)
{
    return p->r == p->S - 1;
}

/* ---- trace spans of each micro-batch's forward and backward ---- */

typedef struct span_mark {
    zt_pipe *p;
    int kind, micro, end;
} span_mark;

static zo_status mark_span(void *arg)
{
    span_mark *m = arg;
    uint64_t now = zo_now_ns();
    if (!m->end) { /* only the compute stream's tasks touch span_t0, one after another */
        m->p->span_t0 = now;
        return ZO_OK;
    }
    const char *name = m->micro < TRACE_NAMES ? span_names[m->kind][m->micro]
                       : m->kind == OP_FWD    ? "forward"
                                              : "backward";
    zo_trace_event ev = {ZO_TRACK_COMPUTE, 0, name, m->p->span_t0, now, -1, -1, 0};
    m->p->c.trace(m->p->c.trace_ctx, &ev);
    return ZO_OK;
}

static zo_status mark(zt_pipe *p, int kind, int micro, int end)
{
    if (!p->c.trace)
        return ZO_OK;
    span_mark m = {p, kind, micro, end};
    ZT_LIB(zo_stream_enqueue(p->c.compute, mark_span, &m, sizeof m));
    return ZO_OK;
}

/* ---- transfers ---- */

/* The pinned buffer of stream s: each transfer stream's, else the
 * compute stream's. */
static void *pinned_of(const zt_pipe *p, zo_stream_t s)
{
    const zo_stream_t t[N_STREAMS] = {p->recv_act,  p->recv_grad, p->send_act,
                                      p->send_grad, p->recv_head, p->send_head};
    for (int i = 0; i < N_STREAMS; i++)
        if (t[i] == s)
            return p->pin[i];
    return p->pin[N_STREAMS];
}

/* A send of device data: direct, or copied to the stream's pinned buffer
 * first, in the stream's order. */
static zo_status pipe_send(zt_pipe *p, zo_comm_t comm, zo_stream_t s, const void *buf, size_t n,
                           zo_dtype dt, int peer)
{
    if (!p->staged)
        return zo_comm_send(comm, s, buf, n, dt, peer);
    void *pin = pinned_of(p, s);
    zo_status st = zo_memcpy_d2h_async(s, pin, buf, n * zo_dtype_size(dt));
    return st < 0 ? st : zo_comm_send(comm, s, pin, n, dt, peer);
}

/* A receive into device memory: direct, or into the stream's pinned
 * buffer and copied on from it, in the stream's order. */
static zo_status pipe_recv(zt_pipe *p, zo_comm_t comm, zo_stream_t s, void *buf, size_t n,
                           zo_dtype dt, int peer)
{
    if (!p->staged)
        return zo_comm_recv(comm, s, buf, n, dt, peer);
    void *pin = pinned_of(p, s);
    zo_status st = zo_comm_recv(comm, s, pin, n, dt, peer);
    return st < 0 ? st : zo_memcpy_h2d_async(s, buf, pin, n * zo_dtype_size(dt));
}

static zo_status after(zo_stream_t s, zo_event_t ev, zo_stream_t from)
{
    ZT_LIB(zo_event_record(ev, from));
    ZT_LIB(zo_stream_wait_event(s, ev));
    return ZO_OK;
}

static zo_status wait_for(zo_stream_t s, zo_event_t ev)
{
    ZT_LIB(zo_stream_wait_event(s, ev));
    return ZO_OK;
}

/* Micro-batch j's input from the previous stage, into its set's slot once
 * micro-batch j-K's backward (the slot's last reader) is done. */
static zo_status recv_act(zt_pipe *p, int j)
{
    const int s = j % p->K;
    if (j >= p->K)
        ZT_TRY(wait_for(p->recv_act, p->ev[EV_BWD_DONE][s]));
    void *buf = zt_model_stage_input(p->c.model, s, p->c.first);
    ZT_LIB(pipe_recv(p, p->c.comm, p->recv_act, buf, zt_model_stage_elems(p->c.model),
                     p->c.act_dtype, p->r - 1));
    ZT_LIB(zo_event_record(p->ev[EV_GOT_ACT][s], p->recv_act));
    return ZO_OK;
}

/* Micro-batch j's output gradient from the next stage, into its set's
 * residual gradient once micro-batch j-K's input gradient left from it. */
static zo_status recv_grad(zt_pipe *p, int j)
{
    const int s = j % p->K;
    if (j >= p->K)
        ZT_TRY(wait_for(p->recv_grad, p->ev[first_stage(p) ? EV_BWD_DONE : EV_SENT_GRAD][s]));
    ZT_LIB(pipe_recv(p, p->c.comm, p->recv_grad, zt_model_stage_grad(p->c.model, s),
                     zt_model_stage_elems(p->c.model), p->c.act_dtype, p->r + 1));
    ZT_LIB(zo_event_record(p->ev[EV_GOT_GRAD][s], p->recv_grad));
    return ZO_OK;
}

/* ---- tied embeddings ---- */

static int tied(const zt_pipe *p)
{
    return p->tcomm != NULL;
}

/* The last stage's source: layer 0 (its head's matrix and norm) is the
 * copy; the rest the caller's. */
static zo_status wrap_fetch(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **params,
                            void **grads, int n)
{
    zt_pipe *p = ctx;
    if (layer >= p->c.first)
        return p->inner.fetch(p->inner.ctx, layer, phase, s, params, grads, n);
    for (int i = 0; i < p->n_tied && i < n; i++) {
        params[i] = p->tied_copy[i];
        if (grads)
            grads[i] = NULL;
    }
    return ZO_OK;
}

static zo_status wrap_release(void *ctx, int layer, zo_stream_t s)
{
    zt_pipe *p = ctx;
    return layer >= p->c.first ? p->inner.release(p->inner.ctx, layer, s) : ZO_OK;
}

static zo_status wrap_grads_ready(void *ctx, int layer, zo_stream_t s)
{
    zt_pipe *p = ctx;
    return p->inner.grads_ready(p->inner.ctx, layer, s);
}

/* The source the model sees this step: the caller's, or the last stage's
 * wrapper of it when tied. */
static void use_source(zt_pipe *p, const zt_param_source *src)
{
    p->inner = *src;
    p->src = *src;
    if (tied(p) && last_stage(p))
        p->src = (zt_param_source){p, wrap_fetch, wrap_release, wrap_grads_ready};
}

/* Layer 0's parameters of this step (or validation) from the first stage
 * to the last, in compute order on both. */
static zo_status share_tied(zt_pipe *p)
{
    if (!tied(p) || (!first_stage(p) && !last_stage(p)))
        return ZO_OK;
    zo_stream_t s = p->c.compute;
    if (last_stage(p)) {
        for (int i = 0; i < p->n_tied; i++)
            ZT_LIB(pipe_recv(p, p->tcomm, s, p->tied_copy[i], p->tied_numel[i], p->c.act_dtype, 0));
        return ZO_OK;
    }
    void *params[ZT_MAX_LAYER_TENSORS] = {0}, *grads[ZT_MAX_LAYER_TENSORS] = {0};
    ZT_TRY(
        p->inner.fetch(p->inner.ctx, 0, ZO_PHASE_FORWARD, s, params, grads, ZT_MAX_LAYER_TENSORS));
    zo_status st = ZO_OK;
    for (int i = 0; st >= 0 && i < p->n_tied; i++)
        if ((st = pipe_send(p, p->tcomm, s, params[i], p->tied_numel[i], p->c.act_dtype,
                            p->S - 1)) < 0)
            zt_lib_fail(st, "zo_comm_send of the tied embedding");
    zo_status rst = p->inner.release(p->inner.ctx, 0, s);
    return st < 0 ? st : rst;
}

/* First stage: micro-batch j's head gradients, into its set's once
 * micro-batch j-K's embedding backward (their reader) is done. */
static zo_status recv_head(zt_pipe *p, int j)
{
    const int s = j % p->K;
    if (j >= p->K)
        ZT_TRY(wait_for(p->recv_head, p->ev[EV_BWD_DONE][s]));
    ZT_LIB(pipe_recv(p, p->tcomm, p->recv_head, zt_model_stage_head_grads(p->c.model, s),
                     zt_model_stage_head_bytes(p->c.model), ZO_DTYPE_U8, p->S - 1));
    ZT_LIB(zo_event_record(p->ev[EV_GOT_HEAD][s], p->recv_head));
    return ZO_OK;
}

/* Last stage: micro-batch j's head gradients to the first stage. */
static zo_status send_head(zt_pipe *p, int j)
{
    const int s = j % p->K;
    ZT_LIB(zo_stream_wait_event(p->send_head, p->ev[EV_BWD_DONE][s]));
    ZT_LIB(pipe_send(p, p->tcomm, p->send_head, zt_model_stage_head_grads(p->c.model, s),
                     zt_model_stage_head_bytes(p->c.model), ZO_DTYPE_U8, 0));
    ZT_LIB(zo_event_record(p->ev[EV_SENT_HEAD][s], p->send_head));
    return ZO_OK;
}

/* Before micro-batch j's backward: its head gradients here (first stage),
 * or the set's last ones gone (last stage). */
static zo_status wait_head(zt_pipe *p, int j)
{
    const int s = j % p->K;
    if (!tied(p))
        return ZO_OK;
    if (first_stage(p))
        return wait_for(p->c.compute, p->ev[EV_GOT_HEAD][s]);
    if (last_stage(p) && j >= p->K)
        return wait_for(p->c.compute, p->ev[EV_SENT_HEAD][s]);
    return ZO_OK;
}

/* What op k needs from the neighbours, asked for one op ahead so the
 * transfer runs beside the op before it. */
static zo_status post_recv(zt_pipe *p, int k)
{
    if (k >= p->n_ops)
        return ZO_OK;
    if (p->op_kind[k] == OP_FWD)
        return first_stage(p) ? ZO_OK : recv_act(p, p->op_micro[k]);
    if (tied(p) && first_stage(p))
        ZT_TRY(recv_head(p, p->op_micro[k]));
    return last_stage(p) ? ZO_OK : recv_grad(p, p->op_micro[k]);
}

static zo_status send_act(zt_pipe *p, int j)
{
    const int s = j % p->K;
    ZT_TRY(after(p->send_act, p->ev[EV_FWD_DONE][s], p->c.compute));
    ZT_LIB(pipe_send(p, p->c.comm, p->send_act, zt_model_stage_output(p->c.model, s, p->c.last),
                     zt_model_stage_elems(p->c.model), p->c.act_dtype, p->r + 1));
    ZT_LIB(zo_event_record(p->ev[EV_SENT_ACT][s], p->send_act));
    return ZO_OK;
}

static zo_status send_grad(zt_pipe *p, int j)
{
    const int s = j % p->K;
    ZT_LIB(zo_stream_wait_event(p->send_grad, p->ev[EV_BWD_DONE][s]));
    ZT_LIB(pipe_send(p, p->c.comm, p->send_grad, zt_model_stage_grad(p->c.model, s),
                     zt_model_stage_elems(p->c.model), p->c.act_dtype, p->r - 1));
    ZT_LIB(zo_event_record(p->ev[EV_SENT_GRAD][s], p->send_grad));
    return ZO_OK;
}

/* ---- the ops ---- */

static zo_status run_forward(zt_pipe *p, const zt_param_source *src, int j)
{
    const int s = j % p->K;
    if (!first_stage(p))
        ZT_TRY(wait_for(p->c.compute, p->ev[EV_GOT_ACT][s]));
    if (!last_stage(p) && j >= p->K) /* the output slot's last send is done */
        ZT_TRY(wait_for(p->c.compute, p->ev[EV_SENT_ACT][s]));
    ZT_TRY(mark(p, OP_FWD, j, 0));
    ZT_TRY(zt_model_stage_forward(p->c.model, src, p->c.first, p->c.last, j, s));
    ZT_TRY(mark(p, OP_FWD, j, 1));
    return last_stage(p) ? ZO_OK : send_act(p, j);
}

static zo_status run_backward(zt_pipe *p, const zt_param_source *src, int j, float scale)
{
    const int s = j % p->K;
    if (!last_stage(p))
        ZT_TRY(wait_for(p->c.compute, p->ev[EV_GOT_GRAD][s]));
    else if (!first_stage(p) && j >= p->K) /* the head writes the gradient the last send read */
        ZT_TRY(wait_for(p->c.compute, p->ev[EV_SENT_GRAD][s]));
    ZT_TRY(wait_head(p, j));
    ZT_TRY(mark(p, OP_BWD, j, 0));
    ZT_TRY(zt_model_stage_backward(p->c.model, src, p->c.first, p->c.last, j, s, scale));
    ZT_TRY(mark(p, OP_BWD, j, 1));
    ZT_LIB(zo_event_record(p->ev[EV_BWD_DONE][s], p->c.compute));
    if (tied(p) && last_stage(p))
        ZT_TRY(send_head(p, j));
    return first_stage(p) ? ZO_OK : send_grad(p, j);
}

/* Every transfer of the step done; the first error among them. */
static zo_status drain(zt_pipe *p)
{
    zo_stream_t s[N_STREAMS] = {p->recv_act,  p->recv_grad, p->send_act,
                                p->send_grad, p->recv_head, p->send_head};
    zo_status first = ZO_OK;
    for (int i = 0; i < N_STREAMS; i++) {
        zo_status st = zo_stream_synchronize(s[i]);
        if (st < 0 && first == ZO_OK)
            first = zt_lib_fail(st, "a pipeline transfer");
    }
    return first;
}

zo_status zt_pipe_train(zt_pipe *p, const zt_param_source *caller, float grad_scale)
{
    use_source(p, caller);
    const zt_param_source *src = &p->src;
    zo_status st = share_tied(p);
    if (st >= 0)
        st = post_recv(p, 0);
    for (int k = 0; st >= 0 && k < p->n_ops; k++) {
        int j = p->op_micro[k];
        st = p->op_kind[k] == OP_FWD ? run_forward(p, src, j) : run_backward(p, src, j, grad_scale);
        if (st >= 0)
            st = post_recv(p, k + 1);
    }
    if (st < 0)
        return st;
    return drain(p);
}

zo_status zt_pipe_eval(zt_pipe *p, const zt_param_source *caller, int n)
{
    zo_stream_t s = p->c.compute; /* forward only: every transfer in order on the compute stream */
    size_t elems = zt_model_stage_elems(p->c.model);
    use_source(p, caller);
    const zt_param_source *src = &p->src;
    ZT_TRY(share_tied(p));
    for (int i = 0; i < n; i++) {
        if (!first_stage(p))
            ZT_LIB(pipe_recv(p, p->c.comm, s, zt_model_stage_input(p->c.model, 0, p->c.first),
                             elems, p->c.act_dtype, p->r - 1));
        ZT_TRY(zt_model_stage_eval(p->c.model, src, p->c.first, p->c.last, i, 0));
        if (!last_stage(p))
            ZT_LIB(pipe_send(p, p->c.comm, s, zt_model_stage_output(p->c.model, 0, p->c.last),
                             elems, p->c.act_dtype, p->r + 1));
    }
    return ZO_OK;
}

zo_status zt_pipe_share_losses(zt_pipe *p, float *losses, int n)
{
    ZT_LIB(zo_comm_broadcast(p->c.comm, p->c.compute, losses, (size_t)n, ZO_DTYPE_F32, p->S - 1));
    ZT_LIB(zo_stream_synchronize(p->c.compute));
    return ZO_OK;
}

void zt_pipe_settle(zt_pipe *p)
{
    zo_stream_t s[N_STREAMS] = {p->recv_act,  p->recv_grad, p->send_act,
                                p->send_grad, p->recv_head, p->send_head};
    for (int i = 0; i < N_STREAMS; i++)
        zo_stream_synchronize(s[i]);
}

/* ---- set-up ---- */

/* The neighbours agree on what travels: elements and type, checked once. */
static zo_status check_shapes(zt_pipe *p)
{
    uint64_t mine[2] = {zt_model_stage_elems(p->c.model), (uint64_t)p->c.act_dtype}, prev[2] = {0};
    if (!first_stage(p))
        ZT_LIB(zo_comm_recv(p->c.comm, p->recv_act, prev, 2, ZO_DTYPE_U64, p->r - 1));
    if (!last_stage(p))
        ZT_LIB(zo_comm_send(p->c.comm, p->send_act, mine, 2, ZO_DTYPE_U64, p->r + 1));
    ZT_TRY(drain(p));
    if (!first_stage(p) && (prev[0] != mine[0] || prev[1] != mine[1]))
        return zt_fail(ZO_ERR_CONFIG,
                       "pipeline stage %d sends activations of %llu elements of type %d but stage "
                       "%d expects %llu of type %d: every stage needs the same --micro-batch, "
                       "--seq, model and dtype",
                       p->r - 1, (unsigned long long)prev[0], (int)prev[1], p->r,
                       (unsigned long long)mine[0], (int)mine[1]);
    return ZO_OK;
}

static zo_status open_streams(zt_pipe *p)
{
    zo_stream_t *s[N_STREAMS] = {&p->recv_act,  &p->recv_grad, &p->send_act,
                                 &p->send_grad, &p->recv_head, &p->send_head};
    for (int i = 0; i < N_STREAMS; i++)
        ZT_LIB(zo_stream_create(p->c.dev, s[i]));
    for (int e = 0; e < N_EV; e++) {
        if (!(p->ev[e] = calloc((size_t)p->K, sizeof *p->ev[e])))
            return zt_fail(ZO_ERR_NO_MEMORY, "pipeline events");
        for (int k = 0; k < p->K; k++)
            ZT_LIB(zo_event_create(p->c.dev, &p->ev[e][k]));
    }
    return ZO_OK;
}

/* Tied: the communicator of layer 0's copy and the head's gradients, and
 * the last stage's copy. Collective over the pipeline group. */
static zo_status open_tied(zt_pipe *p)
{
    const zt_shape *sh = p->c.shape;
    if (!sh->tied)
        return ZO_OK;
    ZT_LIB(zo_comm_split(p->c.comm, 0, p->r, &p->tcomm));
    p->n_tied = zt_layer_tensors(sh, 0);
    for (int i = 0; i < p->n_tied; i++) {
        p->tied_numel[i] = zt_tensor_numel(sh, 0, i);
        if (last_stage(p))
            ZT_LIB(zo_device_malloc(p->c.dev, p->tied_numel[i] * zo_dtype_size(p->c.act_dtype),
                                    &p->tied_copy[i]));
    }
    return ZO_OK;
}

/* The bytes stream i of the staged path carries at most (0: none): the
 * activation streams an activation or its gradient, the head streams the
 * head's gradients (tied, first and last stage), the compute stream
 * (index N_STREAMS) validation's activations and layer 0's tensors. */
static size_t staged_message(const zt_pipe *p, int i)
{
    const size_t act = zt_model_stage_elems(p->c.model) * zo_dtype_size(p->c.act_dtype);
    if (i < 4)
        return act;
    if (i < N_STREAMS)
        return tied(p) && (first_stage(p) || last_stage(p))
                   ? (size_t)zt_model_stage_head_bytes(p->c.model)
                   : 0;
    size_t m = act;
    for (int k = 0; tied(p) && (first_stage(p) || last_stage(p)) && k < p->n_tied; k++) {
        size_t b = p->tied_numel[k] * zo_dtype_size(p->c.act_dtype);
        m = b > m ? b : m;
    }
    return m;
}

/* The pinned buffers of the staged path, sized from the shapes the
 * neighbours agreed on. */
static zo_status open_staging(zt_pipe *p)
{
    p->staged =
        !zo_comm_takes_device_memory(p->c.comm) || (zt_pipe_test_staged && zt_pipe_test_staged());
    for (int i = 0; p->staged && i <= N_STREAMS; i++) {
        size_t bytes = (staged_message(p, i) + 4095) / 4096 * 4096;
        if (!bytes)
            continue;
        if (!(p->pin[i] = aligned_alloc(4096, bytes)))
            return zt_fail(ZO_ERR_NO_MEMORY, "the pipeline's pinned staging buffer of %zu bytes",
                           bytes);
        zo_status st = zo_device_host_register(p->c.dev, p->pin[i], bytes);
        if (st < 0) {
            free(p->pin[i]);
            p->pin[i] = NULL;
            return zt_lib_fail(st, "pinning the pipeline's staging buffers");
        }
        p->pin_bytes += bytes;
    }
    return ZO_OK;
}

size_t zt_pipe_pinned_bytes(const zt_pipe *p)
{
    return p ? p->pin_bytes : 0;
}

static zo_status pipe_open(zt_pipe *p)
{
    p->S = zo_comm_size(p->c.comm);
    p->r = zo_comm_rank(p->c.comm);
    p->K = zt_pipe_sets(p->S, p->r, p->c.n_micro);
    p->n_ops = 2 * p->c.n_micro;
    p->op_kind = calloc((size_t)p->n_ops, sizeof *p->op_kind);
    p->op_micro = calloc((size_t)p->n_ops, sizeof *p->op_micro);
    if (!p->op_kind || !p->op_micro)
        return zt_fail(ZO_ERR_NO_MEMORY, "the pipeline schedule");
    make_schedule(p);
    if (p->c.trace)
        name_spans();
    ZT_TRY(open_streams(p));
    ZT_TRY(open_tied(p));
    ZT_TRY(check_shapes(p));
    return open_staging(p);
}

zo_status zt_pipe_init(zt_pipe **out, const zt_pipe_config *c)
{
    zt_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return zt_fail(ZO_ERR_NO_MEMORY, "pipeline stage");
    p->c = *c;
    zo_status st = pipe_open(p);
    if (st < 0) {
        zt_pipe_free(p);
        return st;
    }
    *out = p;
    return ZO_OK;
}

void zt_pipe_free(zt_pipe *p)
{
    if (!p)
        return;
    zo_stream_t s[N_STREAMS] = {p->recv_act,  p->recv_grad, p->send_act,
                                p->send_grad, p->recv_head, p->send_head};
    for (int i = 0; i < N_STREAMS; i++)
        if (s[i])
            zo_stream_synchronize(s[i]);
    for (int e = 0; e < N_EV; e++)
        for (int k = 0; p->ev[e] && k < p->K; k++)
            zo_event_destroy(p->ev[e][k]);
    for (int e = 0; e < N_EV; e++)
        free(p->ev[e]);
    for (int i = 0; i < N_STREAMS; i++)
        zo_stream_destroy(s[i]);
    for (int i = 0; i < p->n_tied; i++)
        zo_device_mfree(p->c.dev, p->tied_copy[i]);
    zo_comm_free(p->tcomm);
    for (int i = 0; i <= N_STREAMS; i++)
        if (p->pin[i]) {
            zo_device_host_unregister(p->c.dev, p->pin[i]);
            free(p->pin[i]);
        }
    free(p->op_kind);
    free(p->op_micro);
    free(p);
}
