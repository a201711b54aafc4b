/* AVX-512 variant with native bf16 conversion (AVX512_BF16): the same
 * loops as adam_avx512.c; compiled with -mavx512bf16 in addition. */
#define ZO_AVX512_NATIVE_BF16 1
#include "adam_avx512.c"
