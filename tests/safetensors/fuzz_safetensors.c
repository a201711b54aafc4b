/* libFuzzer target for the safetensors reader: the input is a whole file.
 * Every file the reader accepts must have tensors that tile its data section
 * and that can be looked up by name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zo/log.h"
#include "zo/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];
static int fd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    zo_log_set_level(ZO_LOG_NONE);
    fd = memfd_create("zo_st_fuzz", 0);
    if (fd < 0)
        abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return 0;
}

static void check_accepted(zo_st_reader_t r)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < zo_st_reader_count(r); i++) {
        zo_st_tensor_info a = ZO_ST_TENSOR_INFO_INIT, b = ZO_ST_TENSOR_INFO_INIT;
        if (zo_st_reader_at(r, i, &a) != ZO_OK)
            abort();
        if (i > 0 && a.file_offset != pos)
            abort();
        pos = a.file_offset + a.nbytes;
        if (zo_st_reader_expect(r, a.name, a.dtype, a.ndim, a.shape, &b) != ZO_OK)
            abort();
        if (b.file_offset != a.file_offset || b.nbytes != a.nbytes)
            abort();
        volatile unsigned char sink = 0; /* touch the first and last bytes */
        if (a.nbytes)
            sink ^=
                ((const unsigned char *)a.data)[0] ^ ((const unsigned char *)a.data)[a.nbytes - 1];
        (void)sink;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (ftruncate(fd, 0) < 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    zo_st_reader_t r = NULL;
    if (zo_st_reader_open(&r, path) == ZO_OK)
        check_accepted(r);
    zo_st_reader_free(r);
    return 0;
}
