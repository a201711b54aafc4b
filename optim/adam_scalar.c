/* The portable variant: plain C, one element at a time. */
#include "adam_scalar_elem.h"

static double scalar_sum_sq(const void *grad, zo_optim_dtype t, size_t begin, size_t end)
{
    return zs_sum_sq(grad, t, begin, end);
}

const zo_optim_kernels zo_optim_kernels_scalar = {"scalar", zs_adam_elems, scalar_sum_sq,
                                                  zs_roofline_elems};
