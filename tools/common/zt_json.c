/* The tools' JSON files, opened the one way (zt_json.h). */
#include "zt_json.h"

#include <stdio.h>
#include <unistd.h>

#include "zo/file.h"
#include "zt_error.h"

zo_status zt_json_read(const char *path, size_t flags, json_t **out)
{
    int fd;
    if (zo_file_open_read(path, &fd) < 0)
        return zt_fail(zo_last_error_status(), "%s", zt_lib_message());
    json_error_t err;
    *out = json_loadfd(fd, flags, &err);
    close(fd);
    if (!*out)
        return zt_fail(ZO_ERR_CORRUPT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    return ZO_OK;
}
