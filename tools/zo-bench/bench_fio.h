/* fio as zo-bench io's peer (bench_fio.c). */
#ifndef ZO_BENCH_FIO_H
#define ZO_BENCH_FIO_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_fio_job {
    const char *dir;
    uint64_t size, bs, qd;
    int write; /* 0: sequential read, 1: sequential write */
} bench_fio_job;

/* Whether an executable fio is on PATH. */
int bench_fio_found(void);
/* One fio run of j in DIR/zo-bench-fio.0.0 (laid out by its first run):
 * buffers on huge pages (--mem=shmhuge) when huge, else malloc. 0 and its
 * GB/s, or -1 and why it failed. */
int bench_fio_run(const bench_fio_job *j, int huge, double *gbps, char *why, size_t cap);
void bench_fio_remove_file(const char *dir);
/* What a run with huge (or not) passes fio, for the report. */
const char *bench_fio_config(int huge);

#endif
