/* zo_py_layout: prints the size and every field's offset of each C struct the
 * Python package mirrors with ctypes (tools/python/zoffload/_native.py), as one
 * JSON object; tests/python/test_layout.py compares them with the mirrors, so
 * the two cannot drift apart. The field lists name the C fields: a field the
 * package lacks, or a renamed one, fails to compile or to compare. */
#include <stddef.h>
#include <stdio.h>

#include "zo/comm.h"
#include "zo/device.h"
#include "zo/engine.h"
#include "zo/launch.h"
#include "zo/optim.h"
#include "zo/safetensors.h"

static int first_struct = 1, first_field;

static void begin(const char *name, size_t size)
{
    printf("%s\"%s\": {\"size\": %zu, \"fields\": {", first_struct ? "" : ", ", name, size);
    first_struct = 0;
    first_field = 1;
}

static void field(const char *name, size_t off)
{
    printf("%s\"%s\": %zu", first_field ? "" : ", ", name, off);
    first_field = 0;
}

#define F(s, f) field(#f, offsetof(s, f))
#define STRUCT(s, ...)                                                                             \
    do {                                                                                           \
        begin(#s, sizeof(s));                                                                      \
        __VA_ARGS__;                                                                               \
        printf("}}");                                                                              \
    } while (0)

int main(void)
{
    printf("{");
    STRUCT(zo_st_tensor_info, F(zo_st_tensor_info, struct_size), F(zo_st_tensor_info, name),
           F(zo_st_tensor_info, dtype), F(zo_st_tensor_info, ndim), F(zo_st_tensor_info, shape),
           F(zo_st_tensor_info, nbytes), F(zo_st_tensor_info, file_offset),
           F(zo_st_tensor_info, data));
    STRUCT(zo_engine_layout, F(zo_engine_layout, struct_size), F(zo_engine_layout, n_tensors),
           F(zo_engine_layout, numel), F(zo_engine_layout, layer), F(zo_engine_layout, keep_f32));
    STRUCT(zo_device_config, F(zo_device_config, struct_size), F(zo_device_config, backend),
           F(zo_device_config, ordinal), F(zo_device_config, mem_budget),
           F(zo_device_config, cpu_copy_threads));
    STRUCT(zo_device_info, F(zo_device_info, struct_size), F(zo_device_info, backend),
           F(zo_device_info, name), F(zo_device_info, ordinal), F(zo_device_info, total_mem),
           F(zo_device_info, budget), F(zo_device_info, cc_major), F(zo_device_info, cc_minor),
           F(zo_device_info, multiprocessors), F(zo_device_info, pci_bus_id),
           F(zo_device_info, caps));
    STRUCT(zo_device_mem_stats, F(zo_device_mem_stats, budget), F(zo_device_mem_stats, in_use),
           F(zo_device_mem_stats, high_water), F(zo_device_mem_stats, n_allocs),
           F(zo_device_mem_stats, n_failed));
    STRUCT(zo_adam_params, F(zo_adam_params, struct_size), F(zo_adam_params, lr),
           F(zo_adam_params, beta1), F(zo_adam_params, beta2), F(zo_adam_params, eps),
           F(zo_adam_params, weight_decay), F(zo_adam_params, step), F(zo_adam_params, adamw),
           F(zo_adam_params, bias_correction), F(zo_adam_params, grad_scale),
           F(zo_adam_params, simd_level));
    STRUCT(zo_loss_scaler_config, F(zo_loss_scaler_config, struct_size),
           F(zo_loss_scaler_config, loss_scale), F(zo_loss_scaler_config, initial_scale_power),
           F(zo_loss_scaler_config, loss_scale_window), F(zo_loss_scaler_config, hysteresis),
           F(zo_loss_scaler_config, consecutive_hysteresis),
           F(zo_loss_scaler_config, min_loss_scale),
           F(zo_loss_scaler_config, raise_error_at_min_scale));
    STRUCT(zo_state_format, F(zo_state_format, name), F(zo_state_format, dtype),
           F(zo_state_format, code_dtype), F(zo_state_format, code_bits), F(zo_state_format, block),
           F(zo_state_format, min_numel), F(zo_state_format, fused), F(zo_state_format, summary),
           F(zo_state_format, moment_bytes), F(zo_state_format, encode),
           F(zo_state_format, decode));
    STRUCT(zo_engine_caps, F(zo_engine_caps, bytes));
    STRUCT(zo_engine_config, F(zo_engine_config, struct_size), F(zo_engine_config, device),
           F(zo_engine_config, rank), F(zo_engine_config, world_size),
           F(zo_engine_config, param_dtype), F(zo_engine_config, chunk_bytes),
           F(zo_engine_config, param_home), F(zo_engine_config, optim_home),
           F(zo_engine_config, device_bytes), F(zo_engine_config, pinned_bytes),
           F(zo_engine_config, nvme_paths), F(zo_engine_config, n_nvme_paths),
           F(zo_engine_config, nvme_bytes), F(zo_engine_config, nvme_engine),
           F(zo_engine_config, lookahead), F(zo_engine_config, mode),
           F(zo_engine_config, grad_accum_steps), F(zo_engine_config, optim_threads),
           F(zo_engine_config, adam), F(zo_engine_config, max_grad_norm),
           F(zo_engine_config, loss_scaler), F(zo_engine_config, nvme_name),
           F(zo_engine_config, nvme_queue_depth), F(zo_engine_config, nvme_block_size),
           F(zo_engine_config, param_caps), F(zo_engine_config, optim_caps),
           F(zo_engine_config, host_bytes), F(zo_engine_config, micro_group),
           F(zo_engine_config, state_dtype), F(zo_engine_config, zero_stage),
           F(zo_engine_config, comm), F(zo_engine_config, zero_persist_elems),
           F(zo_engine_config, master_split), F(zo_engine_config, host_node),
           F(zo_engine_config, pipe_comm), F(zo_engine_config, reduce_order),
           F(zo_engine_config, update_behind));
    STRUCT(zo_engine_footprint, F(zo_engine_footprint, struct_size), F(zo_engine_footprint, bytes),
           F(zo_engine_footprint, pinned), F(zo_engine_footprint, chunk_bytes),
           F(zo_engine_footprint, n_chunks), F(zo_engine_footprint, max_chunks_per_layer),
           F(zo_engine_footprint, device_param_slots), F(zo_engine_footprint, device_grad_slots),
           F(zo_engine_footprint, n_params), F(zo_engine_footprint, param_staging),
           F(zo_engine_footprint, grad_pinned), F(zo_engine_footprint, grad_host),
           F(zo_engine_footprint, grad_nvme), F(zo_engine_footprint, grad_stage),
           F(zo_engine_footprint, param_gather));
    STRUCT(zo_step_stats, F(zo_step_stats, struct_size), F(zo_step_stats, step),
           F(zo_step_stats, grad_norm), F(zo_step_stats, overflow), F(zo_step_stats, clipped),
           F(zo_step_stats, loss_scale), F(zo_step_stats, rollbacks), F(zo_step_stats, h2d_bytes),
           F(zo_step_stats, d2h_bytes), F(zo_step_stats, nvme_read_bytes),
           F(zo_step_stats, nvme_write_bytes), F(zo_step_stats, step_seconds),
           F(zo_step_stats, stall_seconds), F(zo_step_stats, optim_seconds),
           F(zo_step_stats, h2d_seconds), F(zo_step_stats, d2h_seconds),
           F(zo_step_stats, nvme_seconds), F(zo_step_stats, peak), F(zo_step_stats, peak_pinned),
           F(zo_step_stats, fetch_hits), F(zo_step_stats, fetch_misses),
           F(zo_step_stats, evictions), F(zo_step_stats, prefetches));
    STRUCT(zo_engine_step_state, F(zo_engine_step_state, struct_size),
           F(zo_engine_step_state, updates), F(zo_engine_step_state, steps),
           F(zo_engine_step_state, loss_scale), F(zo_engine_step_state, scaler_iter),
           F(zo_engine_step_state, scaler_last_overflow_iter),
           F(zo_engine_step_state, scaler_hysteresis));
    STRUCT(zo_launch_config, F(zo_launch_config, struct_size), F(zo_launch_config, rank),
           F(zo_launch_config, world_size), F(zo_launch_config, local_rank),
           F(zo_launch_config, master_addr), F(zo_launch_config, master_port));
    STRUCT(zo_rank_info, F(zo_rank_info, struct_size), F(zo_rank_info, rank),
           F(zo_rank_info, world_size), F(zo_rank_info, local_rank), F(zo_rank_info, launcher),
           F(zo_rank_info, master_addr), F(zo_rank_info, master_port));
    STRUCT(zo_comm_config, F(zo_comm_config, struct_size), F(zo_comm_config, backend),
           F(zo_comm_config, device), F(zo_comm_config, launch), F(zo_comm_config, timeout_s),
           F(zo_comm_config, exact_segment_bytes), F(zo_comm_config, device_buffers_only));
    printf("}\n");
    return 0;
}
