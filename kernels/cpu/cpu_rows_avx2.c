/* The row kernels (cpu_rows.h) built for AVX2, with the AVX2 exp, which
 * equals the scalar reference bit for bit. */
#define ZR_NAME             zo_cpu_rows_avx2
#define ZR_LABEL            "avx2"
#define ZR_EXP(x, n, shift) zo_cpu_exp_shifted_avx2(x, n, shift)
#include "cpu_rows_body.h"
