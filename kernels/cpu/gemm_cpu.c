/* The cpu device's GEMMs over the compute pool (see cpu_gemm.h).
 *
 * A problem is split along the larger of m and n (or along its batch); each
 * part is one
 * single-threaded OpenBLAS or oneDNN call on a contiguous block of C. Every
 * element of C is computed by exactly one call, whose summation order does
 * not depend on which thread runs it, so the bits depend on the shape only. */
#include <cblas.h>
#include <pthread.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_pool.h"
#include "zo_internal.h"

#define SUBSYS     "ops"
#define PART_ALIGN 16 /* a part's rows or columns: whole AVX-512 vectors of fp32 */

/* ---- how a problem is split ---- */

typedef enum { SPLIT_BATCH, SPLIT_M, SPLIT_N } split_axis;

typedef struct gemm_split {
    split_axis axis;
    size_t extent, parts;
} gemm_split;

#define PART_MIN 128 /* rows or columns: smaller GEMMs lose more to packing than they gain */

/* The split depends on the shape alone, never on the thread count, so the
 * bits do not either: ranks or processes given different cores (mpirun binds
 * ranks) compute the same GEMM identically. */
static gemm_split split_for(int batch, int m, int n)
{
    gemm_split s;
    if (batch > 1) {
        s.axis = SPLIT_BATCH;
        s.extent = (size_t)batch;
        s.parts = zo_cpu_split(s.extent, ZO_CPU_PARTS, 1);
        return s;
    }
    s.axis = m >= n ? SPLIT_M : SPLIT_N;
    s.extent = (size_t)(m >= n ? m : n);
    size_t parts = s.extent / PART_MIN;
    parts = parts < 1 ? 1 : parts > ZO_CPU_PARTS ? ZO_CPU_PARTS : parts;
    s.parts = zo_cpu_split(s.extent, parts, PART_ALIGN);
    return s;
}

/* The library's own threads: none. The pool is the parallelism, and a
 * library that forked its own team inside each part would oversubscribe the
 * cores and make the bits depend on its thread count. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void)
{
    openblas_set_num_threads(1);
}

/* ---- fp32 through OpenBLAS ---- */

typedef struct sgemm_job {
    int ta, tb, m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int64_t lda, ldb, ldc;
    gemm_split sp;
} sgemm_job;

static void sgemm_part(void *arg, size_t p)
{
    const sgemm_job *j = arg;
    size_t lo, hi;
    zo_cpu_part(j->sp.extent, j->sp.parts, PART_ALIGN, p, &lo, &hi);
    if (lo == hi)
        return;
    const float *a = j->a, *b = j->b;
    float *c = j->c;
    int m = j->m, n = j->n;
    if (j->sp.axis == SPLIT_M) { /* rows lo..hi of op(A) and of C */
        a += j->ta ? lo : lo * (size_t)j->lda;
        c += lo * (size_t)j->ldc;
        m = (int)(hi - lo);
    } else { /* columns lo..hi of op(B) and of C */
        b += j->tb ? lo * (size_t)j->ldb : lo;
        c += lo;
        n = (int)(hi - lo);
    }
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, j->tb ? CblasTrans : CblasNoTrans,
                m, n, j->k, j->alpha, a, (int)j->lda, b, (int)j->ldb, j->beta, c, (int)j->ldc);
}

void zo_cpu_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    pthread_once(&blas_once, blas_single_threaded);
    sgemm_job j = {trans_a, trans_b, m, n,   k,   alpha, beta,
                   a,       b,       c, lda, ldb, ldc,   split_for(1, m, n)};
    zo_cpu_pool_run(j.sp.parts, sgemm_part, &j);
}

void zo_cpu_sgemm_here(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    pthread_once(&blas_once, blas_single_threaded);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, (int)lda, b, (int)ldb, beta,
                c, (int)ldc);
}

/* ---- bf16 through oneDNN ---- */

#ifdef ZO_HAVE_ONEDNN
#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>

/* oneDNN (Debian's build) parallelizes with OpenMP. Each pool thread sets its
 * own OpenMP thread count to 1 before its first call, so oneDNN runs inline
 * and starts no team: no libgomp threads exist to spin after a GEMM and take
 * the cores from the next op (OMP_WAIT_POLICY would be read too late to help:
 * libgomp reads it when it is loaded). test_onednn_starts_no_threads pins it. */
static _Thread_local int omp_single;
static void onednn_single_threaded(void)
{
    if (!omp_single) {
        omp_set_num_threads(1);
        omp_single = 1;
    }
}

static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t dnnl_eng;
static int dnnl_for_bf16; /* bf16 GEMMs go to oneDNN */

/* oneDNN by default only where it multiplies bf16 natively: elsewhere it
 * converts, and OpenBLAS's sgemm is the faster converter. */
static int dnnl_default(void)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

/* Primitives are created one at a time. oneDNN's primitive cache is safe to
 * share, but its lock-free publication of a new entry happens inside libdnnl,
 * which ThreadSanitizer cannot see; under this mutex every entry is published
 * before another pool thread looks it up. Creation is a cache hit after a
 * shape's first call (microseconds), so nothing waits for long. */
static pthread_mutex_t dnnl_create_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether oneDNN builds a bf16 matmul on this CPU: below AVX-512 (an AVX2
 * EPYC, say) it answers "unimplemented" for every shape, so asking for it
 * with ZO_CPU_GEMM=onednn would fail every bf16 GEMM. */
static int dnnl_has_bf16_matmul(void)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t dims = {2, 2}, strides = {2, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_strides(&a, 2, dims, dnnl_bf16, strides) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&b, 2, dims, dnnl_bf16, strides) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&c, 2, dims, dnnl_f32, strides) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success;
    pthread_mutex_lock(&dnnl_create_mu);
    ok = ok && dnnl_primitive_desc_create(&pd, &md, NULL, dnnl_eng, NULL) == dnnl_success;
    pthread_mutex_unlock(&dnnl_create_mu);
    dnnl_primitive_desc_destroy(pd);
    return ok;
}

static void dnnl_start(void)
{
    const char *pick = zo_env_str("ZO_CPU_GEMM", "");
    if (strcmp(pick, "openblas") == 0) {
        dnnl_for_bf16 = 0;
    } else if (strcmp(pick, "onednn") == 0) {
        dnnl_for_bf16 = 1;
    } else {
        if (*pick)
            ZO_LOGW(SUBSYS,
                    "ZO_CPU_GEMM is '%s'; expected 'onednn' or 'openblas' (using the default)",
                    pick);
        dnnl_for_bf16 = dnnl_default();
    }
    if (dnnl_for_bf16 && dnnl_engine_create(&dnnl_eng, dnnl_cpu, 0) != dnnl_success) {
        dnnl_for_bf16 = 0;
        ZO_LOGW(SUBSYS, "oneDNN's cpu engine did not start: bf16 GEMMs use OpenBLAS sgemm");
    }
    if (dnnl_for_bf16 && !dnnl_has_bf16_matmul()) {
        dnnl_for_bf16 = 0;
        ZO_LOGW(SUBSYS,
                "ZO_CPU_GEMM=onednn, but oneDNN has no bf16 matmul on this CPU (it needs AVX-512): "
                "bf16 GEMMs use OpenBLAS sgemm");
    }
    /* Build oneDNN's primitive cache (and its lock) here, under the once:
     * built lazily by whichever pool thread came first, its publication is
     * invisible to ThreadSanitizer (libdnnl is not instrumented). */
    int cap;
    if (dnnl_for_bf16)
        (void)dnnl_get_primitive_cache_capacity(&cap);
    ZO_LOGI(SUBSYS, "bf16 GEMMs on the cpu device: %s", dnnl_for_bf16 ? "oneDNN" : "OpenBLAS");
}

int zo_cpu_gemm_uses_onednn(const zo_gemm_desc *g)
{
    if (g->a_type != ZO_DTYPE_BF16 || g->b_type != ZO_DTYPE_BF16 ||
        (g->c_type != ZO_DTYPE_BF16 && g->c_type != ZO_DTYPE_F32))
        return 0;
    pthread_once(&dnnl_once, dnnl_start);
    return dnnl_for_bf16;
}

typedef struct dnnl_job {
    const zo_gemm_desc *g;
    gemm_split sp;
    dnnl_status_t st[ZO_CPU_PARTS]; /* per part */
    const char *what[ZO_CPU_PARTS];
} dnnl_job;

/* One matrix operand of a part: `batch` problems of rows x cols, element
 * (r, c) at base + p*stride + r*rs + c*cs. */
typedef struct operand {
    dnnl_memory_desc_t md;
    dnnl_memory_t mem;
} operand;

static dnnl_status_t operand_init(operand *o, int batch, int64_t rows, int64_t cols, int64_t stride,
                                  int64_t rs, int64_t cs, dnnl_data_type_t dt, const void *base)
{
    o->mem = NULL;
    dnnl_dims_t dims3 = {batch, rows, cols}, strides3 = {stride, rs, cs};
    dnnl_dims_t dims2 = {rows, cols}, strides2 = {rs, cs};
    dnnl_status_t st = batch > 1 ? dnnl_memory_desc_init_by_strides(&o->md, 3, dims3, dt, strides3)
                                 : dnnl_memory_desc_init_by_strides(&o->md, 2, dims2, dt, strides2);
    if (st == dnnl_success)
        st = dnnl_memory_create(&o->mem, &o->md, dnnl_eng, (void *)base);
    return st;
}

/* alpha scales the product; beta != 0 adds beta * C (oneDNN's sum post-op). */
static dnnl_status_t attr_for(const zo_gemm_desc *g, dnnl_primitive_attr_t *attr)
{
    dnnl_status_t st = dnnl_primitive_attr_create(attr);
    if (st == dnnl_success && g->alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(*attr, 1, 0, &g->alpha);
    if (st == dnnl_success && g->beta != 0.0f) {
        dnnl_post_ops_t po;
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_sum(po, g->beta);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(*attr, po);
        dnnl_post_ops_destroy(po);
    }
    return st;
}

static dnnl_status_t create_matmul(const dnnl_matmul_desc_t *md, dnnl_primitive_attr_t attr,
                                   dnnl_primitive_desc_t *pd, dnnl_primitive_t *prim)
{
    pthread_mutex_lock(&dnnl_create_mu);
    dnnl_status_t st = dnnl_primitive_desc_create(pd, md, attr, dnnl_eng, NULL);
    if (st == dnnl_success)
        st = dnnl_primitive_create(prim, *pd);
    pthread_mutex_unlock(&dnnl_create_mu);
    return st;
}

/* Run problems [b0, b0+nb) restricted to rows [m0, m0+m) and columns
 * [n0, n0+n) of C. The primitive comes from oneDNN's primitive cache after
 * the first call of a shape. */
static dnnl_status_t matmul_block(const zo_gemm_desc *g, int b0, int nb, int m0, int m, int n0,
                                  int n, const char **what)
{
    const int64_t la = g->lda, lb = g->ldb;
    const char *A = (const char *)g->a + ((size_t)b0 * g->stride_a) * 2;
    const char *B = (const char *)g->b + ((size_t)b0 * g->stride_b) * 2;
    char *C = (char *)g->c +
              ((size_t)b0 * g->stride_c + (size_t)m0 * g->ldc + n0) * zo_dtype_size(g->c_type);
    A += (size_t)(g->trans_a ? m0 : m0 * la) * 2;
    B += (size_t)(g->trans_b ? n0 * lb : n0) * 2;
    operand a, b, c;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t strm = NULL;
    dnnl_data_type_t cdt = g->c_type == ZO_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_status_t st;
    *what = "describing the operands";
    st = operand_init(&a, nb, m, g->k, g->stride_a, g->trans_a ? 1 : la, g->trans_a ? la : 1,
                      dnnl_bf16, A);
    if (st == dnnl_success)
        st = operand_init(&b, nb, g->k, n, g->stride_b, g->trans_b ? 1 : lb, g->trans_b ? lb : 1,
                          dnnl_bf16, B);
    if (st == dnnl_success)
        st = operand_init(&c, nb, m, n, g->stride_c, g->ldc, 1, cdt, C);
    dnnl_matmul_desc_t md;
    if (st == dnnl_success && (*what = "creating the matmul", 1))
        st = dnnl_matmul_desc_init(&md, &a.md, &b.md, NULL, &c.md);
    if (st == dnnl_success)
        st = attr_for(g, &attr);
    if (st == dnnl_success)
        st = create_matmul(&md, attr, &pd, &prim);
    if (st == dnnl_success)
        st = dnnl_stream_create(&strm, dnnl_eng, dnnl_stream_default_flags);
    if (st == dnnl_success && (*what = "running the matmul", 1)) {
        dnnl_exec_arg_t args[] = {
            {DNNL_ARG_SRC, a.mem}, {DNNL_ARG_WEIGHTS, b.mem}, {DNNL_ARG_DST, c.mem}};
        st = dnnl_primitive_execute(prim, strm, 3, args);
        if (st == dnnl_success)
            st = dnnl_stream_wait(strm);
    }
    dnnl_stream_destroy(strm);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_memory_destroy(a.mem);
    dnnl_memory_destroy(b.mem);
    dnnl_memory_destroy(c.mem);
    return st;
}

static void dnnl_part(void *arg, size_t p)
{
    dnnl_job *j = arg;
    const zo_gemm_desc *g = j->g;
    onednn_single_threaded();
    size_t lo, hi;
    zo_cpu_part(j->sp.extent, j->sp.parts, j->sp.axis == SPLIT_BATCH ? 1 : PART_ALIGN, p, &lo, &hi);
    j->st[p] = dnnl_success;
    if (lo == hi)
        return;
    int b0 = 0, nb = g->batch, m0 = 0, m = g->m, n0 = 0, n = g->n;
    if (j->sp.axis == SPLIT_BATCH)
        b0 = (int)lo, nb = (int)(hi - lo);
    else if (j->sp.axis == SPLIT_M)
        m0 = (int)lo, m = (int)(hi - lo);
    else
        n0 = (int)lo, n = (int)(hi - lo);
    j->st[p] = matmul_block(g, b0, nb, m0, m, n0, n, &j->what[p]);
}

zo_status zo_cpu_gemm_onednn(const zo_gemm_desc *g)
{
    dnnl_job j;
    j.g = g;
    j.sp = split_for(g->batch, g->m, g->n);
    zo_cpu_pool_run(j.sp.parts, dnnl_part, &j);
    for (size_t p = 0; p < j.sp.parts; p++)
        if (j.st[p] != dnnl_success)
            return ZO_FAIL(j.st[p] == dnnl_out_of_memory ? ZO_ERR_NO_MEMORY : ZO_ERR_UNSUPPORTED,
                           SUBSYS,
                           "gemm (oneDNN, %dx%dx%d, batch %d): %s failed: %s; ZO_CPU_GEMM=openblas "
                           "runs bf16 GEMMs through OpenBLAS instead",
                           g->m, g->n, g->k, g->batch, j.what[p], dnnl_status2str(j.st[p]));
    return ZO_OK;
}

#else /* built with ZO_ONEDNN OFF: bf16 GEMMs through OpenBLAS sgemm */

int zo_cpu_gemm_uses_onednn(const zo_gemm_desc *g)
{
    (void)g;
    return 0;
}

zo_status zo_cpu_gemm_onednn(const zo_gemm_desc *g)
{
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, SUBSYS,
                   "gemm %dx%dx%d: this build has no oneDNN (configured with ZO_ONEDNN OFF)", g->m,
                   g->n, g->k);
}
#endif
