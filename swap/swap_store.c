/* The swap store: config validation, swap files (stale-file detection, free
 * space check, preallocation), engine selection, extent allocation, stats. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "swap_internal.h"
#include "zo_flock.h"
#include "zo_internal.h"

int zo_swap_force_sync(void)
{
    return zo_env_bool("ZO_SWAP_FORCE_SYNC", 0);
}

static const char *g_env_engine = "auto";

static void read_env_engine(void)
{
    const char *v = zo_env_str("ZO_SWAP_ENGINE", "auto");
    if (zo_io_engine_check_name(v) != ZO_OK) {
        zo_clear_error();
        char list[256];
        ZO_LOGW("swap",
                "ZO_SWAP_ENGINE=%s is not an engine a store can use (expected %s); using auto", v,
                zo_io_engine_choices(list, sizeof list));
        v = "auto";
    }
    g_env_engine = v;
}

const char *zo_swap_env_engine(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_env_engine);
    return g_env_engine;
}

static zo_status validate_config(const zo_swap_config *c)
{
    if (!c || c->struct_size < sizeof(zo_swap_config))
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, "swap",
            "config is NULL or has struct_size %zu: initialize it with ZO_SWAP_CONFIG_INIT",
            c ? c->struct_size : 0);
    if (!c->paths || c->npaths == 0 || c->npaths > ZO_SWAP_MAX_PATHS)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "config has %zu paths: give 1 to %d directories (one per drive)",
                       c->paths ? c->npaths : 0, ZO_SWAP_MAX_PATHS);
    for (size_t i = 0; i < c->npaths; i++)
        if (!c->paths[i] || !*c->paths[i])
            return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                           "config path %zu is empty: expected a directory", i);
    if (c->capacity == 0 || c->extent_bytes == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "capacity (%" PRIu64 ") and extent_bytes (%" PRIu64 ") must be > 0",
                       c->capacity, c->extent_bytes);
    if (c->extent_bytes > (1ull << 34))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "extent_bytes %" PRIu64 " is over the 16 GiB limit", c->extent_bytes);
    if (c->queue_depth == 0 || c->queue_depth > 4096)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "queue_depth %u: expected 1..4096",
                       c->queue_depth);
    if (c->block_size < ZO_SWAP_ALIGN || c->block_size % ZO_SWAP_ALIGN ||
        c->block_size > (64u << 20))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "block_size %u: expected a multiple of 4096 between 4 KiB and 64 MiB",
                       c->block_size);
    if (c->reuse != ZO_SWAP_REFUSE && c->reuse != ZO_SWAP_REUSE)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "reuse %d: expected ZO_SWAP_REFUSE or ZO_SWAP_REUSE", (int)c->reuse);
    ZO_TRY(zo_io_engine_check_name(c->engine ? c->engine : "auto"));
    if (c->name && (!*c->name || strchr(c->name, '/')))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "name '%s': expected a file name prefix without '/'", c->name);
    return ZO_OK;
}

/* The layout rule, shared by plan_layout and zo_swap_files_bytes: extents
 * of payload rounded to 4 KiB, laid at a 1 MiB stride once they reach 1 MiB;
 * file i holds slots i, i + nfiles, ...; [file header][one header block per
 * slot][payloads], the payloads starting 1 MiB-aligned. */
static uint64_t extent_payload_of(uint64_t extent_bytes)
{
    return zo_round_up(extent_bytes, ZO_SWAP_ALIGN);
}

static uint64_t payload_stride_of(uint64_t payload)
{
    return payload >= ZO_SWAP_DATA_ALIGN ? zo_round_up(payload, ZO_SWAP_DATA_ALIGN) : payload;
}

static uint64_t file_slots(uint64_t nslots, uint32_t nfiles, uint32_t i)
{
    return nslots / nfiles + (i < nslots % nfiles);
}

static uint64_t file_data_off(uint64_t slots)
{
    return zo_round_up(ZO_SWAP_ALIGN * (1 + slots), ZO_SWAP_DATA_ALIGN);
}

uint64_t zo_swap_files_bytes(uint64_t capacity, uint64_t extent_bytes, size_t npaths)
{
    if (!capacity || !extent_bytes || !npaths)
        return 0;
    uint64_t payload = extent_payload_of(extent_bytes), stride = payload_stride_of(payload);
    uint64_t nslots = (capacity + payload - 1) / payload, total = 0;
    for (uint32_t i = 0; i < npaths; i++) {
        uint64_t slots = file_slots(nslots, (uint32_t)npaths, i);
        total += file_data_off(slots) + slots * stride;
    }
    return total;
}

/* Lay out the slots: slot i lives in file i % nfiles, so consecutive slots
 * land on different drives. */
static zo_status plan_layout(zo_swap_t s)
{
    s->extent_payload = extent_payload_of(s->cfg.extent_bytes);
    s->payload_stride = payload_stride_of(s->extent_payload);
    uint64_t nslots = (s->cfg.capacity + s->extent_payload - 1) / s->extent_payload;
    if (nslots >= ZO_SWAP_EXTENT_NONE)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "capacity %" PRIu64 " / extent %" PRIu64 " gives %" PRIu64
                       " extents: over the limit; use larger extents",
                       s->cfg.capacity, s->extent_payload, nslots);
    s->nslots = (uint32_t)nslots;
    s->nfiles = (uint32_t)s->cfg.npaths;
    s->files = calloc(s->nfiles, sizeof *s->files);
    s->slots = calloc(s->nslots, sizeof *s->slots);
    if (!s->files || !s->slots)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory for %u extents", s->nslots);
    for (uint32_t i = 0; i < s->nfiles; i++) {
        swap_file *f = &s->files[i];
        f->fd = -1;
        f->slots = (uint32_t)file_slots(s->nslots, s->nfiles, i);
        f->data_off = file_data_off(f->slots);
        f->size = f->data_off + f->slots * s->payload_stride;
        size_t n = strlen(s->cfg.paths[i]) + strlen(s->name) + 32;
        f->path = malloc(n);
        if (!f->path)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory");
        snprintf(f->path, n, "%s/%s.swap.%u", s->cfg.paths[i], s->name, i);
    }
    return ZO_OK;
}

/* Test hook: called at the named points of taking and removing a swap file,
 * so that a test can force the interleavings of two stores (NULL otherwise). */
void (*zo_swap_test_pause)(const char *point, const char *path);

static void pause_at(const char *point, const char *path)
{
    if (zo_swap_test_pause)
        zo_swap_test_pause(point, path);
}

/* The file header of fd into h (zeroed when the file is shorter): O_DIRECT
 * needs an aligned buffer. Returns the bytes read, or -1. */
static ssize_t read_file_header(int fd, swap_file_header *h)
{
    void *blk = NULL;
    memset(h, 0, sizeof *h);
    if (posix_memalign(&blk, ZO_SWAP_ALIGN, ZO_SWAP_ALIGN))
        return -1;
    memset(blk, 0, ZO_SWAP_ALIGN);
    ssize_t n = pread(fd, blk, ZO_SWAP_ALIGN, 0);
    memcpy(h, blk, sizeof *h);
    free(blk);
    return n;
}

/* Whether path still names the file open as fd: its holder removes a file
 * while holding its lock, so a lock won on a file no longer at the path is a
 * lock on nothing. */
static int still_at_path(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino && a.st_nlink > 0;
}

/* A file already there whose lock we now hold: its owner is gone. Take it
 * over (ZO_SWAP_REUSE) if it is a zoffload swap file, else refuse it. An
 * empty file is one whose creator died before writing its header (or is
 * about to find it held, and will fail). */
static zo_status check_stale(zo_swap_t s, swap_file *f, uint64_t *reusable)
{
    struct stat st;
    swap_file_header h;
    ssize_t n = read_file_header(f->fd, &h);
    if (fstat(f->fd, &st) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "fstat(%s) failed: %s", f->path, strerror(errno));
    if (st.st_size > 0 && (n < (ssize_t)sizeof h || h.magic != ZO_SWAP_FILE_MAGIC))
        return ZO_FAIL(ZO_ERR_EXISTS, "swap",
                       "%s exists and is not a zoffload swap file: refusing to overwrite it; "
                       "remove it or choose another path or name",
                       f->path);
    if (s->cfg.reuse != ZO_SWAP_REUSE)
        return ZO_FAIL(
            ZO_ERR_EXISTS, "swap",
            "stale swap file %s (left by pid %u on %s, a run that did not close its store): "
            "open with reuse = ZO_SWAP_REUSE to take it over (its contents are discarded) or "
            "delete it",
            f->path, h.pid, h.hostname[0] ? h.hostname : "?");
    ZO_LOGI("swap", "taking over stale swap file %s (left by pid %u); its contents are discarded",
            f->path, h.pid);
    *reusable = (uint64_t)st.st_blocks * 512u;
    return ZO_OK;
}

/* The holder a swap file's header records (zo_flock_take's question). */
static int header_owner(int fd, zo_lock_owner *o)
{
    swap_file_header h;
    memset(o, 0, sizeof *o);
    if (read_file_header(fd, &h) < 0 || h.magic != ZO_SWAP_FILE_MAGIC)
        return 0;
    o->pid = h.pid;
    memcpy(o->host, h.hostname,
           sizeof o->host < sizeof h.hostname ? sizeof o->host : sizeof h.hostname);
    o->host[sizeof o->host - 1] = 0;
    return 1;
}

static zo_status open_failed(const char *path)
{
    if (errno == EINVAL)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "swap",
                       "the file system of %s does not support O_DIRECT: choose a path on a local "
                       "disk (ext4, xfs)",
                       path);
    return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "cannot create swap file %s: %s", path, strerror(errno));
}

/* Hold the file at f->path: create it (O_EXCL: a file we did not create is
 * never taken for ours) or open the one there, then lock it. A file whose
 * lock is held belongs to a live store: refused. A lock won on a file its
 * holder removed meanwhile is let go and the whole step retried. Once this
 * returns with f->fd >= 0 the lock is held until release. */
static zo_status acquire_file(zo_swap_t s, swap_file *f, uint64_t *reusable)
{
    *reusable = 0;
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
        int created = fd >= 0;
        if (fd < 0 && errno == EEXIST)
            fd = open(f->path, O_RDWR | O_DIRECT | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT)
            continue; /* removed between the two opens */
        if (fd < 0)
            return open_failed(f->path);
        pause_at(created ? "created" : "opened", f->path);
        if (!zo_flock_take(fd, header_owner)) {
            swap_file_header h;
            read_file_header(fd, &h);
            close(fd);
            return ZO_FAIL(
                ZO_ERR_EXISTS, "swap",
                "swap file %s is in use by a running process (pid %u): choose another path or name",
                f->path, h.magic == ZO_SWAP_FILE_MAGIC ? h.pid : 0);
        }
        pause_at("locked", f->path);
        if (!still_at_path(fd, f->path)) {
            close(fd);
            continue;
        }
        f->fd = fd;
        f->created = created;
        return created ? ZO_OK : check_stale(s, f, reusable);
    }
    return ZO_FAIL(ZO_ERR_EXISTS, "swap",
                   "swap file %s kept being created and removed by other processes: choose another "
                   "path or name",
                   f->path);
}

static zo_status check_dir(const char *path)
{
    struct stat di;
    if (stat(path, &di) != 0)
        return ZO_FAIL(ZO_ERR_NOT_FOUND, "swap", "swap path %s: %s (expected a directory)", path,
                       strerror(errno));
    if (!S_ISDIR(di.st_mode))
        return ZO_FAIL(ZO_ERR_NOT_FOUND, "swap", "swap path %s is not a directory", path);
    return ZO_OK;
}

/* Sum what each file system must still provide and compare with statvfs. */
static zo_status check_free_space(zo_swap_t s, const uint64_t *reusable)
{
    for (uint32_t i = 0; i < s->nfiles; i++) {
        struct stat di;
        struct statvfs vf;
        if (stat(s->cfg.paths[i], &di) != 0)
            return ZO_FAIL(ZO_ERR_NOT_FOUND, "swap", "swap path %s: %s (expected a directory)",
                           s->cfg.paths[i], strerror(errno));
        if (statvfs(s->cfg.paths[i], &vf) != 0)
            return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "statvfs(%s) failed: %s", s->cfg.paths[i],
                           strerror(errno));
        uint64_t need = 0;
        int first = 1;
        for (uint32_t j = 0; j < s->nfiles; j++) {
            struct stat dj;
            if (stat(s->cfg.paths[j], &dj) != 0 || dj.st_dev != di.st_dev)
                continue;
            if (j < i)
                first = 0; /* this file system was checked with path j */
            need += s->files[j].size > reusable[j] ? s->files[j].size - reusable[j] : 0;
        }
        uint64_t avail = (uint64_t)vf.f_bavail * vf.f_frsize;
        if (first && avail < need) {
            char a[32], b[32], c[32];
            return ZO_FAIL(
                ZO_ERR_NO_SPACE, "swap",
                "not enough free space for swap files in %s: need %s, %s free, %s missing",
                s->cfg.paths[i], zo_fmt_bytes(a, sizeof a, need), zo_fmt_bytes(b, sizeof b, avail),
                zo_fmt_bytes(c, sizeof c, need - avail));
        }
    }
    return ZO_OK;
}

static zo_status write_file_header(zo_swap_t s, swap_file *f, uint32_t index)
{
    void *blk = NULL;
    if (posix_memalign(&blk, ZO_SWAP_ALIGN, ZO_SWAP_ALIGN))
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory");
    memset(blk, 0, ZO_SWAP_ALIGN);
    swap_file_header *h = blk;
    h->magic = ZO_SWAP_FILE_MAGIC;
    h->version = ZO_SWAP_FORMAT_VERSION;
    h->index = index;
    h->nfiles = s->nfiles;
    h->pid = (uint32_t)getpid();
    h->extent_payload = s->extent_payload;
    h->slots = f->slots;
    h->created_unix = (uint64_t)time(NULL);
    gethostname(h->hostname, sizeof h->hostname - 1);
    ssize_t n = pwrite(f->fd, blk, ZO_SWAP_ALIGN, 0);
    int err = errno;
    free(blk);
    if (n != (ssize_t)ZO_SWAP_ALIGN)
        return ZO_FAIL(err == ENOSPC ? ZO_ERR_NO_SPACE : ZO_ERR_IO, "swap",
                       "writing the header of %s failed: %s", f->path,
                       n < 0 ? strerror(err) : "short write");
    return ZO_OK;
}

static zo_status preallocate(swap_file *f)
{
    if (ftruncate(f->fd, (off_t)f->size) != 0)
        return ZO_FAIL(errno == ENOSPC || errno == EFBIG ? ZO_ERR_NO_SPACE : ZO_ERR_SYSTEM, "swap",
                       "sizing %s to %" PRIu64 " bytes failed: %s", f->path, f->size,
                       strerror(errno));
    int rc = fallocate(f->fd, 0, 0, (off_t)f->size);
    if (rc == 0)
        return ZO_OK;
    if (errno == ENOSPC)
        return ZO_FAIL(ZO_ERR_NO_SPACE, "swap",
                       "preallocating %" PRIu64 " bytes for %s failed: no space left on the device",
                       f->size, f->path);
    if (errno == EOPNOTSUPP) {
        ZO_LOGW("swap",
                "%s: the file system cannot preallocate (fallocate unsupported); a full disk will "
                "show up as ENOSPC on write",
                f->path);
        return ZO_OK;
    }
    return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "fallocate(%s, %" PRIu64 ") failed: %s", f->path, f->size,
                   strerror(errno));
}

/* A new file's blocks, reserved in one request before its header is
 * written. With the header written first, ext4 gave its block an allocation
 * of its own and began the rest one block past a 1 MiB boundary of the disk,
 * so every payload request in the file's first ~120 MiB straddled two of the
 * disk's 1 MiB chunks (zo-bench io read ran ~7% behind fio, whose files start
 * aligned). FALLOC_FL_KEEP_SIZE leaves the size at 0 until the header is in,
 * so a run killed in between leaves a file a takeover still treats as a
 * stale swap file, not a foreign one. A refusal here is not an error:
 * preallocate() asks again and says why. */
static void reserve_blocks(const swap_file *f)
{
    if (f->created && fallocate(f->fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)f->size) != 0)
        ZO_LOGD("swap", "%s: reserving its blocks up front failed: %s", f->path, strerror(errno));
}

/* The header goes before the size, so that a file with any bytes in it
 * names its owner (a takeover checks it). */
static zo_status open_files(zo_swap_t s)
{
    uint64_t reusable[ZO_SWAP_MAX_PATHS] = {0};
    for (uint32_t i = 0; i < s->nfiles; i++) {
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(s->files[i].path, s->files[j].path))
                return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                               "path %s is given twice: give one directory per drive",
                               s->cfg.paths[i]);
        ZO_TRY(check_dir(s->cfg.paths[i]));
        ZO_TRY(acquire_file(s, &s->files[i], &reusable[i]));
    }
    ZO_TRY(check_free_space(s, reusable));
    for (uint32_t i = 0; i < s->nfiles; i++) {
        reserve_blocks(&s->files[i]);
        ZO_TRY(write_file_header(s, &s->files[i], i));
        ZO_TRY(preallocate(&s->files[i]));
    }
    return ZO_OK;
}

static zo_io_engine_args engine_args(zo_swap_t s, char *why, size_t cap)
{
    return (zo_io_engine_args){.queue_depth = s->cfg.queue_depth, .why = why, .why_cap = cap};
}

/* "auto": the first engine marked for it that sets up here, the fallback
 * said once (io_uring is refused by old kernels and seccomp profiles). */
static zo_status create_auto(zo_swap_t s, zo_io_engine **out)
{
    static atomic_int fallback_logged;
    const zo_io_engine_ops *const *tab;
    size_t n = zo_io_engines(&tab);
    const char *failed = NULL;
    char why[256] = "";
    zo_status st = ZO_ERR_UNSUPPORTED;
    for (size_t i = 0; i < n; i++) {
        if (!(tab[i]->caps & ZO_IO_CAP_AUTO))
            continue;
        if (failed)
            zo_clear_error(); /* the engine tried before is superseded */
        zo_io_engine_args a = engine_args(s, why, sizeof why);
        st = zo_io_engine_create(tab[i], &a, out);
        if (st == ZO_OK) {
            if (failed && atomic_exchange(&fallback_logged, 1) == 0)
                ZO_LOGW("swap", "%s is unavailable (%s): using the %s engine", failed, why,
                        tab[i]->name);
            return ZO_OK;
        }
        failed = failed ? failed : tab[i]->name;
    }
    if (!failed)
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "no I/O engine is marked for \"auto\"");
    return st;
}

/* The engine the store was configured with; "auto" follows ZO_SWAP_ENGINE. */
static zo_status create_named(zo_swap_t s, zo_io_engine **out)
{
    const char *want = s->cfg.engine ? s->cfg.engine : "auto";
    if (!strcmp(want, "auto"))
        want = zo_swap_env_engine();
    if (!strcmp(want, "auto"))
        return create_auto(s, out);
    char why[256] = "";
    zo_io_engine_args a = engine_args(s, why, sizeof why);
    return zo_io_engine_create(zo_io_engine_find(want), &a, out);
}

static zo_status create_engine(zo_swap_t s)
{
    zo_io_engine *e = NULL;
    ZO_TRY(create_named(s, &e));
    if (s->cfg.nfaults) {
        zo_io_engine_args a = {.queue_depth = s->cfg.queue_depth, .inner = e};
        ZO_TRY(zo_io_engine_create(&zo_io_fault_ops, &a, &e));
        s->engine = e;
        ZO_TRY(zo_io_fault_arm(e, s->cfg.faults, s->cfg.nfaults));
    }
    s->engine = e;
    int fds[ZO_SWAP_MAX_PATHS];
    for (uint32_t i = 0; i < s->nfiles; i++)
        fds[i] = s->files[i].fd;
    return e->ops->register_files(e, fds, (int)s->nfiles);
}

/* closing: a normal close (removes every file unless keep_files); otherwise
 * a failed open (removes only the files it created). Either way only files
 * whose lock this store holds (f->fd >= 0). */
static void release(zo_swap_t s, int closing)
{
    if (s->thread_started)
        zo_swap_stop_io(s);
    if (s->engine)
        s->engine->ops->destroy(s->engine);
    for (uint32_t i = 0; s->files && i < s->nfiles; i++) {
        swap_file *f = &s->files[i];
        if (f->fd >= 0) { /* held: only a file's holder removes it */
            if (closing ? !s->cfg.keep_files : f->created) {
                pause_at("removing", f->path);
                unlink(f->path);
                pause_at("removed", f->path);
            }
            /* Unlock explicitly: a torn-down io_uring may hold the file a
             * little longer, and with it the lock. */
            flock(f->fd, LOCK_UN);
            close(f->fd);
        }
        free(f->path);
    }
    while (s->tickets) {
        struct zo_swap_io *op = s->tickets;
        s->tickets = op->tnext;
        zo_swap_op_free(op);
    }
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->reqs);
    free(s->reap_buf);
    free(s->files);
    free(s->slots);
    free(s->name);
    free(s);
}

/* "eio@40,delay@3:20": KIND@OP[:MS] into f; the count, or -1. */
static int parse_faults(const char *text, zo_swap_fault *f, size_t cap)
{
    static const char *const kinds[ZO_SWAP_FAULT_KIND_COUNT_] = {"eio",   "nospc",  "short",
                                                                 "eintr", "eagain", "delay"};
    int n = 0;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "@");
        int kind = -1;
        for (int k = 0; k < ZO_SWAP_FAULT_KIND_COUNT_; k++)
            if (strlen(kinds[k]) == len && !strncmp(p, kinds[k], len))
                kind = k;
        char *end;
        if (kind < 0 || p[len] != '@' || (size_t)n == cap)
            return -1;
        unsigned long long op = strtoull(p + len + 1, &end, 10), ms = 0;
        if (end == p + len + 1)
            return -1;
        if (*end == ':')
            ms = strtoull(end + 1, &end, 10);
        if ((*end && *end != ',') || ms > 60000)
            return -1;
        f[n++] = (zo_swap_fault){(zo_swap_fault_kind)kind, op, (uint32_t)ms};
        p = *end ? end + 1 : end;
    }
    return n;
}

/* The config's faults, then those of ZO_SWAP_FAULTS (armed in every store
 * the process opens: drills and end-to-end tests of programs, such as
 * zo-train, whose configs do not carry faults). */
static zo_status faults_to_arm(const zo_swap_config *cfg, zo_swap_fault *out, size_t *n)
{
    *n = cfg->nfaults < ZO_SWAP_MAX_FAULTS ? cfg->nfaults : ZO_SWAP_MAX_FAULTS;
    if (cfg->faults && *n)
        memcpy(out, cfg->faults, *n * sizeof *out);
    const char *env = zo_env_str("ZO_SWAP_FAULTS", NULL);
    if (!env || !*env)
        return ZO_OK;
    int k = parse_faults(env, out + *n, ZO_SWAP_MAX_FAULTS - *n);
    if (k < 0)
        return ZO_FAIL(ZO_ERR_CONFIG, "swap",
                       "ZO_SWAP_FAULTS '%s': expected KIND@OP[:MS],... (at most %d) with KIND "
                       "eio, nospc, short, eintr, eagain or delay",
                       env, ZO_SWAP_MAX_FAULTS);
    ZO_LOGW("swap", "ZO_SWAP_FAULTS: %d injected fault(s) armed: %s", k, env);
    *n += (size_t)k;
    return ZO_OK;
}

zo_status zo_swap_open(const zo_swap_config *cfg, zo_swap_t *out)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_open: out is NULL");
    *out = NULL;
    ZO_TRY(validate_config(cfg));
    zo_swap_t s = calloc(1, sizeof *s);
    if (!s)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->cfg = *cfg;
    s->cfg.paths = NULL; /* not kept: the caller's array may go away */
    s->cfg.faults = NULL;
    s->name = strdup(cfg->name ? cfg->name : "zoffload");
    zo_status st = s->name ? ZO_OK : ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory");
    s->cfg.paths = cfg->paths;
    if (st == ZO_OK)
        st = plan_layout(s);
    if (st == ZO_OK)
        st = open_files(s);
    zo_swap_fault faults[ZO_SWAP_MAX_FAULTS];
    if (st == ZO_OK)
        st = faults_to_arm(cfg, faults, &s->cfg.nfaults);
    s->cfg.faults = faults;
    if (st == ZO_OK)
        st = create_engine(s);
    s->cfg.paths = NULL;
    s->cfg.faults = NULL;
    if (st == ZO_OK)
        st = zo_swap_start_io(s);
    if (st != ZO_OK) {
        release(s, 0);
        return st;
    }
    s->stats.struct_size = sizeof s->stats;
    s->stats.engine = s->engine->name;
    s->stats.extents_total = s->nslots;
    s->stats.nfiles = s->nfiles;
    for (uint32_t i = 0; i < s->nfiles; i++)
        s->stats.file_bytes += s->files[i].size;
    ZO_LOGI("swap",
            "store open: %u file(s), %u extents of %" PRIu64
            " bytes, engine %s, queue depth %u, block %u",
            s->nfiles, s->nslots, s->extent_payload, s->engine->name, s->cfg.queue_depth,
            s->cfg.block_size);
    *out = s;
    return ZO_OK;
}

void zo_swap_close(zo_swap_t s)
{
    if (!s)
        return;
    release(s, 1);
}

zo_status zo_swap_alloc_extent(zo_swap_t s, uint64_t owner, zo_swap_extent_t *out)
{
    if (!s || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_alloc_extent: NULL store or out");
    *out = ZO_SWAP_EXTENT_NONE;
    pthread_mutex_lock(&s->mu);
    for (uint32_t k = 0; k < s->nslots; k++) {
        uint32_t i = (s->cursor + k) % s->nslots;
        if (s->slots[i].used)
            continue;
        s->slots[i].used = 1;
        s->slots[i].owner = owner;
        s->cursor = (i + 1) % s->nslots;
        s->used++;
        s->stats.extents_used = s->used;
        pthread_mutex_unlock(&s->mu);
        *out = i;
        return ZO_OK;
    }
    uint32_t total = s->nslots;
    pthread_mutex_unlock(&s->mu);
    return ZO_FAIL(ZO_ERR_BUDGET, "swap",
                   "all %u extents are in use: open the store with a larger capacity", total);
}

zo_status zo_swap_free_extent(zo_swap_t s, zo_swap_extent_t ext)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_free_extent: NULL store");
    pthread_mutex_lock(&s->mu);
    zo_status st = ZO_OK;
    if (ext >= s->nslots || !s->slots[ext].used)
        st = ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "extent %u is not allocated (store has %u)", ext,
                     s->nslots);
    else if (s->slots[ext].busy)
        st = ZO_FAIL(ZO_ERR_STATE, "swap",
                     "extent %u has I/O in flight: wait for it before freeing", ext);
    else {
        s->slots[ext].used = 0;
        s->used--;
        s->stats.extents_used = s->used;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

zo_status zo_swap_get_stats(zo_swap_t s, zo_swap_stats *out)
{
    if (!s || !out || out->struct_size < sizeof *out)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, "swap",
            "zo_swap_get_stats: NULL argument or stats not initialized with ZO_SWAP_STATS_INIT");
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
    return ZO_OK;
}

zo_status zo_swap_extent_location(zo_swap_t s, zo_swap_extent_t ext, const char **path,
                                  uint64_t *header_offset, uint64_t *payload_offset)
{
    if (!s || ext >= s->nslots)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "extent %u is out of range (store has %u)", ext,
                       s ? s->nslots : 0);
    const swap_file *f = &s->files[ext % s->nfiles];
    uint64_t local = ext / s->nfiles;
    if (path)
        *path = f->path;
    if (header_offset)
        *header_offset = ZO_SWAP_ALIGN * (1 + local);
    if (payload_offset)
        *payload_offset = f->data_off + local * s->payload_stride;
    return ZO_OK;
}

const char *zo_swap_engine_name(zo_swap_t s)
{
    return s && s->engine ? s->engine->name : "";
}

zo_status zo_swap_set_faults(zo_swap_t s, const zo_swap_fault *faults, size_t n)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_set_faults: NULL store");
    return zo_io_fault_arm(s->engine, faults, n);
}

static int free_region(zo_swap_t s, void *match)
{
    for (int i = 0; i < ZO_SWAP_MAX_REGISTERED; i++)
        if (s->regions[i].buf == match)
            return i;
    return -1;
}

zo_status zo_swap_register_buffer(zo_swap_t s, void *buf, size_t len)
{
    if (!s || !buf || !len)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "zo_swap_register_buffer: NULL store or empty buffer");
    pthread_mutex_lock(&s->mu);
    int i = free_region(s, NULL);
    if (i >= 0)
        s->regions[i] = (swap_region){buf, len, -1}; /* reserved; unused until it has an index */
    pthread_mutex_unlock(&s->mu);
    if (i < 0)
        return ZO_FAIL(ZO_ERR_BUDGET, "swap", "already %d buffers registered: unregister one first",
                       ZO_SWAP_MAX_REGISTERED);
    swap_ctl ctl = {0, buf, len, -1, ZO_OK, "", 0, NULL};
    zo_status st = zo_swap_run_ctl(s, &ctl);
    pthread_mutex_lock(&s->mu);
    if (st == ZO_OK)
        s->regions[i].index = ctl.index;
    else
        s->regions[i] = (swap_region){NULL, 0, -1};
    pthread_mutex_unlock(&s->mu);
    return st;
}

zo_status zo_swap_unregister_buffer(zo_swap_t s, void *buf)
{
    if (!s || !buf)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_unregister_buffer: NULL argument");
    pthread_mutex_lock(&s->mu);
    int i = free_region(s, buf);
    int index = i >= 0 ? s->regions[i].index : -1;
    if (i >= 0)
        s->regions[i].index = -1; /* new requests stop using it */
    pthread_mutex_unlock(&s->mu);
    if (i < 0)
        return ZO_FAIL(ZO_ERR_NOT_FOUND, "swap", "buffer %p was not registered", buf);
    swap_ctl ctl = {1, buf, 0, index, ZO_OK, "", 0, NULL};
    zo_status st = index >= 0 ? zo_swap_run_ctl(s, &ctl) : ZO_OK;
    pthread_mutex_lock(&s->mu);
    s->regions[i] = (swap_region){NULL, 0, -1};
    pthread_mutex_unlock(&s->mu);
    return st;
}
