/* The multi-rank backends on the cpu device: mpi run by ctest under mpirun,
 * tcp under ranks_launch (torchrun's variables, no MPI world), each with 1,
 * 2 and 4 ranks. Every collective (reduce included) against a reference
 * computed on every rank from every rank's data (which each rank can
 * generate), exact reductions bitwise equal to the sequential sum in rank
 * order, fast ones within a stated tolerance (tcp's are exact too, and
 * checked bitwise), sub-groups, stream order, the configuration check, and
 * the TCP rendezvous with the ranks the launcher gives.
 *     test_comm_backends BACKEND [EXPECTED]: the backend to ask for (mpi,
 *     tcp, auto) and the one that must serve (default: the one asked for). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "zo/comm.h"
#include "zo/half.h"
#include "zo_test.h"
#include "zo_test_port.h"

static zo_device_t dev;
static zo_comm_t world;
static zo_stream_t s1, s2;
static int me, n;
static int all_exact; /* the backend's fast reductions are its exact ones (tcp) */

/* Rank r's element i: values of mixed sign and magnitude, so that the order
 * of the additions shows in the bits. */
static float value(int r, size_t i, uint64_t salt)
{
    uint64_t st = salt * 1000003u + (uint64_t)r * 7919u + i * 104729u;
    uint64_t x = zo_test_rand(&st);
    double mant = (double)(x >> 11) / 9007199254740992.0 - 0.5;
    return (float)(mant * pow(2.0, (double)((x & 15) - 4)));
}

static void fill(void *buf, zo_dtype dt, int r, size_t off, size_t count, uint64_t salt)
{
    for (size_t i = 0; i < count; i++) {
        float v = value(r, off + i, salt);
        if (dt == ZO_DTYPE_F32)
            ((float *)buf)[i] = v;
        else if (dt == ZO_DTYPE_F64)
            ((double *)buf)[i] = (double)v * (1.0 + 1e-9 * (double)r);
        else if (dt == ZO_DTYPE_BF16)
            ((uint16_t *)buf)[i] = zo_f32_to_bf16(v);
        else
            ((uint16_t *)buf)[i] = zo_f32_to_f16(v);
    }
}

static double as_double(const void *buf, zo_dtype dt, size_t i)
{
    switch (dt) {
    case ZO_DTYPE_F32: return ((const float *)buf)[i];
    case ZO_DTYPE_F64: return ((const double *)buf)[i];
    case ZO_DTYPE_BF16: return zo_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return zo_f16_to_f32(((const uint16_t *)buf)[i]);
    }
}

/* The reference: ((x0 + x1) + x2) + ... in dt's arithmetic, over `ranks`
 * (world ranks in group order), for elements [off, off+count); also the sum
 * of magnitudes for the fast mode's tolerance. */
static void reference(void *out, double *mag, zo_dtype dt, const int *ranks, int nr, size_t off,
                      size_t count, uint64_t salt)
{
    size_t esz = zo_dtype_size(dt);
    void *x = malloc(count * esz + 1);
    for (int k = 0; k < nr; k++) {
        fill(k == 0 ? out : x, dt, ranks[k], off, count, salt);
        if (k > 0) {
            /* The same rounding as each chain step: a + b in dt. */
            for (size_t i = 0; i < count; i++) {
                if (dt == ZO_DTYPE_F32)
                    ((float *)out)[i] = ((float *)out)[i] + ((float *)x)[i];
                else if (dt == ZO_DTYPE_F64)
                    ((double *)out)[i] = ((double *)out)[i] + ((double *)x)[i];
                else if (dt == ZO_DTYPE_BF16)
                    ((uint16_t *)out)[i] = zo_f32_to_bf16(zo_bf16_to_f32(((uint16_t *)out)[i]) +
                                                          zo_bf16_to_f32(((uint16_t *)x)[i]));
                else
                    ((uint16_t *)out)[i] = zo_f32_to_f16(zo_f16_to_f32(((uint16_t *)out)[i]) +
                                                         zo_f16_to_f32(((uint16_t *)x)[i]));
            }
        }
        for (size_t i = 0; mag && i < count; i++)
            mag[i] = (k ? mag[i] : 0) + fabs(as_double(k ? x : out, dt, i));
    }
    free(x);
}

/* The fast mode's bound: n - 1 roundings of at most half an ulp of the
 * running magnitude each, doubled for the conversions of 16-bit types. */
static double tolerance(zo_dtype dt, double mag, int nr)
{
    double eps = dt == ZO_DTYPE_F32    ? 0x1p-24
                 : dt == ZO_DTYPE_F64  ? 0x1p-53
                 : dt == ZO_DTYPE_BF16 ? 0x1p-8
                                       : 0x1p-11;
    return 2.0 * eps * mag * (double)(nr > 1 ? nr - 1 : 1) + 1e-30;
}

static void check_reduced(const void *got, const void *want, const double *mag, zo_dtype dt,
                          size_t count, zo_reduce_mode mode, int nr, const char *what)
{
    size_t esz = zo_dtype_size(dt);
    if (mode == ZO_REDUCE_EXACT || all_exact) {
        if (memcmp(got, want, count * esz))
            for (size_t i = 0; i < count; i++)
                if (memcmp((const char *)got + i * esz, (const char *)want + i * esz, esz))
                    fail_msg("%s %s exact, rank %d of %d: element %zu is %.9g, the sequential "
                             "sum is %.9g",
                             what, zo_dtype_name(dt), me, n, i, as_double(got, dt, i),
                             as_double(want, dt, i));
        return;
    }
    for (size_t i = 0; i < count; i++) {
        double d = fabs(as_double(got, dt, i) - as_double(want, dt, i));
        if (d > tolerance(dt, mag[i], nr))
            fail_msg("%s %s fast, rank %d of %d: element %zu is %.9g, the sum is %.9g (off by "
                     "%g, tolerance %g)",
                     what, zo_dtype_name(dt), me, n, i, as_double(got, dt, i),
                     as_double(want, dt, i), d, tolerance(dt, mag[i], nr));
    }
}

static int *world_list(void)
{
    int *r = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        r[i] = i;
    return r;
}

static const zo_dtype sum_types[] = {ZO_DTYPE_F32, ZO_DTYPE_F64, ZO_DTYPE_BF16, ZO_DTYPE_F16};

static void all_reduce_one(zo_comm_t c, const int *ranks, size_t count, zo_dtype dt,
                           zo_reduce_mode mode, int in_place, uint64_t salt)
{
    size_t esz = zo_dtype_size(dt);
    char *send = malloc(count * esz + 1), *recv = in_place ? send : malloc(count * esz + 1);
    char *want = malloc(count * esz + 1);
    double *mag = malloc(count * sizeof(double) + 1);
    fill(send, dt, ranks[zo_comm_rank(c)], 0, count, salt);
    ZO_ASSERT_OK(zo_comm_all_reduce(c, s1, send, recv, count, dt, mode));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    reference(want, mag, dt, ranks, zo_comm_size(c), 0, count, salt);
    check_reduced(recv, want, mag, dt, count, mode, zo_comm_size(c), "all-reduce");
    if (!in_place)
        free(recv);
    free(send);
    free(want);
    free(mag);
}

static void all_reduce_matches_reference(void **state)
{
    int *ranks = world_list();
    const size_t counts[] = {0, 5, 4099, 300007};
    for (size_t t = 0; t < sizeof sum_types / sizeof sum_types[0]; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (int mode = 0; mode < 2; mode++)
                all_reduce_one(world, ranks, counts[k], sum_types[t], (zo_reduce_mode)mode, k & 1,
                               t * 10 + k);
    free(ranks);
}

static void reduce_scatter_one(zo_comm_t c, const int *ranks, size_t count, zo_dtype dt,
                               zo_reduce_mode mode, int in_place, uint64_t salt)
{
    size_t esz = zo_dtype_size(dt), gn = (size_t)zo_comm_size(c), gr = (size_t)zo_comm_rank(c);
    char *send = malloc(count * gn * esz + 1);
    char *recv = in_place ? send + gr * count * esz : malloc(count * esz + 1);
    char *want = malloc(count * esz + 1);
    double *mag = malloc(count * sizeof(double) + 1);
    fill(send, dt, ranks[gr], 0, count * gn, salt);
    ZO_ASSERT_OK(zo_comm_reduce_scatter(c, s1, send, recv, count, dt, mode));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    reference(want, mag, dt, ranks, (int)gn, gr * count, count, salt);
    check_reduced(recv, want, mag, dt, count, mode, (int)gn, "reduce-scatter");
    if (!in_place)
        free(recv);
    free(send);
    free(want);
    free(mag);
}

static void reduce_scatter_matches_reference(void **state)
{
    int *ranks = world_list();
    const size_t counts[] = {0, 3, 5000, 70001};
    for (size_t t = 0; t < sizeof sum_types / sizeof sum_types[0]; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (int mode = 0; mode < 2; mode++)
                reduce_scatter_one(world, ranks, counts[k], sum_types[t], (zo_reduce_mode)mode,
                                   k & 1, 100 + t * 10 + k);
    free(ranks);
}

/* The sum lands on the root only; the others pass no recv buffer. */
static void reduce_to_each_root(void **state)
{
    int *ranks = world_list();
    const zo_dtype types[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16};
    for (int root = 0; root < n; root++)
        for (int t = 0; t < 2; t++)
            for (int mode = 0; mode < 2; mode++) {
                size_t count = 4099 + (size_t)root * 1000, esz = zo_dtype_size(types[t]);
                int in_place = (root + mode) & 1;
                char *send = malloc(count * esz), *want = malloc(count * esz);
                char *recv = me != root ? NULL : in_place ? send : malloc(count * esz);
                double *mag = malloc(count * sizeof(double));
                uint64_t salt = 300u + (uint64_t)root * 4 + (uint64_t)t * 2 + (uint64_t)mode;
                fill(send, types[t], me, 0, count, salt);
                ZO_ASSERT_OK(zo_comm_reduce(world, s1, send, recv, count, types[t], root,
                                            (zo_reduce_mode)mode));
                ZO_ASSERT_OK(zo_stream_synchronize(s1));
                if (me == root) {
                    reference(want, mag, types[t], ranks, n, 0, count, salt);
                    check_reduced(recv, want, mag, types[t], count, (zo_reduce_mode)mode, n,
                                  "reduce");
                }
                if (recv && recv != send)
                    free(recv);
                free(send);
                free(want);
                free(mag);
            }
    free(ranks);
}

/* Exact results are the same bits whatever the world size: the reference
 * above does not depend on n, and this pins the value of one element. */
static void exact_sum_is_sequential(void **state)
{
    float x = (float)(me == 0 ? 1.0 : me == 1 ? 1e8 : me == 2 ? -1e8 : 1.0);
    float y;
    ZO_ASSERT_OK(zo_comm_all_reduce(world, s1, &x, &y, 1, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    /* ((1 + 1e8) - 1e8) + 1 = 1 in fp32 (1 + 1e8 rounds to 1e8), not 2. */
    float want = n == 1 ? 1.0f : n == 2 ? 1.0f + 1e8f : n == 3 ? 0.0f : 1.0f;
    assert_true(memcmp(&y, &want, sizeof y) == 0);
}

static void all_gather_matches_reference(void **state)
{
    const size_t counts[] = {1, 1000, 65537};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t cnt = counts[k];
        int32_t *recv = malloc(sizeof(int32_t) * cnt * (size_t)n);
        int32_t *send = k == 1 ? recv + cnt * (size_t)me : malloc(sizeof(int32_t) * cnt);
        for (size_t i = 0; i < cnt; i++)
            send[i] = (int32_t)(me * 1000003 + (int)i);
        ZO_ASSERT_OK(zo_comm_all_gather(world, s1, send, recv, cnt, ZO_DTYPE_I32));
        ZO_ASSERT_OK(zo_stream_synchronize(s1));
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < cnt; i++)
                assert_int_equal(recv[(size_t)r * cnt + i], r * 1000003 + (int)i);
        if (k != 1)
            free(send);
        free(recv);
    }
}

static void broadcast_from_each_root(void **state)
{
    for (int root = 0; root < n; root++) {
        uint16_t buf[777];
        for (int i = 0; i < 777; i++)
            buf[i] = (uint16_t)(me == root ? root * 100 + i : 0xffff);
        ZO_ASSERT_OK(zo_comm_broadcast(world, s1, buf, 777, ZO_DTYPE_BF16, root));
        ZO_ASSERT_OK(zo_stream_synchronize(s1));
        for (int i = 0; i < 777; i++)
            assert_int_equal(buf[i], root * 100 + i);
    }
}

/* A ring: each rank sends to the next and receives from the previous, on two
 * streams (one stream would wait for its send before posting the receive). */
static void send_recv_ring(void **state)
{
    if (n == 1)
        return;
    size_t cnt = 1 << 18;
    float *out = malloc(cnt * sizeof(float)), *in = malloc(cnt * sizeof(float));
    for (size_t i = 0; i < cnt; i++)
        out[i] = (float)me + (float)i;
    ZO_ASSERT_OK(zo_comm_recv(world, s2, in, cnt, ZO_DTYPE_F32, (me + n - 1) % n));
    ZO_ASSERT_OK(zo_comm_send(world, s1, out, cnt, ZO_DTYPE_F32, (me + 1) % n));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    ZO_ASSERT_OK(zo_stream_synchronize(s2));
    for (size_t i = 0; i < cnt; i++)
        assert_true(in[i] == (float)((me + n - 1) % n) + (float)i);
    ZO_ASSERT_OK(zo_comm_barrier(world, s1));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    free(out);
    free(in);
}

/* Groups of the ranks of equal parity, in reverse order (key = -rank). */
static void sub_groups_reduce_among_themselves(void **state)
{
    zo_comm_t g;
    ZO_ASSERT_OK(zo_comm_split(world, me % 2, -me, &g));
    int members[8], nm = 0;
    for (int r = n - 1; r >= 0; r--)
        if (r % 2 == me % 2)
            members[nm++] = r;
    assert_int_equal(zo_comm_size(g), nm);
    for (int i = 0; i < nm; i++)
        assert_int_equal(zo_comm_world_rank(g, i), members[i]);
    assert_int_equal(zo_comm_world_rank(g, zo_comm_rank(g)), me);
    for (int mode = 0; mode < 2; mode++) {
        all_reduce_one(g, members, 10007, ZO_DTYPE_F32, (zo_reduce_mode)mode, 0, 77);
        reduce_scatter_one(g, members, 999, ZO_DTYPE_BF16, (zo_reduce_mode)mode, 0, 78);
    }
    zo_comm_t none;
    ZO_ASSERT_OK(zo_comm_split(world, me == 0 ? 0 : -1, 0, &none));
    assert_true((me == 0) == (none != NULL));
    zo_comm_free(none);
    zo_comm_free(g);
}

typedef struct late_write {
    float *buf;
    size_t cnt;
    float v;
} late_write;

static zo_status write_late(void *arg)
{
    late_write *w = arg;
    struct timespec ts = {0, 30 * 1000000};
    nanosleep(&ts, NULL); /* a slow kernel: the collective must still wait */
    for (size_t i = 0; i < w->cnt; i++)
        w->buf[i] = w->v;
    return ZO_OK;
}

static void collective_sees_earlier_stream_work(void **state)
{
    float buf[256], out[256];
    memset(buf, 0, sizeof buf);
    late_write w = {buf, 256, (float)(me + 1)};
    ZO_ASSERT_OK(zo_stream_enqueue(s1, write_late, &w, sizeof w));
    ZO_ASSERT_OK(zo_comm_all_reduce(world, s1, buf, out, 256, ZO_DTYPE_F32, ZO_REDUCE_FAST));
    /* and work after it sees the collective's result */
    ZO_ASSERT_OK(zo_comm_all_reduce(world, s1, buf, buf, 256, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    for (int i = 0; i < 256; i++) {
        assert_true(out[i] == (float)(n * (n + 1) / 2));
        assert_true(buf[i] == (float)(n * (n + 1) / 2));
    }
}

static void config_mismatch_names_the_key(void **state)
{
    const char *keys[] = {"model", "zero_stage", "lr"};
    const char *same[] = {"llama-7b", "2", "0.0001"};
    ZO_ASSERT_OK(zo_comm_check_config(world, keys, same, 3));
    const char *odd[] = {"llama-7b", me == n - 1 ? "3" : "2", me == n - 1 ? "0.1" : "0.0001"};
    if (n == 1) {
        ZO_ASSERT_OK(zo_comm_check_config(world, keys, odd, 3));
        return;
    }
    ZO_ASSERT_ST(zo_comm_check_config(world, keys, odd, 3), ZO_ERR_CONFIG);
    const char *msg = zo_last_error();
    char last[32];
    snprintf(last, sizeof last, "%d", n - 1);
    if (!strstr(msg, "key 'zero_stage'") || !strstr(msg, last))
        fail_msg("rank %d: message does not name zero_stage and rank %d: %s", me, n - 1, msg);
    /* Different lists of keys are told as such, not compared key by key. */
    ZO_ASSERT_ST(zo_comm_check_config(world, keys, same, me == 0 ? 2 : 3), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "different lists of configuration keys"));
}

/* The rendezvous NCCL uses without MPI, with the ranks the launcher gave,
 * on a port of its own. */
static void tcp_rendezvous_with_launcher_ranks(void **state)
{
    unsetenv("MASTER_PORT"); /* the launcher's, which the world used */
    int32_t port = me == 0 ? zo_test_free_port() : 0;
    ZO_ASSERT_OK(zo_comm_broadcast(world, s1, &port, 1, ZO_DTYPE_I32, 0));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    zo_launch_config lc = ZO_LAUNCH_CONFIG_INIT;
    lc.master_addr = "127.0.0.1";
    lc.master_port = port;
    zo_rank_info ri = ZO_RANK_INFO_INIT;
    ZO_ASSERT_OK(zo_launch_discover(&lc, &ri));
    assert_int_equal(ri.rank, me);
    assert_int_equal(ri.world_size, n);
    uint64_t mine = 0xabc000u + (uint64_t)me, all[8];
    ZO_ASSERT_OK(zo_launch_rendezvous(&ri, &mine, all, sizeof mine, 20.0));
    for (int r = 0; r < n; r++)
        assert_int_equal(all[r], 0xabc000u + (uint64_t)r);
}

static zo_status note_handle(void *native, void *arg)
{
    *(void **)arg = native;
    return ZO_OK;
}

static void native_call_gets_the_backends_handle(void **state)
{
    void *handle = NULL;
    ZO_ASSERT_OK(zo_comm_run_native(world, note_handle, &handle));
    assert_non_null(handle);
}

/* device_buffers_only: a second world communicator over mpi that takes
 * device allocations only, as NCCL does, refuses a host buffer by name and
 * gathers device ones; its sub-groups inherit it. (mpi only: a second tcp
 * world would need a second rendezvous.) */
static void device_only_refuses_host_buffers(void **state)
{
    (void)state;
    if (strcmp(zo_comm_backend(world), "mpi") != 0)
        skip(); /* one tcp world per rendezvous address */
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "mpi";
    cc.device = dev;
    cc.timeout_s = 60;
    cc.device_buffers_only = 1;
    zo_comm_t only = NULL, sub = NULL;
    ZO_ASSERT_OK(zo_comm_init(&only, &cc));
    assert_int_equal(zo_comm_takes_host_memory(only), 0);
    assert_int_equal(zo_comm_takes_device_memory(only), 1);
    int32_t host_mine = me, *host_all = calloc((size_t)n, sizeof *host_all);
    assert_true(zo_comm_all_gather(only, s1, &host_mine, host_all, 1, ZO_DTYPE_I32) < 0);
    assert_non_null(strstr(zo_last_error(), "needs device buffers"));
    int32_t *d = NULL;
    ZO_ASSERT_OK(zo_device_malloc(dev, sizeof *d * (size_t)(n + 1), (void **)&d));
    d[n] = me * 7;
    ZO_ASSERT_OK(zo_comm_all_gather(only, s1, d + n, d, 1, ZO_DTYPE_I32));
    ZO_ASSERT_OK(zo_stream_synchronize(s1));
    for (int r = 0; r < n; r++)
        assert_int_equal(d[r], r * 7);
    ZO_ASSERT_OK(zo_comm_split(only, me % 2, me, &sub));
    assert_int_equal(zo_comm_takes_host_memory(sub), 0);
    assert_true(zo_comm_all_gather(sub, s1, &host_mine, host_all, 1, ZO_DTYPE_I32) < 0);
    zo_comm_free(sub);
    zo_comm_free(only);
    zo_device_mfree(dev, d);
    free(host_all);
}

int main(int argc, char **argv)
{
    const char *ask = argc > 1 ? argv[1] : "mpi", *want = argc > 2 ? argv[2] : ask;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = ask;
    cc.timeout_s = 60;
    cc.exact_segment_bytes = 4096; /* many segments: the window turns over */
    if (zo_device_init(&dev, &dc) || (cc.device = dev, zo_comm_init(&world, &cc)) ||
        zo_stream_create(dev, &s1) || zo_stream_create(dev, &s2)) {
        fprintf(stderr, "test_comm_backends %s: setup failed: %s\n", ask, zo_last_error());
        return 1;
    }
    if (strcmp(zo_comm_backend(world), want)) {
        fprintf(stderr, "test_comm_backends: asked for %s, expected %s, got %s\n", ask, want,
                zo_comm_backend(world));
        return 1;
    }
    if (zo_comm_takes_host_memory(world) != 1) { /* mpi and tcp reach host memory */
        fprintf(stderr, "test_comm_backends: %s says it does not take host memory\n", want);
        return 1;
    }
    all_exact = !strcmp(want, "tcp");
    me = zo_comm_rank(world);
    n = zo_comm_size(world);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(all_reduce_matches_reference),
        cmocka_unit_test(reduce_scatter_matches_reference),
        cmocka_unit_test(reduce_to_each_root),
        cmocka_unit_test(exact_sum_is_sequential),
        cmocka_unit_test(all_gather_matches_reference),
        cmocka_unit_test(broadcast_from_each_root),
        cmocka_unit_test(send_recv_ring),
        cmocka_unit_test(sub_groups_reduce_among_themselves),
        cmocka_unit_test(collective_sees_earlier_stream_work),
        cmocka_unit_test(config_mismatch_names_the_key),
        cmocka_unit_test(tcp_rendezvous_with_launcher_ranks),
        cmocka_unit_test(native_call_gets_the_backends_handle),
        cmocka_unit_test(device_only_refuses_host_buffers),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    zo_stream_destroy(s1);
    zo_stream_destroy(s2);
    zo_comm_free(world);
    zo_device_free(dev);
    return failed ? 1 : 0;
}
