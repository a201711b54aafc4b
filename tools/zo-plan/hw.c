/* zo-plan: the machine's tiers (device interface, hwloc, statvfs) and where
 * its speeds come from. */
#include "hw.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zo/device.h"
#include "zo/file.h"
#include "zo/swap.h"
#include "zo/topo.h"
#include "zt_error.h"
#include "zt_host_limit.h"
#include "zt_tiers.h"

static const char *resolve_backend(const char *dev)
{
    if (!dev || strcmp(dev, "auto") == 0)
        return zo_device_cuda_count() > 0 ? "cuda" : "cpu";
    return dev;
}

/* The device's budget: what the device interface reports (the GPU's free
 * memory; the cpu device's capacity, 1 GiB unless given). */
static zo_status detect_device(const zp_hw_request *req, zp_hardware *hw, zp_hw_facts *f)
{
    const char *be = resolve_backend(req->device);
    if (strcmp(be, "cpu") != 0 && strcmp(be, "cuda") != 0)
        return zt_fail(ZO_ERR_INVALID_ARG, "--device '%s': expected auto, cpu or cuda", be);
    snprintf(hw->backend, sizeof hw->backend, "%s", be);
    hw->reserve_bytes = strcmp(be, "cuda") == 0 ? ZT_CUDA_RESERVE : 0;
    if (strcmp(be, "cuda") == 0 && zo_device_cuda_count() == 0) { /* planning for a GPU elsewhere */
        if (!req->gpu_mem)
            return zt_fail(ZO_ERR_INVALID_ARG,
                           "--device cuda: no GPU here; pass --gpu-mem BYTES to plan for one");
        snprintf(hw->device_name, sizeof hw->device_name, "a CUDA GPU (not present here)");
        hw->device_bytes = req->gpu_mem;
        snprintf(f->device_how, sizeof f->device_how, "--gpu-mem");
        return ZO_OK;
    }
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = be;
    dc.mem_budget = strcmp(be, "cpu") == 0 ? req->gpu_mem : 0;
    zo_device_t dev = NULL;
    ZT_LIB(zo_device_init(&dev, &dc));
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    zo_status st = zo_device_get_info(dev, &info);
    zo_device_free(dev);
    if (st < 0)
        return zt_lib_fail(st, "zo_device_get_info");
    snprintf(hw->device_name, sizeof hw->device_name, "%s", info.name);
    hw->device_bytes = req->gpu_mem ? req->gpu_mem : info.budget;
    snprintf(f->device_how, sizeof f->device_how, "%s",
             req->gpu_mem ? "--gpu-mem"
                          : (strcmp(be, "cuda") == 0 ? "free GPU memory" : "cpu device default"));
    return ZO_OK;
}

/* The host budget: zo-train's own host limit (physical RAM less a margin, or
 * the cgroup's limit), so a plan that fits is one zo-train accepts. On the
 * cpu device the "GPU" memory comes out of the same RAM. The RAM is the
 * kernel's figure, not the sum of hwloc's NUMA nodes: in a VM those were
 * seen to hold 5.0 of 125.9 GiB, and the sum is kept as a cross-check. */
static void detect_host(const zp_hw_request *req, zp_hardware *hw, zp_hw_facts *f)
{
    f->numa_nodes = zo_topo_numa_node_count();
    for (int i = 0; i < f->numa_nodes; i++) {
        zo_topo_node n = ZO_TOPO_NODE_INIT;
        if (zo_topo_get_node(i, &n) == ZO_OK) {
            f->numa_ram += n.memory_bytes;
            f->cores += n.n_cores;
        }
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    f->host_ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : f->numa_ram;
    char why[128];
    f->host_limit = zt_host_limit(why, sizeof why);
    uint64_t base = f->host_limit ? f->host_limit : f->host_ram;
    if (!f->host_limit)
        snprintf(why, sizeof why, "RAM, no limit known");
    hw->pinned_max = req->pinned_max;
    if (req->host_mem) {
        hw->host_bytes = req->host_mem;
        snprintf(f->host_how, sizeof f->host_how, "--host-mem");
    } else if (strcmp(hw->backend, "cpu") == 0) {
        hw->host_bytes = base > hw->device_bytes ? base - hw->device_bytes : 0;
        snprintf(f->host_how, sizeof f->host_how,
                 "zo-train's host limit (%s) less the cpu device's memory", why);
    } else {
        hw->host_bytes = base;
        snprintf(f->host_how, sizeof f->host_how, "zo-train's host limit: %s", why);
    }
}

int zp_numa_ram_disagrees(const zp_hw_facts *f)
{
    return f->numa_ram && f->host_ram &&
           (f->numa_ram < f->host_ram / 10 * 9 || f->numa_ram > f->host_ram);
}

static zo_status detect_nvme(const zp_hw_request *req, zp_hardware *hw, zp_hw_facts *f)
{
    hw->n_nvme_paths = req->n_nvme_paths;
    uint64_t sum = 0;
    for (int i = 0; i < req->n_nvme_paths; i++) {
        int odirect = 0;
        char why[256];
        ZT_LIB(zo_swap_probe_dir(req->nvme_paths[i], &odirect, &f->nvme_free[i], why, sizeof why));
        sum += f->nvme_free[i];
    }
    if (req->nvme_bytes) {
        hw->nvme_bytes = req->nvme_bytes;
        if (!hw->n_nvme_paths)
            hw->n_nvme_paths = 1;
        snprintf(f->nvme_how, sizeof f->nvme_how, "--nvme-bytes");
    } else {
        hw->nvme_bytes = sum;
        snprintf(f->nvme_how, sizeof f->nvme_how, "%s",
                 req->n_nvme_paths ? "free space of --nvme-path (statvfs)" : "no --nvme-path");
    }
    return ZO_OK;
}

zo_status zp_detect_hardware(const zp_hw_request *req, zp_hardware *hw, zp_hw_facts *facts)
{
    memset(hw, 0, sizeof *hw);
    memset(facts, 0, sizeof *facts);
    ZT_TRY(detect_device(req, hw, facts));
    detect_host(req, hw, facts);
    return detect_nvme(req, hw, facts);
}

/* ---- speeds ---- */

double *zp_speed_field(zp_speeds *sp, int which)
{
    double *f[ZP_N_SPEEDS] = {&sp->h2d,         &sp->d2h,   &sp->nvme_read,   &sp->nvme_write,
                              &sp->adam_params, &sp->flops, &sp->model_flops, &sp->nvme_update};
    return (unsigned)which < ZP_N_SPEEDS ? f[which] : NULL;
}

const char *zp_speed_name(int which)
{
    static const char *const names[ZP_N_SPEEDS] = {
        "h2d_bytes_per_s",   "d2h_bytes_per_s", "nvme_read_bytes_per_s", "nvme_write_bytes_per_s",
        "adam_params_per_s", "device_flops",    "model_flops",           "nvme_update_bytes_per_s"};
    return (unsigned)which < ZP_N_SPEEDS ? names[which] : "?";
}

/* Why a cpu-device figure is assumed, truthfully: --measure measures every
 * speed except NVMe's, which needs a directory to measure. */
static const char *cpu_assumed_why(int which, int measured)
{
    if (!measured)
        return "assumed for the cpu device (pass --measure)";
    if (which == ZP_SPEED_NVME_READ || which == ZP_SPEED_NVME_WRITE)
        return "assumed for the cpu device (--measure needs --nvme-path to measure it)";
    return "assumed for the cpu device (not measured)";
}

void zp_assume_speeds(const char *backend, int measured, zp_speeds *sp, zp_speed_sources *src)
{
    int gpu = strcmp(backend, "cuda") == 0;
    /* a GPU host: PCIe Gen4 x16 as achieved with pinned memory, one Gen4
     * drive, a server CPU's Adam, an A100-class GPU's dense bf16; the cpu
     * device: memcpy, a SATA-class disk, a laptop's cores */
    static const double on_gpu[ZP_SPEED_MODEL_FLOPS] = {25e9, 25e9, 6e9, 5e9, 2e9, 300e12};
    static const double on_cpu[ZP_SPEED_MODEL_FLOPS] = {8e9, 8e9, 0.5e9, 0.4e9, 0.3e9, 0.1e12};
    static const char *const why_gpu[ZP_SPEED_MODEL_FLOPS] = {
        "assumed: PCIe Gen4 x16",       "assumed: PCIe Gen4 x16", "assumed: one Gen4 NVMe drive",
        "assumed: one Gen4 NVMe drive", "assumed: a server CPU",  "assumed: A100-class bf16"};
    for (int i = 0; i < ZP_SPEED_MODEL_FLOPS; i++) {
        double *f = zp_speed_field(sp, i);
        if (*f > 0)
            continue;
        *f = gpu ? on_gpu[i] : on_cpu[i];
        int nvme = i == ZP_SPEED_NVME_READ || i == ZP_SPEED_NVME_WRITE;
        snprintf(src->what[i], sizeof src->what[i], "%s%s",
                 gpu ? why_gpu[i] : cpu_assumed_why(i, measured),
                 gpu && measured && nvme ? " (--measure needs --nvme-path to measure it)" : "");
    }
    /* without a measurement of the layers, they run at the matmul rate */
    if (!(sp->model_flops > 0)) {
        /* a note --measure left when the layers were too large to time */
        char why[96];
        snprintf(why, sizeof why, "%s", src->what[ZP_SPEED_MODEL_FLOPS]);
        sp->model_flops = sp->flops;
        snprintf(src->what[ZP_SPEED_MODEL_FLOPS], sizeof src->what[0],
                 "the matmul rate (%.45s)%s%.30s", src->what[ZP_SPEED_FLOPS], why[0] ? ": " : "",
                 why);
    }
    if (!(sp->nvme_update > 0))
        snprintf(src->what[ZP_SPEED_NVME_UPDATE], sizeof src->what[0],
                 "from the read and write rates");
}

static void take(zp_speeds *sp, zp_speed_sources *src, int which, double v, const char *path)
{
    double *f = zp_speed_field(sp, which);
    if (*f > 0 || !(v > 0))
        return;
    *f = v;
    snprintf(src->what[which], sizeof src->what[which], "zo-bench %.80s", path);
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

/* One zo-bench result object. */
static void bench_object(json_t *o, zp_speeds *sp, zp_speed_sources *src, const char *path)
{
    const char *bench = json_string_value(json_object_get(o, "bench"));
    if (!bench)
        return;
    if (strcmp(bench, "io") == 0) {
        const char *rw = json_string_value(json_object_get(o, "rw"));
        int which = !rw                         ? -1
                    : strcmp(rw, "read") == 0   ? ZP_SPEED_NVME_READ
                    : strcmp(rw, "write") == 0  ? ZP_SPEED_NVME_WRITE
                    : strcmp(rw, "update") == 0 ? ZP_SPEED_NVME_UPDATE
                                                : -1;
        if (which >= 0)
            take(sp, src, which, num(o, "gbps") * 1e9, path);
    } else if (strcmp(bench, "adam") == 0) {
        take(sp, src, ZP_SPEED_ADAM, num(o, "gparams_per_s") * 1e9, path);
    } else if (strcmp(bench, "engine") == 0) {
        double h = num(o, "h2d_link_seconds"), d = num(o, "d2h_link_seconds");
        take(sp, src, ZP_SPEED_H2D, h > 0 ? num(o, "h2d_bytes") / h : 0, path);
        take(sp, src, ZP_SPEED_D2H, d > 0 ? num(o, "d2h_bytes") / d : 0, path);
    }
}

zo_status zp_read_bench_json(const char *path, zp_speeds *sp, zp_speed_sources *src)
{
    FILE *f = NULL;
    if (zo_file_fopen_read(path, &f) < 0)
        return zt_lib_fail(zo_last_error_status(), "--bench-json");
    char line[8192];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] != '{')
            continue; /* zo-bench's human lines, blank lines */
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) {
            fclose(f);
            return zt_fail(ZO_ERR_CONFIG, "%s:%d: invalid JSON: %s", path, lineno, err.text);
        }
        bench_object(o, sp, src, path);
        json_decref(o);
        n++;
    }
    fclose(f);
    if (!n)
        return zt_fail(ZO_ERR_CONFIG,
                       "%s: no zo-bench --json result in it (one JSON object per line)", path);
    return ZO_OK;
}
