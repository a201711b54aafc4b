/* The shared command line of zo-train and zo-plan (zt_cli.h): the table
 * expanded from zt_cli_options.h, each tool's getopt table and --help built
 * from it, and the value parsers. */
#include "zt_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/units.h"

#define ZT_IN(SECTION, VALUE, HELP)                                                                \
    {                                                                                              \
        ZT_SEC_##SECTION, VALUE, HELP                                                              \
    }
#define ZT_NO                                                                                      \
    {                                                                                              \
        ZT_SEC_NONE, NULL, NULL                                                                    \
    }
#define ZT_OPTION_ENTRY(ID, NAME, SHORT, TRAIN, PLAN) {ZT_OPT_##ID, NAME, SHORT, {TRAIN, PLAN}},
static const zt_cli_opt table[] = {ZT_CLI_OPTIONS(ZT_OPTION_ENTRY)};
#undef ZT_OPTION_ENTRY

/* Each tool's --help: what it does, then its sections' titles in order. */
enum { MAX_TITLES = 8 };
typedef struct title {
    zt_cli_section section;
    const char *title;
} title;
static const struct {
    const char *intro;
    title titles[MAX_TITLES];
} helps[ZT_N_TOOLS] = {
    [ZT_TOOL_TRAIN] = {"usage: zo-train [options]\n"
                       "Train a LLaMA-style decoder through the zoffload engine (parameters, "
                       "gradients and\noptimizer states paged between device memory, pinned host "
                       "memory and NVMe).\n\n",
                       {{ZT_SEC_MODEL, "model:"},
                        {ZT_SEC_DATA, "data and schedule:"},
                        {ZT_SEC_PLACEMENT, "placement:"},
                        {ZT_SEC_RANKS, "ranks (mpirun -np N zo-train ..., srun, or torchrun's "
                                       "RANK/WORLD_SIZE):"},
                        {ZT_SEC_CONFIG, "config:"},
                        {ZT_SEC_CHECKPOINTS, "checkpoints:"},
                        {ZT_SEC_OUTPUT, "output:"}}},
    [ZT_TOOL_PLAN] = {"usage: zo-plan [options]\n"
                      "Plan a zo-train job before running it: for each placement (no offload; "
                      "optimizer on\nhost; optimizer on NVMe; parameters and optimizer on host; "
                      "both on NVMe) the bytes of\nevery tier by use, whether it fits, the step "
                      "time and its bottleneck, tokens/s, MFU\nand NVMe wear; the fastest plan "
                      "that fits is recommended.\n\n",
                      {{ZT_SEC_MODEL, "model:"},
                       {ZT_SEC_JOB, "job:"},
                       {ZT_SEC_RANKS, "ranks (ZeRO, zo-train --zero-stage under mpirun/srun/"
                                      "torchrun):"},
                       {ZT_SEC_PIPELINE, "pipeline (zo-train --pipeline-stages under mpirun):"},
                       {ZT_SEC_HARDWARE, "hardware (detected unless given):"},
                       {ZT_SEC_SPEEDS, "speeds (measured with --measure, given, read from "
                                       "zo-bench, else assumed):"},
                       {ZT_SEC_OUTPUT, "output:"}}},
};

const zt_cli_opt *zt_cli_table(int *n)
{
    *n = ZT_N_OPTS;
    return table;
}

const char *zt_cli_name(int id)
{
    return id >= ZT_OPT_FIRST && id < ZT_OPT_END ? table[id - ZT_OPT_FIRST].name : "?";
}

void zt_cli_init(zt_cli *c, zt_tool tool, const char *prog)
{
    memset(c, 0, sizeof *c);
    c->tool = tool;
    c->prog = prog;
    int n = 0, s = 0;
    for (int i = 0; i < ZT_N_OPTS; i++) {
        const zt_cli_use *u = &table[i].use[tool];
        if (u->section == ZT_SEC_NONE)
            continue;
        c->longs[n++] = (struct option){table[i].name, u->value ? required_argument : no_argument,
                                        NULL, table[i].id};
        if (table[i].short_name && s + 2 < (int)sizeof c->shorts) {
            c->shorts[s++] = table[i].short_name;
            if (u->value)
                c->shorts[s++] = ':';
        }
    }
}

int zt_cli_next(const zt_cli *c, int argc, char **argv)
{
    opterr = 0;
    int opt = getopt_long(argc, argv, c->shorts, c->longs, NULL);
    if (opt == ':')
        return '?';
    for (int i = 0; opt > 0 && opt < ZT_OPT_FIRST && i < ZT_N_OPTS; i++)
        if (table[i].short_name == opt)
            return table[i].id;
    return opt;
}

/* text with "{presets}" replaced. */
static void put_text(FILE *f, const char *text, size_t len, const char *presets)
{
    static const char key[] = "{presets}";
    const char *end = text + len, *at;
    while ((at = strstr(text, key)) && at < end) {
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(presets ? presets : "", f);
        text = at + sizeof key - 1;
    }
    fwrite(text, 1, (size_t)(end - text), f);
}

/* The texts start at column 25 and keep lines within 90 columns. */
enum { HELP_COLUMN = 25, HELP_WIDTH = 90 };

/* The help text's lines, the first after the head (head_len columns) or,
 * when it would not fit there, on a line of its own; the others indented to
 * the help column. */
static void put_help(FILE *f, int head_len, const char *help, const char *presets)
{
    const char *nl = strchr(help, '\n');
    int first_len = nl ? (int)(nl - help) : (int)strlen(help);
    int own_line = head_len > HELP_COLUMN - 2 && head_len + 3 + first_len > HELP_WIDTH;
    if (own_line)
        fputc('\n', f);
    else if (head_len <= HELP_COLUMN - 2) /* two spaces at least between them */
        fprintf(f, "%*s", HELP_COLUMN - head_len, "");
    else
        fputs("   ", f);
    for (int indent = own_line;; indent = 1) {
        nl = strchr(help, '\n');
        if (indent)
            fprintf(f, "%*s", HELP_COLUMN, "");
        put_text(f, help, nl ? (size_t)(nl - help) : strlen(help), presets);
        fputc('\n', f);
        if (!nl)
            return;
        help = nl + 1;
    }
}

/* One option's head ("--name VALUE", "-v, --verbose"), its columns. */
static int put_head(FILE *f, const zt_cli_opt *o, const zt_cli_use *u, int joined)
{
    int n = fprintf(f, "%s", joined ? " " : "  ");
    if (o->short_name)
        n += fprintf(f, "-%c, ", o->short_name);
    n += fprintf(f, "--%s", o->name);
    if (u->value)
        n += fprintf(f, " %s", u->value);
    return n;
}

static void put_section(const zt_cli *c, FILE *f, zt_cli_section s, const char *presets)
{
    int head_len = 0; /* of the joined heads so far ("" texts) */
    for (int i = 0; i < ZT_N_OPTS; i++) {
        const zt_cli_use *u = &table[i].use[c->tool];
        if (u->section != s || !u->help)
            continue;
        head_len += put_head(f, &table[i], u, head_len > 0);
        if (!u->help[0])
            continue;
        put_help(f, head_len, u->help, presets);
        head_len = 0;
    }
}

void zt_cli_usage(const zt_cli *c, FILE *f, const char *presets)
{
    fputs(helps[c->tool].intro, f);
    for (int i = 0; i < MAX_TITLES && helps[c->tool].titles[i].title; i++) {
        fprintf(f, "%s\n", helps[c->tool].titles[i].title);
        put_section(c, f, helps[c->tool].titles[i].section, presets);
    }
}

int zt_cli_bad_value(const zt_cli *c, int id, const char *value, const char *expected)
{
    fprintf(stderr, "%s: --%s '%s': expected %s\n", c->prog, zt_cli_name(id), value, expected);
    return 2;
}

int zt_cli_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int zt_cli_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int zt_cli_choice(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int zt_cli_on_off(const char *s, int *out)
{
    static const char *const names[] = {"off", "on", NULL};
    int i = zt_cli_choice(s, names);
    if (i < 0)
        return -1;
    *out = i;
    return 0;
}

int zt_cli_mlp_chunk(const char *s, uint64_t *out)
{
    uint64_t b = 0;
    if (strcmp(s, "auto") != 0 && (zo_parse_bytes(s, &b) != 0 || b == 0))
        return -1;
    *out = b;
    return 0;
}

const char *const zt_cli_devices[] = {"auto", "cpu", "cuda", NULL};

int zt_cli_dtype(const char *s, zo_dtype *out)
{
    static const char *const names[] = {"bf16", "fp16", "fp32", NULL};
    static const zo_dtype types[] = {ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    int i = zt_cli_choice(s, names);
    if (i < 0)
        return -1;
    *out = types[i];
    return 0;
}

int zt_cli_attention(const char *s, int *flash)
{
    static const char *const names[] = {"dense", "flash", NULL};
    int i = zt_cli_choice(s, names);
    if (i < 0)
        return -1;
    *flash = i;
    return 0;
}

/* The names are the core's (zo_optim_mode_name), so JSON and flags agree. */
int zt_cli_optim_mode(const char *s, zo_optim_mode *out)
{
    for (int m = ZO_OPTIM_SYNC; m <= ZO_OPTIM_DPU; m++)
        if (strcmp(s, zo_optim_mode_name((zo_optim_mode)m)) == 0) {
            *out = (zo_optim_mode)m;
            return 0;
        }
    return -1;
}
