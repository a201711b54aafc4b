/* The null engine (after fio's): runs the whole swap pipeline without a
 * disk. fio's null engine completes requests without moving a byte, which
 * would fail the store's checksums on every read, and a store that skipped
 * verification for one engine would have a path no real run takes. So this
 * engine completes each request at submit by copying to or from a memory
 * image of its file: reads return what was written (the headers, checksums
 * and generations verify as on a disk), never-written bytes read as zeros
 * (as a fresh preallocated file does), and zo-bench io --engine null
 * measures the store's own cost (headers, checksums, one copy on the I/O
 * thread) with no device in the way.
 *
 * The images are anonymous MAP_NORESERVE mappings of each file's size, so
 * only written pages cost memory. Nothing reaches the files (the store
 * still creates, locks and sizes them), and nothing outlives the engine:
 * a store reopened on kept files reads its old extents as missing. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "swap_engine.h"
#include "zo_internal.h"

typedef struct null_image {
    unsigned char *bytes; /* NULL when the file is empty */
    uint64_t size;
} null_image;

typedef struct null_engine {
    zo_io_engine base;
    pthread_mutex_t mu; /* wake() comes from other threads */
    pthread_cond_t done_cv;
    zo_io_req **done; /* completed, not yet reaped (at most queue_depth) */
    uint32_t ndone;
    int woken;
    null_image *images;
    int nimages;
} null_engine;

static null_engine *as_null(zo_io_engine *e)
{
    return (null_engine *)e;
}

static zo_status map_image(null_image *im, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "null engine: fstat of a swap file failed: %s",
                       strerror(errno));
    im->size = (uint64_t)st.st_size;
    if (im->size == 0)
        return ZO_OK;
    void *p = mmap(NULL, im->size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap",
                       "null engine: reserving a %" PRIu64 "-byte memory image failed: %s",
                       im->size, strerror(errno));
    im->bytes = p;
    return ZO_OK;
}

static zo_status null_register_files(zo_io_engine *e, const int *fds, int n)
{
    null_engine *z = as_null(e);
    z->images = calloc((size_t)n, sizeof *z->images);
    if (!z->images)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "null engine: out of memory");
    z->nimages = n;
    for (int i = 0; i < n; i++)
        ZO_TRY(map_image(&z->images[i], fds[i]));
    return ZO_OK;
}

/* A file's semantics: a read past the end is short, a write past it fails
 * (the image, unlike a file, cannot grow). */
static int64_t null_transfer(null_image *im, zo_io_req *r)
{
    if (r->off >= im->size)
        return r->dir == ZO_IO_READ ? 0 : -ENOSPC;
    size_t n = r->len < im->size - r->off ? r->len : (size_t)(im->size - r->off);
    if (r->dir == ZO_IO_READ)
        memcpy(r->buf, im->bytes + r->off, n);
    else if (n < r->len)
        return -ENOSPC;
    else
        memcpy(im->bytes + r->off, r->buf, n);
    return (int64_t)n;
}

static zo_status null_submit(zo_io_engine *e, zo_io_req *r)
{
    null_engine *z = as_null(e);
    if (r->file < 0 || r->file >= z->nimages)
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "null engine: file %d is not registered", r->file);
    pthread_mutex_lock(&z->mu);
    if (z->ndone >= z->base.queue_depth) {
        pthread_mutex_unlock(&z->mu);
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "null engine: more than %u requests outstanding",
                       z->base.queue_depth);
    }
    r->result = null_transfer(&z->images[r->file], r);
    z->done[z->ndone++] = r;
    pthread_mutex_unlock(&z->mu);
    return ZO_OK;
}

/* Completions come back in submission order, as a FIFO device's would. */
static int null_reap(zo_io_engine *e, zo_io_req **out, int max, int wait)
{
    null_engine *z = as_null(e);
    pthread_mutex_lock(&z->mu);
    while (wait && z->ndone == 0 && !z->woken)
        pthread_cond_wait(&z->done_cv, &z->mu);
    z->woken = 0;
    uint32_t n = z->ndone < (uint32_t)max ? z->ndone : (uint32_t)max;
    memcpy(out, z->done, n * sizeof *out);
    memmove(z->done, z->done + n, (z->ndone - n) * sizeof *z->done);
    z->ndone -= n;
    pthread_mutex_unlock(&z->mu);
    return (int)n;
}

static void null_wake(zo_io_engine *e)
{
    null_engine *z = as_null(e);
    pthread_mutex_lock(&z->mu);
    z->woken = 1;
    pthread_cond_signal(&z->done_cv);
    pthread_mutex_unlock(&z->mu);
}

static void null_destroy(zo_io_engine *e)
{
    null_engine *z = as_null(e);
    if (!z)
        return;
    for (int i = 0; i < z->nimages; i++)
        if (z->images[i].bytes)
            munmap(z->images[i].bytes, z->images[i].size);
    free(z->images);
    free(z->done);
    pthread_cond_destroy(&z->done_cv);
    pthread_mutex_destroy(&z->mu);
    free(z);
}

static zo_status null_create(const zo_io_engine_args *a, zo_io_engine **out)
{
    *out = NULL;
    null_engine *z = calloc(1, sizeof *z);
    zo_io_req **done = calloc(a->queue_depth, sizeof *done);
    if (!z || !done) {
        free(z);
        free(done);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "null engine: out of memory");
    }
    z->base.ops = &zo_io_null_ops;
    z->base.queue_depth = a->queue_depth;
    snprintf(z->base.name, sizeof z->base.name, "null");
    z->done = done;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->done_cv, NULL);
    *out = &z->base;
    return ZO_OK;
}

const zo_io_engine_ops zo_io_null_ops = {
    .name = "null",
    .version = ZO_IO_ENGINE_OPS_VERSION,
    .caps = ZO_IO_CAP_NO_DISK,
    .create = null_create,
    .register_files = null_register_files,
    .submit = null_submit, /* completes at once; memcpy needs no fixed buffers */
    .reap = null_reap,
    .wake = null_wake,
    .destroy = null_destroy,
};
