/* zo-bench subcommands: each is a main() of its own over the public API. */
#ifndef ZO_BENCH_H
#define ZO_BENCH_H

int zo_bench_io_main(int argc, char **argv);
int zo_bench_adam_main(int argc, char **argv);
int zo_bench_engine_main(int argc, char **argv);
int zo_bench_comm_main(int argc, char **argv);
int zo_bench_attention_main(int argc, char **argv);

#endif
