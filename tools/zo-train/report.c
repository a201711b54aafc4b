/* zo-train's progress line, metrics lines and trace file (see report.h). */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"
#include "zo/file.h"
#include "zo/units.h"
#include "zt_error.h"

/* ---- human figures ---- */

/* "1.5M": zo_fmt_bytes_prec's one-decimal text without the space and the "iB". */
static const char *compact_bytes(char *buf, size_t cap, uint64_t b)
{
    char full[32];
    zo_fmt_bytes_prec(full, sizeof full, b, 1);
    size_t n = 0;
    for (const char *p = full; *p && n + 1 < cap; p++)
        if (*p != ' ' && *p != 'i' && !(*p == 'B' && p > full && p[-1] == 'i'))
            buf[n++] = *p;
    buf[n] = 0;
    return buf;
}

static const char *duration(char *buf, size_t cap, double s)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, cap, "?");
    else if (s < 60)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    return buf;
}

void zt_progress_line(FILE *f, int tty, const zt_step_figures *g)
{
    char eta[32], b[4][16];
    const char *tag = g->overflow ? "  overflow: skipped" : g->clipped ? "  clipped" : "";
    fprintf(f,
            "%sstep %d/%d  loss %.4f  lr %.3g  %.0f tok/s  %.3g TFLOPS  ETA %s  dev %s pin %s host "
            "%s nvme %s  nvme %.2f GB/s  stall %.1f%%%s%s",
            tty ? "\r\033[K" : "", g->step, g->total, g->loss, g->lr, g->tokens_per_s,
            g->model_tflops, duration(eta, sizeof eta, g->eta_s),
            compact_bytes(b[0], sizeof b[0], g->in_use[0]),
            compact_bytes(b[1], sizeof b[1], g->in_use[1]),
            compact_bytes(b[2], sizeof b[2], g->in_use[2]),
            compact_bytes(b[3], sizeof b[3], g->in_use[3]), g->nvme_gbps, g->stall_pct, tag,
            tty ? "" : "\n");
    fflush(f);
}

void zt_progress_end(FILE *f, int tty)
{
    if (tty)
        fputc('\n', f);
}

/* ---- metrics ---- */

static void put_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.9g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

zo_status zt_metrics_line(FILE *f, const zt_step_figures *g)
{
    fprintf(f, "{\"step\":%d,\"total\":%d", g->step, g->total);
    put_num(f, "loss", g->loss);
    put_num(f, "lr", g->lr);
    put_num(f, "grad_norm", g->grad_norm);
    put_num(f, "loss_scale", g->loss_scale);
    fprintf(f, ",\"overflow\":%s,\"clipped\":%s", g->overflow ? "true" : "false",
            g->clipped ? "true" : "false");
    put_num(f, "step_s", g->step_s);
    put_num(f, "elapsed_s", g->elapsed_s);
    put_num(f, "tokens_per_s", g->tokens_per_s);
    put_num(f, "model_tflops", g->model_tflops);
    put_num(f, "eta_s", g->eta_s);
    put_num(f, "nvme_gbps", g->nvme_gbps);
    put_num(f, "stall_pct", g->stall_pct);
    fprintf(f,
            ",\"bytes_in_use\":{\"device\":%" PRIu64 ",\"pinned\":%" PRIu64 ",\"host\":%" PRIu64
            ",\"nvme\":%" PRIu64 "},\"bytes_moved\":{\"h2d\":%" PRIu64 ",\"d2h\":%" PRIu64
            ",\"nvme_read\":%" PRIu64 ",\"nvme_write\":%" PRIu64 "}}\n",
            g->in_use[0], g->in_use[1], g->in_use[2], g->in_use[3], g->h2d, g->d2h, g->nvme_read,
            g->nvme_write);
    if (fflush(f) != 0 || ferror(f))
        return zt_fail(ZO_ERR_IO, "writing the metrics file: %s", strerror(errno));
    return ZO_OK;
}

/* ---- the trace file ---- */

/* Track ids (Chrome's tid): the loop, the streams, the engine's threads,
 * NVMe lanes (requests of a queue in flight together need a lane each, as
 * spans on one track must nest), then the optimizer's workers. */
enum {
    TID_MAIN = 1,
    TID_COMPUTE,
    TID_H2D,
    TID_D2H,
    TID_JOBS,
    TID_UPDATE,
    TID_NVME = 100,   /* + 32 * store + lane */
    TID_WORKER = 200, /* + worker */
    NVME_LANES = 32,
    MAX_WORKERS = 1024,
};

struct zt_trace {
    FILE *f;
    char path[4096];
    pthread_mutex_t mu;
    uint64_t origin;
    int events;
    uint64_t lane_end[2][NVME_LANES]; /* the last span's end on each NVMe lane */
    int lanes[2];                     /* lanes used per queue */
    int workers;                      /* optimizer workers seen (1 + highest index) */
    int used[TID_UPDATE + 1];
    int err;
};

zo_status zt_trace_open(zt_trace **out, const char *path)
{
    zt_trace *t = calloc(1, sizeof *t);
    if (!t)
        return zt_fail(ZO_ERR_NO_MEMORY, "the trace writer");
    if (zo_file_fopen_write(path, 0, &t->f) < 0) {
        free(t);
        return zt_lib_fail(zo_last_error_status(), "--trace");
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    pthread_mutex_init(&t->mu, NULL);
    t->origin = zo_now_ns();
    fputs("[\n", t->f);
    *out = t;
    return ZO_OK;
}

static double us(const zt_trace *t, uint64_t ns)
{
    return ((double)ns - (double)t->origin) / 1e3;
}

/* Under t->mu. */
static void put_span(zt_trace *t, int tid, const char *cat, const char *name, int layer,
                     uint64_t t0, uint64_t t1, const char *args)
{
    char label[96];
    if (layer >= 0)
        snprintf(label, sizeof label, "%s L%d", name, layer);
    else
        snprintf(label, sizeof label, "%s", name);
    if (fprintf(t->f,
                "%s{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,"
                "\"dur\":%.3f,\"args\":{%s}}",
                t->events ? ",\n" : "", tid, cat, label, us(t, t0), (double)(t1 - t0) / 1e3,
                args) < 0)
        t->err = errno ? errno : EIO;
    t->events++;
}

/* The first lane of the queue free since t0 (spans on one lane never overlap). */
static int nvme_lane(zt_trace *t, int store, uint64_t t0, uint64_t t1)
{
    int l = 0;
    while (l < t->lanes[store] && t->lane_end[store][l] > t0)
        l++;
    if (l == NVME_LANES)
        l = NVME_LANES - 1; /* more in flight than lanes: the last one takes the rest */
    if (l == t->lanes[store])
        t->lanes[store]++;
    if (t1 > t->lane_end[store][l])
        t->lane_end[store][l] = t1;
    return l;
}

static int track_tid(zt_trace *t, const zo_trace_event *ev)
{
    switch (ev->track) {
    case ZO_TRACK_H2D: return TID_H2D;
    case ZO_TRACK_D2H: return TID_D2H;
    case ZO_TRACK_COMPUTE: return TID_COMPUTE;
    case ZO_TRACK_HOST_JOBS: return TID_JOBS;
    case ZO_TRACK_UPDATE: return TID_UPDATE;
    case ZO_TRACK_NVME: {
        int store = ev->index ? 1 : 0;
        return TID_NVME + NVME_LANES * store + nvme_lane(t, store, ev->t0_ns, ev->t1_ns);
    }
    case ZO_TRACK_OPTIM_WORKER: {
        int w = ev->index < MAX_WORKERS ? ev->index : MAX_WORKERS - 1;
        if (w + 1 > t->workers)
            t->workers = w + 1;
        return TID_WORKER + w;
    }
    }
    return TID_MAIN;
}

static const char *const track_cats[] = {"copy",   "copy",      "compute",  "nvme",
                                         "engine", "optimizer", "optimizer"};

void zt_trace_event(void *ctx, const zo_trace_event *ev)
{
    zt_trace *t = ctx;
    char args[160];
    snprintf(args, sizeof args, "\"layer\":%d,\"chunk\":%d,\"%s\":%" PRIu64, ev->layer, ev->chunk,
             ev->track == ZO_TRACK_OPTIM_WORKER ? "elements" : "bytes", ev->bytes);
    const char *cat = (unsigned)ev->track < sizeof track_cats / sizeof *track_cats
                          ? track_cats[ev->track]
                          : "engine";
    pthread_mutex_lock(&t->mu);
    int tid = track_tid(t, ev);
    if (tid <= TID_UPDATE)
        t->used[tid] = 1;
    put_span(t, tid, cat, ev->name, ev->layer, ev->t0_ns, ev->t1_ns, args);
    pthread_mutex_unlock(&t->mu);
}

void zt_trace_main(zt_trace *t, const char *name, int step, uint64_t t0_ns, uint64_t t1_ns)
{
    if (!t)
        return;
    char args[32], label[64];
    snprintf(args, sizeof args, "\"step\":%d", step);
    snprintf(label, sizeof label, "%s %d", name, step);
    pthread_mutex_lock(&t->mu);
    t->used[TID_MAIN] = 1;
    put_span(t, TID_MAIN, "train", label, -1, t0_ns, t1_ns, args);
    pthread_mutex_unlock(&t->mu);
}

static void name_track(zt_trace *t, int tid, const char *name)
{
    fprintf(t->f,
            "%s{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%"
            "s\"}},\n"
            "{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_"
            "index\":%d}}",
            t->events++ ? ",\n" : "", tid, name, tid, tid);
}

zo_status zt_trace_close(zt_trace *t)
{
    if (!t)
        return ZO_OK;
    static const char *const names[] = {NULL,
                                        "training loop",
                                        "compute stream",
                                        "h2d stream (copy engine)",
                                        "d2h stream (copy engine)",
                                        "engine host jobs",
                                        "optimizer update"};
    fprintf(t->f,
            "%s{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"zo-train\"}}",
            t->events++ ? ",\n" : "");
    for (int tid = TID_MAIN; tid <= TID_UPDATE; tid++)
        if (t->used[tid])
            name_track(t, tid, names[tid]);
    char name[64];
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < t->lanes[s]; l++) {
            snprintf(name, sizeof name, "nvme queue: %s (lane %d)",
                     s ? "parameters" : "optimizer states", l);
            name_track(t, TID_NVME + NVME_LANES * s + l, name);
        }
    for (int w = 0; w < t->workers; w++) {
        snprintf(name, sizeof name, "optimizer worker %d", w);
        name_track(t, TID_WORKER + w, name);
    }
    fputs("\n]\n", t->f);
    int err = t->err;
    if (fclose(t->f) != 0 && !err)
        err = errno ? errno : EIO;
    zo_status st =
        err ? zt_fail(ZO_ERR_IO, "writing the trace file %s: %s", t->path, strerror(err)) : ZO_OK;
    pthread_mutex_destroy(&t->mu);
    free(t);
    return st;
}
