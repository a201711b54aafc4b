/* zoffload: safetensors files, the format Hugging Face tools read.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * (padded with spaces so that the data starts at a multiple of 8), then the
 * data section. The JSON maps each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} (byte offsets into the data section) and may
 * hold "__metadata__", a string-to-string map. The data section is entirely
 * covered by the tensors, without holes or overlaps; values are little-endian
 * and row-major.
 *
 * The writer streams: the tensors' names, dtypes and shapes are declared
 * first, then their bytes are written in declaration order, in as many
 * pieces as the caller likes, so a checkpoint never needs the whole model in
 * host memory. The file is written through zo_atomic_file (temporary name,
 * fsync, rename, fsync of the directory). By default __metadata__ holds
 * {"format": "pt"}, which transformers' from_pretrained requires.
 *
 * The reader maps the file read-only and validates everything before any
 * lookup: header length, JSON, dtypes, shapes (sizes = product of shape x
 * dtype size, without overflow), offsets in range, no overlaps, no holes, no
 * trailing bytes. Messages name the file and the tensor:
 *   tensor 'NAME' not found in 'FILE' (N tensors; nearest: 'OTHER')
 *   tensor 'NAME' in 'FILE': expected dtype BF16, found F32
 *   tensor 'NAME' in 'FILE': expected shape [4096, 4096], found [4096, 1024]
 */
#ifndef ZO_SAFETENSORS_H
#define ZO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/dtype.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format's name of a dtype ("BF16", "F32"...; sizes from zo_dtype_size);
 * "?" for ZO_DTYPE_NONE or an invalid value, which files cannot hold. */
ZO_API const char *zo_st_dtype_name(zo_dtype d);
/* The dtype named name (exact, upper case as in the format). */
ZO_API zo_status zo_st_dtype_from_name(const char *name, zo_dtype *out);

enum { ZO_ST_MAX_DIMS = 8 };

typedef struct zo_st_tensor_info {
    size_t struct_size;
    const char *name; /* owned by the reader */
    zo_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[ZO_ST_MAX_DIMS];
    uint64_t nbytes;
    uint64_t file_offset; /* of the first byte, from the start of the file */
    const void *data;     /* into the reader's read-only mapping */
} zo_st_tensor_info;

#define ZO_ST_TENSOR_INFO_INIT                                                                     \
    {                                                                                              \
        .struct_size = sizeof(zo_st_tensor_info)                                                   \
    }

/* ---- writer ---- */

typedef struct zo_st_writer *zo_st_writer_t;

ZO_API zo_status zo_st_writer_init(zo_st_writer_t *out, const char *path);
/* Set a __metadata__ entry (replaces "format" when key is "format"). */
ZO_API zo_status zo_st_writer_set_metadata(zo_st_writer_t w, const char *key, const char *value);
/* Declare the next tensor; all declarations come before the first write. */
ZO_API zo_status zo_st_writer_declare(zo_st_writer_t w, const char *name, zo_dtype dtype, int ndim,
                                      const int64_t *shape);
/* Append n bytes of the tensor name, which must be the first declared tensor
 * that is not complete yet; a tensor may be written in several pieces. The
 * header is written by the first call. */
ZO_API zo_status zo_st_writer_write(zo_st_writer_t w, const char *name, const void *data, size_t n);
/* Check that every tensor is complete, then make the file durable under its
 * final name. */
ZO_API zo_status zo_st_writer_commit(zo_st_writer_t w);
/* Accepts NULL; an uncommitted file is discarded (its temporary removed). */
ZO_API void zo_st_writer_free(zo_st_writer_t w);

/* ---- reader ---- */

typedef struct zo_st_reader *zo_st_reader_t;

ZO_API zo_status zo_st_reader_open(zo_st_reader_t *out, const char *path);
ZO_API void zo_st_reader_free(zo_st_reader_t r);
ZO_API size_t zo_st_reader_count(zo_st_reader_t r);
/* The i-th tensor in data order (ascending offsets). */
ZO_API zo_status zo_st_reader_at(zo_st_reader_t r, size_t i, zo_st_tensor_info *out);
/* By name: ZO_ERR_NOT_FOUND names the nearest existing name. */
ZO_API zo_status zo_st_reader_find(zo_st_reader_t r, const char *name, zo_st_tensor_info *out);
/* By name, checking dtype and shape: ZO_ERR_INVALID_ARG names the expected
 * and found dtype or shape. out may be NULL. */
ZO_API zo_status zo_st_reader_expect(zo_st_reader_t r, const char *name, zo_dtype dtype, int ndim,
                                     const int64_t *shape, zo_st_tensor_info *out);
/* A __metadata__ value, or NULL. */
ZO_API const char *zo_st_reader_metadata(zo_st_reader_t r, const char *key);

/* The checksum zoffload's checkpoints record for each tensor's bytes (as
 * stored in the file): xxh64 with seed 0.
 * For readers that have no xxHash of their own (the Python front end). */
ZO_API uint64_t zo_st_checksum(const void *data, size_t n);

/* ---- Hugging Face LLaMA tensor names ---- */

typedef enum zo_llama_role {
    ZO_LLAMA_EMBED_TOKENS = 0, /* model.embed_tokens.weight        [vocab, hidden] */
    ZO_LLAMA_Q_PROJ,           /* model.layers.N.self_attn.q_proj.weight [heads*hd, hidden] */
    ZO_LLAMA_K_PROJ,           /* ...k_proj.weight [kv_heads*hd, hidden] */
    ZO_LLAMA_V_PROJ,           /* ...v_proj.weight [kv_heads*hd, hidden] */
    ZO_LLAMA_O_PROJ,           /* ...o_proj.weight [hidden, heads*hd] */
    ZO_LLAMA_GATE_PROJ,        /* model.layers.N.mlp.gate_proj.weight [inter, hidden] */
    ZO_LLAMA_UP_PROJ,          /* ...up_proj.weight [inter, hidden] */
    ZO_LLAMA_DOWN_PROJ,        /* ...down_proj.weight [hidden, inter] */
    ZO_LLAMA_INPUT_LAYERNORM,  /* model.layers.N.input_layernorm.weight [hidden] */
    ZO_LLAMA_POST_ATTENTION_LAYERNORM, /* model.layers.N.post_attention_layernorm.weight [hidden] */
    ZO_LLAMA_FINAL_NORM,               /* model.norm.weight [hidden] */
    ZO_LLAMA_LM_HEAD,                  /* lm_head.weight [vocab, hidden] */
    ZO_LLAMA_ROLE_COUNT_
} zo_llama_role;

typedef struct zo_llama_dims {
    size_t struct_size;
    int64_t vocab_size, hidden_size, intermediate_size;
    int64_t num_heads, num_kv_heads; /* head_dim = hidden_size / num_heads */
    int64_t num_layers;
} zo_llama_dims;

#define ZO_LLAMA_DIMS_INIT                                                                         \
    {                                                                                              \
        .struct_size = sizeof(zo_llama_dims)                                                       \
    }

/* Whether the role belongs to a decoder layer (needs a layer index). */
ZO_API int zo_llama_role_is_per_layer(zo_llama_role role);
/* The tensor name for role (layer ignored for global roles) into buf. */
ZO_API zo_status zo_llama_tensor_name(zo_llama_role role, int64_t layer, char *buf, size_t cap);
/* The inverse: role and layer (-1 for global roles) of a Hugging Face name. */
ZO_API zo_status zo_llama_parse_name(const char *name, zo_llama_role *role, int64_t *layer);
/* The tensor's shape in Hugging Face layout ([out, in] for projections). */
ZO_API zo_status zo_llama_tensor_shape(const zo_llama_dims *dims, zo_llama_role role, int *ndim,
                                       int64_t shape[2]);

#ifdef __cplusplus
}
#endif
#endif
