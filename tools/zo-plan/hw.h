/* zo-plan: the machine it plans for, detected or given, and its speeds,
 * measured (short micro-benchmarks), given, read from zo-bench --json output
 * or assumed. */
#ifndef ZP_HW_H
#define ZP_HW_H

#include "plan.h"

enum { ZP_MAX_NVME_PATHS = 16 };

/* What the user gave; 0 / NULL: detect. */
typedef struct zp_hw_request {
    const char *device; /* "auto", "cpu" or "cuda" */
    uint64_t gpu_mem, host_mem, pinned_max, nvme_bytes;
    const char *nvme_paths[ZP_MAX_NVME_PATHS];
    int n_nvme_paths;
} zp_hw_request;

/* What was detected, for the report. */
typedef struct zp_hw_facts {
    uint64_t host_ram;   /* physical RAM as the kernel counts it (sysconf) */
    uint64_t numa_ram;   /* hwloc: memory of every NUMA node, a cross-check */
    uint64_t host_limit; /* zo-train's host limit (zt_host_limit); 0: unknown */
    int numa_nodes, cores;
    uint64_t nvme_free[ZP_MAX_NVME_PATHS]; /* statvfs of each path */
    char host_how[200], device_how[64], nvme_how[64];
} zp_hw_facts;

zo_status zp_detect_hardware(const zp_hw_request *req, zp_hardware *hw, zp_hw_facts *facts);
/* hwloc's NUMA nodes hold less than 90% of the kernel's RAM (or more than it):
 * a VM's topology that placement by node would misjudge, said in the report. */
int zp_numa_ram_disagrees(const zp_hw_facts *f);

/* Where each speed came from. */
enum {
    ZP_SPEED_H2D,
    ZP_SPEED_D2H,
    ZP_SPEED_NVME_READ,
    ZP_SPEED_NVME_WRITE,
    ZP_SPEED_ADAM,
    ZP_SPEED_FLOPS,
    ZP_SPEED_MODEL_FLOPS,
    ZP_SPEED_NVME_UPDATE,
    ZP_N_SPEEDS
};
typedef struct zp_speed_sources {
    char what[ZP_N_SPEEDS][96]; /* "measured", "--h2d-gbps", "zo-bench FILE", "assumed: ..." */
} zp_speed_sources;

double *zp_speed_field(zp_speeds *sp, int which);
const char *zp_speed_name(int which); /* "h2d", "d2h", "nvme_read", ... */

/* Fill every speed still 0 with an assumption for the backend (PCIe Gen4
 * x16, one Gen4 NVMe drive, a data-center GPU's 16-bit TFLOPS; on the cpu
 * device figures of a small host), naming it in src. measured: --measure
 * ran, so an assumed figure says why it was not measured rather than
 * suggesting --measure. */
void zp_assume_speeds(const char *backend, int measured, zp_speeds *sp, zp_speed_sources *src);

/* Read `zo-bench ... --json` output (one JSON object per line: io, adam,
 * engine) into the speeds it measures; speeds already set stay. */
zo_status zp_read_bench_json(const char *path, zp_speeds *sp, zp_speed_sources *src);

/* Short micro-benchmarks on this machine: host<->device copies on the
 * device, NVMe reads, writes and the optimizer update's read-ahead/write-
 * behind pipeline at the job's extent size through a swap store in nvme_dir
 * (skipped when NULL), CPU Adam through the optimizer pool with the engine's thread
 * count, the device's GEMM rate at the model's shapes (zo_op_gemm), and the
 * rate of the model's own layers (training micro-batches of the whole
 * model, or of the model cut to one and three blocks, on the cpu device
 * with fewer sequences).
 * Speeds already set stay. progress (may be NULL) is told each part as it
 * starts. */
zo_status zp_measure(const zp_hardware *hw, const zp_job *job, const char *nvme_dir, zp_speeds *sp,
                     zp_speed_sources *src, void (*progress)(const char *what));

#endif
