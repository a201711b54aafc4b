/* A layer-major group's layer inputs off the device: the records' homes
 * (pinned host, or NVMe with a pageable carry), the two copy streams and the
 * events that order them with the compute stream (act_store.h). */
#include "act_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_error.h"

struct zt_act_store {
    zo_device_t dev;
    zo_stream_t compute, load, store; /* load: host/NVMe -> slots; store: slots -> host/NVMe */
    zo_event_t loaded[2], computed[2], drained[2], entered;
    int home, G, L;
    size_t bytes;         /* one record's payload */
    uint64_t stride;      /* one record's room */
    uint64_t head_stride; /* act_home host, tied: a micro-batch's head gradients */
    void *slot[4];        /* device: x0, y0, x1, y1 */
    uint64_t unit;        /* units begun: the parity picks the pair */
    /* act_home host: G x (L + 2) records, pinned */
    char *host;
    uint64_t host_bytes;
    /* act_home nvme */
    zo_swap_t swap;
    char *ring; /* pinned: the load slot, then the store slot */
    uint64_t ring_slot, ring_bytes;
    char *carry;           /* pageable: a stride per micro-batch */
    zo_swap_extent_t *ext; /* [j * L + l]: block l+1's input */
    uint64_t *gen;         /* the generation each extent was last written with */
    uint64_t next_gen;
    zt_act_hook hook; /* tests */
    void *hook_ctx;
    pthread_mutex_t mu;
    zo_status err; /* the first failure of a copy function since zt_act_sync */
    char msg[768];
};

/* ---- the records ---- */

static char *host_rec(const zt_act_store *a, int j, int l) /* l = L + 1: the residual gradient */
{
    return a->host + ((uint64_t)j * (a->L + 2) + (uint64_t)l) * a->stride;
}

static char *carry(const zt_act_store *a, int j)
{
    return a->carry + (uint64_t)j * a->stride;
}

/* The record a unit reads as its layer input x (-1: none), and whether it
 * reads (y_in) and writes (y_out) its y. */
static int input_record(const zt_act_store *a, int layer, zo_phase phase)
{
    if (phase == ZO_PHASE_FORWARD)
        return layer >= 1 ? layer - 1 : -1;
    return layer == a->L + 1 ? a->L : layer - 1;
}

static int reads_y(const zt_act_store *a, int layer, zo_phase phase)
{
    return phase == ZO_PHASE_BACKWARD && layer <= a->L;
}

static int writes_y(int layer, zo_phase phase)
{
    return phase == ZO_PHASE_FORWARD || layer > 0;
}

/* ---- failures inside the copy streams ---- */

static zo_status keep_error(zt_act_store *a, zo_status st, const char *what, int j, int l)
{
    pthread_mutex_lock(&a->mu);
    if (a->err >= 0) {
        a->err = st;
        snprintf(a->msg, sizeof a->msg, "%s micro-batch %d's input of layer %d: %s", what, j, l + 1,
                 zo_last_error());
    }
    pthread_mutex_unlock(&a->mu);
    return st;
}

/* ---- the functions the copy streams run (act_home nvme) ---- */

typedef struct fill_arg {
    zt_act_store *a;
    int j, rec; /* rec >= 0: read block rec+1's input from NVMe; -1: from the carry */
    uint64_t gen;
} fill_arg;

static zo_status fill_fn(void *p)
{
    const fill_arg *f = p;
    zt_act_store *a = f->a;
    if (f->rec < 0) {
        memcpy(a->ring, carry(a, f->j), a->bytes);
        return ZO_OK;
    }
    zo_status st =
        zo_swap_read(a->swap, a->ext[(size_t)f->j * a->L + f->rec], a->ring, a->bytes, f->gen);
    return st < 0 ? keep_error(a, st, "reading back", f->j, f->rec) : ZO_OK;
}

typedef struct drain_arg {
    zt_act_store *a;
    int j, rec; /* rec >= 0: also write it to its extent */
    uint64_t gen;
} drain_arg;

static zo_status drain_fn(void *p)
{
    const drain_arg *d = p;
    zt_act_store *a = d->a;
    char *out = a->ring + a->ring_slot;
    memcpy(carry(a, d->j), out, a->bytes);
    if (d->rec < 0)
        return ZO_OK;
    zo_status st =
        zo_swap_write(a->swap, a->ext[(size_t)d->j * a->L + d->rec], out, a->bytes, d->gen);
    return st < 0 ? keep_error(a, st, "writing", d->j, d->rec) : ZO_OK;
}

/* ---- one record in, one out ---- */

/* Record rec of micro-batch j (L + 1: its residual gradient) into a slot, on
 * the load stream. */
static zo_status load_record(zt_act_store *a, void *dst, int j, int rec, zo_phase phase)
{
    if (a->home == ZT_ACT_HOST) {
        ZT_LIB(zo_memcpy_h2d_async(a->load, dst, host_rec(a, j, rec), a->bytes));
        return ZO_OK;
    }
    /* the backward reads block inputs back from NVMe; the rest is carried */
    int from_nvme = phase == ZO_PHASE_BACKWARD && rec < a->L;
    fill_arg f = {a, j, from_nvme ? rec : -1, from_nvme ? a->gen[(size_t)j * a->L + rec] : 0};
    ZT_LIB(zo_stream_enqueue(a->load, fill_fn, &f, sizeof f));
    ZT_LIB(zo_memcpy_h2d_async(a->load, dst, a->ring, a->bytes));
    return ZO_OK;
}

/* A slot's record rec of micro-batch j out, on the store stream. */
static zo_status store_record(zt_act_store *a, const void *src, int j, int rec, zo_phase phase)
{
    if (a->home == ZT_ACT_HOST) {
        ZT_LIB(zo_memcpy_d2h_async(a->store, host_rec(a, j, rec), src, a->bytes));
        return ZO_OK;
    }
    /* the forward's block inputs go to NVMe for the backward, and are carried on */
    drain_arg d = {a, j, -1, 0};
    if (phase == ZO_PHASE_FORWARD && rec < a->L) {
        d.rec = rec;
        d.gen = a->gen[(size_t)j * a->L + rec] = ++a->next_gen;
    }
    ZT_LIB(zo_memcpy_d2h_async(a->store, a->ring + a->ring_slot, src, a->bytes));
    ZT_LIB(zo_stream_enqueue(a->store, drain_fn, &d, sizeof d));
    return ZO_OK;
}

zo_status zt_act_begin(zt_act_store *a, int j, int layer, zo_phase phase, void **x, void **y)
{
    if (j < 0 || j >= a->G || layer < 0 || layer > a->L + 1)
        return zt_fail(ZO_ERR_INVALID_ARG, "layer inputs of micro-batch %d (0..%d), layer %d", j,
                       a->G - 1, layer);
    if (a->hook && phase == ZO_PHASE_BACKWARD && layer == a->L + 1 && j == 0) {
        zt_act_hook fn = a->hook;
        zo_stream_synchronize(a->store);
        fn(a->hook_ctx, a);
    }
    const int p = (int)(a->unit & 1);
    *x = a->slot[2 * p];
    *y = a->slot[2 * p + 1];
    /* the pair's last unit is done with it: computed, and its output stored */
    ZT_LIB(zo_stream_wait_event(a->load, a->drained[p]));
    int rec = input_record(a, layer, phase);
    if (rec >= 0)
        ZT_TRY(load_record(a, *x, j, rec, phase));
    if (reads_y(a, layer, phase))
        ZT_TRY(load_record(a, *y, j, a->L + 1, ZO_PHASE_FORWARD));
    ZT_LIB(zo_event_record(a->loaded[p], a->load));
    ZT_LIB(zo_stream_wait_event(a->compute, a->loaded[p]));
    return ZO_OK;
}

zo_status zt_act_end(zt_act_store *a, int j, int layer, zo_phase phase)
{
    const int p = (int)(a->unit++ & 1);
    ZT_LIB(zo_event_record(a->computed[p], a->compute));
    ZT_LIB(zo_stream_wait_event(a->store, a->computed[p]));
    if (writes_y(layer, phase))
        ZT_TRY(store_record(a, a->slot[2 * p + 1], j, phase == ZO_PHASE_FORWARD ? layer : a->L + 1,
                            phase));
    ZT_LIB(zo_event_record(a->drained[p], a->store));
    return ZO_OK;
}

zo_status zt_act_enter(zt_act_store *a)
{
    ZT_LIB(zo_event_record(a->entered, a->compute));
    ZT_LIB(zo_stream_wait_event(a->load, a->entered));
    return ZO_OK;
}

zo_status zt_act_fence(zt_act_store *a)
{
    for (int p = 0; p < 2; p++)
        ZT_LIB(zo_stream_wait_event(a->compute, a->drained[p]));
    return ZO_OK;
}

zo_status zt_act_sync(zt_act_store *a)
{
    zo_status ls = zo_stream_synchronize(a->load);
    zo_status ss = zo_stream_synchronize(a->store);
    pthread_mutex_lock(&a->mu);
    zo_status st = a->err;
    char msg[sizeof a->msg];
    memcpy(msg, a->msg, sizeof msg);
    a->err = ZO_OK;
    a->msg[0] = '\0';
    pthread_mutex_unlock(&a->mu);
    if (st < 0)
        return zt_fail(st, "layer inputs on NVMe: %s", msg);
    if (ls < 0)
        return zt_lib_fail(ls, "loading layer inputs");
    if (ss < 0)
        return zt_lib_fail(ss, "storing layer inputs");
    return ZO_OK;
}

void *zt_act_head_grad(zt_act_store *a, int j)
{
    return a->host ? host_rec(a, a->G, 0) + (uint64_t)j * a->head_stride : NULL;
}

void zt_act_set_backward_hook(zt_act_store *a, zt_act_hook fn, void *ctx)
{
    a->hook = fn;
    a->hook_ctx = ctx;
}

zo_swap_t zt_act_swap(zt_act_store *a)
{
    return a ? a->swap : NULL;
}

zo_swap_extent_t zt_act_extent(const zt_act_store *a, int j, int layer)
{
    if (!a || !a->ext || j < 0 || j >= a->G || layer < 0 || layer >= a->L)
        return ZO_SWAP_EXTENT_NONE;
    return a->ext[(size_t)j * a->L + layer];
}

/* ---- setup ---- */

/* Host memory the device copies from and into, pinned where it can be. */
static zo_status pinned_alloc(zt_act_store *a, char **out, uint64_t bytes, const char *what)
{
    *out = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!*out)
        return zt_fail(ZO_ERR_NO_MEMORY, "%llu bytes of host memory for %s",
                       (unsigned long long)bytes, what);
    if (zo_device_caps(a->dev) & ZO_DEVCAP_HOST_REGISTER) {
        zo_status st = zo_device_host_register(a->dev, *out, bytes);
        if (st < 0) {
            free(*out);
            *out = NULL;
            return zt_lib_fail(st, what);
        }
    }
    return ZO_OK;
}

static void pinned_free(zt_act_store *a, char *p)
{
    if (p && (zo_device_caps(a->dev) & ZO_DEVCAP_HOST_REGISTER))
        zo_device_host_unregister(a->dev, p);
    free(p);
}

/* The swap store of the block inputs: an extent per micro-batch and block. */
static zo_status open_swap(zt_act_store *a, const zt_act_nvme *nv)
{
    if (!nv || !nv->n_paths)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--act-home nvme needs a directory: pass --nvme-path DIR");
    const size_t n = (size_t)a->G * a->L;
    zo_swap_config sc = ZO_SWAP_CONFIG_INIT;
    sc.paths = nv->paths;
    sc.npaths = nv->n_paths;
    sc.extent_bytes = (a->bytes + 4095) / 4096 * 4096;
    sc.capacity = n * sc.extent_bytes;
    sc.name = "zoffload-act";
    sc.reuse = ZO_SWAP_REUSE; /* a file a killed run left must not block later runs */
    sc.faults = nv->faults;
    sc.nfaults = nv->n_faults;
    if (nv->queue_depth)
        sc.queue_depth = nv->queue_depth;
    if (nv->block_size)
        sc.block_size = nv->block_size;
    ZT_LIB(zo_swap_open(&sc, &a->swap));
    a->ext = calloc(n, sizeof *a->ext);
    a->gen = calloc(n, sizeof *a->gen);
    if (!a->ext || !a->gen)
        return zt_fail(ZO_ERR_NO_MEMORY, "the layer inputs' extent table");
    for (size_t i = 0; i < n; i++)
        ZT_LIB(zo_swap_alloc_extent(a->swap, i, &a->ext[i]));
    ZT_LIB(zo_swap_register_buffer(a->swap, a->ring, a->ring_bytes));
    return ZO_OK;
}

static zo_status nvme_alloc(zt_act_store *a, const zt_model_config *c, const zt_act_group *g,
                            const zt_act_nvme *nv)
{
    a->ring_slot = (a->bytes + 4095) / 4096 * 4096;
    a->ring_bytes = zt_model_host_activation_bytes(c, g);
    ZT_TRY(pinned_alloc(a, &a->ring, a->ring_bytes, "the layer inputs' staging ring"));
    a->carry = malloc(zt_model_act_carry_bytes(c, g));
    if (!a->carry)
        return zt_fail(ZO_ERR_NO_MEMORY, "%llu bytes of host memory for the residual streams",
                       (unsigned long long)zt_model_act_carry_bytes(c, g));
    return open_swap(a, nv);
}

static zo_status store_alloc(zt_act_store *a, const zt_model_config *c, const zt_act_group *g,
                             const zt_act_nvme *nv)
{
    ZT_LIB(zo_stream_create(a->dev, &a->load));
    ZT_LIB(zo_stream_create(a->dev, &a->store));
    ZT_LIB(zo_event_create(a->dev, &a->entered));
    for (int p = 0; p < 2; p++) {
        ZT_LIB(zo_event_create(a->dev, &a->loaded[p]));
        ZT_LIB(zo_event_create(a->dev, &a->computed[p]));
        ZT_LIB(zo_event_create(a->dev, &a->drained[p]));
    }
    if (a->home == ZT_ACT_NVME)
        return nvme_alloc(a, c, g, nv);
    a->host_bytes = zt_model_host_activation_bytes(c, g);
    return pinned_alloc(a, &a->host, a->host_bytes, "the group's layer inputs");
}

zo_status zt_act_store_init(zt_act_store **out, zo_device_t dev, zo_stream_t compute,
                            const zt_model_config *c, const zt_act_group *g, const zt_act_nvme *nv,
                            void *const slot[4])
{
    if (!g || (g->act_home != ZT_ACT_HOST && g->act_home != ZT_ACT_NVME))
        return zt_fail(ZO_ERR_INVALID_ARG, "a layer-input store is for act_home host or nvme");
    if (g->act_home == ZT_ACT_NVME && c->shape.tied)
        return zt_fail(ZO_ERR_UNSUPPORTED, "--act-home nvme with a tied head: the head's "
                                           "gradients per micro-batch have no NVMe home yet; use "
                                           "--act-home host or device");
    zt_act_store *a = calloc(1, sizeof *a);
    if (!a)
        return zt_fail(ZO_ERR_NO_MEMORY, "layer-input store");
    pthread_mutex_init(&a->mu, NULL);
    a->dev = dev;
    a->compute = compute;
    a->home = g->act_home;
    a->G = zt_model_group(c, g);
    a->L = c->shape.n_layers;
    a->bytes = (size_t)zt_model_res_rows(c) * c->shape.dim * zo_dtype_size(c->dt);
    a->stride = zt_model_act_stride(c);
    a->head_stride = zt_head_grad_stride(c);
    memcpy(a->slot, slot, sizeof a->slot);
    zo_status st = store_alloc(a, c, g, nv);
    if (st < 0) {
        zt_act_store_free(a);
        return st;
    }
    *out = a;
    return ZO_OK;
}

void zt_act_store_free(zt_act_store *a)
{
    if (!a)
        return;
    if (a->load)
        zo_stream_synchronize(a->load);
    if (a->store)
        zo_stream_synchronize(a->store);
    if (a->swap && a->ring)
        zo_swap_unregister_buffer(a->swap, a->ring);
    zo_swap_close(a->swap);
    zo_event_destroy(a->entered);
    for (int p = 0; p < 2; p++) {
        zo_event_destroy(a->loaded[p]);
        zo_event_destroy(a->computed[p]);
        zo_event_destroy(a->drained[p]);
    }
    zo_stream_destroy(a->load);
    zo_stream_destroy(a->store);
    pinned_free(a, a->host);
    pinned_free(a, a->ring);
    free(a->carry);
    free(a->ext);
    free(a->gen);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

/* ---- per layer ---- */

struct zt_act_layers {
    zo_device_t dev;
    zo_stream_t compute, load, store;
    zo_event_t stored[2], loaded[2], freed[2]; /* per slot */
    int L;
    size_t bytes;
    uint64_t stride;
    void *slot[2];
    char *host; /* L records of a stride, pinned */
    uint64_t host_bytes;
};

static zo_status layers_alloc(zt_act_layers *a)
{
    ZT_LIB(zo_stream_create(a->dev, &a->load));
    ZT_LIB(zo_stream_create(a->dev, &a->store));
    for (int p = 0; p < 2; p++) {
        ZT_LIB(zo_event_create(a->dev, &a->stored[p]));
        ZT_LIB(zo_event_create(a->dev, &a->loaded[p]));
        ZT_LIB(zo_event_create(a->dev, &a->freed[p]));
    }
    /* pinned_alloc reads only the device */
    zt_act_store dev_only = {.dev = a->dev};
    return pinned_alloc(&dev_only, &a->host, a->host_bytes, "the layer inputs on the host");
}

zo_status zt_act_layers_init(zt_act_layers **out, zo_device_t dev, zo_stream_t compute,
                             const zt_model_config *c, void *const slot[2])
{
    zt_act_layers *a = calloc(1, sizeof *a);
    if (!a)
        return zt_fail(ZO_ERR_NO_MEMORY, "layer-input store");
    a->dev = dev;
    a->compute = compute;
    a->L = c->shape.n_layers;
    a->bytes = (size_t)zt_model_res_rows(c) * c->shape.dim * zo_dtype_size(c->dt);
    a->stride = zt_model_act_stride(c);
    a->host_bytes = (uint64_t)a->L * a->stride;
    a->slot[0] = slot[0], a->slot[1] = slot[1];
    zo_status st = layers_alloc(a);
    if (st < 0) {
        zt_act_layers_free(a);
        return st;
    }
    *out = a;
    return ZO_OK;
}

void zt_act_layers_free(zt_act_layers *a)
{
    if (!a)
        return;
    if (a->load)
        zo_stream_synchronize(a->load);
    if (a->store)
        zo_stream_synchronize(a->store);
    for (int p = 0; p < 2; p++) {
        zo_event_destroy(a->stored[p]);
        zo_event_destroy(a->loaded[p]);
        zo_event_destroy(a->freed[p]);
    }
    zo_stream_destroy(a->load);
    zo_stream_destroy(a->store);
    zt_act_store dev_only = {.dev = a->dev};
    pinned_free(&dev_only, a->host);
    free(a);
}

static zo_status layers_check(const zt_act_layers *a, int layer, int lo, int hi, const char *what)
{
    if (layer < lo || layer > hi)
        return zt_fail(ZO_ERR_INVALID_ARG, "layer inputs: %s of layer %d (expected %d..%d)", what,
                       layer, lo, hi);
    return ZO_OK;
}

zo_status zt_act_layers_forward(zt_act_layers *a, int layer)
{
    ZT_TRY(layers_check(a, layer, 0, a->L, "a forward"));
    /* the slot's last record is on the host, and a load into it has landed */
    ZT_LIB(zo_stream_wait_event(a->compute, a->stored[layer & 1]));
    ZT_LIB(zo_stream_wait_event(a->compute, a->loaded[layer & 1]));
    return ZO_OK;
}

zo_status zt_act_layers_store(zt_act_layers *a, int layer)
{
    ZT_TRY(layers_check(a, layer, 0, a->L - 1, "storing the output"));
    const int p = layer & 1;
    ZT_LIB(zo_event_record(a->freed[p], a->compute)); /* here: the slot's output is computed */
    ZT_LIB(zo_stream_wait_event(a->store, a->freed[p]));
    ZT_LIB(
        zo_memcpy_d2h_async(a->store, a->host + (uint64_t)layer * a->stride, a->slot[p], a->bytes));
    ZT_LIB(zo_event_record(a->stored[p], a->store));
    return ZO_OK;
}

zo_status zt_act_layers_backward(zt_act_layers *a, int layer)
{
    ZT_TRY(layers_check(a, layer, 1, a->L, "a backward"));
    if (layer >= 2) { /* x_{l-2} into slot l & 1, whose x_l block l+1 has read */
        const int p = layer & 1;
        ZT_LIB(zo_event_record(a->freed[p], a->compute));
        ZT_LIB(zo_stream_wait_event(a->load, a->freed[p]));
        ZT_LIB(zo_stream_wait_event(a->load, a->stored[p]));
        ZT_LIB(zo_memcpy_h2d_async(a->load, a->slot[p], a->host + (uint64_t)(layer - 2) * a->stride,
                                   a->bytes));
        ZT_LIB(zo_event_record(a->loaded[p], a->load));
    }
    /* x_{l-1}: loaded by block l+1's call, or (block L) still there from the forward */
    ZT_LIB(zo_stream_wait_event(a->compute, a->loaded[(layer - 1) & 1]));
    return ZO_OK;
}

zo_status zt_act_layers_sync(zt_act_layers *a)
{
    zo_status ls = zo_stream_synchronize(a->load);
    zo_status ss = zo_stream_synchronize(a->store);
    if (ls < 0)
        return zt_lib_fail(ls, "loading layer inputs");
    if (ss < 0)
        return zt_lib_fail(ss, "storing layer inputs");
    return ZO_OK;
}

const void *zt_act_layers_record(const zt_act_layers *a, int l)
{
    return a && l >= 0 && l < a->L ? a->host + (uint64_t)l * a->stride : NULL;
}
