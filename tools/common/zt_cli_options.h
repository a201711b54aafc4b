/* The long options of zo-train and zo-plan, one entry each, in the order
 * each tool's --help lists them within a section (zt_cli.h reads this).
 *
 * Each entry X(ID, NAME, SHORT, TRAIN, PLAN): ID names ZT_OPT_<ID>; NAME is the
 * flag without its dashes; SHORT a one-letter alias (0: none); TRAIN and
 * PLAN say how each tool offers it: ZT_NO (not offered), or
 * ZT_IN(SECTION, VALUE, HELP): the --help section (zt_cli_section), the
 * value's spelling in --help (NULL: a flag without a value) and the help
 * text (lines split by \n; "" joins the flag to the next entry's line, as
 * "--vocab N --dim N ..."; NULL lists it only where another entry's text
 * names it; "{presets}" becomes the preset names). An option both tools
 * offer is one entry whatever their texts: the same name parses the same
 * way in both (zt_cli.h's value parsers), only what a tool accepts beyond
 * it ("auto" in zo-plan) differs.
 *
 * Adding an option: one X(...) entry here, and its case in the tool's
 * parse_opt (tools/zo-train/main.c, tools/zo-plan/main.c). */

/* clang-format off */
#define ZT_CLI_OPTIONS(X)                                                                          \
    X(PRESET, "preset", 0,                                                                         \
      ZT_IN(MODEL, "NAME", "{presets} (default tiny)"),                                            \
      ZT_IN(MODEL, "NAME", "{presets} (default tiny)"))                                            \
    X(VOCAB, "vocab", 0, ZT_IN(MODEL, "N", ""), ZT_IN(MODEL, "N", ""))                             \
    X(DIM, "dim", 0, ZT_IN(MODEL, "N", ""), ZT_IN(MODEL, "N", ""))                                 \
    X(LAYERS, "layers", 0, ZT_IN(MODEL, "N", ""), ZT_IN(MODEL, "N", ""))                           \
    X(HEADS, "heads", 0, ZT_IN(MODEL, "N", ""), ZT_IN(MODEL, "N", ""))                             \
    X(FFN, "ffn", 0,                                                                               \
      ZT_IN(MODEL, "N", "override the preset's shape"),                                            \
      ZT_IN(MODEL, "N", "override the preset's shape"))                                            \
    X(HF_CONFIG, "hf-config", 0, ZT_NO,                                                            \
      ZT_IN(MODEL, "FILE", "a Hugging Face LLaMA config.json instead of a preset"))                \
    X(DTYPE, "dtype", 0,                                                                           \
      ZT_IN(MODEL, "bf16|fp16|fp32",                                                               \
            "parameter and activation type (default bf16; fp16 uses\n"                             \
            "dynamic loss scaling; fp32 computes with the master weights)"),                       \
      ZT_IN(JOB, "bf16|fp16|fp32",                                                                 \
            "parameters and activations (default bf16; fp32: the engine's\n"                       \
            "slots hold the fp32 master)"))                                                        \
    X(ATTENTION, "attention", 0,                                                                   \
      ZT_IN(MODEL, "dense|flash",                                                                  \
            "attention op (default flash): flash is the fused op, memory\n"                       \
            "O(seq) per head; dense materializes seq x seq"),                                      \
      ZT_IN(JOB, "dense|flash", "the attention op zo-train runs (default flash)"))                 \
    X(DATA, "data", 0,                                                                             \
      ZT_IN(DATA, "FILE",                                                                          \
            "text (byte-level, vocabulary 256) or a ZOTOKENS token file\n"                         \
            "(default: the shipped Shakespeare corpus)"),                                          \
      ZT_IN(OUTPUT, "FILE", "--validate's tokens (default: zo-train's shipped corpus)"))           \
    X(STEPS, "steps", 0, ZT_IN(DATA, "N", "optimizer steps (default 120)"), ZT_NO)                 \
    X(SEQ, "seq", 0, ZT_IN(DATA, "N", "tokens per sequence (default 128)"), ZT_IN(JOB, "N", ""))   \
    X(MICRO_BATCH, "micro-batch", 0,                                                               \
      ZT_IN(DATA, "N", "sequences per micro-batch (default 8)"), ZT_IN(JOB, "N", ""))              \
    X(GRAD_ACCUM, "grad-accum", 0,                                                                 \
      ZT_IN(DATA, "N", "micro-batches per optimizer step (default 1)"),                            \
      ZT_IN(JOB, "N", "(defaults 128, 8, 1: zo-train's)"))                                         \
    X(MAX_SEQ, "max-seq", 0, ZT_NO,                                                                \
      ZT_IN(JOB, NULL,                                                                             \
            "the longest --seq this model trains at on this device and host\n"                     \
            "(some plan fits) at the job's micro-batch; the plans shown are\n"                      \
            "at that length"))                                                                     \
    X(LR, "lr", 0, ZT_IN(DATA, "X", "Adam learning rate, constant (default 2e-3)"), ZT_NO)         \
    X(WEIGHT_DECAY, "weight-decay", 0,                                                             \
      ZT_IN(DATA, "X", "AdamW decoupled weight decay (default 0)"), ZT_NO)                         \
    X(MAX_GRAD_NORM, "max-grad-norm", 0,                                                           \
      ZT_IN(DATA, "X", "clip the global gradient norm (default 1; 0: off)"), ZT_NO)                \
    X(MAX_SKIPPED_STEPS, "max-skipped-steps", 0,                                                   \
      ZT_IN(DATA, "N",                                                                             \
            "fp16: stop after N overflowing (skipped) steps in a row\n"                            \
            "(default 50); bf16 stops at the first NaN/Inf"), ZT_NO)                               \
    X(STEP_RETRIES, "step-retries", 0,                                                             \
      ZT_IN(DATA, "N",                                                                             \
            "run a step an NVMe I/O error failed again, up to N times\n"                           \
            "(default 3; one rank); a run that must stop saves first"), ZT_NO)                     \
    X(SEED, "seed", 0, ZT_IN(DATA, "S", "initial weights and data order (default 1)"), ZT_NO)      \
    X(VAL_BATCHES, "val-batches", 0,                                                               \
      ZT_IN(DATA, "N", "validation micro-batches at the end (default 8)"), ZT_NO)                  \
    X(OPTIMIZER, "optimizer", 0, ZT_NO,                                                            \
      ZT_IN(JOB, "adam|adamw", "Adam's memory is the same either way (default adamw)"))            \
    X(DEVICE, "device", 0,                                                                         \
      ZT_IN(PLACEMENT, "auto|cpu|cuda", "the device (default auto: cuda when a GPU is present)"),  \
      ZT_IN(HARDWARE, "auto|cpu|cuda", "the device (auto: cuda when a GPU is present)"))           \
    X(DEVICE_MEM, "device-mem", 0,                                                                 \
      ZT_IN(PLACEMENT, "BYTES",                                                                    \
            "the device budget, e.g. 24GiB (cpu device: its capacity;\n"                           \
            "default: all free GPU memory, or on the cpu device the\n"                             \
            "activations plus three layers of parameters)"), ZT_NO)                                \
    X(OFFLOAD_OPTIMIZER, "offload-optimizer", 0,                                                   \
      ZT_IN(PLACEMENT, "none|cpu|nvme",                                                            \
            "where Adam's states live (default: cpu on a\n"                                        \
            "GPU, nvme on the cpu device)"), ZT_NO)                                                \
    X(OFFLOAD_PARAM, "offload-param", 0,                                                           \
      ZT_IN(PLACEMENT, "none|cpu|nvme",                                                            \
            "where the 16-bit parameters live between uses\n"                                      \
            "(default: none on a GPU, cpu on the cpu device)"), ZT_NO)                             \
    X(NVME_PATH, "nvme-path", 0,                                                                   \
      ZT_IN(PLACEMENT, "DIR",                                                                      \
            "a swap directory, one per drive (repeatable; default: a\n"                            \
            "zo-train-swap directory next to the executable)"),                                    \
      ZT_IN(HARDWARE, "DIR",                                                                       \
            "a swap directory, one per drive (repeatable; free space by\n"                         \
            "statvfs)"))                                                                           \
    X(OPTIMIZER_MODE, "optimizer-mode", 0,                                                         \
      ZT_IN(PLACEMENT, "sync|overlap|dpu", "(default sync)"),                                      \
      ZT_IN(JOB, "auto|sync|overlap|dpu",                                                          \
            "the fixed placements use sync for auto;\n"                                            \
            "the per-chunk plan picks sync or overlap (both exact)\n"                              \
            "(default auto)"))                                                                     \
    X(UPDATE_BEHIND, "update-behind", 0,                                                           \
      ZT_IN(PLACEMENT, "on|off",                                                                   \
            "states on NVMe, parameters on NVMe or the host: sync\n"                               \
            "mode's updates (overlap mode's after a clipped step) run\n"                          \
            "behind the next forward, which waits per chunk (default on)"),                        \
      ZT_IN(JOB, "on|off",                                                                         \
            "zo-train's update behind the next forward (sync mode,\n"                              \
            "states on NVMe): its step time counts it so (default on)"))                           \
    X(STATE_DTYPE, "state-dtype", 0,                                                               \
      ZT_IN(PLACEMENT, "fp32|bf16|int8",                                                           \
            "Adam's m and v (the master stays fp32): fp32\n"                                       \
            "(default), bf16, or int8 (8-bit blocks of 256 with a scale\n"                         \
            "each, as bitsandbytes' 8-bit Adam): 12, 8 or about 6 bytes\n"                         \
            "of states per parameter"),                                                            \
      ZT_IN(JOB, "fp32|bf16|int8|auto",                                                            \
            "Adam's m and v (master fp32): bf16, or 8-bit\n"                                       \
            "blockwise; auto: a compact one when it makes the step faster\n"                       \
            "(default fp32)"))                                                                     \
    X(MASTER_SPLIT, "master-split", 0,                                                             \
      ZT_IN(PLACEMENT, "on|off",                                                                   \
            "with states on NVMe and bf16 parameters, keep the fp32\n"                             \
            "master there as its low 16 bits and one bit (2.125 bytes,\n"                          \
            "not 4; rebuilt exactly from the bf16 parameters; default off)"),                      \
      ZT_IN(JOB, "on|off",                                                                         \
            "the fp32 master split on NVMe (low halves and one bit,\n"                             \
            "rebuilt from the bf16 parameters: zo-train's; default off)"))                         \
    X(EMBEDDING_F32_STATES, "embedding-f32-states", 0,                                             \
      ZT_IN(PLACEMENT, "on|off",                                                                   \
            "with int8 states, the token embedding keeps fp32\n"                                   \
            "m and v, as bitsandbytes' 8-bit Adam keeps an embedding's;\n"                         \
            "its chunk takes 4x its elements (default off; tensors under\n"                        \
            "4096 elements always keep fp32 moments)"),                                            \
      ZT_IN(JOB, "on|off",                                                                         \
            "int8 states: the token embedding keeps fp32 m and v\n"                                \
            "(zo-train's; its chunk takes 4x its elements; default off)"))                         \
    X(CHUNK_BYTES, "chunk-bytes", 0,                                                               \
      ZT_IN(PLACEMENT, "BYTES", "engine chunk size (default: the largest tensor)"),                \
      ZT_IN(JOB, "BYTES", "the engine's chunk (default: chosen per strategy)"))                    \
    X(MLP_CHUNK_BYTES, "mlp-chunk-bytes", 0,                                                       \
      ZT_IN(PLACEMENT, "BYTES|auto",                                                               \
            "a block's MLP and norms run in chunks of tokens whose\n"                              \
            "ffn-wide buffers take at most BYTES each, recomputed in the\n"                        \
            "backward (auto, the default: $ZO_MLP_CHUNK_BYTES or 16MiB)"),                         \
      ZT_IN(JOB, "BYTES|auto",                                                                     \
            "zo-train's --mlp-chunk-bytes (auto, the default: 16MiB,\n"                            \
            "or the largest power of two down to one row that lets\n"                              \
            "the job fit)"))                                                                       \
    X(HOST_MEM, "host-mem", 0,                                                                     \
      ZT_IN(PLACEMENT, "BYTES",                                                                    \
            "the host memory the run may take (default: physical RAM\n"                            \
            "less 10%, or the cgroup's limit); checked before allocating"),                        \
      ZT_IN(HARDWARE, "BYTES",                                                                     \
            "host memory for pinned and pageable tiers: a hard budget\n"                           \
            "(cpu device: beside its capacity; the zo-train command\n"                             \
            "printed adds the capacity, as zo-train counts it)"))                                  \
    X(OPTIM_HOST_BYTES, "optim-host-bytes", 0,                                                     \
      ZT_IN(PLACEMENT, "BYTES",                                                                    \
            "per-chunk homes: Adam's states of this many bytes stay in\n"                          \
            "host memory, the rest on NVMe (layer 0's chunks first; sets\n"                        \
            "--offload-optimizer nvme unless given); also\n"                                       \
            "--optim-device-bytes (cpu device), --param-host-bytes,\n"                             \
            "--param-device-bytes for the 16-bit parameters"), ZT_NO)                              \
    X(OPTIM_DEVICE_BYTES, "optim-device-bytes", 0, ZT_IN(PLACEMENT, "BYTES", NULL), ZT_NO)         \
    X(PARAM_HOST_BYTES, "param-host-bytes", 0, ZT_IN(PLACEMENT, "BYTES", NULL), ZT_NO)             \
    X(PARAM_DEVICE_BYTES, "param-device-bytes", 0, ZT_IN(PLACEMENT, "BYTES", NULL), ZT_NO)         \
    X(PLACEMENT, "placement", 0,                                                                   \
      ZT_IN(PLACEMENT, "auto|homes",                                                               \
            "auto: fill the host with states (then parameters) homed on\n"                         \
            "NVMe up to --host-mem; homes: every chunk at its home"), ZT_NO)                       \
    X(MICRO_GROUP, "micro-group", 0,                                                               \
      ZT_IN(PLACEMENT, "N",                                                                        \
            "layer-major micro-batches: groups of N go through a layer\n"                          \
            "before the next (each layer fetched once per group and phase,\n"                      \
            "the group's gradients summed in fp32 on the device; default 1:\n"                     \
            "micro-batch-major; same losses either way)"),                                         \
      ZT_IN(JOB, "N|auto",                                                                         \
            "micro-batches per layer-major group of the per-chunk plan\n"                          \
            "(1..grad-accum; auto: the planner's choice)"))                                        \
    X(ACT_HOME, "act-home", 0,                                                                     \
      ZT_IN(PLACEMENT, "device|host|nvme",                                                         \
            "where a group's layer inputs wait for its\n"                                          \
            "backward (default device; host: pinned host memory; nvme:\n"                          \
            "checksummed extents in the --nvme-path directory, through a\n"                        \
            "two-slot pinned ring; the copies run on copy streams beside\n"                        \
            "the compute)"),                                                                       \
      ZT_IN(JOB, "auto|device|host|nvme",                                                          \
            "where the per-chunk plan keeps the layer\n"                                           \
            "inputs the backward recomputes from (host: pinned)"))                                 \
    X(ZERO_STAGE, "zero-stage", 0,                                                                 \
      ZT_IN(RANKS, "1|2|3",                                                                        \
            "ZeRO across the ranks (default 2 with several ranks): each\n"                         \
            "rank holds the optimizer states of its 1/N of the chunks\n"                           \
            "(2: and only their reduced gradients; 3: and only their\n"                            \
            "16-bit parameters, the others' gathered from their owners\n"                          \
            "as each layer is fetched; zero_optimization.\n"                                       \
            "stage3_param_persistence_threshold: chunks that small stay\n"                         \
            "whole on every rank, 0 without --config); every mode and\n"                           \
            "--offload-param;\n"                                                                   \
            "NVMe files in DIR/rank-R; output and progress from rank 0,\n"                         \
            "log lines tagged with the rank; checkpoints sharded by\n"                             \
            "rank, resumable at any number of ranks"), ZT_NO)                                      \
    X(WORLD_SIZE, "world-size", 0, ZT_NO,                                                          \
      ZT_IN(RANKS, "N",                                                                            \
            "also plan ZeRO stages 1, 2, 3 over N ranks, each with the\n"                          \
            "job's micro-batch and grad-accum (default 1: one rank)"))                             \
    X(GPUS_PER_NODE, "gpus-per-node", 0, ZT_NO,                                                    \
      ZT_IN(RANKS, "G",                                                                            \
            "ranks sharing a node's host memory, NVMe and cores\n"                                 \
            "(default: all N on one node)"))                                                       \
    X(LINK_GBPS, "link-gbps", 0, ZT_NO,                                                            \
      ZT_IN(RANKS, "G",                                                                            \
            "GB/s of the slowest link between two ranks (default 25 on\n"                          \
            "a GPU: PCIe 4.0 x16; 10 on the cpu device)"))                                         \
    X(PIPELINE_STAGES, "pipeline-stages", 0,                                                       \
      ZT_IN(RANKS, "S",                                                                            \
            "pipeline parallelism: the layers (embedding, blocks, head)\n"                         \
            "split into S contiguous stages, one per rank, each rank's\n"                          \
            "engine tiering its own stage's parameters and states; the\n"                          \
            "--grad-accum M micro-batches run in 1F1B order, bitwise equal\n"                      \
            "to one rank; N = S x D ranks: D data-parallel (ZeRO) ranks\n"                         \
            "per stage, rank r stage r / D; the timeline (--trace FILE)\n"                         \
            "of rank r > 0 goes to FILE.rank-R"),                                                  \
      ZT_IN(PIPELINE, "S|auto",                                                                    \
            "split the engine layers into S contiguous stages (1F1B\n"                             \
            "over --grad-accum micro-batches), balanced by each layer's\n"                         \
            "time; each stage planned like one GPU with its own layers;\n"                         \
            "with --world-size N, N/S data-parallel ranks per stage\n"                             \
            "(ZeRO stage 1). auto: the S that fits with the most\n"                                \
            "tokens/s among the divisors of --world-size"))                                        \
    X(TENSOR_PARALLEL, "tensor-parallel", 0,                                                       \
      ZT_IN(RANKS, "T",                                                                            \
            "tensor parallelism (Megatron-LM's): each block's heads and\n"                         \
            "FFN split over T consecutive ranks, the o_proj and down_proj\n"                       \
            "outputs all-reduced, the embedding and head split over the\n"                         \
            "vocabulary; every tier holds 1/T of each tensor;\n"                                   \
            "N = S x D x T ranks, rank r tensor rank r % T\n"                                      \
            "(tensor_parallel.autotp_size, or tp_size, in a --config)"),                           \
      ZT_IN(PIPELINE, "T|auto",                                                                    \
            "plan T tensor-parallel ranks per layer (1/T of every\n"                               \
            "tensor and of the FLOPs per rank, the all-reduces over the\n"                         \
            "tensor group's link); with --world-size N, N/(S x T)\n"                               \
            "data-parallel ranks. auto: every T that divides N and the\n"                          \
            "model, the grid (S, T) recommended by tokens/s"))                                     \
    X(SEQUENCE_PARALLEL, "sequence-parallel", 0,                                                   \
      ZT_IN(RANKS, NULL,                                                                           \
            "with --tensor-parallel T: the norms and residual adds hold\n"                         \
            "seq/T of the tokens per rank (Megatron's sequence\n"                                  \
            "parallelism): reduce-scatters and all-gathers replace the\n"                          \
            "all-reduces; --seq a multiple of T\n"                                                  \
            "(zoffload.sequence_parallel in a --config)"),                                        \
      ZT_IN(PIPELINE, NULL,                                                                        \
            "plan --tensor-parallel with sequence parallelism: the\n"                              \
            "residual stream's activations 1/T per rank, reduce-scatters\n"                        \
            "and all-gathers for the all-reduces"))                                                \
    X(NODE_LINK_GBPS, "node-link-gbps", 0, ZT_NO,                                                  \
      ZT_IN(PIPELINE, "G",                                                                         \
            "GB/s between two GPUs of one node, the link of a tensor\n"                            \
            "group on one node (default: --link-gbps's)"))                                         \
    X(PIPELINE_SPLIT, "pipeline-split", 0,                                                         \
      ZT_IN(RANKS, "parameters|uniform|L1,L2,...",                                                 \
            "the stages' layers: balanced by parameter count (the\n"                               \
            "default), as even layer counts, or the first engine layer\n"                          \
            "of stages 1..S-1 (0 is the embedding; pipeline.stages and\n"                          \
            "pipeline.partition in a --config)"),                                                  \
      ZT_IN(PIPELINE, "L1,...",                                                                    \
            "the first engine layer of stages 1..S-1 (0 the\n"                                     \
            "embedding, 1..L the blocks, L+1 the head) instead of the\n"                           \
            "balanced split"))                                                                     \
    X(REDUCE_ORDER, "reduce-order", 0,                                                             \
      ZT_IN(RANKS, "global|rank",                                                                  \
            "with --grad-accum k > 1 (zoffload.reduce_order): global\n"                            \
            "(default): rank r trains micro-batches j x N + r of the\n"                            \
            "step's N x k, j = 0..k-1, each reduced over the ranks as it\n"                        \
            "comes down onto the running sum at its owner, so N ranks\n"                           \
            "equal one rank with --grad-accum N x k bit for bit, for any\n"                        \
            "N and k (k chains a step on the link); rank: rank r trains\n"                         \
            "the r-th k of them and sums them first, one chain a step,\n"                          \
            "within rounding of one rank (allows --micro-group > 1)"), ZT_NO)                      \
    X(VERBOSE, "verbose", 'v',                                                                     \
      ZT_IN(RANKS, NULL,                                                                           \
            "per-rank resources (host share, NUMA node) and the library's\n"                       \
            "info lines on stderr"), ZT_NO)                                                        \
    X(COMM_TIMEOUT, "comm-timeout", 0,                                                             \
      ZT_IN(RANKS, "S",                                                                            \
            "a collective not done after S seconds fails the run (default\n"                       \
            "ZO_COMM_TIMEOUT or 300); a rank that stops answering (killed,\n"                      \
            "stopped) fails the others after half of it, at most 30 s"), ZT_NO)                    \
    X(COMM_BACKEND, "comm-backend", 0,                                                             \
      ZT_IN(RANKS, "NAME",                                                                         \
            "the communicator: host (default: mpi under mpirun or srun,\n"                         \
            "else tcp: torchrun), mpi or tcp"),                        \
      ZT_NO)                                                                                       \
    X(GPU_MEM, "gpu-mem", 0, ZT_NO,                                                                \
      ZT_IN(HARDWARE, "BYTES", "device memory (cpu device: its capacity, default 1 GiB)"))         \
    X(PINNED_MAX, "pinned-max", 0, ZT_NO,                                                          \
      ZT_IN(HARDWARE, "BYTES", "a cap on pinned host memory"))                                     \
    X(NVME_BYTES, "nvme-bytes", 0, ZT_NO,                                                          \
      ZT_IN(HARDWARE, "BYTES", "NVMe space instead of the paths' free space"))                     \
    X(NVME_TBW, "nvme-tbw", 0, ZT_NO,                                                              \
      ZT_IN(HARDWARE, "TB", "the drives' rated endurance, terabytes written"))                     \
    X(MEASURE, "measure", 0, ZT_NO,                                                                \
      ZT_IN(SPEEDS, NULL, "short micro-benchmarks on this machine (seconds)"))                     \
    X(H2D_GBPS, "h2d-gbps", 0, ZT_NO, ZT_IN(SPEEDS, "G", ""))                                      \
    X(D2H_GBPS, "d2h-gbps", 0, ZT_NO, ZT_IN(SPEEDS, "G", ""))                                      \
    X(NVME_READ_GBPS, "nvme-read-gbps", 0, ZT_NO, ZT_IN(SPEEDS, "G", ""))                          \
    X(NVME_WRITE_GBPS, "nvme-write-gbps", 0, ZT_NO, ZT_IN(SPEEDS, "G", "GB/s"))                    \
    X(ADAM_GPARAMS, "adam-gparams", 0, ZT_NO,                                                      \
      ZT_IN(SPEEDS, "G", "CPU Adam, billions of parameters per second"))                           \
    X(GPU_TFLOPS, "gpu-tflops", 0, ZT_NO,                                                          \
      ZT_IN(SPEEDS, "T", "the device's dense TFLOPS in --dtype (16-bit; fp32's for fp32)"))        \
    X(NVME_UPDATE_GBPS, "nvme-update-gbps", 0, ZT_NO,                                              \
      ZT_IN(SPEEDS, "G",                                                                           \
            "GB/s read and written together by the optimizer's NVMe\n"                             \
            "pipeline (default: --measure's, else from read and write)"))                          \
    X(BENCH_JSON, "bench-json", 0, ZT_NO,                                                          \
      ZT_IN(SPEEDS, "FILE", "zo-bench io/adam/engine --json output (repeatable)"))                 \
    X(CONFIG, "config", 0,                                                                         \
      ZT_IN(CONFIG, "FILE",                                                                        \
            "a DeepSpeed-style JSON config (batch sizes, optimizer, scheduler,\n"                  \
            "fp16/bf16, gradient_clipping, zero_optimization offload, aio, and\n"                  \
            "a zoffload section); flags given as well override it"), ZT_NO)                        \
    X(SET, "set", 0,                                                                               \
      ZT_IN(CONFIG, "KEY=VALUE",                                                                   \
            "override one config key, e.g. --set scheduler.type=WarmupLR\n"                        \
            "(repeatable; needs --config)"),                                                       \
      ZT_IN(JOB, "sparse_attention.KEY=VALUE",                                                     \
            "a key of DeepSpeed's sparse_attention section, as zo-train's\n"                       \
            "--config takes it (repeatable: mode, block, num_local_blocks,\n"                      \
            "num_global_blocks, num_random_blocks, num_sliding_window_blocks,\n"                   \
            "seed): the layout's density scales the attention's FLOPs and\n"                       \
            "its block mask is in the arena"))                                                     \
    X(SAVE, "save", 0,                                                                             \
      ZT_IN(CHECKPOINTS, "DIR",                                                                    \
            "save checkpoints in DIR (DIR/step-N: model.safetensors with\n"                        \
            "Hugging Face LLaMA names, optimizer.safetensors,\n"                                   \
            "trainer_state.json; DIR/latest names the newest), at the end\n"                       \
            "and every --save-every steps"), ZT_NO)                                                \
    X(SAVE_EVERY, "save-every", 0,                                                                 \
      ZT_IN(CHECKPOINTS, "N",                                                                      \
            "also save every N steps (default: only at the end)\n"                                 \
            "(each save also writes DIR/hf-model: config.json and the\n"                           \
            "weights, a directory transformers loads as is)"), ZT_NO)                              \
    X(HF_SAVE_DTYPE, "hf-save-dtype", 0,                                                           \
      ZT_IN(CHECKPOINTS, "bf16|fp32", "the weights in DIR/hf-model (default bf16)"), ZT_NO)        \
    X(HF_SHARD_SIZE, "hf-shard-size", 0,                                                           \
      ZT_IN(CHECKPOINTS, "BYTES", "shard DIR/hf-model's weights above this (default 5GB)"), ZT_NO) \
    X(RESUME, "resume", 0,                                                                         \
      ZT_IN(CHECKPOINTS, "PATH",                                                                   \
            "continue from a checkpoint (a DIR given to --save, or one of its\n"                   \
            "step-N directories); --steps is the total to reach"), ZT_NO)                          \
    X(RESUME_ALLOW_CHANGES, "resume-allow-changes", 0,                                             \
      ZT_IN(CHECKPOINTS, NULL,                                                                     \
            "continue a checkpoint with another --seq, --micro-batch,\n"                           \
            "--grad-accum, --dtype or --data (refused otherwise)"), ZT_NO)                         \
    X(INIT_WEIGHTS, "init-weights", 0,                                                             \
      ZT_IN(CHECKPOINTS, "FILE",                                                                   \
            "start from the weights of a safetensors file with Hugging Face\n"                     \
            "LLaMA names (F32, BF16 or F16), e.g. a model.safetensors"), ZT_NO)                    \
    X(HF_MODEL, "hf-model", 0,                                                                     \
      ZT_IN(CHECKPOINTS, "DIR",                                                                    \
            "the model of a Hugging Face directory: config.json (Llama,\n"                         \
            "Mistral, Qwen2 layouts: GQA, head_dim, q/k/v biases, RoPE\n"                          \
            "scaling; a tied head is the embedding) and its weights\n"                             \
            "(model.safetensors or shards with the index), instead of\n"                           \
            "--preset; with --resume, DIR's shape and the checkpoint's weights"), ZT_NO)           \
    X(LOG_EVERY, "log-every", 0,                                                                   \
      ZT_IN(OUTPUT, "N",                                                                           \
            "a progress line on stderr every N steps (default 10); on a\n"                         \
            "terminal the line is updated in place every step"), ZT_NO)                            \
    X(PROGRESS, "progress", 0,                                                                     \
      ZT_IN(OUTPUT, "auto|line|log", "in place (line), log lines (log), or line on a terminal"),   \
      ZT_NO)                                                                                       \
    X(METRICS, "metrics", 0,                                                                       \
      ZT_IN(OUTPUT, "FILE",                                                                        \
            "one JSON line per step (loss, lr, tokens/s, TFLOPS, ETA, bytes\n"                     \
            "in use per tier, NVMe GB/s, stall %, ...)"), ZT_NO)                                   \
    X(TRACE, "trace", 0,                                                                           \
      ZT_IN(OUTPUT, "FILE",                                                                        \
            "a Chrome trace-event JSON timeline (open in Perfetto): one\n"                         \
            "track per stream, copy engine, NVMe queue, optimizer worker"), ZT_NO)                 \
    X(JSON, "json", 0,                                                                             \
      ZT_IN(OUTPUT, NULL, "print the summary as one JSON object"),                                 \
      ZT_IN(OUTPUT, NULL, "one JSON object"))                                                      \
    X(DEEPSPEED_ESTIMATE, "deepspeed-estimate", 0, ZT_NO,                                          \
      ZT_IN(OUTPUT, NULL, "also what DeepSpeed's ZeRO-2/3 estimators would say"))                  \
    X(EMIT_CONFIG, "emit-config", 0, ZT_NO,                                                        \
      ZT_IN(OUTPUT, "FILE", "write the recommended plan as a zo-train config"))                    \
    X(VALIDATE, "validate", 0, ZT_NO,                                                              \
      ZT_IN(OUTPUT, "N",                                                                           \
            "run N steps of every plan that fits through zo-train's trainer\n"                     \
            "here and report measured peaks and step time beside the plan"))                       \
    X(WEIGHTS_DIGEST, "weights-digest", 0,                                                         \
      ZT_IN(OUTPUT, NULL,                                                                          \
            "add a digest of the final fp32 master weights (xxh64 of each\n"                       \
            "tensor's, from its owner across ranks, then of those in\n"                            \
            "order): equal for runs whose weights are bitwise equal"), ZT_NO)                      \
    X(HELP, "help", 0, ZT_IN(OUTPUT, NULL, "this text"), ZT_IN(OUTPUT, NULL, "this text"))
/* clang-format on */
