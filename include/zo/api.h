/* zoffload: ZO_API marks the functions and objects the library exports.
 * The library is compiled with -fvisibility=hidden, so what the installed
 * headers declare with ZO_API is its whole ABI; everything else, shared
 * between its parts, stays inside libzoffload.so (tests check both ways:
 * tools/scripts/check-exports.py). */
#ifndef ZO_API_H
#define ZO_API_H

#ifndef ZO_API
#if defined(__GNUC__) || defined(__clang__)
#define ZO_API __attribute__((visibility("default")))
#else
#define ZO_API
#endif
#endif

#endif
