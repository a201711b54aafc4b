/* zo-bench: benchmarks that report speed as a ratio against a limit
 * measured in the same run. One subcommand per part of the library. */
#include <stdio.h>
#include <string.h>

#include "zo_bench.h"

typedef struct bench_cmd {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} bench_cmd;

static const bench_cmd cmds[] = {
    {"adam", zo_bench_adam_main, "fused CPU Adam step vs the memory roofline of the same bytes"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: zo-bench <command> [options]   (zo-bench <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].main(argc - 1, argv + 1);
    fprintf(stderr, "zo-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
