/* zo-train's DeepSpeed monitors (see monitor.h): CSV files, one per figure
 * with a "step,NAME" header, and a TensorBoard event file: TFRecord framing
 * (length, masked CRC-32C of the length, the record, its masked CRC-32C)
 * around one Event protocol buffer per step, encoded here by hand (the
 * fields are few and fixed: wall_time, step, file_version, a Summary of
 * tag/simple_value pairs) rather than pulling in protobuf for them. */
#include "monitor.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainer.h"
#include "zo/file.h"
#include "zt_error.h"

enum { N_FIGURES = 14, REC_CAP = 4096 };

static const char *const figure_names[N_FIGURES] = {
    "Train/Samples/train_loss",        "Train/Samples/lr",
    "Train/Samples/grad_norm",         "Train/Samples/loss_scale",
    "Train/Samples/tokens_per_second", "Train/Samples/model_tflops",
    "Train/Samples/h2d_bytes",         "Train/Samples/d2h_bytes",
    "Train/Samples/nvme_read_bytes",   "Train/Samples/nvme_write_bytes",
    "Train/Samples/peak_device_bytes", "Train/Samples/peak_pinned_bytes",
    "Train/Samples/peak_host_bytes",   "Train/Samples/peak_nvme_bytes",
};

struct zt_monitor {
    FILE *csv[N_FIGURES]; /* NULL without csv_monitor */
    FILE *tb;             /* NULL without tensorboard */
    char tb_path[PATH_MAX];
};

static void figures_of(const zt_step_figures *g, double v[N_FIGURES])
{
    const double f[N_FIGURES] = {g->loss,
                                 g->lr,
                                 g->grad_norm,
                                 g->loss_scale,
                                 g->tokens_per_s,
                                 g->model_tflops,
                                 (double)g->h2d,
                                 (double)g->d2h,
                                 (double)g->nvme_read,
                                 (double)g->nvme_write,
                                 (double)g->in_use[0],
                                 (double)g->in_use[1],
                                 (double)g->in_use[2],
                                 (double)g->in_use[3]};
    memcpy(v, f, sizeof f);
}

/* ---- CRC-32C (Castagnoli), as TFRecord frames records ---- */

static uint32_t crc32c(const unsigned char *p, size_t n)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* idempotent: a race writes the same values */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t zt_tfrecord_masked_crc(const void *data, size_t n)
{
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- protocol buffer encoding, what an Event needs ---- */

typedef struct pb {
    unsigned char b[REC_CAP];
    size_t n;
} pb;

static void pb_byte(pb *p, unsigned v)
{
    if (p->n < REC_CAP)
        p->b[p->n++] = (unsigned char)v;
}

static void pb_varint(pb *p, uint64_t v)
{
    while (v >= 0x80) {
        pb_byte(p, (unsigned)(v & 0x7F) | 0x80);
        v >>= 7;
    }
    pb_byte(p, (unsigned)v);
}

static void pb_fixed(pb *p, const void *v, size_t n) /* little-endian hosts only (x86, ARM) */
{
    for (size_t i = 0; i < n; i++)
        pb_byte(p, ((const unsigned char *)v)[i]);
}

static void pb_bytes(pb *p, int field, const void *v, size_t n)
{
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    pb_fixed(p, v, n);
}

/* Summary.Value {tag = 1; simple_value = 2} */
static void pb_value(pb *p, const char *tag, float v)
{
    pb val = {.n = 0};
    pb_bytes(&val, 1, tag, strlen(tag));
    pb_varint(&val, 2 << 3 | 5);
    pb_fixed(&val, &v, 4);
    pb_bytes(p, 1, val.b, val.n);
}

/* Event {wall_time = 1; step = 2; file_version = 3 | summary = 5} */
static void pb_event_head(pb *p, int64_t step)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wall = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    pb_varint(p, 1 << 3 | 1);
    pb_fixed(p, &wall, 8);
    pb_varint(p, 2 << 3 | 0);
    pb_varint(p, (uint64_t)step);
}

static zo_status tb_record(zt_monitor *m, const pb *rec)
{
    if (rec->n >= REC_CAP)
        return zt_fail(ZO_ERR_INTERNAL, "a TensorBoard event outgrew %d bytes", REC_CAP);
    uint64_t len = rec->n;
    uint32_t lcrc = zt_tfrecord_masked_crc(&len, 8), dcrc = zt_tfrecord_masked_crc(rec->b, rec->n);
    if (fwrite(&len, 8, 1, m->tb) != 1 || fwrite(&lcrc, 4, 1, m->tb) != 1 ||
        fwrite(rec->b, 1, rec->n, m->tb) != rec->n || fwrite(&dcrc, 4, 1, m->tb) != 1 ||
        fflush(m->tb) != 0)
        return zt_fail(ZO_ERR_IO, "writing %s: %s", m->tb_path, strerror(errno));
    return ZO_OK;
}

/* ---- opening ---- */

static zo_status monitor_dir(char *out, size_t cap, const char *path, const char *deflt,
                             const char *job)
{
    char base[PATH_MAX];
    snprintf(base, sizeof base, "%s", path[0] ? path : deflt);
    ZT_TRY(zt_make_dir(base));
    if ((size_t)snprintf(out, cap, "%s/%s", base, job[0] ? job : "DeepSpeedJobName") >= cap)
        return zt_fail(ZO_ERR_INVALID_ARG, "monitor directory %s/%s is too long", base, job);
    return zt_make_dir(out);
}

static zo_status open_csv(zt_monitor *m, const char *dir, int append)
{
    for (int i = 0; i < N_FIGURES; i++) {
        char path[PATH_MAX], file[96];
        snprintf(file, sizeof file, "%s", figure_names[i]);
        for (char *c = file; *c; c++)
            *c = *c == '/' ? '_' : *c;
        if ((size_t)snprintf(path, sizeof path, "%s/%s.csv", dir, file) >= sizeof path)
            return zt_fail(ZO_ERR_INVALID_ARG, "the CSV directory %s is too long", dir);
        int fresh = !append || access(path, F_OK) != 0;
        if (zo_file_fopen_write(path, !fresh, &m->csv[i]) < 0)
            return zt_lib_fail(zo_last_error_status(), "csv_monitor");
        if (fresh)
            fprintf(m->csv[i], "step,%s\n", figure_names[i]);
    }
    return ZO_OK;
}

static zo_status open_tb(zt_monitor *m, const char *dir)
{
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    if ((size_t)snprintf(m->tb_path, sizeof m->tb_path,
                         "%s/events.out.tfevents.%lld.%s.%d.zo-train", dir, (long long)time(NULL),
                         host, (int)getpid()) >= sizeof m->tb_path)
        return zt_fail(ZO_ERR_INVALID_ARG, "the TensorBoard directory %s is too long", dir);
    if (zo_file_fopen_write(m->tb_path, 0, &m->tb) < 0)
        return zt_lib_fail(zo_last_error_status(), "tensorboard");
    pb rec = {.n = 0};
    pb_event_head(&rec, 0);
    pb_bytes(&rec, 3, "brain.Event:2", 13);
    return tb_record(m, &rec);
}

zo_status zt_monitor_open(zt_monitor **out, const zo_train_config *cfg, int rank, int append)
{
    *out = NULL;
    if (rank != 0 || (!cfg->csv_monitor.enabled && !cfg->tensorboard.enabled))
        return ZO_OK;
    zt_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return zt_fail(ZO_ERR_NO_MEMORY, "the monitors");
    char dir[PATH_MAX];
    zo_status st = ZO_OK;
    if (cfg->csv_monitor.enabled &&
        (st = monitor_dir(dir, sizeof dir, cfg->csv_monitor.output_path, "csv_monitor",
                          cfg->csv_monitor.job_name)) >= 0)
        st = open_csv(m, dir, append);
    if (st >= 0 && cfg->tensorboard.enabled &&
        (st = monitor_dir(dir, sizeof dir, cfg->tensorboard.output_path, "runs",
                          cfg->tensorboard.job_name)) >= 0)
        st = open_tb(m, dir);
    if (st < 0) {
        zt_monitor_close(m);
        return st;
    }
    *out = m;
    return ZO_OK;
}

zo_status zt_monitor_step(zt_monitor *m, const zt_step_figures *g, int64_t samples)
{
    if (!m)
        return ZO_OK;
    double v[N_FIGURES];
    figures_of(g, v);
    for (int i = 0; m->csv[0] && i < N_FIGURES; i++)
        if (fprintf(m->csv[i], "%lld,%.9g\n", (long long)samples, v[i]) < 0 ||
            fflush(m->csv[i]) != 0)
            return zt_fail(ZO_ERR_IO, "writing the %s CSV file: %s", figure_names[i],
                           strerror(errno));
    if (!m->tb)
        return ZO_OK;
    pb summary = {.n = 0}, rec = {.n = 0};
    for (int i = 0; i < N_FIGURES; i++)
        pb_value(&summary, figure_names[i], (float)v[i]);
    pb_event_head(&rec, samples);
    pb_bytes(&rec, 5, summary.b, summary.n);
    return tb_record(m, &rec);
}

zo_status zt_monitor_close(zt_monitor *m)
{
    if (!m)
        return ZO_OK;
    zo_status st = ZO_OK;
    for (int i = 0; i < N_FIGURES; i++)
        if (m->csv[i] && fclose(m->csv[i]) != 0 && st >= 0)
            st =
                zt_fail(ZO_ERR_IO, "closing the %s CSV file: %s", figure_names[i], strerror(errno));
    if (m->tb && fclose(m->tb) != 0 && st >= 0)
        st = zt_fail(ZO_ERR_IO, "closing %s: %s", m->tb_path, strerror(errno));
    free(m);
    return st;
}
