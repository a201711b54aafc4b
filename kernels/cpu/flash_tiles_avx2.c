/* The fused attention's tile product (flash_tiles.h) built for AVX2. */
#define FT_NAME  zo_flash_tiles_avx2
#define FT_LABEL "avx2"
#define FT_W     8
#define FT_NV    2
#include "flash_tiles_body.h"
