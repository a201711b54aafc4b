/* The tools' JSON files (config.json, index files, trainer_state.json, a
 * --bench-json line file): read through the one way to open a file a user
 * names (zo/file.h), so that a FIFO, a device or a directory is refused by
 * name before jansson reads a byte. */
#ifndef ZT_JSON_H
#define ZT_JSON_H

#include <jansson.h>

#include "zo/status.h"

/* Read path's JSON into *out, or fail with the tool's error set: a refused
 * open's message, or "PATH:LINE:COLUMN: <jansson's text>" (ZO_ERR_CORRUPT). */
zo_status zt_json_read(const char *path, size_t flags, json_t **out);

#endif
