/* The command line zo-train and zo-plan share: one table of their long
 * options (zt_cli_options.h: name, value, --help section and text per tool),
 * the getopt table and --help text each tool gets from it, and the value
 * parsers both use, so that a flag both offer is spelled, parsed and refused
 * the same way in both.
 *
 * Adding an option: one X(...) entry in zt_cli_options.h's ZT_CLI_OPTIONS (its
 * id becomes ZT_OPT_<ID>), then its case in the tool's parse_opt. Its getopt entry and
 * its --help lines follow from the table. */
#ifndef ZT_CLI_H
#define ZT_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "zo/dtype.h"
#include "zo/optim_mode.h"
#include "zt_cli_options.h"

typedef enum zt_tool { ZT_TOOL_TRAIN, ZT_TOOL_PLAN, ZT_N_TOOLS } zt_tool;

/* The --help sections; each tool titles and orders the ones it uses
 * (zt_cli.c). */
typedef enum zt_cli_section {
    ZT_SEC_NONE, /* not offered by the tool */
    ZT_SEC_MODEL,
    ZT_SEC_DATA,
    ZT_SEC_JOB,
    ZT_SEC_PLACEMENT,
    ZT_SEC_RANKS,
    ZT_SEC_PIPELINE,
    ZT_SEC_HARDWARE,
    ZT_SEC_SPEEDS,
    ZT_SEC_CONFIG,
    ZT_SEC_CHECKPOINTS,
    ZT_SEC_OUTPUT,
} zt_cli_section;

/* After the short options' characters and getopt's '?' and ':'. */
#define ZT_OPT_FIRST                               256
#define ZT_OPTION_ID(ID, NAME, SHORT, TRAIN, PLAN) ZT_OPT_##ID,
typedef enum zt_opt_id {
    ZT_OPT_BEFORE_FIRST = ZT_OPT_FIRST - 1,
    ZT_CLI_OPTIONS(ZT_OPTION_ID) ZT_OPT_END
} zt_opt_id;
#undef ZT_OPTION_ID
enum { ZT_N_OPTS = ZT_OPT_END - ZT_OPT_FIRST };

/* How one tool offers an option (zt_cli_options.h). */
typedef struct zt_cli_use {
    zt_cli_section section; /* ZT_SEC_NONE: the tool has no such option */
    const char *value;      /* the value in --help; NULL: a flag without one */
    const char *help;       /* "": joined to the next line; NULL: named elsewhere */
} zt_cli_use;

typedef struct zt_cli_opt {
    zt_opt_id id;
    const char *name; /* without the dashes */
    char short_name;  /* 0: none */
    zt_cli_use use[ZT_N_TOOLS];
} zt_cli_opt;

/* The whole table, in zt_cli_options.h's order; *n its length. */
const zt_cli_opt *zt_cli_table(int *n);
/* The option's name without dashes ("?" for an id outside the table). */
const char *zt_cli_name(int id);

/* One tool's parser: its getopt table, built from the shared one. */
typedef struct zt_cli {
    zt_tool tool;
    const char *prog; /* "zo-train": the prefix of its messages */
    struct option longs[ZT_N_OPTS + 1];
    char shorts[16];
} zt_cli;

void zt_cli_init(zt_cli *c, zt_tool tool, const char *prog);
/* getopt_long over the tool's options: a ZT_OPT_* id (a short alias gives
 * its long option's id), '?' for an unknown option or a missing value, -1
 * at the end. getopt's own message is off: the tools print theirs. */
int zt_cli_next(const zt_cli *c, int argc, char **argv);

/* --help: what the tool does, then each of its sections' options in the
 * table's order (flag and value, the text from column 25, lines within 90
 * columns); presets replaces "{presets}". */
void zt_cli_usage(const zt_cli *c, FILE *f, const char *presets);

/* "PROG: --NAME 'VALUE': expected EXPECTED" on stderr; returns 2, the usage
 * error's exit code. */
int zt_cli_bad_value(const zt_cli *c, int id, const char *value, const char *expected);

/* Value parsers: 0 and *out set, or -1 and *out left. */
int zt_cli_long(const char *s, long lo, long hi, long *out); /* decimal, in [lo, hi] */
int zt_cli_double(const char *s, double *out);               /* finite */
int zt_cli_choice(const char *s, const char *const *names);  /* NULL-ended: the index */
int zt_cli_on_off(const char *s, int *out);                  /* on: 1, off: 0 */
int zt_cli_dtype(const char *s, zo_dtype *out);              /* bf16, fp16, fp32 */
int zt_cli_attention(const char *s, int *flash);             /* dense (0), flash (1) */
int zt_cli_optim_mode(const char *s, zo_optim_mode *out);
/* --mlp-chunk-bytes: auto (0) or a byte count > 0 (zo_parse_bytes' spellings). */
int zt_cli_mlp_chunk(const char *s, uint64_t *out);
/* --device's values, NULL-ended: auto (cuda when a GPU is present), cpu, cuda. */
extern const char *const zt_cli_devices[]; /* sync, overlap, dpu */

#endif
