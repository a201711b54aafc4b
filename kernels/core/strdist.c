/* Edit distance for "did you mean" suggestions. */
#include "zo_strdist.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static size_t min3(size_t a, size_t b, size_t c)
{
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

static int same_char(char x, char y)
{
    return tolower((unsigned char)x) == tolower((unsigned char)y);
}

/* Three rolling rows keep it allocation-free: suggestions are computed on
 * error paths, where an allocation failure must not hide the real error. */
size_t zo_strdist(const char *a, const char *b)
{
    size_t n = strnlen(a, ZO_STRDIST_MAX_LEN), m = strnlen(b, ZO_STRDIST_MAX_LEN);
    size_t rows[3][ZO_STRDIST_MAX_LEN + 1];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++)
        prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t cost = same_char(a[i - 1], b[j - 1]) ? 0 : 1;
            cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && same_char(a[i - 1], b[j - 2]) && same_char(a[i - 2], b[j - 1]) &&
                prev2[j - 2] + 1 < cur[j])
                cur[j] = prev2[j - 2] + 1;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[m];
}

long zo_strdist_nearest(const char *word, const char *const *cands, size_t n, size_t *dist)
{
    long best = -1;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = zo_strdist(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = (long)i;
        }
    }
    if (dist)
        *dist = best_d;
    return best;
}

int zo_strdist_is_close(const char *word, size_t d)
{
    size_t len = strlen(word);
    size_t limit = len / 3 > 2 ? len / 3 : 2;
    return d <= limit;
}
