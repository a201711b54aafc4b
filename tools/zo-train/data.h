/* zo-train's data: a token stream cut into training and validation windows.
 *
 * Two file formats:
 *  - text (any file not starting with the token-file magic): one token per
 *    byte, vocabulary 256 (a byte-level tokenizer);
 *  - a token file, for corpora tokenized elsewhere: a 32-byte little-endian
 *    header, then the ids:
 *        offset  size  field
 *             0     8  magic "ZOTOKENS"
 *             8     4  version, 1
 *            12     4  bytes per id: 2 (uint16) or 4 (uint32)
 *            16     8  number of ids
 *            24     4  vocabulary size (every id must be below it)
 *            28     4  reserved, 0
 *            32        the ids
 *    zt_data_write_tokens writes one (tools and tests use it).
 *
 * The last val_fraction of the stream is the validation split. Training
 * samples are the windows of seq+1 tokens starting at multiples of seq in the
 * training split, visited in an order shuffled per epoch from the seed (a
 * Feistel permutation keyed by splitmix64, computed per window): the same
 * seed gives the same batches.
 * Validation windows are taken in order from the start of the split. */
#ifndef ZT_DATA_H
#define ZT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "zo/status.h"

#define ZT_TOKENS_MAGIC "ZOTOKENS"
enum { ZT_TOKENS_HEADER_BYTES = 32, ZT_TOKENS_VERSION = 1 };

typedef struct zt_data zt_data;

typedef struct zt_data_info {
    int binary;        /* 1: a token file; 0: text read byte by byte */
    int id_bytes;      /* 1 (text), 2 or 4 */
    int vocab;         /* 256 for text */
    uint64_t n_tokens; /* the whole stream */
    uint64_t n_train;  /* tokens of the training split (the rest is validation) */
    uint64_t train_windows, val_windows;
} zt_data_info;

/* Open path (mapped, not copied) for windows of seq+1 tokens. Fails, naming
 * the file, when it cannot be read, a token file's header or ids are wrong,
 * or a split is too short for one window. The memory it takes does not grow
 * with the file: the file is mapped (its pages are the page cache's), and the
 * shuffled order is computed per window. */
zo_status zt_data_open(zt_data **out, const char *path, int seq, double val_fraction,
                       uint64_t seed);

/* What a caller learns of the one long part of opening, a token file's check
 * of every id (seconds for a file of gigabytes): progress, called about once
 * a second with the ids checked and their number, and stop, asked between
 * slices: non-zero ends the check (ZO_ERR_STATE, "stopped" in the message).
 * Either may be NULL. */
typedef struct zt_data_hooks {
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    int (*stop)(void *ctx);
    void *ctx;
} zt_data_hooks;

zo_status zt_data_open_with(zt_data **out, const char *path, int seq, double val_fraction,
                            uint64_t seed, const zt_data_hooks *hooks);
void zt_data_free(zt_data *d);
void zt_data_get_info(const zt_data *d, zt_data_info *out);

/* The next n training windows: inputs[j*seq + t] = w_j[t], targets = w_j[t+1]. */
void zt_data_next_train(zt_data *d, int32_t *inputs, int32_t *targets, int n);
/* Where the training order stands: the seed, the epoch (each reshuffles the
 * windows) and how many windows of it were taken. */
typedef struct zt_data_position {
    uint64_t seed, epoch, cursor;
} zt_data_position;

void zt_data_get_position(const zt_data *d, zt_data_position *out);
/* Continue from a position taken by zt_data_get_position (a cursor beyond
 * the training windows is refused). */
zo_status zt_data_set_position(zt_data *d, const zt_data_position *pos);

/* Validation windows first..first+n-1 (the caller keeps first+n <= val_windows). */
void zt_data_val(const zt_data *d, uint64_t first, int32_t *inputs, int32_t *targets, int n);

/* Write a token file (id_bytes 2 or 4). */
zo_status zt_data_write_tokens(const char *path, const uint32_t *ids, uint64_t n, int id_bytes,
                               int vocab);

#endif
