/* The fused attention's tile product (flash_tiles.h) built for AVX-512. */
#define FT_NAME  zo_flash_tiles_avx512
#define FT_LABEL "avx512"
#define FT_W     16
#define FT_NV    4
#include "flash_tiles_body.h"
