/* The cuda backend: the CUDA runtime behind the device table. The front end
 * (device.c) enforces the byte budget and keeps the allocation registry. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_impl.h"
#include "zo_cuda_check.h"

#define SUBSYS "cuda"

typedef struct cuda_dev {
    int ordinal;
} cuda_dev;

static int cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ZO_LOGD(SUBSYS, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return 0;
    }
    return n;
}

static zo_status use_device(zo_device_t dev)
{
    ZO_CUDA_CHECK(cudaSetDevice(((cuda_dev *)dev->impl)->ordinal));
    return ZO_OK;
}

static zo_status cuda_init(zo_device_t dev, const zo_device_config *cfg)
{
    int n = cuda_device_count();
    if (cfg->ordinal >= n)
        return ZO_FAIL(ZO_ERR_NO_DEVICE, SUBSYS, "GPU %d requested but %d CUDA GPU(s) are visible",
                       cfg->ordinal, n);
    ZO_CUDA_CHECK(cudaSetDevice(cfg->ordinal));
    struct cudaDeviceProp p;
    ZO_CUDA_CHECK(cudaGetDeviceProperties(&p, cfg->ordinal));
    size_t free_b = 0, total_b = 0;
    ZO_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    cuda_dev *cd = calloc(1, sizeof *cd);
    if (!cd)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the cuda device");
    cd->ordinal = cfg->ordinal;
    dev->impl = cd;
    snprintf(dev->info.backend, sizeof dev->info.backend, "cuda");
    snprintf(dev->info.name, sizeof dev->info.name, "%s", p.name);
    dev->info.ordinal = cfg->ordinal;
    dev->info.total_mem = total_b;
    dev->info.budget = cfg->mem_budget ? cfg->mem_budget : free_b;
    if (dev->info.budget > free_b)
        ZO_LOGW(SUBSYS, "device budget %llu bytes exceeds the GPU's free memory (%zu bytes)",
                (unsigned long long)dev->info.budget, free_b);
    dev->info.cc_major = p.major;
    dev->info.cc_minor = p.minor;
    dev->info.multiprocessors = p.multiProcessorCount;
    cudaDeviceGetPCIBusId(dev->info.pci_bus_id, sizeof dev->info.pci_bus_id, cfg->ordinal);
    dev->info.caps = ZO_DEVCAP_REAL_GPU | ZO_DEVCAP_ASYNC_COPY | ZO_DEVCAP_HOST_REGISTER |
                     (p.major >= 8 ? ZO_DEVCAP_BF16 : 0u);
#ifdef ZO_HAVE_NCCL
    dev->info.caps |= ZO_DEVCAP_NCCL;
#endif
    return ZO_OK;
}

static void cuda_fini(zo_device_t dev)
{
    free(dev->impl);
}

static zo_status cuda_mem_alloc(zo_device_t dev, size_t bytes, void **out)
{
    ZO_TRY(use_device(dev));
    ZO_CUDA_CHECK(cudaMalloc(out, bytes));
    return ZO_OK;
}

static void cuda_mem_free(zo_device_t dev, void *p)
{
    (void)dev;
    if (cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static zo_status cuda_host_register(zo_device_t dev, void *p, size_t n)
{
    ZO_TRY(use_device(dev));
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ZO_FAIL(ZO_ERR_PIN, SUBSYS, "cudaHostRegister of %zu bytes failed: %s", n,
                       cudaGetErrorString(e));
    }
    return ZO_OK;
}

static void cuda_host_unregister(zo_device_t dev, void *p, size_t n)
{
    (void)dev;
    (void)n;
    if (cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static zo_status cuda_stream_create(zo_stream_t s)
{
    ZO_TRY(use_device(s->dev));
    cudaStream_t cs;
    ZO_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    s->impl = cs;
    return ZO_OK;
}

/* Adopt the caller's stream. Asking its flags refuses a handle that is no
 * stream now, at wrap time, rather than at the first copy queued on it. */
static zo_status cuda_stream_wrap(zo_stream_t s, void *native)
{
    ZO_TRY(use_device(s->dev));
    /* NULL is the legacy default stream (PyTorch's current stream unless the
     * script made another current): work on it is ordered with everything
     * else queued there, which is what a caller wrapping it wants. */
    if (!native)
        native = (void *)cudaStreamLegacy;
    unsigned flags = 0;
    ZO_CUDA_CHECK(cudaStreamGetFlags((cudaStream_t)native, &flags));
    s->impl = native;
    return ZO_OK;
}

static void cuda_stream_destroy(zo_stream_t s)
{
    if (cudaStreamDestroy((cudaStream_t)s->impl) != cudaSuccess)
        (void)cudaGetLastError();
}

static zo_status cuda_stream_sync(zo_stream_t s)
{
    ZO_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s->impl));
    return ZO_OK;
}

static zo_status cuda_stream_query(zo_stream_t s)
{
    cudaError_t e = cudaStreamQuery((cudaStream_t)s->impl);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return ZO_NOT_READY;
    }
    ZO_CUDA_CHECK(e);
    return ZO_OK;
}

static zo_status cuda_event_create(zo_event_t ev)
{
    ZO_TRY(use_device(ev->dev));
    cudaEvent_t e;
    ZO_CUDA_CHECK(cudaEventCreate(&e));
    ev->impl = e;
    return ZO_OK;
}

static void cuda_event_destroy(zo_event_t ev)
{
    if (cudaEventDestroy((cudaEvent_t)ev->impl) != cudaSuccess)
        (void)cudaGetLastError();
}

static zo_status cuda_event_record(zo_event_t ev, zo_stream_t s)
{
    ZO_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev->impl, (cudaStream_t)s->impl));
    return ZO_OK;
}

static zo_status cuda_stream_wait_event(zo_stream_t s, zo_event_t ev)
{
    ZO_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)s->impl, (cudaEvent_t)ev->impl, 0));
    return ZO_OK;
}

static zo_status cuda_event_query(zo_event_t ev)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev->impl);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return ZO_NOT_READY;
    }
    ZO_CUDA_CHECK(e);
    return ZO_OK;
}

static zo_status cuda_event_sync(zo_event_t ev)
{
    ZO_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev->impl));
    return ZO_OK;
}

static zo_status cuda_event_elapsed(zo_event_t a, zo_event_t b, float *ms)
{
    ZO_CUDA_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)a->impl, (cudaEvent_t)b->impl));
    return ZO_OK;
}

static zo_status cuda_copy(zo_stream_t s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    enum cudaMemcpyKind k = kind == ZO_COPY_H2D   ? cudaMemcpyHostToDevice
                            : kind == ZO_COPY_D2H ? cudaMemcpyDeviceToHost
                                                  : cudaMemcpyDeviceToDevice;
    ZO_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, k, (cudaStream_t)s->impl));
    return ZO_OK;
}

static zo_status cuda_memset(zo_stream_t s, void *dst, int value, size_t n)
{
    ZO_CUDA_CHECK(cudaMemsetAsync(dst, value, n, (cudaStream_t)s->impl));
    return ZO_OK;
}

static void CUDART_CB run_task(void *arg)
{
    zo_stream_task_run((zo_stream_task *)arg);
}

static zo_status cuda_enqueue(zo_stream_t s, zo_stream_task *t)
{
    ZO_CUDA_CHECK(cudaLaunchHostFunc((cudaStream_t)s->impl, run_task, t));
    return ZO_OK;
}

const zo_backend_ops zo_cuda_backend = {
    .name = "cuda",
    .version = ZO_BACKEND_OPS_VERSION,
    .caps = ZO_BACKEND_CAP_NATIVE_STREAMS,
    .device_count = cuda_device_count,
    .init = cuda_init,
    .fini = cuda_fini,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_wrap = cuda_stream_wrap,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_query = cuda_stream_query,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_elapsed_ms = cuda_event_elapsed,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .enqueue = cuda_enqueue,
};
