/* The row kernels (cpu_rows.h) built for AVX-512, with the AVX-512 exp. */
#define ZR_NAME             zo_cpu_rows_avx512
#define ZR_LABEL            "avx512"
#define ZR_EXP(x, n, shift) zo_cpu_exp_shifted_avx512(x, n, shift)
#include "cpu_rows_body.h"
