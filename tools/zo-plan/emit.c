/* zo-plan --emit-config: a zo_train_config serialized by the library's own
 * writer and checked with its own reader. */
#include "emit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/config.h"
#include "zo/file.h"
#include "zt_error.h"

static void set_offload(const zp_emit *e, zo_train_config *c)
{
    c->zero_optimization.offload_optimizer.device = (zo_offload_device)e->optim_home;
    c->zero_optimization.offload_param.device = (zo_offload_device)e->param_home;
    /* DeepSpeed offloads the optimizer from stage 2 on and parameters at stage 3 */
    c->zero_optimization.stage = e->param_home ? 3 : e->optim_home ? 2 : 0;
    const char *first = e->n_nvme_paths ? e->nvme_paths[0] : "";
    if (e->optim_home == ZO_OFFLOAD_NVME)
        snprintf(c->zero_optimization.offload_optimizer.nvme_path, ZO_CONFIG_PATH_CAP, "%s", first);
    if (e->param_home == ZO_OFFLOAD_NVME)
        snprintf(c->zero_optimization.offload_param.nvme_path, ZO_CONFIG_PATH_CAP, "%s", first);
    c->zero_optimization.offload_optimizer.pin_memory = e->optim_home != 0;
    c->zero_optimization.offload_param.pin_memory = e->param_home != 0;
    c->zoffload.n_nvme_paths = e->n_nvme_paths;
    for (int i = 0; i < e->n_nvme_paths && i < ZO_CONFIG_MAX_NVME_PATHS; i++)
        snprintf(c->zoffload.nvme_paths[i], ZO_CONFIG_PATH_CAP, "%s", e->nvme_paths[i]);
}

static zo_train_config make_config(const zp_emit *e)
{
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    c.train_micro_batch_size_per_gpu = e->micro_batch;
    c.gradient_accumulation_steps = e->grad_accum;
    c.train_batch_size = (int64_t)e->micro_batch * e->grad_accum;
    c.gradient_clipping = 1.0; /* zo-train's default --max-grad-norm */
    c.optimizer.type = ZO_OPTIMIZER_ADAMW;
    c.fp16.enabled = e->fp16;
    c.bf16.enabled = !e->fp16;
    set_offload(e, &c);
    c.zoffload.device_mem = (int64_t)e->device_mem;
    c.zoffload.host_mem = (int64_t)e->host_budget; /* zo-train's --host-mem: pinned + pageable */
    c.zoffload.chunk_size = (int64_t)e->chunk_bytes;
    c.zoffload.optimizer_mode = (zo_optim_mode)e->mode;
    c.zoffload.placement.optimizer.device = (int64_t)e->optim_caps[0];
    c.zoffload.placement.optimizer.host = (int64_t)e->optim_caps[1];
    c.zoffload.placement.params.device = (int64_t)e->param_caps[0];
    c.zoffload.placement.params.host = (int64_t)e->param_caps[1];
    c.zoffload.micro_group = e->micro_group > 1 ? e->micro_group : 1;
    c.zoffload.mlp_chunk_bytes = (int64_t)e->mlp_chunk_bytes;
    if (e->sparse)
        c.sparse_attention = *e->sparse;
    /* the config's 0 device, 1 host, 2 nvme */
    c.zoffload.act_home = e->act_home == 2 ? 1 : e->act_home == 3 ? 2 : 0;
    c.zoffload.optimizer_state_dtype = (zo_dtype)e->state_dtype;
    c.zoffload.master_split = e->master_split;
    c.zoffload.embedding_f32_states = e->embedding_f32;
    c.zoffload.update_behind = e->update_behind;
    return c;
}

zo_status zp_emit_config(const zp_emit *e, const char *path)
{
    if (e->n_nvme_paths > ZO_CONFIG_MAX_NVME_PATHS)
        return zt_fail(ZO_ERR_INVALID_ARG, "%d NVMe paths: a config holds at most %d",
                       e->n_nvme_paths, ZO_CONFIG_MAX_NVME_PATHS);
    zo_train_config c = make_config(e);
    char *text = NULL;
    ZT_LIB(zo_train_config_to_json(&c, 2, &text));
    FILE *f = NULL;
    if (zo_file_fopen_write(path, 0, &f) < 0) {
        free(text);
        return zt_lib_fail(zo_last_error_status(), "--emit-config");
    }
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    free(text);
    if (bad)
        return zt_fail(ZO_ERR_IO, "--emit-config %s: writing failed", path);
    zo_train_config back = ZO_TRAIN_CONFIG_INIT;
    ZT_LIB(zo_train_config_load(path, 1, &back));
    return ZO_OK;
}
