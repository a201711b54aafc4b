/* zo-train's feedback while it trains: the figures of each step, shown as a
 * progress line (updated in place on a terminal, plain log lines
 * otherwise), written as one JSON line per step (--metrics), and the
 * timeline of the engine's streams, queues and threads as a Chrome
 * trace-event file (--trace) that Perfetto and chrome://tracing open. */
#ifndef ZT_REPORT_H
#define ZT_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "zo/engine.h"
#include "zo/status.h"

typedef struct zt_step_figures {
    int step, total; /* steps done (counting a resumed run's earlier ones) and to reach */
    double loss, lr, grad_norm, loss_scale;
    int overflow, clipped;
    double step_s;       /* wall time of the step, a checkpoint written after it included */
    double elapsed_s;    /* since this process started training */
    double tokens_per_s; /* of this step */
    double model_tflops; /* training FLOPs per token (no recompute) x tokens/s */
    double eta_s;        /* steps left x the mean step time so far */
    double nvme_gbps;    /* NVMe bytes read and written / step time, GB/s */
    double stall_pct;    /* of the step's time the compute stream waited for parameters */
    uint64_t in_use[4];  /* bytes the engine holds: device, pinned host, pageable host, NVMe */
    uint64_t h2d, d2h, nvme_read, nvme_write; /* bytes moved this step */
} zt_step_figures;

/* One progress line. On a terminal it replaces the previous one in place
 * (no newline: zt_progress_end closes it); else it is a log line. */
void zt_progress_line(FILE *f, int tty, const zt_step_figures *g);
void zt_progress_end(FILE *f, int tty);

/* One JSON object on one line, flushed (a killed run keeps its lines). */
zo_status zt_metrics_line(FILE *f, const zt_step_figures *g);

/* ---- the trace file ---- */

typedef struct zt_trace zt_trace;

/* Create the file; its timestamps count from now. */
zo_status zt_trace_open(zt_trace **out, const char *path);
/* The engine's callback (zo_trace_fn; ctx is the zt_trace), also used by
 * the trainer for its compute-stream spans. Thread-safe. */
void zt_trace_event(void *ctx, const zo_trace_event *ev);
/* A span of the training loop's thread (a step, a checkpoint). */
void zt_trace_main(zt_trace *t, const char *name, int step, uint64_t t0_ns, uint64_t t1_ns);
/* Name the tracks, close the JSON array and the file; reports a failed
 * write. Accepts NULL. */
zo_status zt_trace_close(zt_trace *t);

#endif
