/* zo-report: what a user needs to know about this machine before training
 * with zoffload. Human output by default, one JSON object with --json. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zo/cpu.h"
#include "zo/device.h"
#include "zo/file.h"
#include "zo/hostpool.h"
#include "zo/swap.h"
#include "zo/sysinfo.h"
#include "zo/topo.h"
#include "zt_error.h"
#include "zt_output.h"

#define MAX_DIRS 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-report [--swap-dir DIR]... [--json] [--help]\n"
            "\n"
            "Reports what zoffload sees on this machine: each CUDA GPU (name, memory, PCIe link,\n"
            "nearest NUMA node) or the cpu device, NUMA nodes, the CPU's SIMD level, whether\n"
            "io_uring works, the host pool's node choice and the memlock limit, and for each\n"
            "--swap-dir whether it accepts O_DIRECT and how much space it has.\n"
            "\n"
            "  --swap-dir DIR  check a directory meant for NVMe swap files (repeatable; exit\n"
            "                  status 1 when one cannot hold them)\n"
            "  --json          print one JSON object instead of text\n"
            "  --help          this text\n");
}

static json_t *versions_json(void)
{
    zo_versions v = ZO_VERSIONS_INIT;
    zo_get_versions(&v);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "zoffload", v.zoffload, "cuda_runtime",
                     v.cuda_runtime, "cuda_driver", v.cuda_driver, "cublas", v.cublas, "nccl",
                     v.nccl, "hwloc", v.hwloc, "liburing", zo_swap_liburing_version());
}

static json_t *cpu_json(void)
{
    char model[256];
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    json_int_t ram = pages > 0 && page > 0 ? (json_int_t)pages * page : 0;
    return json_pack("{s:s, s:i, s:I, s:s, s:s}", "model",
                     zo_sysinfo_cpu_model(model, sizeof model), "online_cpus",
                     (int)sysconf(_SC_NPROCESSORS_ONLN), "ram_bytes", ram, "simd_detected",
                     zo_simd_level_name(zo_cpu_simd_detected()), "simd_used",
                     zo_simd_level_name(zo_cpu_simd_level()));
}

static json_t *numa_json(void)
{
    json_t *arr = json_array();
    int n = zo_topo_numa_node_count();
    for (int i = 0; i < n; i++) {
        zo_topo_node nd = ZO_TOPO_NODE_INIT;
        if (zo_topo_get_node(i, &nd) != ZO_OK)
            continue;
        json_array_append_new(arr, json_pack("{s:i, s:I, s:i, s:i}", "node", nd.node,
                                             "memory_bytes", (json_int_t)nd.memory_bytes, "cores",
                                             nd.n_cores, "hardware_threads", nd.n_pus));
    }
    return arr;
}

static json_t *placement_json(zo_device_t dev)
{
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    if (zo_hostpool_placement_for_device(dev, &pl) != ZO_OK)
        return json_pack("{s:s}", "error", zo_last_error());
    json_t *j = json_pack("{s:i, s:s, s:i}", "node", pl.node, "reason", pl.reason, "local_cpus",
                          pl.n_local_cpus);
    json_object_set_new(j, "memlock_soft_bytes",
                        pl.memlock_soft == ZO_MEMLOCK_UNLIMITED
                            ? json_string("unlimited")
                            : json_integer((json_int_t)pl.memlock_soft));
    json_object_set_new(j, "cap_ipc_lock", json_boolean(pl.cap_ipc_lock));
    return j;
}

static json_t *gpus_json(json_t **cpu_device)
{
    json_t *arr = json_array();
    int n = zo_device_cuda_count();
    for (int i = 0; i < n; i++) {
        zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
        cfg.backend = "cuda";
        cfg.ordinal = i;
        zo_device_t dev = NULL;
        if (zo_device_init(&dev, &cfg) != ZO_OK) {
            json_array_append_new(arr,
                                  json_pack("{s:i, s:s}", "ordinal", i, "error", zo_last_error()));
            continue;
        }
        zo_device_info info = ZO_DEVICE_INFO_INIT;
        zo_device_get_info(dev, &info);
        float link = 0;
        zo_sysinfo_pci_link(info.pci_bus_id, &link);
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", info.cc_major, info.cc_minor);
        json_t *g = json_pack("{s:i, s:s, s:I, s:s, s:i, s:s, s:f}", "ordinal", i, "name",
                              info.name, "memory_bytes", (json_int_t)info.total_mem,
                              "compute_capability", cc, "multiprocessors", info.multiprocessors,
                              "pci_bus_id", info.pci_bus_id, "pcie_link_gbps", (double)link);
        json_object_set_new(g, "host_pool", placement_json(dev));
        json_array_append_new(arr, g);
        zo_device_free(dev);
    }
    *cpu_device = NULL;
    if (n == 0) {
        zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
        cfg.backend = "cpu";
        zo_device_t dev = NULL;
        if (zo_device_init(&dev, &cfg) == ZO_OK) {
            *cpu_device =
                json_pack("{s:s, s:I}", "name", "zoffload emulated GPU (cpu)",
                          "default_capacity_bytes", (json_int_t)ZO_CPU_DEVICE_DEFAULT_CAPACITY);
            json_object_set_new(*cpu_device, "host_pool", placement_json(dev));
            zo_device_free(dev);
        }
    }
    return arr;
}

static json_t *io_uring_json(void)
{
    char why[256] = "";
    int ok = zo_swap_probe_io_uring(why, sizeof why);
    return json_pack("{s:b, s:s}", "available", ok, "detail", ok ? "ok" : why);
}

/* Each --swap-dir's check; *failed counts the ones that cannot hold swap
 * files (missing, not a directory, unreadable), which fail the program. */
static json_t *swap_dirs_json(char **dirs, int n, int *failed)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        int odirect = 0;
        uint64_t free_b = 0;
        char why[256] = "";
        zo_status st = zo_file_check_dir(dirs[i]);
        if (st == ZO_OK)
            st = zo_swap_probe_dir(dirs[i], &odirect, &free_b, why, sizeof why);
        json_t *d = json_pack("{s:s}", "path", dirs[i]);
        if (st != ZO_OK) {
            json_object_set_new(d, "error", json_string(zt_lib_message()));
            fprintf(stderr, "zo-report: --swap-dir %s: %s\n", dirs[i], zt_lib_message());
            ++*failed;
        } else {
            json_object_set_new(d, "o_direct", json_boolean(odirect));
            if (!odirect)
                json_object_set_new(d, "o_direct_detail", json_string(why));
            json_object_set_new(d, "free_bytes", json_integer((json_int_t)free_b));
        }
        json_array_append_new(arr, d);
    }
    return arr;
}

/* Bytes in the largest binary unit that keeps the figure >= 1. */
static const char *gib(char *b, size_t cap, json_int_t v)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)v;
    int u = 0;
    while (x >= 1024.0 && u < 4) {
        x /= 1024.0;
        u++;
    }
    snprintf(b, cap, u ? "%.1f %s" : "%.0f %s", x, units[u]);
    return b;
}

static void print_pool(json_t *pool)
{
    json_t *err = json_object_get(pool, "error");
    if (err) {
        printf("    host pool:  (unknown: %s)\n", json_string_value(err));
        return;
    }
    json_t *ml = json_object_get(pool, "memlock_soft_bytes");
    char mlb[64];
    if (json_is_string(ml))
        snprintf(mlb, sizeof mlb, "unlimited");
    else
        gib(mlb, sizeof mlb, json_integer_value(ml));
    printf("    host pool:  NUMA node %lld (%s), %lld local CPUs\n",
           (long long)json_integer_value(json_object_get(pool, "node")),
           json_string_value(json_object_get(pool, "reason")),
           (long long)json_integer_value(json_object_get(pool, "local_cpus")));
    printf("    memlock:    %s%s\n", mlb,
           json_is_true(json_object_get(pool, "cap_ipc_lock"))
               ? " (CAP_IPC_LOCK held: no limit applies)"
               : "");
}

static void print_human(json_t *r)
{
    char b[64];
    json_t *v = json_object_get(r, "versions");
    printf("zoffload %s\n", json_string_value(json_object_get(v, "zoffload")));
    printf("  versions: CUDA runtime %s, driver %s, cuBLAS %s, NCCL %s, liburing %s, hwloc %s\n",
           json_string_value(json_object_get(v, "cuda_runtime")),
           json_string_value(json_object_get(v, "cuda_driver")),
           json_string_value(json_object_get(v, "cublas")),
           json_string_value(json_object_get(v, "nccl")),
           json_string_value(json_object_get(v, "liburing")),
           json_string_value(json_object_get(v, "hwloc")));
    json_t *cpu = json_object_get(r, "cpu");
    char b2[32];
    printf("\nCPU: %s, %lld online CPUs, %s of RAM, SIMD %s (used: %s)\n",
           json_string_value(json_object_get(cpu, "model")),
           (long long)json_integer_value(json_object_get(cpu, "online_cpus")),
           gib(b2, sizeof b2, json_integer_value(json_object_get(cpu, "ram_bytes"))),
           json_string_value(json_object_get(cpu, "simd_detected")),
           json_string_value(json_object_get(cpu, "simd_used")));
    printf("\nNUMA nodes:\n");
    json_int_t numa_ram = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r, "numa_nodes"), i, e)
    {
        printf("  node %lld: %s, %lld cores, %lld hardware threads\n",
               (long long)json_integer_value(json_object_get(e, "node")),
               gib(b, sizeof b, json_integer_value(json_object_get(e, "memory_bytes"))),
               (long long)json_integer_value(json_object_get(e, "cores")),
               (long long)json_integer_value(json_object_get(e, "hardware_threads")));
        numa_ram += json_integer_value(json_object_get(e, "memory_bytes"));
    }
    /* In a VM hwloc's nodes were seen to hold 5.0 of 125.9 GiB: say so, since
     * the host pool's placement reads the nodes and the tools plan by RAM. */
    json_int_t ram = json_integer_value(json_object_get(cpu, "ram_bytes"));
    if (numa_ram && ram && (numa_ram < ram / 10 * 9 || numa_ram > ram))
        printf("  note: these nodes hold %s of the %s of RAM the kernel reports (zo-train and "
               "zo-plan use the kernel's figure)\n",
               gib(b, sizeof b, numa_ram), gib(b2, sizeof b2, ram));
    printf("\nDevices:\n");
    json_t *gpus = json_object_get(r, "gpus");
    json_array_foreach(gpus, i, e)
    {
        if (json_object_get(e, "error")) {
            printf("  GPU %zu: error: %s\n", i, json_string_value(json_object_get(e, "error")));
            continue;
        }
        printf("  GPU %lld: %s, %s, compute %s, %lld SMs, PCIe %s (%.1f GB/s)\n",
               (long long)json_integer_value(json_object_get(e, "ordinal")),
               json_string_value(json_object_get(e, "name")),
               gib(b, sizeof b, json_integer_value(json_object_get(e, "memory_bytes"))),
               json_string_value(json_object_get(e, "compute_capability")),
               (long long)json_integer_value(json_object_get(e, "multiprocessors")),
               json_string_value(json_object_get(e, "pci_bus_id")),
               json_real_value(json_object_get(e, "pcie_link_gbps")));
        print_pool(json_object_get(e, "host_pool"));
    }
    json_t *cd = json_object_get(r, "cpu_device");
    if (json_array_size(gpus) == 0) {
        printf("  no GPU: cpu device (an emulated GPU in host memory, default capacity %s)\n",
               gib(b, sizeof b, json_integer_value(json_object_get(cd, "default_capacity_bytes"))));
        if (cd)
            print_pool(json_object_get(cd, "host_pool"));
    }
    json_t *io = json_object_get(r, "io_uring");
    printf("\nio_uring: %s\n", json_is_true(json_object_get(io, "available"))
                                   ? "available"
                                   : json_string_value(json_object_get(io, "detail")));
    json_t *dirs = json_object_get(r, "swap_dirs");
    if (json_array_size(dirs))
        printf("\nSwap directories:\n");
    json_array_foreach(dirs, i, e)
    {
        const char *path = json_string_value(json_object_get(e, "path"));
        if (json_object_get(e, "error")) {
            printf("  %s: %s\n", path, json_string_value(json_object_get(e, "error")));
            continue;
        }
        int od = json_is_true(json_object_get(e, "o_direct"));
        printf("  %s: O_DIRECT %s%s%s, %s free\n", path, od ? "ok" : "refused", od ? "" : ": ",
               od ? "" : json_string_value(json_object_get(e, "o_direct_detail")),
               gib(b, sizeof b, json_integer_value(json_object_get(e, "free_bytes"))));
    }
}

int main(int argc, char **argv)
{
    zt_output_check_at_exit("zo-report");
    static const struct option opts[] = {{"swap-dir", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    char *dirs[MAX_DIRS];
    int ndirs = 0, as_json = 0, c;
    while ((c = getopt_long(argc, argv, "s:jh", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (ndirs == MAX_DIRS) {
                fprintf(stderr, "zo-report: at most %d --swap-dir options\n", MAX_DIRS);
                return 2;
            }
            dirs[ndirs++] = optarg;
            break;
        case 'j': as_json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zo-report: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    json_t *r = json_object();
    json_object_set_new(r, "versions", versions_json());
    json_object_set_new(r, "cpu", cpu_json());
    json_object_set_new(r, "numa_nodes", numa_json());
    json_t *cpu_device = NULL;
    json_object_set_new(r, "gpus", gpus_json(&cpu_device));
    json_object_set_new(r, "cpu_device", cpu_device ? cpu_device : json_null());
    json_object_set_new(r, "io_uring", io_uring_json());
    int failed = 0;
    json_object_set_new(r, "swap_dirs", swap_dirs_json(dirs, ndirs, &failed));
    if (as_json) {
        char *s = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
    } else {
        print_human(r);
    }
    json_decref(r);
    return failed ? 1 : 0;
}
