/* The checksums of a checkpoint's tensors: xxh64 of each tensor's bytes as
 * stored in its safetensors file, the same hash the swap extents carry.
 *
 *   DIR/step-N/checksums.json                     one rank's run
 *   DIR/step-N/checksums-0000{R+1}-of-0000{N}.json rank R's tensors across N ranks
 *
 *   {"format": "zoffload-checksums", "algorithm": "xxh64",
 *    "files": {"model.safetensors": {"model.norm.weight": "0123456789abcdef", ...},
 *              "optimizer.safetensors": {...}}}
 *
 * Each rank records what it writes while streaming it (no second pass over
 * the data) and writes its own list (atomically) before rank 0 renames the
 * checkpoint into place: a checkpoint under its final name always has them.
 * A loader reads every list in the directory and verifies each tensor it
 * maps before anything reaches the engine. A checkpoint with no list (saved
 * before checksums existed) loads with a warning. */
#ifndef ZT_CKPT_SUMS_H
#define ZT_CKPT_SUMS_H

#include <stddef.h>

#include "zo/status.h"

#define ZT_SUMS_BASE "checksums" /* checksums.json, checksums-0000R-of-0000N.json */

typedef struct zt_sums zt_sums;

/* An empty list to record into. */
zo_status zt_sums_new(zt_sums **out);
/* Record tensor name of file (a base name) as n bytes at data. */
zo_status zt_sums_add(zt_sums *s, const char *file, const char *name, const void *data, size_t n);
/* Write the list as DIR/checksums.json (ranks 1) or rank's shard name. */
zo_status zt_sums_write(const zt_sums *s, const char *dir, int rank, int ranks);

/* Every list in DIR merged; *out NULL when DIR has none (an old checkpoint). */
zo_status zt_sums_read(const char *dir, zt_sums **out);
/* Tensor name of DIR/file must have its recorded hash: a mismatch, or a
 * tensor the lists do not name, fails naming the file and the tensor. */
zo_status zt_sums_verify(const zt_sums *s, const char *dir, const char *file, const char *name,
                         const void *data, size_t n);

/* 1 when the lists name file (a base name): a file of this checkpoint. */
int zt_sums_has_file(const zt_sums *s, const char *file);

void zt_sums_free(zt_sums *s);

#endif
