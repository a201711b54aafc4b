/* Where a layer-major group's layer inputs and residual gradients wait
 * between layers when they leave the device (act_home host or nvme), and the
 * copies that bring them back.
 *
 * A group runs as a sequence of units (one micro-batch through one layer in
 * one phase). Each unit computes on a pair of device slots (its layer input
 * x, and y: the layer's output in the forward, the residual gradient in the
 * backward), the two pairs alternating from unit to unit: while unit u
 * computes, the load stream brings unit u+1's inputs into the other pair and
 * the store stream takes unit u-1's output away. Events order the three
 * streams, so the compute stream waits only for data that is not there yet.
 *
 * act_home host: the records sit in pinned host memory, copied straight to
 * and from the slots. act_home nvme: every block's input goes to a
 * checksummed extent of a swap store of its own (NAME-act) in the forward
 * and is read back for the backward's recompute; the residual stream (the
 * next layer's input in the forward, the residual gradient in the backward)
 * is carried in pageable host memory, a stride per micro-batch; both pass
 * through one pinned staging slot per direction, filled and drained by
 * functions run in the copy streams' order. A failed read or write (EIO, a
 * checksum mismatch) is kept and reported by zt_act_sync. */
#ifndef ZT_ACT_STORE_H
#define ZT_ACT_STORE_H

#include <stddef.h>

#include "model_shape.h"
#include "zo/device.h"
#include "zo/engine.h"
#include "zo/swap.h"

/* act_home nvme: where the swap store goes and how it is driven. */
typedef struct zt_act_nvme {
    const char *const *paths; /* directories (the run's NVMe paths) */
    size_t n_paths;
    uint32_t queue_depth, block_size; /* 0: the store's defaults */
    const zo_swap_fault *faults;      /* tests: armed at open (zo_swap_set_faults re-arms) */
    size_t n_faults;
} zt_act_nvme;

typedef struct zt_act_store zt_act_store;

/* The store of a group of c/g on dev, computing on `compute`, with the four
 * device slots slot[0..3] (x and y of pair 0, then of pair 1) of a stride
 * each; nv is needed with act_home nvme. */
zo_status zt_act_store_init(zt_act_store **out, zo_device_t dev, zo_stream_t compute,
                            const zt_model_config *c, const zt_act_group *g, const zt_act_nvme *nv,
                            void *const slot[4]);
void zt_act_store_free(zt_act_store *a);

/* Before micro-batch j (0..group-1) computes `layer` in `phase`: its inputs
 * are loaded into the next pair of slots and the compute stream waits for
 * them; *x and *y are the pair. */
zo_status zt_act_begin(zt_act_store *a, int j, int layer, zo_phase phase, void **x, void **y);
/* After its compute is enqueued: what it produced is stored. */
zo_status zt_act_end(zt_act_store *a, int j, int layer, zo_phase phase);
/* Before a group computes through the store: the load stream may refill
 * the slots only after what the compute stream was given so far (the arena's
 * one set, used directly by micro-batch-major work). */
zo_status zt_act_enter(zt_act_store *a);
/* Before the compute stream uses the arena's set directly: the stores out
 * of the slots are done. */
zo_status zt_act_fence(zt_act_store *a);
/* Wait for the copies in flight; the first failure since the last call
 * (naming the micro-batch, the layer and the cause), else ZO_OK. */
zo_status zt_act_sync(zt_act_store *a);
/* act_home host, a tied model: micro-batch j's head gradients in the store's
 * pinned memory (zt_head_grad_stride bytes, after the layer inputs). */
void *zt_act_head_grad(zt_act_store *a, int j);
/* Tests: fn(ctx, a) runs once the forward's stores of a group have landed,
 * before its backward loads the first layer input (NULL: none; the store
 * waits for its copies there only while one is set). */
typedef void (*zt_act_hook)(void *ctx, zt_act_store *a);
void zt_act_set_backward_hook(zt_act_store *a, zt_act_hook fn, void *ctx);
/* The swap store (act_home nvme; NULL otherwise), for tests. */
zo_swap_t zt_act_swap(zt_act_store *a);
/* The extent holding micro-batch j's input of block `layer` + 1 (tests). */
zo_swap_extent_t zt_act_extent(const zt_act_store *a, int j, int layer);

/* ---- per layer (zt_act_per_layer: act_home host, one micro-batch a group) ----
 * Block l's input x_l sits in device slot l & 1. The forward copies x_l
 * (l < n_layers) to pinned host memory on the store stream while block l+1
 * computes, and a block writes its slot only once that slot's last copy out
 * is done. The backward starts with x_{L-1} still on the device; before
 * block l computes, the load stream brings x_{l-2} back into slot l & 1
 * (free once block l+1 read x_l there) and block l waits for x_{l-1}. */
typedef struct zt_act_layers zt_act_layers;

/* The store of c's block inputs on dev, computing on `compute`, with the
 * two slots of a stride each. */
zo_status zt_act_layers_init(zt_act_layers **out, zo_device_t dev, zo_stream_t compute,
                             const zt_model_config *c, void *const slot[2]);
void zt_act_layers_free(zt_act_layers *a);
/* Before layer `layer` (0..n_layers) writes its output into slot layer & 1
 * in a forward: the compute stream waits for that slot's copy out. */
zo_status zt_act_layers_forward(zt_act_layers *a, int layer);
/* After a training forward of `layer` (0..n_layers - 1) is enqueued: its
 * output, the next block's input, goes to the host. */
zo_status zt_act_layers_store(zt_act_layers *a, int layer);
/* Before block `layer` (1..n_layers) computes its backward. */
zo_status zt_act_layers_backward(zt_act_layers *a, int layer);
/* Wait for the copies in flight; the first failure, else ZO_OK. */
zo_status zt_act_layers_sync(zt_act_layers *a);
/* Tests: the host copy of block l+1's input (n_layers records of a stride). */
const void *zt_act_layers_record(const zt_act_layers *a, int l);

#endif
