/* zoffload: the one way every part and tool opens a file it reads or writes.
 *
 * A path given by a user may name a FIFO (an open for reading blocks until a
 * writer comes, and SIGTERM cannot end the wait), a device, a socket, or a
 * directory where a file is expected. These calls open with O_NONBLOCK, so
 * the open itself never waits, then fstat the descriptor and refuse what is
 * not what the caller expects before a byte is read; the descriptor returned
 * is blocking again. Errors name the path, what it is and what was expected:
 * ZO_ERR_NOT_FOUND for a missing path, ZO_ERR_INVALID_ARG for the wrong kind
 * of file, ZO_ERR_SYSTEM for other open failures (with strerror). */
#ifndef ZO_FILE_H
#define ZO_FILE_H

#include <stdio.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open path for reading (O_RDONLY | O_CLOEXEC): a regular file only. */
ZO_API zo_status zo_file_open_read(const char *path, int *fd);

/* The same as a stdio stream ("r"), for parsers that read FILE *. */
ZO_API zo_status zo_file_fopen_read(const char *path, FILE **f);

/* Open path for writing, created 0644 when missing, truncated (append 0) or
 * appended to (append 1). Refused: a directory, a FIFO nobody reads (it would
 * block), a socket. A FIFO with a reader and a character device (/dev/null,
 * a terminal) are written as streams. */
ZO_API zo_status zo_file_fopen_write(const char *path, int append, FILE **f);

/* path is an existing directory (not a file, not missing). */
ZO_API zo_status zo_file_check_dir(const char *path);

/* What the file at path is, for messages: "a regular file", "a directory",
 * "a FIFO", "a socket", "a character device", "a block device", "a symbolic
 * link" or "missing". */
ZO_API const char *zo_file_kind(const char *path);

#ifdef __cplusplus
}
#endif
#endif
