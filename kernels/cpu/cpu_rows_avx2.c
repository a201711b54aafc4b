/* The row kernels (cpu_rows.h) built for AVX2; exp runs the scalar
 * reference, which the AVX-512 exp equals bit for bit. */
#define ZR_NAME             zo_cpu_rows_avx2
#define ZR_LABEL            "avx2"
#define ZR_EXP(x, n, shift) zo_cpu_exp_shifted_at(0, x, n, shift)
#include "cpu_rows_body.h"
