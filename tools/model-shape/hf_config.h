/* A Hugging Face LLaMA config.json as the model's shape (zo-plan --hf-config). */
#ifndef ZT_HF_CONFIG_H
#define ZT_HF_CONFIG_H

#include <stddef.h>

#include "model_shape.h"

/* hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 * vocab_size (rms_norm_eps, rope_theta when present). What zo-train's model
 * does differently is said in note (empty when nothing): grouped-query
 * attention (num_key_value_heads below the heads) is planned as full
 * multi-head attention, a tied output head as an untied one. */
zo_status zt_read_hf_config(const char *path, zt_shape *out, char *note, size_t cap);

#endif
