/* The configuration check across ranks: each key's canonical value hashed
 * (xxh64) on every rank, the hashes all-gathered, the first key that differs
 * named with the ranks holding each value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "comm_impl.h"

/* "0, 2" for the ranks whose hash of key k equals that of rank r0. */
static void ranks_with(zo_comm_t c, const uint64_t *all, size_t n, size_t k, int r0, char *buf,
                       size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int r = 0; r < c->size && len + 16 < cap; r++)
        if (all[(size_t)r * n + k] == all[(size_t)r0 * n + k])
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "",
                                    zo_comm_world_rank(c, r));
}

static zo_status report_mismatch(zo_comm_t c, const uint64_t *all, size_t n, size_t k,
                                 const char *key, const char *value)
{
    int other = 0;
    while (other < c->size && all[(size_t)other * n + k] == all[(size_t)c->rank * n + k])
        other++;
    char same[128], differ[128];
    ranks_with(c, all, n, k, c->rank, same, sizeof same);
    ranks_with(c, all, n, k, other, differ, sizeof differ);
    return ZO_FAIL(ZO_ERR_CONFIG, "comm",
                   "configuration differs across ranks at key '%s': rank(s) %s have '%s', rank(s) "
                   "%s have another value; give every rank the same configuration",
                   key, same, value, differ);
}

/* Every rank must check the same keys: their count and names hashed, all
 * gathered first (a fixed size, whatever n is on each rank). */
static zo_status check_same_keys(zo_comm_t c, const char *const *keys, size_t n)
{
    XXH64_state_t *h = XXH64_createState();
    if (!h)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    XXH64_reset(h, n);
    for (size_t k = 0; k < n; k++)
        XXH64_update(h, keys[k], strlen(keys[k]) + 1);
    uint64_t mine = XXH64_digest(h);
    XXH64_freeState(h);
    uint64_t *all = calloc((size_t)c->size, sizeof(uint64_t));
    if (!all)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    zo_status st = c->be->host_all_gather(c, &mine, all, sizeof mine);
    for (int r = 0; st == ZO_OK && r < c->size; r++)
        if (all[r] != mine)
            st = ZO_FAIL(ZO_ERR_CONFIG, "comm",
                         "ranks %d and %d check different lists of configuration keys (%zu keys "
                         "here): every rank must pass the same keys",
                         zo_comm_world_rank(c, c->rank), zo_comm_world_rank(c, r), n);
    free(all);
    return st;
}

zo_status zo_comm_check_config(zo_comm_t c, const char *const *keys, const char *const *values,
                               size_t n)
{
    if (!c || (n && (!keys || !values)))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "zo_comm_check_config: a communicator and n keys and values");
    for (size_t k = 0; k < n; k++)
        if (!keys[k])
            return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "zo_comm_check_config: key %zu is NULL", k);
    ZO_TRY(check_same_keys(c, keys, n));
    if (!n)
        return ZO_OK;
    uint64_t *mine = calloc(n, sizeof(uint64_t));
    uint64_t *all = calloc(n * (size_t)c->size, sizeof(uint64_t));
    zo_status st = mine && all ? ZO_OK : ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    for (size_t k = 0; st == ZO_OK && k < n; k++) {
        const char *v = values[k] ? values[k] : "";
        mine[k] = XXH64(v, strlen(v), 0);
    }
    if (st == ZO_OK)
        st = c->be->host_all_gather(c, mine, all, n * sizeof(uint64_t));
    for (size_t k = 0; st == ZO_OK && k < n; k++)
        for (int r = 0; r < c->size; r++)
            if (all[(size_t)r * n + k] != mine[k]) {
                st = report_mismatch(c, all, n, k, keys[k], values[k] ? values[k] : "");
                break;
            }
    free(mine);
    free(all);
    return st;
}
