/* zo-plan --validate: the trainer run under a plan. */
#include "validate.h"

#include <stdlib.h>
#include <string.h>

#include "trainer.h"
#include "zo/units.h"
#include "zt_error.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

zt_options zp_trainer_options(const zp_job *job, const zp_hardware *hw, const zp_plan *p,
                              const char *data, const char *nvme_dir)
{
    zt_options o = ZT_OPTIONS_INIT;
    o.shape = job->shape;
    o.data_path = data;
    o.seq = job->seq;
    o.micro_batch = job->micro_batch;
    o.grad_accum = job->grad_accum;
    o.dtype = job->dtype;
    o.flash_attention = job->flash_attention;
    o.sparse_layout = job->layout;
    o.state_dtype = job->state_dtype;
    o.master_split = job->master_split;
    o.embedding_f32 = job->embedding_f32;
    o.update_behind = !job->no_update_behind;
    o.mode = p->mode;
    o.param_caps = p->param_caps; /* the per-chunk plan's split (0: every chunk at its home) */
    o.optim_caps = p->optim_caps;
    o.micro_group = p->micro_group;
    o.mlp_chunk_bytes = job->mlp_chunk_bytes;
    o.act_home = p->act_home == ZP_ACT_HOST   ? ZT_ACT_HOST
                 : p->act_home == ZP_ACT_NVME ? ZT_ACT_NVME
                                              : ZT_ACT_DEVICE;
    o.device = hw->backend;
    o.device_mem = hw->device_bytes;
    o.pinned_bytes = hw->pinned_max;
    o.param_home = (int)p->param_home;
    o.optim_home = (int)p->optim_home;
    o.chunk_bytes = p->fp.chunk_bytes;
    o.val_batches = 1;
    if (p->engine_host_budget) {
        /* zo-train gives the engine what its host limit leaves beside the
         * layer inputs it keeps (pinned, or carried for NVMe) and the cpu
         * device: the plan's share, so that the engine keeps and spills the
         * gradients the plan does. Beside the engine the plan keeps its
         * totals less the engine's footprint and the modelled terms. */
        int64_t beside = (int64_t)(p->pinned.total + p->host.total) -
                         (int64_t)(p->fp.pinned + p->fp.bytes[ZO_TIER_HOST]) - p->modelled.pinned;
        o.host_mem = (uint64_t)((int64_t)p->engine_host_budget + (beside > 0 ? beside : 0)) +
                     (strcmp(hw->backend, "cpu") == 0 ? hw->device_bytes : 0);
        o.host_mem_from = "zo-plan's host budget";
    }
    if (nvme_dir) {
        o.nvme_paths[0] = nvme_dir;
        o.n_nvme_paths = 1;
    }
    return o;
}

zo_status zp_validate(const zp_job *job, const zp_hardware *hw, const zp_plan *p, const char *data,
                      const char *nvme_dir, int steps, zp_validation *out)
{
    if (steps < 1)
        return zt_fail(ZO_ERR_INVALID_ARG, "--validate %d: at least one step", steps);
    if ((p->param_home == ZO_TIER_NVME || p->optim_home == ZO_TIER_NVME) && !nvme_dir)
        return zt_fail(ZO_ERR_INVALID_ARG, "validating %s needs an --nvme-path for the swap files",
                       zp_strategy_name(p->strategy));
    zt_options o = zp_trainer_options(job, hw, p, data, nvme_dir);
    double *secs = calloc((size_t)steps, sizeof *secs);
    if (!secs)
        return zt_fail(ZO_ERR_NO_MEMORY, "step times");
    zt_trainer *t = NULL;
    zo_status st = zt_trainer_init(&t, &o);
    memset(out, 0, sizeof *out);
    for (int i = 0; st >= 0 && i < steps; i++) {
        zo_step_stats s = ZO_STEP_STATS_INIT;
        float loss;
        double t0 = zo_now_s();
        st = zt_trainer_step(t, &loss, &s);
        secs[i] = zo_now_s() - t0;
        out->last = s;
    }
    if (st >= 0) {
        out->device_high_water = zt_trainer_device_high_water(t);
        int skip = steps > 1; /* the first step records the trace */
        qsort(secs + skip, (size_t)(steps - skip), sizeof *secs, cmp_double);
        out->step_seconds = secs[skip + (steps - skip) / 2];
    }
    zt_trainer_free(t);
    free(secs);
    return st;
}
