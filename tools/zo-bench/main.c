/* zo-bench: benchmarks that report speed as a ratio against a limit
 * measured in the same run. One subcommand per part of the library. */
#include <stdio.h>
#include <string.h>

#include "zo_bench.h"
#include "zt_output.h"

typedef struct bench_cmd {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *summary;
} bench_cmd;

/* One line per benchmark. */
static const bench_cmd commands[] = {
    {"io", zo_bench_io_main, "NVMe swap store bandwidth (compare with fio on the same directory)"},
    {"adam", zo_bench_adam_main, "fused CPU Adam step vs the memory roofline of the same bytes"},
    {"engine", zo_bench_engine_main, "training-step time vs the limit of perfect overlap"},
    {"comm", zo_bench_comm_main, "collectives' bus bandwidth vs the backend's own calls"},
    {"attention", zo_bench_attention_main, "fused attention vs materialized; a window vs dense"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: zo-bench COMMAND [OPTIONS]   (zo-bench COMMAND --help for its "
                 "options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    zt_output_check_at_exit("zo-bench");
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "zo-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
