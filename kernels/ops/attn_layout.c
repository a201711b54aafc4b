/* Block-sparse attention layouts (zo_attn_layout_build): the host-side
 * builders of the fused attention's block mask, one small function per
 * layout, as DeepSpeed's sparse_attention and BigBird define them. */
#include <stdlib.h>
#include <string.h>

#include "zo/ops.h"
#include "zo_internal.h"

#define SUBSYS "ops"

/* SplitMix64: a seeded stream that is the same on every platform. */
static uint64_t next_rand(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void layout_sliding(const zo_attn_layout *l, int nb, uint8_t *m)
{
    int w = l->window_blocks, ahead = l->causal ? 0 : w - 1;
    for (int r = 0; r < nb; r++)
        for (int c = 0; c < nb; c++)
            m[(size_t)r * nb + c] = c > r - w && c <= r + ahead;
}

/* DeepSpeed's FixedSparsityConfig (unidirectional or bidirectional, one
 * pattern for all heads): query block r reads the blocks of its own stripe
 * of window_blocks, and the last global_blocks blocks of every stripe. */
static void layout_fixed(const zo_attn_layout *l, int nb, uint8_t *m)
{
    int w = l->window_blocks, g = l->global_blocks;
    for (int r = 0; r < nb; r++)
        for (int c = 0; c < nb; c++) {
            int local = r / w == c / w, summary = c % w >= w - g;
            m[(size_t)r * nb + c] = local || summary;
        }
}

/* BigBird: a window of window_blocks centred on the diagonal, the first
 * global_blocks rows and columns, and random_blocks random columns per row
 * (drawn in row order from the seed; a causal layout draws among c <= r). */
static void layout_bigbird(const zo_attn_layout *l, int nb, uint8_t *m)
{
    int half = l->window_blocks / 2;
    uint64_t x = l->seed;
    for (int r = 0; r < nb; r++) {
        for (int c = 0; c < nb; c++) {
            int d = r > c ? r - c : c - r;
            m[(size_t)r * nb + c] = d <= half || r < l->global_blocks || c < l->global_blocks;
        }
        int span = l->causal ? r + 1 : nb;
        for (int i = 0; i < l->random_blocks; i++)
            m[(size_t)r * nb + (int)(next_rand(&x) % (uint64_t)span)] = 1;
    }
}

static zo_status check_layout(const zo_attn_layout *l, int seq)
{
    if (!l || l->struct_size != sizeof *l)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout is NULL or its struct_size is not sizeof(zo_attn_layout) "
                       "(use ZO_ATTN_LAYOUT_INIT)");
    if (seq <= 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "attention layout: seq %d must be > 0", seq);
    if (l->block < 16 || l->block > 512 || l->block % 16)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout: block %d must be a multiple of 16 in 16..512", l->block);
    if (l->kind < ZO_ATTN_LAYOUT_DENSE || l->kind > ZO_ATTN_LAYOUT_BIGBIRD)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout: kind %d is unknown; expected dense, sliding_window, "
                       "fixed or bigbird",
                       (int)l->kind);
    if (l->kind != ZO_ATTN_LAYOUT_DENSE && l->window_blocks < 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout: window_blocks %d must be >= 1", l->window_blocks);
    if (l->kind == ZO_ATTN_LAYOUT_FIXED &&
        (l->global_blocks < 1 || l->global_blocks > l->window_blocks))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout fixed: global_blocks %d must be in 1..window_blocks (%d)",
                       l->global_blocks, l->window_blocks);
    if (l->kind == ZO_ATTN_LAYOUT_BIGBIRD && (l->global_blocks < 0 || l->random_blocks < 0))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout bigbird: global_blocks %d and random_blocks %d must be "
                       ">= 0",
                       l->global_blocks, l->random_blocks);
    return ZO_OK;
}

zo_status zo_attn_layout_build(const zo_attn_layout *l, int seq, uint8_t *mask, size_t cap,
                               int *n_blocks, double *density)
{
    ZO_TRY(check_layout(l, seq));
    int nb = (seq + l->block - 1) / l->block;
    if (n_blocks)
        *n_blocks = nb;
    size_t n = (size_t)nb * nb;
    if (!mask && !density)
        return ZO_OK;
    uint8_t *m = mask;
    if (mask && cap < n)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "attention layout: the mask holds %zu bytes; %d blocks need %zu", cap, nb,
                       n);
    if (!m && !(m = malloc(n)))
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a %zu-byte attention mask", n);
    switch (l->kind) {
    case ZO_ATTN_LAYOUT_SLIDING_WINDOW: layout_sliding(l, nb, m); break;
    case ZO_ATTN_LAYOUT_FIXED: layout_fixed(l, nb, m); break;
    case ZO_ATTN_LAYOUT_BIGBIRD: layout_bigbird(l, nb, m); break;
    default: memset(m, 1, n); break;
    }
    size_t kept = 0;
    for (int r = 0; r < nb; r++)
        for (int c = 0; c < nb; c++) {
            if (l->causal && c > r)
                m[(size_t)r * nb + c] = 0;
            kept += m[(size_t)r * nb + c] != 0;
        }
    if (density)
        *density = (double)kept / (l->causal ? (double)nb * (nb + 1) / 2 : (double)nb * nb);
    if (m != mask)
        free(m);
    return ZO_OK;
}
