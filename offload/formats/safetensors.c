/* safetensors: a streaming, crash-safe writer and a validating, mapped
 * reader. See include/zo/safetensors.h. */
#include "zo/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "zo/atomic_file.h"
#include "zo/file.h"
#include "zo_internal.h"
#include "zo_strdist.h"

#define SUBSYS "checkpoint"

/* The reference implementation refuses larger headers; so do we. */
#define MAX_HEADER ((uint64_t)100 << 20)

/* The format's spelling of each dtype; NULL for ZO_DTYPE_NONE, which no file holds. */
static const char *const st_names[ZO_DTYPE_COUNT_] = {
    [ZO_DTYPE_BOOL] = "BOOL",       [ZO_DTYPE_U8] = "U8",           [ZO_DTYPE_I8] = "I8",
    [ZO_DTYPE_F8_E5M2] = "F8_E5M2", [ZO_DTYPE_F8_E4M3] = "F8_E4M3", [ZO_DTYPE_I16] = "I16",
    [ZO_DTYPE_U16] = "U16",         [ZO_DTYPE_F16] = "F16",         [ZO_DTYPE_BF16] = "BF16",
    [ZO_DTYPE_I32] = "I32",         [ZO_DTYPE_U32] = "U32",         [ZO_DTYPE_F32] = "F32",
    [ZO_DTYPE_F64] = "F64",         [ZO_DTYPE_I64] = "I64",         [ZO_DTYPE_U64] = "U64",
};

static int st_valid(zo_dtype d)
{
    return (unsigned)d < ZO_DTYPE_COUNT_ && st_names[d];
}

const char *zo_st_dtype_name(zo_dtype d)
{
    return st_valid(d) ? st_names[d] : "?";
}

zo_status zo_st_dtype_from_name(const char *name, zo_dtype *out)
{
    for (int i = 0; name && i < ZO_DTYPE_COUNT_; i++)
        if (st_names[i] && strcmp(name, st_names[i]) == 0) {
            *out = (zo_dtype)i;
            return ZO_OK;
        }
    return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "unknown safetensors dtype '%s'",
                   name ? name : "(null)");
}

/* Bytes of a tensor, or UINT64_MAX when the product overflows. */
static uint64_t tensor_bytes(zo_dtype dtype, int ndim, const int64_t *shape)
{
    uint64_t n = zo_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d && n > UINT64_MAX / d)
            return UINT64_MAX;
        n *= d;
    }
    return n;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* ---- writer ---- */

typedef struct st_decl {
    char *name;
    zo_dtype dtype;
    int ndim;
    int64_t shape[ZO_ST_MAX_DIMS];
    uint64_t begin, nbytes, written;
} st_decl;

struct zo_st_writer {
    char *path;
    json_t *meta;
    st_decl *t;
    size_t n, cap;
    size_t cur; /* first tensor not complete */
    uint64_t data_len;
    int started, failed;
    zo_atomic_file_t file;
};

zo_status zo_st_writer_init(zo_st_writer_t *out, const char *path)
{
    if (!out || !path || !*path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_writer_init: NULL or empty argument");
    struct zo_st_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = strdup(path);
        w->meta = json_pack("{ss}", "format", "pt");
    }
    if (!w || !w->path || !w->meta) {
        zo_st_writer_free(w);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_st_writer_init '%s': out of host memory",
                       path);
    }
    *out = w;
    return ZO_OK;
}

void zo_st_writer_free(zo_st_writer_t w)
{
    if (!w)
        return;
    zo_atomic_file_free(w->file);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    free(w->path);
    free(w);
}

static zo_status check_declaring(zo_st_writer_t w, const char *op)
{
    if (w->started)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS, "%s on '%s': tensor data is already being written", op,
                       w->path);
    return ZO_OK;
}

zo_status zo_st_writer_set_metadata(zo_st_writer_t w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_writer_set_metadata: NULL argument");
    ZO_TRY(check_declaring(w, "zo_st_writer_set_metadata"));
    if (json_object_set_new(w->meta, key, json_string(value)) < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "metadata '%s' of '%s': key and value must be UTF-8 text", key, w->path);
    return ZO_OK;
}

static zo_status check_decl(zo_st_writer_t w, const char *name, zo_dtype dtype, int ndim,
                            const int64_t *shape)
{
    if (!*name || strcmp(name, "__metadata__") == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "'%s': invalid tensor name '%s'", w->path, name);
    if (!st_valid(dtype))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "tensor '%s': invalid dtype %d", name,
                       (int)dtype);
    if (ndim < 0 || ndim > ZO_ST_MAX_DIMS || (ndim && !shape))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "tensor '%s': ndim %d is not in [0, %d]", name,
                       ndim, ZO_ST_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                           "tensor '%s': dimension %d is negative (%lld)", name, i,
                           (long long)shape[i]);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return ZO_FAIL(ZO_ERR_EXISTS, SUBSYS, "tensor '%s' is declared twice in '%s'", name,
                           w->path);
    uint64_t nb = tensor_bytes(dtype, ndim, shape);
    if (nb == UINT64_MAX || w->data_len > UINT64_MAX / 2 - nb)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "tensor '%s': size overflows", name);
    return ZO_OK;
}

zo_status zo_st_writer_declare(zo_st_writer_t w, const char *name, zo_dtype dtype, int ndim,
                               const int64_t *shape)
{
    if (!w || !name)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_writer_declare: NULL argument");
    ZO_TRY(check_declaring(w, "zo_st_writer_declare"));
    ZO_TRY(check_decl(w, name, dtype, ndim, shape));
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        st_decl *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_st_writer_declare: out of host memory");
        w->t = t;
        w->cap = cap;
    }
    st_decl *d = &w->t[w->n];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    if (!d->name)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_st_writer_declare: out of host memory");
    d->dtype = dtype;
    d->ndim = ndim;
    if (ndim)
        memcpy(d->shape, shape, (size_t)ndim * sizeof *shape);
    d->nbytes = tensor_bytes(dtype, ndim, shape);
    d->begin = w->data_len;
    w->data_len += d->nbytes;
    w->n++;
    return ZO_OK;
}

static json_t *decl_json(const st_decl *d)
{
    json_t *shape = json_array();
    for (int i = 0; shape && i < d->ndim; i++)
        json_array_append_new(shape, json_integer(d->shape[i]));
    return json_pack("{ss so s[II]}", "dtype", zo_st_dtype_name(d->dtype), "shape", shape,
                     "data_offsets", (json_int_t)d->begin, (json_int_t)(d->begin + d->nbytes));
}

/* The header JSON, padded with spaces to a multiple of 8 bytes. */
static char *build_header(zo_st_writer_t w, size_t *len)
{
    json_t *h = json_object();
    if (h && json_object_size(w->meta))
        json_object_set(h, "__metadata__", w->meta);
    for (size_t i = 0; h && i < w->n; i++) {
        json_t *e = decl_json(&w->t[i]);
        if (!e || json_object_set_new(h, w->t[i].name, e) < 0) {
            json_decref(h);
            h = NULL;
        }
    }
    char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!text)
        return NULL;
    size_t n = strlen(text), padded = zo_round_up(n, 8);
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static void skip_complete(zo_st_writer_t w)
{
    while (w->cur < w->n && w->t[w->cur].written == w->t[w->cur].nbytes)
        w->cur++;
}

static zo_status start_file(zo_st_writer_t w)
{
    size_t len = 0;
    char *header = build_header(w, &len);
    if (!header)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "'%s': out of host memory building the header",
                       w->path);
    zo_status st = zo_atomic_file_open(&w->file, w->path);
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)((uint64_t)len >> (8 * i));
    if (st == ZO_OK)
        st = zo_atomic_file_write(w->file, le, sizeof le);
    if (st == ZO_OK)
        st = zo_atomic_file_write(w->file, header, len);
    free(header);
    w->started = 1;
    if (st < 0)
        w->failed = 1;
    skip_complete(w);
    return st;
}

static zo_status check_usable(zo_st_writer_t w, const char *op)
{
    if (w->failed)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS,
                       "%s on '%s': an earlier error left the file incomplete", op, w->path);
    return ZO_OK;
}

static zo_status out_of_order(zo_st_writer_t w, const char *name)
{
    if (w->cur == w->n)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS,
                       "tensor '%s': every declared tensor of '%s' is already complete", name,
                       w->path);
    const st_decl *d = &w->t[w->cur];
    return ZO_FAIL(
        ZO_ERR_STATE, SUBSYS,
        "tensor '%s' written out of order in '%s': '%s' comes first and still needs %llu of "
        "its %llu bytes",
        name, w->path, d->name, (unsigned long long)(d->nbytes - d->written),
        (unsigned long long)d->nbytes);
}

zo_status zo_st_writer_write(zo_st_writer_t w, const char *name, const void *data, size_t n)
{
    if (!w || !name || (!data && n))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_writer_write: NULL argument");
    ZO_TRY(check_usable(w, "zo_st_writer_write"));
    if (!w->started)
        ZO_TRY(start_file(w));
    if (w->cur == w->n || strcmp(w->t[w->cur].name, name) != 0)
        return out_of_order(w, name);
    st_decl *d = &w->t[w->cur];
    if (n > d->nbytes - d->written)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "tensor '%s' in '%s': %zu bytes written, but only %llu of its %llu bytes remain", name,
            w->path, n, (unsigned long long)(d->nbytes - d->written),
            (unsigned long long)d->nbytes);
    zo_status st = zo_atomic_file_write(w->file, data, n);
    if (st < 0) {
        w->failed = 1;
        return st;
    }
    d->written += n;
    skip_complete(w);
    return ZO_OK;
}

zo_status zo_st_writer_commit(zo_st_writer_t w)
{
    if (!w)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_writer_commit: NULL writer");
    ZO_TRY(check_usable(w, "zo_st_writer_commit"));
    if (!w->started)
        ZO_TRY(start_file(w));
    if (w->cur < w->n) {
        const st_decl *d = &w->t[w->cur];
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS,
                       "'%s' cannot be committed: tensor '%s' has %llu of its %llu bytes", w->path,
                       d->name, (unsigned long long)d->written, (unsigned long long)d->nbytes);
    }
    zo_status st = zo_atomic_file_commit(w->file);
    if (st < 0)
        w->failed = 1;
    return st;
}

/* ---- reader ---- */

typedef struct st_entry {
    const char *name; /* a key of the parsed header */
    zo_dtype dtype;
    int ndim;
    int64_t shape[ZO_ST_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

struct zo_st_reader {
    char *path;
    unsigned char *map;
    size_t map_len;
    uint64_t data_start, data_len;
    json_t *header;
    json_t *meta;             /* borrowed from header */
    st_entry *t;              /* ascending offsets */
    const st_entry **by_name; /* into t, sorted by name */
    size_t n;
};

static zo_status corrupt(zo_st_reader_t r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A malformed file: the message names the file first. */
static zo_status corrupt(zo_st_reader_t r, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ZO_FAIL(ZO_ERR_CORRUPT, SUBSYS, "'%s': %s", r->path, msg);
}

static zo_status map_file(zo_st_reader_t r)
{
    int fd;
    ZO_TRY(zo_file_open_read(r->path, &fd));
    struct stat sb;
    zo_status st = ZO_OK;
    if (fstat(fd, &sb) < 0)
        st = ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot stat '%s': %s", r->path, strerror(errno));
    else if (sb.st_size < 8)
        st = ZO_FAIL(
            ZO_ERR_CORRUPT, SUBSYS,
            "'%s' is %lld bytes: too short for a safetensors file (the 8-byte header length is "
            "missing)",
            r->path, (long long)sb.st_size);
    if (st == ZO_OK) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            st = ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot map '%s': %s", r->path, strerror(errno));
        else {
            r->map = m;
            r->map_len = (size_t)sb.st_size;
        }
    }
    close(fd);
    return st;
}

static zo_status parse_header(zo_st_reader_t r)
{
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)r->map[i] << (8 * i);
    if (n > MAX_HEADER)
        return ZO_FAIL(ZO_ERR_CORRUPT, SUBSYS, "'%s': header length %llu exceeds the 100 MiB limit",
                       r->path, (unsigned long long)n);
    if (n > r->map_len - 8)
        return ZO_FAIL(
            ZO_ERR_CORRUPT, SUBSYS,
            "'%s': header length %llu exceeds the %llu bytes after the length field (truncated "
            "file?)",
            r->path, (unsigned long long)n, (unsigned long long)(r->map_len - 8));
    json_error_t err;
    r->header = json_loadb((const char *)r->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!r->header)
        return ZO_FAIL(ZO_ERR_CORRUPT, SUBSYS,
                       "'%s': header is not valid JSON: %s (at byte %d of the header)", r->path,
                       err.text, err.position);
    if (!json_is_object(r->header))
        return corrupt(r, "the header is not a JSON object");
    r->data_start = 8 + n;
    r->data_len = r->map_len - r->data_start;
    return ZO_OK;
}

static zo_status check_metadata(zo_st_reader_t r, json_t *meta)
{
    if (!json_is_object(meta))
        return corrupt(r, "__metadata__ is not an object");
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v)
    {
        if (!json_is_string(v))
            return corrupt(r, "__metadata__ value '%s' is not a string", key);
    }
    r->meta = meta;
    return ZO_OK;
}

static zo_status parse_shape(zo_st_reader_t r, const char *name, json_t *shape, st_entry *e)
{
    if (!json_is_array(shape) || json_array_size(shape) > ZO_ST_MAX_DIMS)
        return corrupt(r, "tensor '%s': 'shape' is not an array of at most %d dimensions", name,
                       ZO_ST_MAX_DIMS);
    e->ndim = (int)json_array_size(shape);
    for (int i = 0; i < e->ndim; i++) {
        json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return corrupt(
                r, "tensor '%s': 'shape' holds a value that is not a non-negative integer", name);
        e->shape[i] = json_integer_value(d);
    }
    return ZO_OK;
}

static zo_status parse_offsets(zo_st_reader_t r, const char *name, json_t *off, st_entry *e)
{
    json_t *b = json_array_get(off, 0), *x = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(x) || json_integer_value(b) < 0 ||
        json_integer_value(x) < json_integer_value(b))
        return corrupt(r, "tensor '%s': 'data_offsets' is not [begin, end] with 0 <= begin <= end",
                       name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(x);
    return ZO_OK;
}

static zo_status check_entry_size(zo_st_reader_t r, const st_entry *e)
{
    uint64_t need = tensor_bytes(e->dtype, e->ndim, e->shape);
    char shape[160];
    fmt_shape(shape, sizeof shape, e->ndim, e->shape);
    if (need != e->end - e->begin)
        return ZO_FAIL(
            ZO_ERR_CORRUPT, SUBSYS,
            "'%s': tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but shape %s of %s "
            "needs %llu",
            r->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
            (unsigned long long)(e->end - e->begin), shape, zo_st_dtype_name(e->dtype),
            (unsigned long long)need);
    if (e->end > r->data_len)
        return ZO_FAIL(
            ZO_ERR_CORRUPT, SUBSYS,
            "'%s': tensor '%s': data_offsets [%llu, %llu] extend past the end of the data "
            "section (%llu bytes; truncated file?)",
            r->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
            (unsigned long long)r->data_len);
    return ZO_OK;
}

static zo_status parse_entry(zo_st_reader_t r, const char *name, json_t *v, st_entry *e)
{
    if (!json_is_object(v))
        return corrupt(r, "tensor '%s': its entry is not an object", name);
    e->name = name;
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    if (!dt)
        return corrupt(r, "tensor '%s': 'dtype' is missing or not a string", name);
    int found = 0;
    for (int i = 0; i < ZO_DTYPE_COUNT_ && !found; i++)
        if (st_names[i] && strcmp(dt, st_names[i]) == 0) {
            e->dtype = (zo_dtype)i;
            found = 1;
        }
    if (!found)
        return corrupt(r, "tensor '%s': unknown dtype '%s'", name, dt);
    ZO_TRY(parse_shape(r, name, json_object_get(v, "shape"), e));
    ZO_TRY(parse_offsets(r, name, json_object_get(v, "data_offsets"), e));
    return check_entry_size(r, e);
}

static int by_offset(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* The spec requires the tensors to tile the data section exactly. */
static zo_status check_tiling(zo_st_reader_t r)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < r->n; i++) {
        const st_entry *e = &r->t[i];
        if (e->begin < pos)
            return ZO_FAIL(ZO_ERR_CORRUPT, SUBSYS,
                           "'%s': tensors '%s' and '%s' overlap (data_offsets begin at %llu, "
                           "before the previous tensor ends at %llu)",
                           r->path, r->t[i - 1].name, e->name, (unsigned long long)e->begin,
                           (unsigned long long)pos);
        if (e->begin > pos)
            return ZO_FAIL(ZO_ERR_CORRUPT, SUBSYS,
                           "'%s': bytes [%llu, %llu) of the data section belong to no tensor",
                           r->path, (unsigned long long)pos, (unsigned long long)e->begin);
        pos = e->end;
    }
    if (pos != r->data_len)
        return ZO_FAIL(
            ZO_ERR_CORRUPT, SUBSYS,
            "'%s': the data section has %llu bytes but its tensors cover %llu (trailing bytes)",
            r->path, (unsigned long long)r->data_len, (unsigned long long)pos);
    return ZO_OK;
}

static zo_status index_tensors(zo_st_reader_t r)
{
    size_t cap = json_object_size(r->header);
    r->t = calloc(cap ? cap : 1, sizeof *r->t);
    r->by_name = calloc(cap ? cap : 1, sizeof *r->by_name);
    if (!r->t || !r->by_name)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "'%s': out of host memory", r->path);
    const char *key;
    json_t *v;
    json_object_foreach(r->header, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            ZO_TRY(check_metadata(r, v));
        else
            ZO_TRY(parse_entry(r, key, v, &r->t[r->n++]));
    }
    qsort(r->t, r->n, sizeof *r->t, by_offset);
    ZO_TRY(check_tiling(r));
    for (size_t i = 0; i < r->n; i++)
        r->by_name[i] = &r->t[i];
    qsort(r->by_name, r->n, sizeof *r->by_name, by_name);
    return ZO_OK;
}

zo_status zo_st_reader_open(zo_st_reader_t *out, const char *path)
{
    if (!out || !path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_reader_open: NULL argument");
    struct zo_st_reader *r = calloc(1, sizeof *r);
    if (r)
        r->path = strdup(path);
    if (!r || !r->path) {
        free(r);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_st_reader_open '%s': out of host memory",
                       path);
    }
    zo_status st = map_file(r);
    if (st == ZO_OK)
        st = parse_header(r);
    if (st == ZO_OK)
        st = index_tensors(r);
    if (st < 0) {
        zo_st_reader_free(r);
        return st;
    }
    *out = r;
    return ZO_OK;
}

void zo_st_reader_free(zo_st_reader_t r)
{
    if (!r)
        return;
    if (r->map)
        munmap(r->map, r->map_len);
    json_decref(r->header);
    free(r->t);
    free(r->by_name);
    free(r->path);
    free(r);
}

size_t zo_st_reader_count(zo_st_reader_t r)
{
    return r ? r->n : 0;
}

static zo_status fill_info(zo_st_reader_t r, const st_entry *e, zo_st_tensor_info *out)
{
    if (out->struct_size != sizeof *out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_st_tensor_info.struct_size is %zu, expected %zu "
                       "(use ZO_ST_TENSOR_INFO_INIT)",
                       out->struct_size, sizeof *out);
    out->name = e->name;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memset(out->shape, 0, sizeof out->shape);
    memcpy(out->shape, e->shape, (size_t)e->ndim * sizeof e->shape[0]);
    out->nbytes = e->end - e->begin;
    out->file_offset = r->data_start + e->begin;
    out->data = r->map + out->file_offset;
    return ZO_OK;
}

zo_status zo_st_reader_at(zo_st_reader_t r, size_t i, zo_st_tensor_info *out)
{
    if (!r || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_reader_at: NULL argument");
    if (i >= r->n)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "'%s': tensor index %zu out of range (%zu tensors)", r->path, i, r->n);
    return fill_info(r, &r->t[i], out);
}

static const st_entry *lookup(zo_st_reader_t r, const char *name)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->by_name[mid]->name, name);
        if (c == 0)
            return r->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static zo_status not_found(zo_st_reader_t r, const char *name)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < r->n; i++) {
        size_t d = zo_strdist(name, r->t[i].name);
        if (d < best_d) {
            best_d = d;
            best = r->t[i].name;
        }
    }
    if (!best)
        return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS,
                       "tensor '%s' not found in '%s' (the file has no tensors)", name, r->path);
    return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS,
                   "tensor '%s' not found in '%s' (%zu tensors; nearest: '%s')", name, r->path,
                   r->n, best);
}

zo_status zo_st_reader_find(zo_st_reader_t r, const char *name, zo_st_tensor_info *out)
{
    if (!r || !name || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_reader_find: NULL argument");
    const st_entry *e = lookup(r, name);
    if (!e)
        return not_found(r, name);
    return fill_info(r, e, out);
}

zo_status zo_st_reader_expect(zo_st_reader_t r, const char *name, zo_dtype dtype, int ndim,
                              const int64_t *shape, zo_st_tensor_info *out)
{
    if (!r || !name || (ndim && !shape) || ndim < 0 || ndim > ZO_ST_MAX_DIMS)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_st_reader_expect: invalid argument");
    const st_entry *e = lookup(r, name);
    if (!e)
        return not_found(r, name);
    if (e->dtype != dtype)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "tensor '%s' in '%s': expected dtype %s, found %s", name, r->path,
                       zo_st_dtype_name(dtype), zo_st_dtype_name(e->dtype));
    if (e->ndim != ndim || (ndim && memcmp(e->shape, shape, (size_t)ndim * sizeof *shape) != 0)) {
        char want[160], got[160];
        fmt_shape(want, sizeof want, ndim, shape);
        fmt_shape(got, sizeof got, e->ndim, e->shape);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "tensor '%s' in '%s': expected shape %s, found %s", name, r->path, want,
                       got);
    }
    return out ? fill_info(r, e, out) : ZO_OK;
}

const char *zo_st_reader_metadata(zo_st_reader_t r, const char *key)
{
    if (!r || !r->meta || !key)
        return NULL;
    return json_string_value(json_object_get(r->meta, key));
}

/* ---- Hugging Face LLaMA names ---- */

static const char *const llama_suffix[ZO_LLAMA_ROLE_COUNT_] = {
    [ZO_LLAMA_EMBED_TOKENS] = "model.embed_tokens.weight",
    [ZO_LLAMA_Q_PROJ] = "self_attn.q_proj.weight",
    [ZO_LLAMA_K_PROJ] = "self_attn.k_proj.weight",
    [ZO_LLAMA_V_PROJ] = "self_attn.v_proj.weight",
    [ZO_LLAMA_O_PROJ] = "self_attn.o_proj.weight",
    [ZO_LLAMA_GATE_PROJ] = "mlp.gate_proj.weight",
    [ZO_LLAMA_UP_PROJ] = "mlp.up_proj.weight",
    [ZO_LLAMA_DOWN_PROJ] = "mlp.down_proj.weight",
    [ZO_LLAMA_INPUT_LAYERNORM] = "input_layernorm.weight",
    [ZO_LLAMA_POST_ATTENTION_LAYERNORM] = "post_attention_layernorm.weight",
    [ZO_LLAMA_FINAL_NORM] = "model.norm.weight",
    [ZO_LLAMA_LM_HEAD] = "lm_head.weight",
};

int zo_llama_role_is_per_layer(zo_llama_role role)
{
    return role >= ZO_LLAMA_Q_PROJ && role <= ZO_LLAMA_POST_ATTENTION_LAYERNORM;
}

zo_status zo_llama_tensor_name(zo_llama_role role, int64_t layer, char *buf, size_t cap)
{
    if ((unsigned)role >= ZO_LLAMA_ROLE_COUNT_ || !buf)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_llama_tensor_name: invalid role %d",
                       (int)role);
    int per_layer = zo_llama_role_is_per_layer(role);
    if (per_layer && layer < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_llama_tensor_name: layer %lld is negative",
                       (long long)layer);
    int n = per_layer
                ? snprintf(buf, cap, "model.layers.%lld.%s", (long long)layer, llama_suffix[role])
                : snprintf(buf, cap, "%s", llama_suffix[role]);
    if (n < 0 || (size_t)n >= cap)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_llama_tensor_name: buffer of %zu bytes is too small", cap);
    return ZO_OK;
}

static int parse_layer_index(const char *s, int64_t *layer, const char **rest)
{
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
        return 0;
    int64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (INT64_MAX - 9) / 10)
            return 0;
        v = v * 10 + (*s - '0');
    }
    if (*s != '.')
        return 0;
    *layer = v;
    *rest = s + 1;
    return 1;
}

zo_status zo_llama_parse_name(const char *name, zo_llama_role *role, int64_t *layer)
{
    if (!name || !role || !layer)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_llama_parse_name: NULL argument");
    static const char prefix[] = "model.layers.";
    const char *rest = NULL;
    int64_t l = -1;
    int in_layer = strncmp(name, prefix, sizeof prefix - 1) == 0 &&
                   parse_layer_index(name + sizeof prefix - 1, &l, &rest);
    for (int r = 0; r < ZO_LLAMA_ROLE_COUNT_; r++) {
        int per_layer = zo_llama_role_is_per_layer((zo_llama_role)r);
        if (per_layer ? (in_layer && strcmp(rest, llama_suffix[r]) == 0)
                      : strcmp(name, llama_suffix[r]) == 0) {
            *role = (zo_llama_role)r;
            *layer = per_layer ? l : -1;
            return ZO_OK;
        }
    }
    return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS, "'%s' is not a Hugging Face LLaMA weight name", name);
}

zo_status zo_llama_tensor_shape(const zo_llama_dims *d, zo_llama_role role, int *ndim,
                                int64_t shape[2])
{
    if (!d || !ndim || !shape || d->struct_size != sizeof *d ||
        (unsigned)role >= ZO_LLAMA_ROLE_COUNT_)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_llama_tensor_shape: invalid argument");
    if (d->hidden_size <= 0 || d->num_heads <= 0 || d->num_kv_heads <= 0 ||
        d->hidden_size % d->num_heads || d->num_heads % d->num_kv_heads || d->vocab_size <= 0 ||
        d->intermediate_size <= 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "LLaMA dims: hidden %lld must be a multiple of heads %lld, heads a multiple "
                       "of kv heads "
                       "%lld, and vocab %lld and intermediate %lld positive",
                       (long long)d->hidden_size, (long long)d->num_heads,
                       (long long)d->num_kv_heads, (long long)d->vocab_size,
                       (long long)d->intermediate_size);
    int64_t h = d->hidden_size, kv = d->hidden_size / d->num_heads * d->num_kv_heads,
            f = d->intermediate_size;
    int64_t rows, cols = h;
    *ndim = 2;
    switch (role) {
    case ZO_LLAMA_EMBED_TOKENS:
    case ZO_LLAMA_LM_HEAD: rows = d->vocab_size; break;
    case ZO_LLAMA_Q_PROJ:
    case ZO_LLAMA_O_PROJ: rows = h; break;
    case ZO_LLAMA_K_PROJ:
    case ZO_LLAMA_V_PROJ: rows = kv; break;
    case ZO_LLAMA_GATE_PROJ:
    case ZO_LLAMA_UP_PROJ: rows = f; break;
    case ZO_LLAMA_DOWN_PROJ:
        rows = h;
        cols = f;
        break;
    default:
        *ndim = 1;
        rows = h;
        cols = 0;
        break;
    }
    shape[0] = rows;
    shape[1] = cols;
    return ZO_OK;
}

uint64_t zo_st_checksum(const void *data, size_t n)
{
    return (uint64_t)XXH64(data, n, 0);
}
