/* zo-train's data: text and token files, the split, and the shuffled order. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo/file.h"
#include "zo/units.h"
#include "zt_error.h"

/* The epoch's window order: a keyed bijection on [0, n) computed per window
 * (a Feistel network over the smallest even number of bits covering n,
 * values >= n walked on through it), so the order takes no memory however
 * large the file: a table of 8 bytes per window was 1.7 GB for 6 GB of text,
 * outside --host-mem, and took 40 s to shuffle for 20 GB before step 1. */
typedef struct zt_order {
    uint64_t n, key, mask;
    int half; /* bits per half */
} zt_order;

struct zt_data {
    zt_data_info info;
    int seq;
    const unsigned char *map;
    size_t map_bytes;
    const unsigned char *ids; /* the first id */
    zt_order order;           /* the current epoch's window order */
    uint64_t cursor, epoch, seed;
};

static uint64_t rd_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void wr_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

static int32_t token_at(const zt_data *d, uint64_t i)
{
    return (int32_t)rd_le(d->ids + i * (uint64_t)d->info.id_bytes, d->info.id_bytes);
}

static uint64_t splitmix64(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Four rounds make a keyed permutation of the 2 * half-bit values that is
 * pseudo-random to any test a training order meets (Luby-Rackoff). */
static uint64_t feistel(const zt_order *o, uint64_t x)
{
    uint64_t l = x >> o->half, r = x & o->mask;
    for (uint64_t round = 0; round < 4; round++) {
        uint64_t st = o->key ^ (r * 0xD6E8FEB86659FD93ull + round);
        uint64_t t = l ^ (splitmix64(&st) & o->mask);
        l = r;
        r = t;
    }
    return l << o->half | r;
}

/* The i-th window of the epoch (i < n): the domain is below 4n, so the walk
 * takes fewer than 4 steps on average, and ends because i itself is < n. */
static uint64_t order_at(const zt_order *o, uint64_t i)
{
    uint64_t x = i;
    do
        x = feistel(o, x);
    while (x >= o->n);
    return x;
}

static void shuffle_epoch(zt_data *d)
{
    uint64_t n = d->info.train_windows, st = d->seed * 0x9E3779B97F4A7C15ull + d->epoch;
    int bits = 2;
    while (bits < 64 && (1ull << bits) < n)
        bits += 2;
    d->order = (zt_order){.n = n, .key = splitmix64(&st), .half = bits / 2};
    d->order.mask = (1ull << d->order.half) - 1;
    d->cursor = 0;
}

/* A token file's header: fills the id width, count and vocabulary. */
static zo_status parse_header(zt_data *d, const char *path)
{
    const unsigned char *h = d->map;
    if (d->map_bytes < ZT_TOKENS_HEADER_BYTES)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s: token file is %zu bytes, shorter than its %d-byte header", path,
                       d->map_bytes, ZT_TOKENS_HEADER_BYTES);
    uint64_t version = rd_le(h + 8, 4), width = rd_le(h + 12, 4), n = rd_le(h + 16, 8),
             vocab = rd_le(h + 24, 4);
    if (version != ZT_TOKENS_VERSION)
        return zt_fail(ZO_ERR_CORRUPT,
                       "%s: token file version %llu; this zo-train reads version %d", path,
                       (unsigned long long)version, ZT_TOKENS_VERSION);
    if (width != 2 && width != 4)
        return zt_fail(ZO_ERR_CORRUPT, "%s: %llu bytes per id; expected 2 (uint16) or 4 (uint32)",
                       path, (unsigned long long)width);
    if (vocab == 0 || vocab > INT32_MAX)
        return zt_fail(ZO_ERR_CORRUPT, "%s: vocabulary size %llu; expected 1..%d", path,
                       (unsigned long long)vocab, INT32_MAX);
    uint64_t payload = d->map_bytes - ZT_TOKENS_HEADER_BYTES;
    if (n > payload / width || n * width != payload)
        return zt_fail(
            ZO_ERR_CORRUPT, "%s: header says %llu ids of %llu bytes but %llu bytes follow it", path,
            (unsigned long long)n, (unsigned long long)width, (unsigned long long)payload);
    d->info =
        (zt_data_info){.binary = 1, .id_bytes = (int)width, .vocab = (int)vocab, .n_tokens = n};
    d->ids = d->map + ZT_TOKENS_HEADER_BYTES;
    return ZO_OK;
}

enum { CHECK_SLICE = 1 << 24 }; /* ids between looks at the clock and the stop hook */

static zo_status check_slice(const zt_data *d, const char *path, uint64_t from, uint64_t to)
{
    for (uint64_t i = from; i < to; i++)
        if ((uint64_t)(uint32_t)token_at(d, i) >= (uint64_t)d->info.vocab)
            return zt_fail(ZO_ERR_CORRUPT,
                           "%s: id %u at position %llu is not below the vocabulary size %d", path,
                           (unsigned)token_at(d, i), (unsigned long long)i, d->info.vocab);
    return ZO_OK;
}

/* Every id below the vocabulary: a bad id is reported here, not as a NaN
 * loss a thousand steps later. In slices, so a long check reports progress
 * and a stop signal ends it. */
static zo_status check_ids(const zt_data *d, const char *path, const zt_data_hooks *h)
{
    uint64_t n = d->info.n_tokens;
    double next_report = zo_now_s() + 1.0;
    for (uint64_t at = 0; at < n; at += CHECK_SLICE) {
        if (h && h->stop && h->stop(h->ctx))
            return zt_fail(ZO_ERR_STATE, "%s: stopped while checking its ids (%llu of %llu)", path,
                           (unsigned long long)at, (unsigned long long)n);
        ZT_TRY(check_slice(d, path, at, n - at < CHECK_SLICE ? n : at + CHECK_SLICE));
        if (h && h->progress && zo_now_s() >= next_report) {
            h->progress(h->ctx, n - at < CHECK_SLICE ? n : at + CHECK_SLICE, n);
            next_report = zo_now_s() + 1.0;
        }
    }
    return ZO_OK;
}

static zo_status map_file(zt_data *d, const char *path)
{
    int fd;
    if (zo_file_open_read(path, &fd) < 0)
        return zt_fail(zo_last_error_status(), "the data file: %s", zt_lib_message());
    struct stat sb;
    zo_status st = ZO_OK;
    if (fstat(fd, &sb) != 0)
        st = zt_fail(ZO_ERR_IO, "cannot stat data file %s: %s", path, strerror(errno));
    else if (sb.st_size == 0)
        st = zt_fail(ZO_ERR_INVALID_ARG, "data file %s is empty", path);
    if (st >= 0) {
        d->map_bytes = (size_t)sb.st_size;
        void *p = mmap(NULL, d->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            st = zt_fail(ZO_ERR_IO, "cannot map data file %s: %s", path, strerror(errno));
        else
            d->map = p;
    }
    close(fd);
    return st;
}

static zo_status split(zt_data *d, const char *path, double val_fraction)
{
    zt_data_info *in = &d->info;
    uint64_t n_val = (uint64_t)((double)in->n_tokens * val_fraction);
    in->n_train = in->n_tokens - n_val;
    in->train_windows = in->n_train > 0 ? (in->n_train - 1) / (uint64_t)d->seq : 0;
    in->val_windows = n_val > 0 ? (n_val - 1) / (uint64_t)d->seq : 0;
    if (in->train_windows == 0 || (val_fraction > 0 && in->val_windows == 0))
        return zt_fail(
            ZO_ERR_INVALID_ARG,
            "%s: %llu tokens give %llu training and %llu validation windows of %d+1 tokens; each "
            "split needs at least one (use a shorter --seq or a longer file)",
            path, (unsigned long long)in->n_tokens, (unsigned long long)in->train_windows,
            (unsigned long long)in->val_windows, d->seq);
    shuffle_epoch(d);
    return ZO_OK;
}

/* A text file that starts like a token file whose magic was damaged: the
 * magic within two bytes of ZOTOKENS, or a valid header behind another magic.
 * Trained as bytes it would give a model of the file's binary, silently. */
static int damaged_magic(const zt_data *d)
{
    if (d->map_bytes < ZT_TOKENS_HEADER_BYTES)
        return 0;
    int differ = 0;
    for (int i = 0; i < 8; i++)
        differ += d->map[i] != (unsigned char)ZT_TOKENS_MAGIC[i];
    const unsigned char *h = d->map;
    uint64_t width = rd_le(h + 12, 4), n = rd_le(h + 16, 8);
    int header = rd_le(h + 8, 4) == ZT_TOKENS_VERSION && (width == 2 || width == 4) &&
                 n == (d->map_bytes - ZT_TOKENS_HEADER_BYTES) / width;
    return differ <= 2 || header;
}

static zo_status refuse_damaged(const zt_data *d, const char *path)
{
    char seen[8 * 4 + 1];
    size_t at = 0;
    for (int i = 0; i < 8; i++) {
        unsigned char c = d->map[i];
        at += (size_t)snprintf(seen + at, sizeof seen - at,
                               c >= 32 && c < 127 && c != '\\' ? "%c" : "\\x%02x", c);
    }
    return zt_fail(ZO_ERR_CORRUPT,
                   "%s starts like a token file with a damaged magic ('%s', expected '%s'): "
                   "refused rather than trained as text; rewrite it with "
                   "tools/data/prepare_tokens.py",
                   path, seen, ZT_TOKENS_MAGIC);
}

static zo_status data_load(zt_data *d, const char *path, double val_fraction,
                           const zt_data_hooks *h)
{
    ZT_TRY(map_file(d, path));
    if (d->map_bytes >= 8 && memcmp(d->map, ZT_TOKENS_MAGIC, 8) == 0) {
        ZT_TRY(parse_header(d, path));
        madvise((void *)d->map, d->map_bytes, MADV_SEQUENTIAL);
        ZT_TRY(check_ids(d, path, h));
    } else if (damaged_magic(d)) {
        return refuse_damaged(d, path);
    } else {
        d->info =
            (zt_data_info){.binary = 0, .id_bytes = 1, .vocab = 256, .n_tokens = d->map_bytes};
        d->ids = d->map;
    }
    /* windows are read in a shuffled order: no readahead around each */
    madvise((void *)d->map, d->map_bytes, MADV_RANDOM);
    return split(d, path, val_fraction);
}

zo_status zt_data_open(zt_data **out, const char *path, int seq, double val_fraction, uint64_t seed)
{
    return zt_data_open_with(out, path, seq, val_fraction, seed, NULL);
}

zo_status zt_data_open_with(zt_data **out, const char *path, int seq, double val_fraction,
                            uint64_t seed, const zt_data_hooks *hooks)
{
    if (!path || seq <= 0 || !(val_fraction >= 0.0 && val_fraction < 1.0))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "data: path %s, seq %d (> 0), validation fraction %g (in [0, 1))",
                       path ? path : "(null)", seq, val_fraction);
    zt_data *d = calloc(1, sizeof *d);
    if (!d)
        return zt_fail(ZO_ERR_NO_MEMORY, "data");
    d->seq = seq;
    d->seed = seed;
    zo_status st = data_load(d, path, val_fraction, hooks);
    if (st < 0) {
        zt_data_free(d);
        return st;
    }
    *out = d;
    return ZO_OK;
}

void zt_data_free(zt_data *d)
{
    if (!d)
        return;
    if (d->map)
        munmap((void *)d->map, d->map_bytes);
    free(d);
}

void zt_data_get_info(const zt_data *d, zt_data_info *out)
{
    *out = d->info;
}

static void window(const zt_data *d, uint64_t start, int32_t *in, int32_t *tgt)
{
    for (int t = 0; t < d->seq; t++) {
        in[t] = token_at(d, start + (uint64_t)t);
        tgt[t] = token_at(d, start + (uint64_t)t + 1);
    }
}

void zt_data_next_train(zt_data *d, int32_t *inputs, int32_t *targets, int n)
{
    for (int j = 0; j < n; j++) {
        if (d->cursor == d->info.train_windows) {
            d->epoch++;
            shuffle_epoch(d);
        }
        uint64_t w = order_at(&d->order, d->cursor++);
        window(d, w * (uint64_t)d->seq, inputs + (size_t)j * d->seq, targets + (size_t)j * d->seq);
    }
}

void zt_data_get_position(const zt_data *d, zt_data_position *out)
{
    out->seed = d->seed;
    out->epoch = d->epoch;
    out->cursor = d->cursor;
}

zo_status zt_data_set_position(zt_data *d, const zt_data_position *pos)
{
    if (pos->cursor > d->info.train_windows)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "data position: window %llu of an epoch of %llu training windows (the data "
                       "or --seq differs from the run that saved it)",
                       (unsigned long long)pos->cursor, (unsigned long long)d->info.train_windows);
    d->seed = pos->seed;
    d->epoch = pos->epoch;
    shuffle_epoch(d);
    d->cursor = pos->cursor;
    return ZO_OK;
}

void zt_data_val(const zt_data *d, uint64_t first, int32_t *inputs, int32_t *targets, int n)
{
    for (int j = 0; j < n; j++)
        window(d, d->info.n_train + (first + (uint64_t)j) * (uint64_t)d->seq,
               inputs + (size_t)j * d->seq, targets + (size_t)j * d->seq);
}

zo_status zt_data_write_tokens(const char *path, const uint32_t *ids, uint64_t n, int id_bytes,
                               int vocab)
{
    if ((id_bytes != 2 && id_bytes != 4) || vocab <= 0 || (id_bytes == 2 && vocab > 65536))
        return zt_fail(ZO_ERR_INVALID_ARG, "token file: %d bytes per id with vocabulary %d",
                       id_bytes, vocab);
    FILE *f = fopen(path, "wb");
    if (!f)
        return zt_fail(ZO_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    unsigned char h[ZT_TOKENS_HEADER_BYTES] = {0}, b[4];
    memcpy(h, ZT_TOKENS_MAGIC, 8);
    wr_le(h + 8, ZT_TOKENS_VERSION, 4);
    wr_le(h + 12, (uint64_t)id_bytes, 4);
    wr_le(h + 16, n, 8);
    wr_le(h + 24, (uint64_t)vocab, 4);
    int ok = fwrite(h, sizeof h, 1, f) == 1;
    for (uint64_t i = 0; ok && i < n; i++) {
        wr_le(b, ids[i], id_bytes);
        ok = fwrite(b, (size_t)id_bytes, 1, f) == 1;
    }
    if (fclose(f) != 0)
        ok = 0;
    if (!ok)
        return zt_fail(ZO_ERR_IO, "writing %s: %s", path, strerror(errno));
    return ZO_OK;
}
