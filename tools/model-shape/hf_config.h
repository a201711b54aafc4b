/* A Hugging Face config.json as the model's shape (zo-plan --hf-config,
 * zo-train --hf-model). */
#ifndef ZT_HF_CONFIG_H
#define ZT_HF_CONFIG_H

#include <stddef.h>

#include "model_shape.h"

/* LlamaForCausalLM and the LLaMA-shaped MistralForCausalLM and
 * Qwen2ForCausalLM: hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size, vocab_size; when present num_key_value_heads, head_dim,
 * rms_norm_eps, rope_theta, rope_scaling (llama3, yarn, dynamic, linear; or transformers 5's
 * rope_parameters, rope_theta inside), tie_word_embeddings,
 * and the q/k/v biases of Qwen2 and Llama's attention_bias (q, k, v and o_proj).
 * What would make another model (another model_type or architecture, hidden_act
 * other than silu, mlp_bias, attention_bias outside Llama, another rope_scaling type,
 * partial_rotary_factor) is refused naming the key. The sliding window
 * (Mistral's sliding_window on every layer; Qwen2's with use_sliding_window,
 * on the layers from max_window_layers or as layer_types says) goes to the
 * shape's window and window_from, and the config's value to *window (0:
 * none; NULL: not wanted). note says what the reader should know
 * of the model (empty when nothing): a tied head is one tensor with the
 * embedding's matrix. */
zo_status zt_read_hf_config(const char *path, zt_shape *out, char *note, size_t cap);
zo_status zt_read_hf_config_window(const char *path, zt_shape *out, int *window, char *note,
                                   size_t cap);

#endif
