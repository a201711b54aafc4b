/* libFuzzer target for zo-train's checkpoint loader (zt_ckpt_load): the
 * input replaces one file of a valid checkpoint, and the loader must refuse
 * it with a message or load it, never crash, hang or read out of bounds.
 *
 * The first byte picks the checkpoint and the file: b % 3 one of three
 * checkpoints of a small model saved at start-up with fp32, bf16 and int8
 * moments (the int8 one holds u8 codes, their block scales and the fp32
 * moments of the tensors kept fp32), b / 3 % 4 the file the rest of the
 * input replaces: trainer_state.json, checksums.json, model.safetensors or
 * optimizer.safetensors. One trainer (fp32 moments, so the other formats are
 * converted) loads every input. Seeds: tests/train/ckpt-corpus; each seed
 * is a first byte and a valid file (ZT_FUZZ_SEEDS=DIR writes the safetensors
 * seeds there from the start-up checkpoints). */
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "train_test_util.h"
#include "zo/log.h"
#include "zt_error.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { KINDS = 3, FILES = 4 };
static const char *const k_files[FILES] = {ZT_CKPT_STATE, "checksums.json", ZT_CKPT_MODEL,
                                           ZT_CKPT_OPTIM};
static char g_dir[256], g_base[KINDS][320], g_work[320];
static zt_trainer *g_t;

static zt_options small_options(zo_dtype states)
{
    zt_options o = zt_test_small_options(g_dir, 2);
    /* dim 16: the head (4096 elements) holds int8 moments, the rest fp32 */
    o.shape = (zt_shape){256, 16, 1, 2, 32, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0};
    o.param_home = o.optim_home = ZO_TIER_HOST;
    o.state_dtype = states;
    o.chunk_bytes = 16u << 10;
    return o;
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_checkpoint: %s: %s\n", what, zt_last_error());
    abort();
}

/* A checkpoint of one step, its moments in `states`, as dir/step-00000001. */
static void save_base(const char *dir, zo_dtype states)
{
    zt_options o = small_options(states);
    zt_trainer *t = NULL;
    float loss;
    zo_step_stats st;
    if (zt_trainer_init(&t, &o) < 0 || zt_trainer_step(t, &loss, &st) < 0 ||
        zt_ckpt_save(t, dir, NULL, 0) < 0)
        die("saving a start-up checkpoint");
    zt_trainer_free(t);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (b && fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void put(const char *path, const void *data, size_t n, const void *head, size_t head_n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(head, 1, head_n, f) != head_n || fwrite(data, 1, n, f) != n || fclose(f))
        abort();
}

/* With ZT_FUZZ_SEEDS=DIR: one seed per (checkpoint, file), a first byte and the file. */
static void write_seeds(void)
{
    const char *out = getenv("ZT_FUZZ_SEEDS");
    if (!out)
        return;
    for (int k = 0; k < KINDS; k++)
        for (int f = 0; f < FILES; f++) {
            char src[600], dst[600];
            size_t n;
            unsigned char b = (unsigned char)(f * KINDS + k);
            snprintf(src, sizeof src, "%s/step-00000001/%s", g_base[k], k_files[f]);
            snprintf(dst, sizeof dst, "%s/seed-%d-%d", out, k, f);
            char *text = slurp(src, &n);
            if (!text)
                abort();
            put(dst, text, n, &b, 1);
            free(text);
        }
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The start-up checkpoints and the work directory go when the fuzzer exits. */
static void remove_dir(void)
{
    zt_trainer_free(g_t);
    g_t = NULL;
    nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    zo_log_set_level(ZO_LOG_NONE);
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-fuzz-ckpt-XXXXXX");
    if (!mkdtemp(g_dir))
        abort();
    atexit(remove_dir);
    const zo_dtype states[KINDS] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int k = 0; k < KINDS; k++) {
        snprintf(g_base[k], sizeof g_base[k], "%s/base-%d", g_dir, k);
        save_base(g_base[k], states[k]);
    }
    write_seeds();
    snprintf(g_work, sizeof g_work, "%s/work/step-00000001", g_dir);
    char parent[320];
    snprintf(parent, sizeof parent, "%s/work", g_dir);
    if ((mkdir(parent, 0755) && errno != EEXIST) || (mkdir(g_work, 0755) && errno != EEXIST))
        abort();
    zt_options o = small_options(ZO_DTYPE_F32);
    if (zt_trainer_init(&g_t, &o) < 0)
        die("the loading trainer");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int kind = data[0] % KINDS, which = data[0] / KINDS % FILES;
    for (int f = 0; f < FILES; f++) {
        char src[600], dst[600];
        size_t n = 0;
        snprintf(dst, sizeof dst, "%s/%s", g_work, k_files[f]);
        if (f == which) {
            put(dst, data + 1, size - 1, "", 0);
            continue;
        }
        snprintf(src, sizeof src, "%s/step-00000001/%s", g_base[kind], k_files[f]);
        char *text = slurp(src, &n);
        if (!text)
            abort();
        put(dst, text, n, "", 0);
        free(text);
    }
    zt_ckpt_load(g_t, g_work); /* refused or loaded: either is fine */
    return 0;
}

#ifdef ZT_FUZZ_REPLAY
/* Without libFuzzer (the ordinary build's test): run every file of the
 * directories given, as the fuzzer runs its seeds. */
#include <dirent.h>

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    int runs = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[1200];
            size_t n;
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            char *bytes = slurp(path, &n);
            if (!bytes)
                continue;
            LLVMFuzzerTestOneInput((const uint8_t *)bytes, n);
            free(bytes);
            runs++;
        }
        if (d)
            closedir(d);
    }
    printf("fuzz_checkpoint: %d inputs replayed\n", runs);
    return runs > 0 ? 0 : 1;
}
#endif
