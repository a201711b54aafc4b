/* Edit distance for "did you mean" suggestions (config keys, tensor names).
 * Internal to the library. */
#ifndef ZO_STRDIST_H
#define ZO_STRDIST_H

#include <stddef.h>

/* Optimal-string-alignment (restricted Damerau-Levenshtein) distance between
 * a and b, compared case-insensitively, so a swapped pair of letters ("devcie")
 * costs 1. Strings longer than ZO_STRDIST_MAX_LEN are compared on their first
 * ZO_STRDIST_MAX_LEN characters. */
enum { ZO_STRDIST_MAX_LEN = 255 };
size_t zo_strdist(const char *a, const char *b);

/* Index of the candidate nearest to word (the first one on ties), or -1 when
 * n is 0; its distance goes to *dist when dist is not NULL. */
long zo_strdist_nearest(const char *word, const char *const *cands, size_t n, size_t *dist);

/* Whether a suggestion at distance d is close enough to be a likely typo of
 * word: at most 2 edits, or a third of the word's length for long words. */
int zo_strdist_is_close(const char *word, size_t d);

#endif
