/* Run-time CPU feature detection (CPUID through the compiler's builtins,
 * which also check that the OS saves the vector state). */
#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "zo/cpu.h"
#include "zo_internal.h"

static zo_simd_level detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
    int bf16 = 0;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
    /* the level's 8-bit decoder also uses VBMI's byte permutes: every CPU
     * with both (Zen 4 on, Sapphire Rapids on) but Cooper Lake's, which
     * runs the avx512 level */
    bf16 = avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
#endif
    if (bf16)
        return ZO_SIMD_AVX512_BF16;
    if (avx512)
        return ZO_SIMD_AVX512;
    if (avx2)
        return ZO_SIMD_AVX2; /* F16C comes with every AVX2 CPU */
    return ZO_SIMD_SCALAR;
#elif defined(__aarch64__)
    return ZO_SIMD_NEON;
#else
    return ZO_SIMD_SCALAR;
#endif
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static zo_simd_level detected, chosen;

static int parse_level(const char *s, zo_simd_level *out)
{
    static const zo_simd_level all[] = {ZO_SIMD_SCALAR, ZO_SIMD_NEON, ZO_SIMD_AVX2, ZO_SIMD_AVX512,
                                        ZO_SIMD_AVX512_BF16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        if (strcasecmp(s, zo_simd_level_name(all[i])) == 0) {
            *out = all[i];
            return 1;
        }
    }
    return 0;
}

/* Whether level runs on a CPU whose detected level is d. Takes d explicitly
 * so init_levels can use it without re-entering pthread_once. */
static int level_supported(zo_simd_level level, zo_simd_level d)
{
    if (level == ZO_SIMD_SCALAR)
        return 1;
    if (level == ZO_SIMD_NEON)
        return d == ZO_SIMD_NEON;
    if (d == ZO_SIMD_NEON)
        return 0;
    return level <= d;
}

static void init_levels(void)
{
    detected = detect();
    chosen = detected;
    const char *env = zo_env_str("ZO_SIMD", NULL);
    if (!env)
        return;
    zo_simd_level want;
    if (!parse_level(env, &want)) {
        ZO_LOGW(
            "core",
            "ZO_SIMD='%s' is not a level; expected scalar|neon|avx2|avx512|avx512_bf16; using %s",
            env, zo_simd_level_name(detected));
    } else if (!level_supported(want, detected)) {
        ZO_LOGW("core", "ZO_SIMD=%s is not supported by this CPU (it has %s); using %s", env,
                zo_simd_level_name(detected), zo_simd_level_name(detected));
    } else {
        chosen = want;
    }
}

zo_simd_level zo_cpu_simd_detected(void)
{
    pthread_once(&once, init_levels);
    return detected;
}

zo_simd_level zo_cpu_simd_level(void)
{
    pthread_once(&once, init_levels);
    return chosen;
}

int zo_cpu_simd_supported(zo_simd_level level)
{
    return level_supported(level, zo_cpu_simd_detected());
}

const char *zo_simd_level_name(zo_simd_level level)
{
    switch (level) {
    case ZO_SIMD_SCALAR: return "scalar";
    case ZO_SIMD_NEON: return "neon";
    case ZO_SIMD_AVX2: return "avx2";
    case ZO_SIMD_AVX512: return "avx512";
    case ZO_SIMD_AVX512_BF16: return "avx512_bf16";
    }
    return "?";
}
