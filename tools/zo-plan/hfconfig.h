/* zo-plan --hf-config: a Hugging Face LLaMA config.json as zo-train's shape. */
#ifndef ZP_HFCONFIG_H
#define ZP_HFCONFIG_H

#include <stddef.h>

#include "model.h"

/* hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 * vocab_size (rms_norm_eps, rope_theta when present). What zo-train's model
 * does differently is said in note (empty when nothing): grouped-query
 * attention (num_key_value_heads below the heads) is planned as full
 * multi-head attention, a tied output head as an untied one. */
zo_status zp_read_hf_config(const char *path, zt_shape *out, char *note, size_t cap);

#endif
