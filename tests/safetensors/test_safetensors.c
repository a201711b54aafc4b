/* safetensors: streamed round trips checked by the library's reader and by
 * an independent minimal reader written here; corrupted and truncated files
 * rejected with messages naming the problem; lookups naming the tensor and
 * the expected vs found dtype or shape; crash-safe writes under injected
 * faults; Hugging Face LLaMA names and shapes. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo_test.h"

#include "zo/atomic_file.h"
#include "zo/formats_testing.h"
#include "zo/safetensors.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/zo_st_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* The text after zo_last_error()'s "file:line: status: " prefix. */
static const char *error_text(zo_status st)
{
    const char *e = zo_last_error();
    const char *s = zo_status_str(st);
    const char *p = strstr(e, s);
    return p ? p + strlen(s) + 2 : e;
}

static int file_exists(const char *p)
{
    return access(p, F_OK) == 0;
}

static char *read_all(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_bytes(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* ---- the model written by the round-trip tests ---- */

typedef struct tensor {
    char name[96];
    zo_dtype dtype;
    int ndim;
    int64_t shape[ZO_ST_MAX_DIMS];
    size_t nbytes;
    unsigned char *bytes;
} tensor;

enum { MAX_T = 64 };
typedef struct model {
    tensor t[MAX_T];
    size_t n;
} model;

static void add_tensor(model *m, const char *name, zo_dtype dtype, int ndim, const int64_t *shape,
                       uint64_t *rng)
{
    tensor *t = &m->t[m->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    size_t n = zo_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t->nbytes = n;
    t->bytes = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        t->bytes[i] = (unsigned char)zo_test_rand(rng);
}

/* A 2-layer LLaMA with grouped-query attention, bf16 weights, fp32 norms,
 * plus a scalar and an empty tensor. */
static void make_model(model *m)
{
    uint64_t rng = 42;
    memset(m, 0, sizeof *m);
    zo_llama_dims d = ZO_LLAMA_DIMS_INIT;
    d.vocab_size = 32;
    d.hidden_size = 16;
    d.intermediate_size = 24;
    d.num_heads = 4;
    d.num_kv_heads = 2;
    d.num_layers = 2;
    for (int r = 0; r < ZO_LLAMA_ROLE_COUNT_; r++) {
        int layers = zo_llama_role_is_per_layer((zo_llama_role)r) ? (int)d.num_layers : 1;
        for (int l = 0; l < layers; l++) {
            char name[96];
            int ndim;
            int64_t shape[2];
            ZO_ASSERT_OK(zo_llama_tensor_name((zo_llama_role)r, l, name, sizeof name));
            ZO_ASSERT_OK(zo_llama_tensor_shape(&d, (zo_llama_role)r, &ndim, shape));
            add_tensor(m, name, ndim == 1 ? ZO_DTYPE_F32 : ZO_DTYPE_BF16, ndim, shape, &rng);
        }
    }
    int64_t three[1] = {3}, empty[2] = {0, 4};
    add_tensor(m, "extra.step", ZO_DTYPE_I64, 0, NULL, &rng);
    add_tensor(m, "extra.odd_f16", ZO_DTYPE_F16, 1, three, &rng);
    add_tensor(m, "extra.empty", ZO_DTYPE_F32, 2, empty, &rng);
}

static void free_model(model *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->t[i].bytes);
}

/* Streamed: each tensor goes out in pieces of random sizes. */
static void write_model(const model *m, const char *path)
{
    zo_st_writer_t w = NULL;
    ZO_ASSERT_OK(zo_st_writer_init(&w, path));
    ZO_ASSERT_OK(zo_st_writer_set_metadata(w, "producer", "zoffload test"));
    for (size_t i = 0; i < m->n; i++)
        ZO_ASSERT_OK(
            zo_st_writer_declare(w, m->t[i].name, m->t[i].dtype, m->t[i].ndim, m->t[i].shape));
    uint64_t rng = 7;
    for (size_t i = 0; i < m->n; i++) {
        size_t off = 0;
        while (off < m->t[i].nbytes) {
            size_t piece = 1 + (size_t)(zo_test_rand(&rng) % 97);
            if (piece > m->t[i].nbytes - off)
                piece = m->t[i].nbytes - off;
            ZO_ASSERT_OK(zo_st_writer_write(w, m->t[i].name, m->t[i].bytes + off, piece));
            off += piece;
        }
    }
    ZO_ASSERT_OK(zo_st_writer_commit(w));
    zo_st_writer_free(w);
}

/* ---- an independent minimal reader: the format from the spec, nothing
 * from the library ---- */

static void independent_check(const model *m, const char *path)
{
    size_t len = 0;
    unsigned char *f = (unsigned char *)read_all(path, &len);
    assert_true(len >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f[i];
    assert_true(8 + n <= len);
    assert_int_equal((8 + n) % 8, 0); /* data starts 8-byte aligned */
    json_error_t err;
    json_t *h = json_loadb((const char *)f + 8, n, 0, &err);
    if (!h)
        fail_msg("header JSON: %s", err.text);
    /* Only spaces pad the header after the JSON. */
    size_t end = n;
    while (end > 0 && f[8 + end - 1] == ' ')
        end--;
    assert_int_equal(f[8 + end - 1], '}');
    json_t *meta = json_object_get(h, "__metadata__");
    assert_string_equal(json_string_value(json_object_get(meta, "format")), "pt");
    assert_string_equal(json_string_value(json_object_get(meta, "producer")), "zoffload test");
    assert_int_equal(json_object_size(h), m->n + 1);
    const unsigned char *data = f + 8 + n;
    uint64_t covered = 0;
    for (size_t i = 0; i < m->n; i++) {
        const tensor *t = &m->t[i];
        json_t *e = json_object_get(h, t->name);
        if (!e)
            fail_msg("tensor %s missing from the header", t->name);
        assert_string_equal(json_string_value(json_object_get(e, "dtype")),
                            zo_st_dtype_name(t->dtype));
        json_t *shape = json_object_get(e, "shape");
        assert_int_equal(json_array_size(shape), (size_t)t->ndim);
        for (int d = 0; d < t->ndim; d++)
            assert_int_equal(json_integer_value(json_array_get(shape, (size_t)d)), t->shape[d]);
        json_t *off = json_object_get(e, "data_offsets");
        uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0));
        uint64_t x = (uint64_t)json_integer_value(json_array_get(off, 1));
        assert_int_equal(x - b, t->nbytes);
        assert_true(x <= len - 8 - n);
        if (t->nbytes)
            assert_memory_equal(data + b, t->bytes, t->nbytes);
        covered += x - b;
    }
    assert_int_equal(covered, len - 8 - n); /* no holes, no overlaps, no trailing bytes */
    json_decref(h);
    free(f);
}

/* The test model, written streamed to dir/name (path receives the path). */
static void written_model(model *m, const char *name, char *path, size_t cap)
{
    make_model(m);
    path_in(path, cap, name);
    write_model(m, path);
}

static void test_round_trip(void **state)
{
    (void)state;
    model m;
    char path[128];
    written_model(&m, "model.safetensors", path, sizeof path);
    independent_check(&m, path);

    zo_st_reader_t r = NULL;
    ZO_ASSERT_OK(zo_st_reader_open(&r, path));
    assert_int_equal(zo_st_reader_count(r), m.n);
    assert_string_equal(zo_st_reader_metadata(r, "format"), "pt");
    assert_null(zo_st_reader_metadata(r, "absent"));
    for (size_t i = 0; i < m.n; i++) {
        zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
        ZO_ASSERT_OK(
            zo_st_reader_expect(r, m.t[i].name, m.t[i].dtype, m.t[i].ndim, m.t[i].shape, &info));
        assert_string_equal(info.name, m.t[i].name);
        assert_int_equal(info.nbytes, m.t[i].nbytes);
        if (m.t[i].nbytes)
            assert_memory_equal(info.data, m.t[i].bytes, m.t[i].nbytes);
    }
    /* Data order: ascending, contiguous offsets. */
    uint64_t pos = 0;
    for (size_t i = 0; i < m.n; i++) {
        zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
        ZO_ASSERT_OK(zo_st_reader_at(r, i, &info));
        if (i > 0)
            assert_int_equal(info.file_offset, pos);
        pos = info.file_offset + info.nbytes;
    }
    ZO_ASSERT_ST(zo_st_reader_at(r, m.n, &(zo_st_tensor_info)ZO_ST_TENSOR_INFO_INIT),
                 ZO_ERR_INVALID_ARG);
    zo_st_reader_free(r);
    free_model(&m);
    zo_st_reader_free(NULL);
    zo_st_writer_free(NULL);
}

static void test_lookup_messages(void **state)
{
    (void)state;
    model m;
    char path[128];
    written_model(&m, "lookup.safetensors", path, sizeof path);
    zo_st_reader_t r = NULL;
    ZO_ASSERT_OK(zo_st_reader_open(&r, path));
    char want[512];
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;

    ZO_ASSERT_ST(zo_st_reader_find(r, "model.layers.1.mlp.up_proj.weights", &info),
                 ZO_ERR_NOT_FOUND);
    snprintf(want, sizeof want,
             "tensor 'model.layers.1.mlp.up_proj.weights' not found in '%s' (%zu tensors; nearest: "
             "'model.layers.1.mlp.up_proj.weight')",
             path, m.n);
    assert_string_equal(error_text(ZO_ERR_NOT_FOUND), want);

    int64_t q[2] = {16, 16};
    ZO_ASSERT_ST(
        zo_st_reader_expect(r, "model.layers.0.self_attn.q_proj.weight", ZO_DTYPE_F32, 2, q, NULL),
        ZO_ERR_INVALID_ARG);
    snprintf(
        want, sizeof want,
        "tensor 'model.layers.0.self_attn.q_proj.weight' in '%s': expected dtype F32, found BF16",
        path);
    assert_string_equal(error_text(ZO_ERR_INVALID_ARG), want);

    int64_t k[2] = {16, 16}; /* GQA: k_proj is [8, 16] */
    ZO_ASSERT_ST(
        zo_st_reader_expect(r, "model.layers.1.self_attn.k_proj.weight", ZO_DTYPE_BF16, 2, k, NULL),
        ZO_ERR_INVALID_ARG);
    snprintf(want, sizeof want,
             "tensor 'model.layers.1.self_attn.k_proj.weight' in '%s': expected shape [16, 16], "
             "found [8, 16]",
             path);
    assert_string_equal(error_text(ZO_ERR_INVALID_ARG), want);

    ZO_ASSERT_ST(zo_st_reader_expect(r, "extra.step", ZO_DTYPE_I64, 1, q, NULL),
                 ZO_ERR_INVALID_ARG);
    snprintf(want, sizeof want, "tensor 'extra.step' in '%s': expected shape [16], found []", path);
    assert_string_equal(error_text(ZO_ERR_INVALID_ARG), want);
    zo_st_reader_free(r);
    free_model(&m);
}

/* ---- corrupted and truncated files ---- */

/* A file with this header text and data_len zero bytes of data. */
static void write_raw(const char *path, const char *header, size_t data_len, int pad)
{
    size_t n = strlen(header), padded = pad ? (n + 7) / 8 * 8 : n;
    size_t total = 8 + padded + data_len;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, ' ', padded - n);
    write_bytes(path, buf, total);
    free(buf);
}

typedef struct corrupt_case {
    const char *header;
    size_t data_len;
    const char *message; /* after "'PATH': " */
} corrupt_case;

static const corrupt_case corrupt_cases[] = {
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "tensor 'a': unknown dtype 'F33'"},
    {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "tensor 'a': 'dtype' is missing or not a string"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     "tensor 'a': data_offsets [0, 8] hold 8 bytes, but shape [3] of F32 needs 12"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     "tensor 'a': 'shape' holds a value that is not a non-negative integer"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}",
     8,
     "tensor 'a': data_offsets [0, 8] hold 8 bytes, but shape [1099511627776, 1099511627776] of "
     "F32 needs "
     "18446744073709551615"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
     "tensor 'a': 'data_offsets' is not [begin, end] with 0 <= begin <= end"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12,
     "tensors 'a' and 'b' overlap (data_offsets begin at 4, before the previous tensor ends at 8)"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
     20, "bytes [8, 12) of the data section belong to no tensor"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
     "the data section has 12 bytes but its tensors cover 8 (trailing bytes)"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
     "tensor 'a': data_offsets [0, 16] extend past the end of the data section (12 bytes; "
     "truncated file?)"},
    {"{\"__metadata__\":{\"x\":1}}", 0, "__metadata__ value 'x' is not a string"},
    {"{\"__metadata__\":[]}", 0, "__metadata__ is not an object"},
    {"{\"a\":[]}", 0, "tensor 'a': its entry is not an object"},
    {"[1,2]", 0, "the header is not a JSON object"},
    {"{\"a\":{},\"a\":{}}", 0,
     "header is not valid JSON: duplicate object key near '\"a\"' (at byte 11 of the header)"},
    {"{\"a\":", 0,
     "header is not valid JSON: unexpected token near end of file (at byte 8 of the header)"},
};

static void expect_corrupt(const char *path, const char *message)
{
    zo_st_reader_t r = NULL;
    zo_status st = zo_st_reader_open(&r, path);
    if (st != ZO_ERR_CORRUPT)
        fail_msg("%s: status %d, expected corrupt: %s", path, st, zo_last_error());
    char want[512];
    snprintf(want, sizeof want, "'%s': %s", path, message);
    if (strcmp(error_text(ZO_ERR_CORRUPT), want) != 0)
        fail_msg("\n  got      '%s'\n  expected '%s'", error_text(ZO_ERR_CORRUPT), want);
    assert_null(r);
}

static void test_corrupt_headers(void **state)
{
    (void)state;
    char path[128];
    path_in(path, sizeof path, "bad.safetensors");
    for (size_t i = 0; i < sizeof corrupt_cases / sizeof corrupt_cases[0]; i++) {
        write_raw(path, corrupt_cases[i].header, corrupt_cases[i].data_len, 1);
        expect_corrupt(path, corrupt_cases[i].message);
    }
    /* An unpadded header is still read (other writers may not pad). */
    write_raw(path, "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0);
    zo_st_reader_t r = NULL;
    ZO_ASSERT_OK(zo_st_reader_open(&r, path));
    zo_st_reader_free(r);
}

static void test_truncated_files(void **state)
{
    (void)state;
    model m;
    char path[128], bad[128], want[256];
    written_model(&m, "good.safetensors", path, sizeof path);
    path_in(bad, sizeof bad, "cut.safetensors");
    size_t len = 0;
    char *f = read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | (unsigned char)f[i];

    write_bytes(bad, f, 4);
    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, bad), ZO_ERR_CORRUPT);
    snprintf(
        want, sizeof want,
        "'%s' is 4 bytes: too short for a safetensors file (the 8-byte header length is missing)",
        bad);
    assert_string_equal(error_text(ZO_ERR_CORRUPT), want);

    write_bytes(bad, f, 8 + hlen / 2);
    snprintf(want, sizeof want,
             "header length %llu exceeds the %llu bytes after the length field (truncated file?)",
             (unsigned long long)hlen, (unsigned long long)(hlen / 2));
    expect_corrupt(bad, want);

    /* Cut inside the last tensor's data. */
    write_bytes(bad, f, len - 1);
    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, bad), ZO_ERR_CORRUPT);
    assert_non_null(strstr(zo_last_error(), "extend past the end of the data section"));

    /* One byte too many. */
    char *longer = malloc(len + 1);
    memcpy(longer, f, len);
    longer[len] = 0;
    write_bytes(bad, longer, len + 1);
    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, bad), ZO_ERR_CORRUPT);
    assert_non_null(strstr(zo_last_error(), "(trailing bytes)"));
    free(longer);

    /* A header length beyond the format's limit. */
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 1};
    write_bytes(bad, huge, sizeof huge);
    expect_corrupt(bad, "header length 72057594037927936 exceeds the 100 MiB limit");

    /* A flipped byte inside the header JSON. */
    f[8] = 'x';
    write_bytes(bad, f, len);
    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, bad), ZO_ERR_CORRUPT);
    assert_non_null(strstr(zo_last_error(), "header is not valid JSON"));

    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, "/nonexistent/x.safetensors"),
                 ZO_ERR_NOT_FOUND);
    ZO_ASSERT_ST(zo_st_reader_open(&(zo_st_reader_t){NULL}, dir), ZO_ERR_INVALID_ARG);
    free(f);
    free_model(&m);
}

/* ---- writer misuse ---- */

static void test_writer_misuse(void **state)
{
    (void)state;
    char path[128], want[512];
    path_in(path, sizeof path, "misuse.safetensors");
    int64_t s2[1] = {2}, s4[1] = {4}, neg[1] = {-1};
    float buf[4] = {1, 2, 3, 4};
    zo_st_writer_t w = NULL;
    ZO_ASSERT_OK(zo_st_writer_init(&w, path));
    ZO_ASSERT_OK(zo_st_writer_declare(w, "a", ZO_DTYPE_F32, 1, s2));
    ZO_ASSERT_OK(zo_st_writer_declare(w, "b", ZO_DTYPE_F32, 1, s4));
    ZO_ASSERT_ST(zo_st_writer_declare(w, "a", ZO_DTYPE_F32, 1, s2), ZO_ERR_EXISTS);
    ZO_ASSERT_ST(zo_st_writer_declare(w, "c", ZO_DTYPE_F32, 1, neg), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_st_writer_declare(w, "__metadata__", ZO_DTYPE_F32, 1, s2), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_st_writer_declare(w, "d", ZO_DTYPE_COUNT_, 1, s2), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_st_writer_declare(w, "e", ZO_DTYPE_F32, ZO_ST_MAX_DIMS + 1, s2),
                 ZO_ERR_INVALID_ARG);

    ZO_ASSERT_ST(zo_st_writer_write(w, "b", buf, 16), ZO_ERR_STATE);
    snprintf(
        want, sizeof want,
        "tensor 'b' written out of order in '%s': 'a' comes first and still needs 8 of its 8 bytes",
        path);
    assert_string_equal(error_text(ZO_ERR_STATE), want);
    ZO_ASSERT_ST(zo_st_writer_write(w, "a", buf, 12), ZO_ERR_INVALID_ARG);
    snprintf(want, sizeof want,
             "tensor 'a' in '%s': 12 bytes written, but only 8 of its 8 bytes remain", path);
    assert_string_equal(error_text(ZO_ERR_INVALID_ARG), want);
    ZO_ASSERT_OK(zo_st_writer_write(w, "a", buf, 8));
    ZO_ASSERT_ST(zo_st_writer_declare(w, "late", ZO_DTYPE_F32, 1, s2), ZO_ERR_STATE);
    ZO_ASSERT_ST(zo_st_writer_set_metadata(w, "k", "v"), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_st_writer_write(w, "b", buf, 4));
    ZO_ASSERT_ST(zo_st_writer_commit(w), ZO_ERR_STATE);
    snprintf(want, sizeof want, "'%s' cannot be committed: tensor 'b' has 4 of its 16 bytes", path);
    assert_string_equal(error_text(ZO_ERR_STATE), want);
    zo_st_writer_free(w); /* abandoned: nothing may be left behind */
    assert_false(file_exists(path));
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_false(file_exists(tmp));

    /* A file without tensors is valid. */
    ZO_ASSERT_OK(zo_st_writer_init(&w, path));
    ZO_ASSERT_OK(zo_st_writer_commit(w));
    zo_st_writer_free(w);
    zo_st_reader_t r = NULL;
    ZO_ASSERT_OK(zo_st_reader_open(&r, path));
    assert_int_equal(zo_st_reader_count(r), 0);
    ZO_ASSERT_ST(zo_st_reader_find(r, "x", &(zo_st_tensor_info)ZO_ST_TENSOR_INFO_INIT),
                 ZO_ERR_NOT_FOUND);
    zo_st_reader_free(r);
}

/* ---- crash safety under injected faults ---- */

static void write_old(const char *path)
{
    ZO_ASSERT_OK(zo_atomic_write_file(path, "old contents", 12));
}

static void expect_old(const char *path)
{
    size_t len = 0;
    char *s = read_all(path, &len);
    assert_int_equal(len, 12);
    assert_memory_equal(s, "old contents", 12);
    free(s);
}

static void test_atomic_faults(void **state)
{
    (void)state;
    char path[128], tmp[160];
    path_in(path, sizeof path, "ckpt.bin");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    write_old(path);
    expect_old(path);

    /* A full disk, made real with RLIMIT_FSIZE (write fails with EFBIG). */
    size_t big = 3u << 20;
    char *data = calloc(1, big);
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_FSIZE, &old_lim);
    lim = old_lim;
    lim.rlim_cur = 1u << 20;
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    zo_atomic_file_t f = NULL;
    ZO_ASSERT_OK(zo_atomic_file_open(&f, path));
    zo_status st = zo_atomic_file_write(f, data, big);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    assert_int_equal(st, ZO_ERR_NO_SPACE);
    assert_non_null(strstr(zo_last_error(), tmp));
    ZO_ASSERT_ST(zo_atomic_file_write(f, data, 1), ZO_ERR_STATE);
    ZO_ASSERT_ST(zo_atomic_file_commit(f), ZO_ERR_STATE);
    zo_atomic_file_free(f);
    expect_old(path);
    assert_false(file_exists(tmp));

    /* fsync of the file fails: the old file stays. */
    zo_atomic_inject_fsync_faults(0, 1);
    ZO_ASSERT_ST(zo_atomic_write_file(path, "new contents!", 13), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "fsync"));
    expect_old(path);
    assert_false(file_exists(tmp));

    /* Abandoned before commit (a crash, as far as the file system can tell). */
    ZO_ASSERT_OK(zo_atomic_file_open(&f, path));
    ZO_ASSERT_OK(zo_atomic_file_write(f, data, big));
    assert_true(file_exists(zo_atomic_file_temp_path(f)));
    assert_int_equal(zo_atomic_file_size(f), big);
    zo_atomic_file_free(f);
    expect_old(path);
    assert_false(file_exists(tmp));

    /* A stale temporary with our pid is replaced. */
    write_bytes(tmp, "stale", 5);
    ZO_ASSERT_OK(zo_atomic_write_file(path, "new contents", 12));
    size_t len = 0;
    char *s = read_all(path, &len);
    assert_memory_equal(s, "new contents", 12);
    free(s);
    assert_false(file_exists(tmp));

    /* rename fails: the target is a directory. */
    char sub[128];
    path_in(sub, sizeof sub, "adir");
    assert_int_equal(mkdir(sub, 0755), 0);
    ZO_ASSERT_ST(zo_atomic_write_file(sub, "x", 1), ZO_ERR_SYSTEM);
    assert_non_null(strstr(zo_last_error(), "rename"));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", sub, (long)getpid());
    assert_false(file_exists(tmp));

    /* The directory does not exist. */
    ZO_ASSERT_ST(zo_atomic_write_file("/nonexistent-zo-dir/x", "x", 1), ZO_ERR_SYSTEM);
    assert_non_null(strstr(zo_last_error(), "/nonexistent-zo-dir/x.tmp."));
    ZO_ASSERT_ST(zo_atomic_file_open(&f, ""), ZO_ERR_INVALID_ARG);

    /* The directory's fsync after the rename fails: reported, with the new
     * file in place (the rename happened; only its durability is unknown). */
    zo_atomic_inject_fsync_faults(1, 1);
    ZO_ASSERT_OK(zo_atomic_file_open(&f, path));
    ZO_ASSERT_OK(zo_atomic_file_write(f, "third", 5));
    ZO_ASSERT_OK(zo_atomic_file_write(f, NULL, 0));
    ZO_ASSERT_ST(zo_atomic_file_commit(f), ZO_ERR_IO);
    snprintf(tmp, sizeof tmp, "fsync '%s' failed", dir);
    assert_non_null(strstr(zo_last_error(), tmp));
    ZO_ASSERT_ST(zo_atomic_file_write(f, "x", 1), ZO_ERR_STATE);
    zo_atomic_file_free(f);
    s = read_all(path, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "third", 5);
    free(s);
    free(data);
}

/* A 64 MiB tensor written from a 1 MiB buffer must not grow the process by
 * anything like 64 MiB: the writer streams. */
static void test_streaming_memory(void **state)
{
    (void)state;
    char path[128];
    path_in(path, sizeof path, "big.safetensors");
    size_t piece = 1u << 20, pieces = 64;
    unsigned char *buf = malloc(piece);
    for (size_t i = 0; i < piece; i++)
        buf[i] = (unsigned char)(i * 7);
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    zo_st_writer_t w = NULL;
    int64_t shape[2] = {(int64_t)pieces, (int64_t)(piece / 2)};
    ZO_ASSERT_OK(zo_st_writer_init(&w, path));
    ZO_ASSERT_OK(zo_st_writer_declare(w, "lm_head.weight", ZO_DTYPE_BF16, 2, shape));
    for (size_t i = 0; i < pieces; i++) {
        buf[0] = (unsigned char)i;
        ZO_ASSERT_OK(zo_st_writer_write(w, "lm_head.weight", buf, piece));
    }
    ZO_ASSERT_OK(zo_st_writer_commit(w));
    zo_st_writer_free(w);
    getrusage(RUSAGE_SELF, &after);
    long grown_kib = after.ru_maxrss - before.ru_maxrss;
    if (grown_kib > 16 * 1024)
        fail_msg("peak RSS grew by %ld KiB while streaming 64 MiB", grown_kib);

    zo_st_reader_t r = NULL;
    zo_st_tensor_info info = ZO_ST_TENSOR_INFO_INIT;
    ZO_ASSERT_OK(zo_st_reader_open(&r, path));
    ZO_ASSERT_OK(zo_st_reader_expect(r, "lm_head.weight", ZO_DTYPE_BF16, 2, shape, &info));
    const unsigned char *d = info.data;
    for (size_t i = 0; i < pieces; i++) {
        buf[0] = (unsigned char)i;
        assert_memory_equal(d + i * piece, buf, piece);
    }
    zo_st_reader_free(r);
    free(buf);
    unlink(path);
}

/* ---- Hugging Face LLaMA names ---- */

static void test_llama_names(void **state)
{
    (void)state;
    static const char *const want[ZO_LLAMA_ROLE_COUNT_] = {
        "model.embed_tokens.weight",
        "model.layers.31.self_attn.q_proj.weight",
        "model.layers.31.self_attn.k_proj.weight",
        "model.layers.31.self_attn.v_proj.weight",
        "model.layers.31.self_attn.o_proj.weight",
        "model.layers.31.mlp.gate_proj.weight",
        "model.layers.31.mlp.up_proj.weight",
        "model.layers.31.mlp.down_proj.weight",
        "model.layers.31.input_layernorm.weight",
        "model.layers.31.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    };
    /* Llama-2-7B's shapes, and a GQA variant (8 kv heads). */
    zo_llama_dims d = ZO_LLAMA_DIMS_INIT;
    d.vocab_size = 32000;
    d.hidden_size = 4096;
    d.intermediate_size = 11008;
    d.num_heads = 32;
    d.num_kv_heads = 32;
    d.num_layers = 32;
    static const int64_t shapes[ZO_LLAMA_ROLE_COUNT_][2] = {
        {32000, 4096}, {4096, 4096},  {4096, 4096}, {4096, 4096}, {4096, 4096}, {11008, 4096},
        {11008, 4096}, {4096, 11008}, {4096, 0},    {4096, 0},    {4096, 0},    {32000, 4096},
    };
    for (int r = 0; r < ZO_LLAMA_ROLE_COUNT_; r++) {
        char name[128];
        ZO_ASSERT_OK(zo_llama_tensor_name((zo_llama_role)r, 31, name, sizeof name));
        assert_string_equal(name, want[r]);
        zo_llama_role role;
        int64_t layer;
        ZO_ASSERT_OK(zo_llama_parse_name(name, &role, &layer));
        assert_int_equal(role, r);
        assert_int_equal(layer, zo_llama_role_is_per_layer((zo_llama_role)r) ? 31 : -1);
        int ndim;
        int64_t shape[2];
        ZO_ASSERT_OK(zo_llama_tensor_shape(&d, (zo_llama_role)r, &ndim, shape));
        assert_int_equal(ndim, shapes[r][1] ? 2 : 1);
        assert_int_equal(shape[0], shapes[r][0]);
        if (ndim == 2)
            assert_int_equal(shape[1], shapes[r][1]);
    }
    d.num_kv_heads = 8;
    int ndim;
    int64_t shape[2];
    ZO_ASSERT_OK(zo_llama_tensor_shape(&d, ZO_LLAMA_K_PROJ, &ndim, shape));
    assert_int_equal(shape[0], 1024);
    d.num_kv_heads = 5;
    ZO_ASSERT_ST(zo_llama_tensor_shape(&d, ZO_LLAMA_K_PROJ, &ndim, shape), ZO_ERR_INVALID_ARG);

    char small[8];
    ZO_ASSERT_ST(zo_llama_tensor_name(ZO_LLAMA_Q_PROJ, 0, small, sizeof small), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_llama_tensor_name(ZO_LLAMA_Q_PROJ, -1, small, sizeof small),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_llama_tensor_name(ZO_LLAMA_ROLE_COUNT_, 0, small, sizeof small),
                 ZO_ERR_INVALID_ARG);
    static const char *const bad[] = {
        "model.layers.x.mlp.up_proj.weight",
        "model.layers.01.mlp.up_proj.weight",
        "model.layers.3",
        "model.layers.3.mlp.up_proj.bias",
        "model.embed_tokens",
        "model.layers.3.model.norm.weight",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zo_llama_role role;
        int64_t layer;
        ZO_ASSERT_ST(zo_llama_parse_name(bad[i], &role, &layer), ZO_ERR_NOT_FOUND);
    }
    zo_dtype dt;
    ZO_ASSERT_OK(zo_st_dtype_from_name("BF16", &dt));
    assert_int_equal(dt, ZO_DTYPE_BF16);
    assert_int_equal(zo_dtype_size(ZO_DTYPE_F64), 8);
    ZO_ASSERT_ST(zo_st_dtype_from_name("bf16", &dt), ZO_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_lookup_messages),
        cmocka_unit_test(test_corrupt_headers),  cmocka_unit_test(test_truncated_files),
        cmocka_unit_test(test_writer_misuse),    cmocka_unit_test(test_atomic_faults),
        cmocka_unit_test(test_streaming_memory), cmocka_unit_test(test_llama_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
