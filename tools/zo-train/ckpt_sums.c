/* The checksums of a checkpoint's tensors (see ckpt_sums.h). */
#include "ckpt_sums.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_io.h"
#include "zo/atomic_file.h"
#include "zo/safetensors.h"
#include "zt_error.h"
#include "zt_json.h"

#define ZT_SUMS_FORMAT "zoffload-checksums"
#define ZT_SUMS_ALGO   "xxh64"
enum { SUMS_PATH = 4096 };

struct zt_sums {
    json_t *files; /* {file: {tensor: "hex"}} */
};

static void hex_of(const void *data, size_t n, char out[17])
{
    snprintf(out, 17, "%016" PRIx64, zo_st_checksum(data, n));
}

zo_status zt_sums_new(zt_sums **out)
{
    zt_sums *s = calloc(1, sizeof *s);
    if (!s || !(s->files = json_object())) {
        free(s);
        return zt_fail(ZO_ERR_NO_MEMORY, "a checksum list");
    }
    *out = s;
    return ZO_OK;
}

void zt_sums_free(zt_sums *s)
{
    if (!s)
        return;
    json_decref(s->files);
    free(s);
}

zo_status zt_sums_add(zt_sums *s, const char *file, const char *name, const void *data, size_t n)
{
    char hex[17];
    hex_of(data, n, hex);
    json_t *f = json_object_get(s->files, file);
    if (!f && json_object_set_new(s->files, file, f = json_object()) != 0)
        return zt_fail(ZO_ERR_NO_MEMORY, "a checksum list");
    if (json_object_set_new(f, name, json_string(hex)) != 0)
        return zt_fail(ZO_ERR_NO_MEMORY, "a checksum list");
    return ZO_OK;
}

zo_status zt_sums_write(const zt_sums *s, const char *dir, int rank, int ranks)
{
    char name[128], path[SUMS_PATH];
    char shard[128];
    zt_st_shard_name(shard, sizeof shard, ZT_SUMS_BASE, rank, ranks);
    /* zt_st_shard_name names .safetensors files: the same pattern, .json */
    size_t len = strlen(shard) - strlen(".safetensors");
    snprintf(name, sizeof name, "%.*s.json", (int)len, shard);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/%s", dir, name);
    json_t *root = json_pack("{s:s,s:s,s:O}", "format", ZT_SUMS_FORMAT, "algorithm", ZT_SUMS_ALGO,
                             "files", s->files);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text)
        return zt_fail(ZO_ERR_NO_MEMORY, "the checksums' JSON");
    zo_status st = zo_atomic_write_file(path, text, strlen(text));
    free(text);
    if (st < 0)
        return zt_fail(st, "writing checkpoint file %s: %s", path, zt_lib_message());
    return ZO_OK;
}

/* checksums.json or checksums-*-of-*.json */
static int is_sums_name(const char *n)
{
    size_t len = strlen(n), base = strlen(ZT_SUMS_BASE);
    if (strncmp(n, ZT_SUMS_BASE, base) != 0 || len < base + 5 || strcmp(n + len - 5, ".json") != 0)
        return 0;
    return len == base + 5 || (n[base] == '-' && strstr(n, "-of-") != NULL);
}

/* One list's files merged into s. */
static zo_status merge_list(zt_sums *s, const char *path)
{
    json_t *root = NULL;
    ZT_TRY(zt_json_read(path, 0, &root));
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *algo = json_string_value(json_object_get(root, "algorithm"));
    json_t *files = json_object_get(root, "files");
    zo_status st = ZO_OK;
    if (!fmt || strcmp(fmt, ZT_SUMS_FORMAT) || !algo || strcmp(algo, ZT_SUMS_ALGO) ||
        !json_is_object(files))
        st = zt_fail(ZO_ERR_CORRUPT,
                     "checkpoint file %s is not a %s list (expected \"format\": \"%s\", "
                     "\"algorithm\": \"%s\" and a \"files\" object)",
                     path, ZT_SUMS_FORMAT, ZT_SUMS_FORMAT, ZT_SUMS_ALGO);
    const char *file;
    json_t *tensors;
    json_object_foreach(files, file, tensors)
    {
        if (st < 0)
            break;
        json_t *have = json_object_get(s->files, file);
        if (!json_is_object(tensors))
            st = zt_fail(ZO_ERR_CORRUPT, "checkpoint file %s: files['%s'] is not an object", path,
                         file);
        else if (have)
            json_object_update(have, tensors);
        else
            json_object_set(s->files, file, tensors);
    }
    json_decref(root);
    return st;
}

zo_status zt_sums_read(const char *dir, zt_sums **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return zt_fail(ZO_ERR_SYSTEM, "cannot open %s: %s", dir, strerror(errno));
    zt_sums *s = NULL;
    zo_status st = ZO_OK;
    char path[SUMS_PATH];
    struct dirent *e;
    while (st >= 0 && (e = readdir(d))) {
        if (!is_sums_name(e->d_name))
            continue;
        if (!s && (st = zt_sums_new(&s)) < 0)
            break;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
            st = zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/%s", dir, e->d_name);
        else
            st = merge_list(s, path);
    }
    closedir(d);
    if (st < 0) {
        zt_sums_free(s);
        return st;
    }
    *out = s;
    return ZO_OK;
}

zo_status zt_sums_verify(const zt_sums *s, const char *dir, const char *file, const char *name,
                         const void *data, size_t n)
{
    const char *want = json_string_value(json_object_get(json_object_get(s->files, file), name));
    if (!want)
        return zt_fail(ZO_ERR_CORRUPT,
                       "checkpoint file %s/%s: no checksum recorded for tensor '%s' (the "
                       "checkpoint's %s*.json lists are incomplete): resume from another "
                       "checkpoint",
                       dir, file, name, ZT_SUMS_BASE);
    char have[17];
    hex_of(data, n, have);
    if (strcmp(have, want) != 0)
        return zt_fail(ZO_ERR_CORRUPT,
                       "checkpoint file %s/%s: tensor '%s' does not match its checksum (xxh64 "
                       "%s recorded, %s now): the file is corrupted; resume from another "
                       "checkpoint",
                       dir, file, name, want, have);
    return ZO_OK;
}

int zt_sums_has_file(const zt_sums *s, const char *file)
{
    return s && json_object_get(s->files, file) != NULL;
}
