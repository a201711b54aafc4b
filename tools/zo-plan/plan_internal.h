/* What the fixed-homes planner (plan.c) shares with the per-chunk planner
 * (split.c): the model as the engine packs it, the simulation of its
 * parameter loads, and the pieces of the time model. Not for the tools. */
#ifndef ZP_PLAN_INTERNAL_H
#define ZP_PLAN_INTERNAL_H

#include <stdint.h>

#include "plan.h"

typedef struct model_layout {
    size_t n;
    size_t *numel;
    int *layer;
    unsigned char *keep_f32;      /* job->embedding_f32: the embedding (zt_tensor_embedding) */
    zo_engine_chunk_info *chunks; /* n entries: enough for any packing */
    uint32_t n_chunks;
    uint32_t *first; /* per engine layer: its first chunk; first[L] = n_chunks */
    int n_layers;    /* the job's engine layers, numbered from 0 (a stage's own) */
    int fwd_layers;  /* of them, those fetched in the forward: all but a last head */
} model_layout;

/* The job's tensors (a stage's layers, plan.h) as the engine registers them. */
zo_status zp_layout_init(model_layout *m, const zp_job *job);
void zp_layout_free(model_layout *m);
zo_engine_layout zp_engine_layout(const model_layout *m);
/* Pack under cfg and index the chunks by layer. */
zo_status zp_pack_model(model_layout *m, const zo_engine_config *cfg, int n_layers);

/* The parameter loads (chunks, 16-bit bytes) of a step of `accum` passes
 * of the fetch order (forward 0..F-1, backward E-1..0; F = m->fwd_layers:
 * E-1 when the last layer is the head, E on a stage that sends its output
 * on) through n_slots
 * device slots under the engine's farthest-next-use eviction; chunks
 * flagged in resident (optional) stay on the device and are never loaded. */
zo_status zp_step_loads(const model_layout *m, int n_layers, uint32_t n_slots, int accum,
                        const uint8_t *resident, uint64_t *loads, uint64_t *bytes, uint64_t *work);

zt_model_config zp_model_config(const zp_job *job);
/* A chunk that holds a whole block of the job's parameters, rounded to 4 KiB. */
uint64_t zp_block_chunk_bytes(const zp_job *job);
/* Bytes of one chunk's optimizer states as the engine moves them on NVMe,
 * from the parameter bytes (job->dtype) it uses. */
uint64_t zp_packed_state_bytes(const zp_job *job, uint64_t used_bytes);
/* The optimizer update's NVMe reads and writes, overlapped as the pipeline runs them. */
double zp_nvme_update_seconds(uint64_t rd_bytes, uint64_t wr_bytes, const zp_speeds *sp);
/* Whether the engine runs the update behind the next forward (engine_behind.c,
 * zo-train's --update-behind, on unless job->no_update_behind): sync mode, one
 * rank, no pipeline, no fp16, every chunk's states on NVMe and its 16-bit
 * parameters on NVMe or the host (param_homes, optim_homes by zo_tier). */
int zp_update_behind(const zp_job *job, zo_optim_mode mode, const uint32_t *param_homes,
                     const uint32_t *optim_homes, uint32_t n_chunks);
/* What the step with the update behind the next forward is made of, in
 * seconds: fb the forward and backward of the step, fwd the forward's
 * compute, optim the Adam, nvme_optim the update's disk traffic and
 * nvme_fetch the step's other disk traffic (parameter loads, spills, layer
 * inputs), of which the forward's share is half (each chunk is read once
 * for the forward and once more for the backward). */
typedef struct zp_behind_times {
    double fb, fwd, optim, nvme_optim, nvme_fetch;
} zp_behind_times;
/* The step with the update behind the next forward: the backward (fb less
 * fwd), then the forward beside the update: it starts after the first
 * chunk's update (one chunk's share of it), and the backward after both.
 * On the cpu device the forward's compute and the other chunks' Adam share
 * the cores and add up; on a GPU they overlap. The disk serves the
 * forward's reads and the update's traffic in that window one after the
 * other, and the whole step no faster than all its disk traffic. */
double zp_behind_step_seconds(const zp_behind_times *t, uint32_t n_chunks, int cpu_device);
/* The bottleneck, tokens/s, MFU and NVMe wear from p->seconds, p->step_seconds and the bytes. */
void zp_finish_time(zp_plan *p, const zp_speeds *sp, double nvme_tbw);
/* Under ZeRO (job->world_size > 1) rank 0 updates chunk c of n_chunks. */
int zp_rank0_owns(const zp_job *job, uint32_t n_chunks, uint32_t c);
/* Record why p does not fit (the first reason stands); returns 0. */
int zp_refuse(zp_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
