/* Every float the 8-bit Adam step can encode (all of [-1.0078125, 1.0078125]
 * for m's signed map, [0, 1.0078125] for v's unsigned one: a moment times
 * 1/absmax is at most 1 plus rounding), through each SIMD level's encoder
 * of the step: the same code as the scalar level, bit for bit, and a
 * nearest map value (as test_adam_q8's brute force, with its 2^-22 of
 * slack). Each value's two neighbours in the sorted map come from a pointer
 * that walks with the values, so the whole range costs a few seconds per
 * level. Values beyond the maps (inf, NaN, |x| > 1.0078125) are
 * test_adam_q8's test_out_of_range_codes_equal_scalar. */
#include "adam_ref.h"
#include "q8_codes.h"

static const zo_simd_level all_levels[] = {ZO_SIMD_SCALAR, ZO_SIMD_AVX2, ZO_SIMD_AVX512,
                                           ZO_SIMD_AVX512_BF16, ZO_SIMD_NEON};
#define NLEVELS ((int)(sizeof all_levels / sizeof *all_levels))
#define CHUNK   ((size_t)1 << 20)
#define TOP     0x3f810000u /* 1.0078125 */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct walk {
    float sorted[256];
    int j; /* sorted[j] <= x < sorted[j + 1], within the map's range */
} walk;

static double walk_nearest_dist(walk *w, double x)
{
    while (w->j < 255 && x >= w->sorted[w->j + 1])
        w->j++;
    while (w->j > 0 && x < w->sorted[w->j])
        w->j--;
    double d = fabs(x - w->sorted[w->j]);
    return w->j < 255 ? fmin(d, fabs(x - w->sorted[w->j + 1])) : d;
}

/* Codes of x[0..n) at every level this CPU runs: all equal to the scalar
 * ones, which are a nearest map value. */
static void check_chunk(const float *x, size_t n, int is_signed, walk *w, uint8_t *want)
{
    const float *map = zo_adam_q8_map(is_signed);
    codes_equal_scalar(x, n, is_signed, all_levels + 1, NLEVELS - 1, want);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - map[want[i]]), best = walk_nearest_dist(w, x[i]);
        if (!(d <= best + 0x1p-22 * fmax(fabs((double)x[i]), 1e-30)))
            fail_msg("%s: %a encoded as %u (%.9g), nearest is %.3g away",
                     is_signed ? "signed" : "unsigned", (double)x[i], want[i], map[want[i]], best);
    }
}

/* With the argument "edges" (for emulators, where all floats take too
 * long), only the floats within EDGE_ULPS of an edge, where a code can
 * change (a midpoint of two neighbouring map values, a binade's start), and
 * every SPARSE_STRIDE-th float between: the same range, every decision the
 * encoder makes, not every input. */
#define EDGE_ULPS     2048u
#define SPARSE_STRIDE 4099u
static int edges_only;

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The magnitudes' bits where a code of the map may change, sorted. */
static size_t edges_of(const float *sorted, uint32_t *edges)
{
    size_t n = 0;
    for (int c = 0; c + 1 < 256; c++) {
        float mid = fabsf((float)(((double)sorted[c] + sorted[c + 1]) / 2));
        memcpy(&edges[n++], &mid, 4);
    }
    for (uint32_t e = 0; e <= TOP >> 23; e++)
        edges[n++] = e << 23;
    qsort(edges, n, sizeof *edges, cmp_u32);
    return n;
}

/* The first b' >= b that is checked; *k walks the sorted edges as b grows. */
static uint64_t next_checked(uint64_t b, const uint32_t *edges, size_t nedges, size_t *k)
{
    if (!edges_only)
        return b;
    while (*k < nedges && edges[*k] + (uint64_t)EDGE_ULPS < b)
        ++*k;
    uint64_t sparse = (b + SPARSE_STRIDE - 1) / SPARSE_STRIDE * SPARSE_STRIDE;
    if (*k == nedges)
        return sparse;
    uint64_t window = edges[*k] > EDGE_ULPS ? edges[*k] - EDGE_ULPS : 0;
    return b >= window ? b : window < sparse ? window : sparse;
}

/* The floats with bits [0, TOP] (or their negatives), in order. */
static void check_range(int is_signed, int negative)
{
    walk w = {.j = 0};
    memcpy(w.sorted, zo_adam_q8_map(is_signed), sizeof w.sorted);
    qsort(w.sorted, 256, sizeof(float), cmp_float);
    uint32_t edges[256 + 128];
    size_t nedges = edges_of(w.sorted, edges), k = 0;
    float *x = xcalloc(CHUNK, sizeof *x);
    uint8_t *want = xcalloc(CHUNK, 1);
    size_t n = 0;
    for (uint64_t b = next_checked(0, edges, nedges, &k); b <= TOP;
         b = next_checked(b + 1, edges, nedges, &k)) {
        uint32_t bits = (uint32_t)b | (negative ? 0x80000000u : 0u);
        memcpy(&x[n++], &bits, sizeof bits);
        if (n == CHUNK) {
            check_chunk(x, n, is_signed, &w, want);
            n = 0;
        }
    }
    check_chunk(x, n, is_signed, &w, want);
    free(x);
    free(want);
}

static void test_all_floats_unsigned(void **state)
{
    check_range(0, 0);
}

static void test_all_floats_signed(void **state)
{
    check_range(1, 0);
    check_range(1, 1);
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "edges") != 0)) {
        fprintf(stderr,
                "usage: %s [edges]   (edges: only the floats near where a code changes, "
                "and a sparse sample between)\n",
                argv[0]);
        return 2;
    }
    edges_only = argc == 2;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_floats_unsigned),
        cmocka_unit_test(test_all_floats_signed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
