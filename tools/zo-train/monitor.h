/* zo-train's DeepSpeed monitors: each step's figures as CSV files
 * (csv_monitor) and as a TensorBoard event file (tensorboard), under
 * output_path/job_name as DeepSpeed lays them out, on rank 0. The names are
 * DeepSpeed's where it has them (Train/Samples/train_loss, .../lr) and the
 * PyTorch front end's for the rest (tools/python/zoffload/monitor.py), and
 * the step axis is samples seen, as DeepSpeed's. */
#ifndef ZT_MONITOR_H
#define ZT_MONITOR_H

#include <stdint.h>

#include "report.h"
#include "zo/config.h"
#include "zo/status.h"

typedef struct zt_monitor zt_monitor;

/* *out NULL when no monitor is enabled (or rank != 0). A resumed run
 * (append) adds to the CSV files it finds; TensorBoard gets a new event file
 * per process, as every writer does. */
zo_status zt_monitor_open(zt_monitor **out, const zo_train_config *cfg, int rank, int append);
/* One step's figures; samples: the samples the run has seen after it. */
zo_status zt_monitor_step(zt_monitor *m, const zt_step_figures *g, int64_t samples);
/* Flush and close; reports a failed write. Accepts NULL. */
zo_status zt_monitor_close(zt_monitor *m);

/* The masked CRC-32C TFRecord framing uses (exposed for the tests). */
uint32_t zt_tfrecord_masked_crc(const void *data, size_t n);

#endif
