/* zoffload: the offload engine.
 *
 * The engine decides where every model state lives and moves it so the
 * compute stream waits as little as possible. A training program registers
 * its parameter tensors layer by layer, in execution order; the engine packs
 * each layer's tensors into fixed-size chunks (a chunk never spans two
 * layers) and keeps, per chunk, five model states:
 *
 *   p16     the 16-bit parameters the GPU computes with (bf16 or fp16)
 *   g16     the 16-bit gradients the GPU produces
 *   master  fp32 master weights      \
 *   m, v    Adam's moments (fp32)     } the optimizer states
 *
 * With param_dtype ZO_DTYPE_F32 (training in fp32) p16 and g16 hold fp32
 * values: p16 is then the master weights bit for bit (the update writes
 * both), and "16-bit" below stands for param_dtype's elements throughout.
 *
 * Each state has a home tier: the device, the host (p16 in the pinned pool;
 * optimizer states in pageable host memory) or NVMe (the swap store, read and
 * written through pinned staging slots). Budgets are hard limits: a plan that
 * cannot fit is refused by zo_engine_finalize with the shortfall and tier.
 *
 * One training step, for each micro-batch:
 *   forward:  fetch(l, FORWARD) ... compute ... release(l)          for l = 0..L-1
 *   backward: fetch(l, BACKWARD) ... recompute, compute grads into the
 *             returned gradient buffers ... grads_ready(l); release(l) for l = L-1..0
 * then once per optimizer step: end_step(). (A trainer that recomputes
 * activations may also fetch(l, FORWARD) again inside the backward; the trace
 * records whatever order it uses.)
 *
 * Layer-major micro-batches (micro_group G > 1 with grad_accum_steps M > 1):
 * the step's micro-batches go through the model in groups of G (the last
 * group holds what is left when G does not divide M), a group through a
 * layer before the next layer, so each layer is fetched once per group and
 * phase instead of once per micro-batch:
 *   for each group:
 *     forward:  fetch(l, FORWARD) ... compute every micro-batch of the group ... release(l)
 *     backward: fetch(l, BACKWARD), then per micro-batch of the group, in order:
 *               compute its grads into the returned buffers ... grads_ready(l);
 *               then release(l)
 * Each grads_ready adds the 16-bit gradient into the gradient slot's fp32
 * accumulator on the device (the first micro-batch of the step converts it,
 * later ones add: acc = ((g1 + g2) + g3) + ..., the host's order without
 * groups, so results are bitwise equal) and zeroes the 16-bit buffer for the
 * next micro-batch; the group's last grads_ready sends the fp32 sum down once.
 * A later group's accumulator starts from the running sum sent back up (one
 * H2D of it per chunk and group); with one group per step (G >= M) nothing
 * goes up and the sum that arrives is the step's gradient. The host keeps no
 * 16-bit gradient copies and no separate fp32 accumulators then: the sums
 * land in pinned fp32 buffers the update reads.
 *
 * The first step records which chunks each fetch touches; later steps
 * prefetch along that trace (lookahead fetches ahead, on the host->device
 * stream; with param_home nvme each load is an NVMe read into the device
 * slot's pinned staging twin followed by the H2D) and evict the resident
 * chunk whose next use is farthest (Belady). Everything is asynchronous:
 * fetch makes the caller's compute stream wait on events, never the device.
 *
 * Optimizer modes:
 *   SYNC     update every chunk after the whole backward: the exact reference.
 *   OVERLAP  update each chunk as soon as its gradients reach the host, while
 *            the device computes the backward of earlier layers. The update is
 *            speculative (no clipping, loss scale as is); end_step validates the
 *            global norm and the overflow check and, when clipping or an
 *            overflow makes it wrong, rolls it back and redoes it, so results
 *            equal SYNC bit for bit.
 *   DPU      delayed parameter update: the update of step t runs during step
 *            t+1, whose forward and backward use the parameters of step t-1. */
#ifndef ZO_ENGINE_H
#define ZO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/comm.h"
#include "zo/device.h"
#include "zo/optim.h"
#include "zo/optim_mode.h"
#include "zo/status.h"
#include "zo/swap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_engine *zo_engine_t;

/* The tiers, fastest first. The public arrays a tier indexes (caps, the
 * footprint, the peaks, the homes' counts) have ZO_TIER_MAX entries, the
 * ZO_TIER_COUNT tiers built in first: a tier added later takes the next
 * index and changes no struct's layout. */
typedef enum zo_tier { ZO_TIER_DEVICE = 0, ZO_TIER_HOST = 1, ZO_TIER_NVME = 2 } zo_tier;
#define ZO_TIER_COUNT 3
#define ZO_TIER_MAX   8
typedef enum zo_phase { ZO_PHASE_FORWARD = 0, ZO_PHASE_BACKWARD = 1 } zo_phase;

/* "device", "host", "nvme"; "?" for an index no tier has. */
ZO_API const char *zo_tier_name(zo_tier t);

/* Per-chunk homes: the bytes of one kind of state that each tier faster than
 * the kind's home may hold (0: none). Chunks fill the fastest tier first, in
 * registration order (layer 0 first: its 16-bit parameters open the forward,
 * its update closes the backward), up to the cap; the home takes the rest. A
 * chunk counts chunk_bytes of 16-bit parameters (one copy) or Z bytes of
 * optimizer states (fp32 master, m, v at the chunk's size; Z below). */
typedef struct zo_engine_caps {
    uint64_t bytes[ZO_TIER_MAX]; /* by zo_tier: the tiers faster than the home's only */
} zo_engine_caps;

/* ZeRO with grad_accum_steps k > 1: the order each chunk's gradient sums the
 * step's micro-batches of all ranks in (engine.h, ZeRO below). */
typedef enum zo_reduce_order {
    ZO_REDUCE_ORDER_GLOBAL = 0, /* global micro-batch order: rank r's j-th micro-batch is the
                                   step's (j*N + r)-th, and round j of the chain adds the N of
                                   them onto the running sum: bitwise one rank with k*N */
    ZO_REDUCE_ORDER_RANK = 1,   /* each rank sums its own k first, then the ranks' sums in
                                   rank order: one chain a step, within rounding of one rank */
} zo_reduce_order;

typedef struct zo_engine_config {
    size_t struct_size;
    zo_device_t device;   /* must outlive the engine */
    int rank, world_size; /* world_size > 1: ZeRO over the ranks of comm (zero_stage below) */

    zo_dtype param_dtype; /* ZO_DTYPE_BF16 (default), ZO_DTYPE_F16 or ZO_DTYPE_F32 (p16 and
                             g16; fp32: the master's own bits, no loss scaling, no
                             master_split) */
    size_t chunk_bytes;   /* bytes of parameters per chunk in param_dtype (0: 4 MiB): C/2
                             elements for bf16 and fp16, C/4 for fp32; raised to fit the largest
                             tensor, rounded to 4 KiB; at most ZO_MAX_CHUNK_BYTES, 1 TiB) */
    zo_tier param_home;   /* where p16 lives between uses: device, host or nvme (nvme needs
                             optim_home nvme: the update writes p16 through the NVMe stages) */
    zo_tier optim_home;   /* master, m, v: device (updated there by zo_op_adam), host or nvme */

    uint64_t device_bytes; /* engine's share of the device budget (0: all that is free at init) */
    uint64_t pinned_bytes; /* pinned host pool budget (0: what the plan needs) */
    const char *const *nvme_paths; /* one directory per drive, for any nvme home */
    size_t n_nvme_paths;
    uint64_t nvme_bytes;     /* NVMe capacity to use (0: what the plan needs) */
    const char *nvme_engine; /* "auto", "io_uring" or "sync" */

    int lookahead; /* fetches prefetched ahead (default 2) */
    zo_optim_mode mode;
    int grad_accum_steps; /* micro-batches per optimizer step (>= 1); accumulated in fp32 */
    int optim_threads;    /* CPU optimizer worker threads (0: one per core of the device's node) */

    zo_adam_params adam; /* lr, betas, eps, weight decay, adamw; step and grad_scale are set by
                            the engine */
    float max_grad_norm; /* > 0: clip the global gradient norm (DeepSpeed gradient_clipping) */
    zo_loss_scaler_config loss_scaler; /* fp16 only; static when loss_scale > 0 */

    const char *nvme_name;     /* swap file name prefix (NULL: "zoffload"): DIR/NAME.swap.I */
    uint32_t nvme_queue_depth; /* NVMe requests in flight per store (0: the swap store's default;
                                 DeepSpeed's aio.queue_depth) */
    uint32_t nvme_block_size;  /* bytes per NVMe request, a multiple of 4096 (0: the swap store's
                                  default; DeepSpeed's aio.block_size) */
    zo_engine_caps param_caps; /* 16-bit parameters a faster tier than param_home holds; a chunk
                                 whose states are off NVMe keeps them off NVMe too (the update
                                 writes NVMe parameters through the states' stages), counted in
                                 the host cap first, whatever it is */
    zo_engine_caps optim_caps; /* optimizer states a faster tier than optim_home holds */
    uint64_t host_bytes;  /* the host tier's hard budget: pinned + pageable bytes of the plan (0:
                             not limited). A plan whose footprint's pinned + host exceed it is
                             refused naming the host tier and the shortfall; the measured peaks
                             (peak_pinned + peak[ZO_TIER_HOST]) stay within it */
    int micro_group;      /* micro-batches per layer-major group (0 or 1: micro-batch-major, the
                             protocol above; > 1 needs grad_accum_steps > 1 to matter, and a group
                             larger than grad_accum_steps is one group per step) */
    zo_dtype state_dtype; /* Adam's m and v: ZO_DTYPE_F32 (default), ZO_DTYPE_BF16 (half the
                             bytes) or ZO_DTYPE_I8 (8-bit blockwise with one fp32 scale per
                             ZO_ADAM_Q8_BLOCK elements, zo/optim.h); the master stays fp32 */
    int zero_stage;       /* world_size > 1: 1, 2 or 3 (ZeRO, below); 0 with world_size 1 */
    zo_comm_t comm;       /* world_size > 1: the ranks' communicator, of world_size ranks with rank
                             its own; checked at zo_engine_finalize (plans go without it) */
    uint64_t zero_persist_elems; /* stage 3: a chunk holding at most this many elements (small
                                    tensors: norms, biases) stays whole on every rank, as in
                                    stage 2, instead of being gathered at each use (0: none;
                                    DeepSpeed's stage3_param_persistence_threshold) */
    int master_split;    /* 1: an NVMe extent of states keeps the fp32 master as its low 16 bits
                            and one bit an element, rebuilt exactly from the bf16 parameters the
                            update reads and writes in host memory (zo_master_join, zo/half.h):
                            2.125 bytes an element move where 4 did. bf16 parameters only (fp16
                            is refused); chunks whose parameters live on NVMe, or whose master
                            does not split exactly (a NaN, a flushed subnormal), keep the full
                            master. Device-resident chunks then keep two pinned copies. Results
                            are bitwise those without it; extents keep the full size. Not
                            with world_size > 1 yet (refused). */
    int host_node;       /* NUMA node of the pinned pool and of the optimizer's worker threads
                            (-1: the node nearest the device, or on the cpu device the calling
                            thread's); ranks sharing a node pick each their own */
    zo_comm_t pipe_comm; /* pipeline stages (NULL or one rank: none): this rank's pipeline
                            group, a rank per stage in stage order, each engine holding the
                            contiguous layers of its stage. The global gradient norm and the
                            overflow check combine every stage's per-chunk partials in stage
                            order (collective over the group at each end_step), so clipping
                            and loss scaling decide as one engine holding every layer,
                            bitwise. With ZeRO, comm is the stage's data-parallel group. */
    zo_reduce_order reduce_order; /* world_size > 1 with grad_accum_steps > 1 (ZeRO, below);
                                     default global */
    int update_behind; /* 1: sync mode's updates, and overlap mode's that run after their verdict
                          (the step clipped, or the last one did, or an overflow undid its
                          speculation), run on a thread of their own behind the next step's
                          forward, whose fetches wait per chunk for its new values instead of
                          for the whole update. Taken when every chunk's states are on NVMe and
                          its 16-bit parameters on NVMe or the host, with one rank, no pipeline
                          and no fp16 (else the update runs in end_step as without it). Results are
                          bitwise those without it. end_step returns before the update has run: a
                          failed one is reported by the next call that waits for it (a fetch,
                          end_step, a read of the states), which fails; the weights are then those
                          before it, and it runs again from that step's gradients before the next
                          fetch or read of the states, so that running again what failed trains
                          on as if nothing had. */
} zo_engine_config;

/* ZeRO (world_size > 1, every mode; the ranks run the same steps, each on its
 * own micro-batches). Chunks are the unit of ownership: rank r owns a
 * contiguous range of them in chunk order (the n_chunks split as evenly as
 * counts go, the first ranks taking one more), so each rank's NVMe and host
 * traffic stays its own. A rank holds the optimizer states of its chunks only,
 * in its own tiers (the footprint counts them: Z times its chunks). As each
 * chunk's final gradients of a step come down, its host job reduces them (the
 * rank's fp32 sum of its micro-batches, from its 16-bit gradients when it has
 * one) over the ranks in rank order, bitwise ((g0 + g1) + g2) + ..., the fp32
 * sum one rank with grad_accum_steps = world_size forms of the same
 * micro-batches; every chunk's 16-bit gradients therefore come down through
 * the pinned ring (pinned += min(N, D)*C in place of N*C*G) and wait nowhere
 * after it, owner or not:
 *   stage 1: an exact all-reduce: every rank holds every chunk's reduced fp32
 *            gradient (host += F bytes per chunk, below) and computes the norm;
 *   stage 2: an exact reduce onto the owner: a rank holds the reduced
 *            gradients of its chunks only (host += F per owned chunk); the
 *            owners' per-chunk fp64 norm partials and overflow flags are
 *            all-gathered and summed in chunk order on every rank.
 * With grad_accum_steps k > 1 the order is reduce_order's, the same in every
 * stage, placement and mode:
 *   global (default): the caller gives rank r the step's micro-batches
 *            j*N + r, j = 0..k-1 (in that order), and each chunk's host job
 *            reduces every micro-batch's gradient as it comes down: round j
 *            is the chain above, its rank 0 adding its gradient onto the
 *            running sum of rounds 0..j-1, which rests at the chunk's owner
 *            between rounds (sent to rank 0 when the owner is another rank).
 *            Bitwise ((g0 + g1) + g2) + ... over the N*k micro-batches, the
 *            sum one rank with grad_accum_steps = N*k forms, whatever N and
 *            k; no fp32 accumulators (the owners' reduced gradients hold the
 *            sums). The link carries k chains a step, plus up to two hops a
 *            round between the owner and the chain's ends. Refused with
 *            layer-major groups (micro_group > 1), which sum a group's
 *            micro-batches on the device first.
 *   rank:    each rank gives its k micro-batches a contiguous range
 *            (r*k .. r*k+k-1), sums them in its fp32 accumulators, and the
 *            ranks' sums are added in rank order by one chain a step:
 *            equal to one rank with k*N micro-batches within rounding, not
 *            bitwise. Works with layer-major groups.
 * Both add one chunk's states of scratch (host += Z). The owner updates its
 * chunks and broadcasts their new 16-bit parameters; every rank then
 * publishes them as one rank would.
 *   stage 3: gradients as stage 2, and the 16-bit parameters partitioned
 *            too: a rank's tiers hold the chunks it owns only (param_home,
 *            param_caps.bytes[ZO_TIER_DEVICE]: its own caps over its own chunks; pinned
 *            N*C*P and the device's resident chunks count those), and each
 *            fetch gathers its layer's other chunks from their owners (a
 *            broadcast on the h2d stream into (lookahead+1)*K pinned chunk
 *            buffers, reused least recently used first, pinned += that
 *            times C: param_gather),
 *            with the next lookahead fetches of the recorded trace's, as
 *            loads are prefetched; the device's non-resident slots are at
 *            most (lookahead+1)*K, so a rank's device parameter bytes are its
 *            own resident chunks plus those. Gathers follow the fetches and
 *            the trace only, never a rank's slots, so every rank issues the
 *            same ones; a step's gathers are dropped at its end (the owners
 *            updated). Chunks of at most zero_persist_elems elements stay
 *            whole on every rank as in stage 2.
 * param_home nvme: at stages 1 and 2 every rank keeps every chunk's 16-bit
 * parameters in its own swap files (the owner reads back what its update
 * wrote, broadcasts it through two pinned chunk buffers, param_staging += 2
 * C; the others write it to their alternate extent, checksummed, switched
 * at the commit; nvme += 2 extents per chunk), but with its states in host
 * memory a rank keeps its own chunks there beside them; at stage 3 a rank's
 * files hold its own chunks, read on the h2d stream into the gather buffer
 * its broadcast goes from. param_caps place chunks per chunk as on one rank
 * (device: over every chunk at stages 1 and 2, over the rank's own at stage
 * 3). A rank's failure fails the step on every rank, naming it: NVMe reads
 * of 16-bit parameters that fail during a step are kept until its end, and
 * the ranks agree on the step (before the verdict) and on the owners'
 * updates (after the broadcasts), discarding what was stored beside the
 * committed states; a copy of another rank's chunk that fails its checksum
 * is sent again by its owner, so that the step can be run again. A rank's
 * failed write of another rank's chunk (its copy, not the update) fails no
 * step (outside dpu mode): once the ranks agreed, the owner sends it again
 * into the alternate extent, so the states of an in-place tier (host,
 * device), already updated in sync mode, are the committed ones on every
 * rank; if that write fails too, the copy is marked stale, the next step's
 * load of it fails that step on every rank (before its update) and its
 * owner sends it once more at that step's end. Needs a communicator that
 * reaches host memory (mpi, self). Overlap: each owner
 * updates its chunks speculatively on their reduced gradients as they
 * arrive and validates as one rank does. Dpu: the reduced gradients are kept
 * by step parity (host += that twice) and the owners broadcast from the
 * delayed update's thread, committed with it at the next step's end.
 * zo_engine_read_master and the
 * checkpoint calls read and write only the states of the rank's own chunks
 * (zo_engine_tensor_owner says whose a tensor is). */

#define ZO_ENGINE_CONFIG_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(zo_engine_config), .world_size = 1, .param_dtype = ZO_DTYPE_BF16,    \
        .param_home = ZO_TIER_HOST, .optim_home = ZO_TIER_HOST, .nvme_engine = "auto",             \
        .lookahead = 2, .mode = ZO_OPTIM_SYNC, .grad_accum_steps = 1, .adam = ZO_ADAM_PARAMS_INIT, \
        .loss_scaler = ZO_LOSS_SCALER_CONFIG_INIT, .host_node = -1                                 \
    }

/* Bytes the plan needs in each tier, computed by zo_engine_finalize (and by
 * zo_engine_plan without allocating anything). Exactly, with C = chunk_bytes,
 * w = bytes of a param_dtype element (2, or 4 for fp32), F = 4*C/w (a chunk's
 * elements in fp32: 2*C with 16-bit parameters, C with fp32 ones),
 * N = n_chunks, S = device_param_slots, K = max_chunks_per_layer, and every
 * chunk at the homes below (with caps, each term counts the chunks homed at
 * its tier: N becomes their number there, the staging terms are there as soon
 * as one chunk's state is on NVMe):
 *   device = S*C + K*C (gradient slots) + [grouped] K*F (their fp32 accumulators)
 *            + [optim_home device] Z*N + F + C (its update's room: a chunk's gradients
 *              brought up, fp32 at most, and its 16-bit output)
 *            S = N for param_home device, else min(N, what the budget leaves), >= K
 *   pinned = N*C*P + [not grouped] N*C*G + [grouped] N*F*G (fp32 group sums)
 *            + [optim_home nvme] 3*(Z' + [param_home nvme] C)
 *            + [param_home nvme] T*C (staging twins of the NVMe parameter loads)
 *            + [optim_home device] Z' (a chunk's states staged for the host's reads and writes)
 *            P = 0 (param_home nvme; param_home device with optim_home nvme), 2 (optim_home
 *            nvme with param_home host, or dpu), else 1 (host 16-bit copies; param_home
 *            device: one, reloaded only after an update)
 *            G = 2 for dpu, else 1 (host gradients, by step parity)
 *            T = min(S, D), D = lookahead + 2 (the fetch served, the lookahead's, one more)
 *   host   = [optim_home host] Z*N + [overlap, optim_home host/device] Z*N (backups)
 *            + [grad_accum_steps > 1, not grouped, not ZeRO's global order] F*N*G
 *              (fp32 accumulators)
 *            + [world_size > 1] F*R*G + Z (reduced fp32 gradients, R = N at stage 1, the
 *              rank's own chunks at stages 2 and 3; the scratch)
 *   (grouped: micro_group > 1 and grad_accum_steps > 1; with world_size > 1 every N
 *   counting optimizer states counts the rank's own chunks only)
 *   nvme   = [optim_home nvme] 2*N*E + [param_home nvme] 2*N*P (payload of two extents
 *            per chunk, current and alternate; the files add a 4 KiB header per extent)
 *            E = zo_engine_nvme_state_bytes(the fullest chunk's elements): the states'
 *            extents hold what the model's chunks hold, not the chunk size's worst case;
 *            P = the fullest chunk's param_dtype bytes rounded to 4 KiB
 *   Z = F + 2*M, M = one moment of C/w elements in state_dtype, rounded up to 64 bytes
 *       but for fp32 (zo_adam_moment_bytes: F fp32, F/2 bf16, about F/4 int8): 3*F fp32,
 *       2*F bf16, about 1.5*F int8 (6*C, 4*C, 3*C with 16-bit parameters); Z' = Z rounded
 *       up to 4 KiB
 *   (with state_dtype other than fp32, E is zo_engine_nvme_state_bytes_as)
 *   master_split: host += [optim_home nvme] 3*B (each stage's up bits in transit, B = C/16 + 1
 *   bytes rounded up to 64); P = 2 for param_home device with optim_home nvme (the
 *   committed copy the master is rebuilt from stays untouched by the next update); nvme
 *   unchanged (a chunk that does not split exactly is stored whole); a step moves
 *   zo_engine_nvme_split_state_bytes of each chunk whose parameters are not on NVMe
 * Device-resident chunks whose optimizer states are on NVMe (without ZeRO or master_split)
 * count as param_home nvme in every term above but the device slots: their
 * committed 16-bit copy is an NVMe extent pair beside the states' (written
 * from the stages' room by the update, switched at commit, read through the
 * twins into the slot at its next fetch), so their pinned memory is the
 * staging only, whatever the model's size.
 * Chunks whose 16-bit parameters or optimizer states are homed on NVMe keep
 * no whole-model gradient mirror either (their update goes through the NVMe
 * stages anyway): their N*C*G pinned term becomes a ring of min(N, D) pinned
 * chunk buffers the gradients come down into (pinned staging sized by the
 * queue depth and the lookahead, not by the model). With grad_accum_steps 1
 * the update needs them after the global norm, so each such chunk's G
 * gradients wait in host memory (host += C*G per chunk) as long as host_bytes
 * allows (all of them when it is 0), in chunk order, and the rest are spilled
 * to checksummed NVMe extents (nvme += G*P per chunk: one per parity,
 * rewritten every step) read back into the states' stages for the update
 * (pinned += 3*C for their room, whether one spills or not). With more
 * micro-batches the fp32 accumulators hold them, except grouped with one
 * group per step (micro_group >= grad_accum_steps) outside dpu mode: then
 * the fp32 sums are staged the same way, each term at F a chunk (ring,
 * kept copies, stage room; extents of the fullest chunk's fp32 bytes). The
 * grad_* and param_staging fields below break these terms out. */
typedef struct zo_engine_footprint {
    size_t struct_size;
    uint64_t bytes[ZO_TIER_MAX]; /* by zo_tier: device, host (pageable), nvme */
    uint64_t pinned;             /* the host tier's pinned pool (beside its pageable bytes) */
    uint64_t chunk_bytes;
    uint32_t n_chunks, max_chunks_per_layer;
    uint32_t device_param_slots, device_grad_slots;
    uint64_t n_params;
    /* parts of the totals above: */
    uint64_t param_staging; /* pinned: the staging twins of NVMe parameter loads (T*C) */
    uint64_t grad_pinned;   /* pinned: 16-bit gradient mirrors and the gradient ring */
    uint64_t grad_host;     /* host: 16-bit gradients waiting for the update in pageable memory */
    uint64_t grad_nvme;     /* nvme: spilled 16-bit gradients' extent payload */
    uint64_t grad_stage;    /* pinned: the stages' room for reading spilled gradients back */
    uint64_t param_gather;  /* pinned: ZeRO stage 3's ring of gather buffers */
} zo_engine_footprint;

#define ZO_ENGINE_FOOTPRINT_INIT                                                                   \
    {                                                                                              \
        .struct_size = sizeof(zo_engine_footprint)                                                 \
    }

/* A model described only by its tensors' sizes, for planning without an
 * engine (nothing registered, nothing allocated): numel[i] and layer[i] of
 * the i-th tensor in registration order (layers from 0; each tensor's layer
 * is the previous tensor's or the next one); keep_f32[i] nonzero for a
 * tensor the run marks with zo_engine_keep_f32_states (NULL: none). */
typedef struct zo_engine_layout {
    size_t struct_size;
    size_t n_tensors;
    const size_t *numel;
    const int *layer;
    const unsigned char *keep_f32;
} zo_engine_layout;

#define ZO_ENGINE_LAYOUT_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(zo_engine_layout)                                                    \
    }

/* One chunk of a packed layout: its layer, and the param_dtype bytes in use
 * (what a load of the chunk moves). */
typedef struct zo_engine_chunk_info {
    int layer;
    uint64_t used_bytes;
} zo_engine_chunk_info;

typedef struct zo_step_stats {
    size_t struct_size;
    int64_t step;      /* optimizer updates applied (skipped overflow steps do not count;
                          in dpu mode the update of this step is still running) */
    double grad_norm;  /* global norm of the unscaled gradients */
    int overflow;      /* inf/NaN seen: the update was skipped */
    int clipped;       /* the clip coefficient was applied */
    double loss_scale; /* the scale used this step (1 for bf16) */
    int rollbacks;     /* chunks rolled back and redone (overlap mode) */
    uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes;
    double step_seconds;  /* wall time from the step's first fetch to end_step's return */
    double stall_seconds; /* time the compute stream waited for parameters */
    double optim_seconds; /* CPU optimizer busy time (host job thread and updates) */
    double h2d_seconds, d2h_seconds; /* busy time of the engine's copy streams */
    double nvme_seconds; /* time spent waiting for NVMe I/O (the optimizer's and the fetches') */
    uint64_t peak[ZO_TIER_MAX]; /* high-water marks since init, by zo_tier: the engine's own
                                   device bytes, pageable host bytes, NVMe extent payload bytes */
    uint64_t peak_pinned;       /* ... and the pinned pool's reserved bytes */
    uint64_t fetch_hits;        /* chunks already resident (or prefetched) when fetched */
    uint64_t fetch_misses;      /* chunks loaded on demand by fetch */
    uint64_t evictions;         /* resident chunks evicted (farthest next use) */
    uint64_t prefetches;        /* chunks loaded ahead along the recorded trace */
} zo_step_stats;

#define ZO_STEP_STATS_INIT                                                                         \
    {                                                                                              \
        .struct_size = sizeof(zo_step_stats)                                                       \
    }

/* The engine copies cfg, including its strings and arrays (nvme_paths,
 * nvme_engine, nvme_name): the caller's may go away after. */
ZO_API zo_status zo_engine_init(zo_engine_t *out, const zo_engine_config *cfg);
ZO_API void zo_engine_free(zo_engine_t eng);

/* Register one parameter tensor of layer `layer` (layers in execution order,
 * tensors of a layer in the order they are used); init holds its initial fp32
 * values (numel of them). Returns its id (0, 1, ...) in *id. Only before
 * zo_engine_finalize. */
ZO_API zo_status zo_engine_register(zo_engine_t eng, int layer, const char *name, size_t numel,
                                    const float *init, int *id);
/* Writes tensor id's numel initial fp32 values into dst (ctx: as registered). */
typedef zo_status (*zo_engine_fill_fn)(void *ctx, int id, float *dst);
/* zo_engine_register without holding the initial values: the engine asks
 * fill for them where it places them, straight into each chunk's initial
 * states as zo_engine_finalize goes through the chunks (and for
 * zo_engine_read_master before it), so that registering a model takes no
 * host memory that grows with it. fill and ctx must stay valid until
 * zo_engine_finalize returns; a fill that fails fails finalize. */
ZO_API zo_status zo_engine_register_fill(zo_engine_t eng, int layer, const char *name, size_t numel,
                                         zo_engine_fill_fn fill, void *ctx, int *id);

/* Tensor id keeps fp32 m and v under I8 states, as a tensor below
 * ZO_ADAM_Q8_MIN_NUMEL does (zo/optim.h: laid out in its moments' code
 * bytes, 4 per element, so its chunk's 16-bit and gradient buffers take 4x
 * its elements too; checkpoints and zo_engine_tensor_state_dtype say F32).
 * bitsandbytes' practice for the token embedding
 * (GlobalOptimManager.override_config(weight, 'optim_bits', 32), which its
 * StableEmbedding and transformers' Trainer apply to every nn.Embedding
 * under 8-bit Adam; their argument: a row's gradient is zero whenever its
 * token is absent, so its moments decay between rare updates). With F32 or
 * BF16 states it changes nothing. Only before zo_engine_finalize. */
ZO_API zo_status zo_engine_keep_f32_states(zo_engine_t eng, int id);

/* Tensor id's updates use weight_decay instead of config.adam.weight_decay
 * (finite, >= 0): per-tensor decay, as PyTorch's parameter groups give it
 * (Hugging Face's Trainer decays no bias and no norm weight). Between
 * zo_engine_register and zo_engine_finalize. The chunk's update runs the
 * tensor's elements as a job of their own, elementwise the same bits as one
 * pass with that decay. */
ZO_API zo_status zo_engine_set_weight_decay(zo_engine_t eng, int id, float weight_decay);

/* Tensor id's updates use its parameter group's own Adam settings, as
 * PyTorch's param_groups give them: a learning rate of lr_scale times the
 * engine's (zo_engine_set_lr sets the reference group's, so a schedule
 * scales every group alike, as DeepSpeed's WarmupCosineLR does; the product
 * is taken in double and rounded once, so a constant rate is the group's
 * float exactly), and beta1, beta2, eps instead of config.adam's. Weight
 * decay stays zo_engine_set_weight_decay's. lr_scale finite and >= 0, betas
 * in [0, 1), eps finite and >= 0. Between zo_engine_register and
 * zo_engine_finalize; the tensor's elements run as a job of their own, as
 * with its own decay. */
ZO_API zo_status zo_engine_set_tensor_adam(zo_engine_t eng, int id, double lr_scale, float beta1,
                                           float beta2, float eps);

/* The footprint of the registered model under the configuration, without
 * allocating; fits is 0 and msg names the tier and shortfall when it cannot. */
ZO_API zo_status zo_engine_plan(zo_engine_t eng, zo_engine_footprint *fp, int *fits, char *msg,
                                size_t cap);

/* Pack, allocate every tier, place the initial states. Refuses a plan that
 * cannot fit with ZO_ERR_BUDGET or ZO_ERR_OUT_OF_DEVICE_MEMORY naming the tier
 * and the bytes missing. */
ZO_API zo_status zo_engine_finalize(zo_engine_t eng);

/* Make layer's parameters resident on the device for `phase` and return their
 * device pointers (params[i] for the layer's i-th tensor; grads[i] in the
 * backward phase: param_dtype buffers, zeroed at every backward fetch, that the
 * caller writes (or adds) the micro-batch's gradient into; micro-batches are
 * accumulated in fp32 on the host, or on the device with micro_group > 1,
 * where grads_ready zeroes them again for the group's next micro-batch).
 * The compute stream is made to wait for
 * the data; n is the capacity of the arrays.
 *
 * After any step call returns an error the engine abandons the step: its
 * gradients are dropped, speculative updates undone, the committed weights
 * stay as they were; the caller stops the step (enqueues no more work for
 * it) and may run it again from its first fetch. */
ZO_API zo_status zo_engine_fetch(zo_engine_t eng, int layer, zo_phase phase, zo_stream_t compute,
                                 void **params, void **grads, int n);
/* The caller's compute stream is done with the layer's parameters once the
 * work enqueued so far completes. */
ZO_API zo_status zo_engine_release(zo_engine_t eng, int layer, zo_stream_t compute);
/* The layer's gradients are complete once the work enqueued so far on compute
 * completes: hand them to the host (and to the optimizer in overlap mode).
 * With micro_group > 1 it is called once per micro-batch of the group under
 * one backward fetch: it adds them to the device's fp32 sum, and the group's
 * last call hands the sum to the host. */
ZO_API zo_status zo_engine_grads_ready(zo_engine_t eng, int layer, zo_stream_t compute);
/* Finish the optimizer step: wait for the updates (validating them in overlap
 * mode), publish the new parameters, return the statistics. On an error
 * (a failed NVMe write, say) the previous weights stay intact and the step can
 * be retried once the cause is fixed. */
ZO_API zo_status zo_engine_end_step(zo_engine_t eng, zo_step_stats *stats);
/* The caller's own work for the open step failed (its inputs could not be
 * read back, say): give the step up as after an engine error (gradients
 * dropped, speculative updates undone, the committed weights as they were);
 * the step may then be run again from its first fetch. The caller's compute
 * stream must be idle. A no-op when no step is open. */
ZO_API zo_status zo_engine_abandon_step(zo_engine_t eng);

/* The current fp32 master weights of a tensor (numel floats), for tests and
 * checkpoints; waits for pending updates. */
ZO_API zo_status zo_engine_read_master(zo_engine_t eng, int id, float *out);
/* The learning rate of the updates computed from the gradients of the steps
 * that open from now on (a step opens at its first fetch): a schedule calls
 * it before each step. A step already open keeps the rate it opened with, and
 * its update uses that rate wherever and whenever it runs (speculatively
 * during the backward in overlap mode, during the next step in dpu mode).
 * lr must be finite and >= 0; the initial rate is config.adam.lr. */
ZO_API zo_status zo_engine_set_lr(zo_engine_t eng, float lr);
/* The rate the next step will use. */
ZO_API float zo_engine_lr(zo_engine_t eng);
/* The loss scale to multiply the loss by before backward (1 for bf16). */
ZO_API double zo_engine_loss_scale(zo_engine_t eng);
ZO_API zo_status zo_engine_footprint_get(zo_engine_t eng, zo_engine_footprint *fp);
/* How many chunks the placement homed at each tier (indexed by zo_tier,
 * ZO_TIER_MAX entries, 0 for an index no tier has): their 16-bit parameters
 * in params, their optimizer states in optim (either may be NULL). After
 * zo_engine_finalize. */
ZO_API zo_status zo_engine_homes(zo_engine_t eng, uint32_t params[ZO_TIER_MAX],
                                 uint32_t optim[ZO_TIER_MAX]);

/* Each of n_chunks full chunks' homes as the engine places them under cfg
 * (its homes and caps: in order, the fastest tier up to its cap, then the
 * next; the home takes the rest), for one rank holding every chunk (cfg's
 * ZeRO settings are not used): zo_tier values into param_homes[k] (16-bit
 * parameters) and optim_homes[k] (optimizer states). The planner's placement
 * without an engine or a layout. */
ZO_API zo_status zo_engine_place_homes(const zo_engine_config *cfg, uint32_t n_chunks,
                                       uint8_t *param_homes, uint8_t *optim_homes);

/* The footprint zo_engine_plan would report for the layout's tensors
 * registered on an engine initialized with cfg, computed by the same code
 * but with no engine: cfg->device and the paths are not used, the device
 * budget is cfg->device_bytes (0: unlimited, so every parameter chunk gets a
 * device slot). Work and memory are proportional to the number of tensors,
 * not to their sizes. */
ZO_API zo_status zo_engine_footprint_for(const zo_engine_config *cfg,
                                         const zo_engine_layout *layout, zo_engine_footprint *fp,
                                         int *fits, char *msg, size_t cap);
/* How the engine would pack the layout into chunks under cfg: their number
 * in *n_chunks and, for the first cap of them, each chunk's layer and bytes
 * in use (n_tensors entries always suffice: a chunk holds a tensor at least). */
ZO_API zo_status zo_engine_chunks_for(const zo_engine_config *cfg, const zo_engine_layout *layout,
                                      zo_engine_chunk_info *chunks, size_t cap, uint32_t *n_chunks);
/* The bytes of optimizer states a chunk with n_elems parameters in use
 * reads and writes on NVMe per update: fp32 master, m and v of those
 * elements, packed, each padded to 4 KiB (a chunk's extent keeps room for
 * the whole chunk; only what it holds moves). */
ZO_API uint64_t zo_engine_nvme_state_bytes(uint64_t n_elems);
/* The same for m and v in state_dtype (zo_engine_config.state_dtype): the
 * fp32 master and the moments in that format, packed, padded to 4 KiB as a
 * whole; 0 for a type that is not a state format. */
ZO_API uint64_t zo_engine_nvme_state_bytes_as(zo_dtype state_dtype, uint64_t n_elems);
/* ... and what one way of a step moves for such a chunk with master_split
 * (the extent's split layout: the master's low halves and bits, then m and
 * v; 0 for a format that is not a state format). */
ZO_API uint64_t zo_engine_nvme_split_state_bytes(zo_dtype state_dtype, uint64_t n_elems);
ZO_API int zo_engine_n_tensors(zo_engine_t eng);
ZO_API int zo_engine_layer_tensors(zo_engine_t eng, int layer, int *ids, int cap);
/* The swap store holding the optimizer states on NVMe (NULL when they are not
 * there), for statistics and fault drills (zo_swap_set_faults). */
ZO_API zo_swap_t zo_engine_nvme_store(zo_engine_t eng);
/* The swap store holding the 16-bit parameters when param_home is nvme (else NULL). */
ZO_API zo_swap_t zo_engine_nvme_param_store(zo_engine_t eng);
/* The swap store holding the spilled 16-bit gradients (NULL when none spill). */
ZO_API zo_swap_t zo_engine_nvme_grad_store(zo_engine_t eng);

/* ---- checkpoints: the full optimizer state ----
 *
 * A checkpoint holds, per tensor, the fp32 master weights and Adam's m and v
 * (as the engine stores them: zo_engine_read_state_raw; or as fp32, which
 * converts from and to a compact state_dtype), plus the step state below; restoring them into an
 * engine with the same tensors and configuration makes its next steps bitwise identical to those of
 * the engine they were read from. The 16-bit parameters are not saved: they are always the master
 * weights rounded (the update writes both). Reads and writes go tensor by tensor through whatever
 * tier holds the states, so a checkpoint never needs the whole model in memory at once.
 *
 * All of these run between steps (not while a step is open: ZO_ERR_STATE). In
 * dpu mode the update of the last step is still pending: zo_engine_flush
 * applies it first (a run that checkpoints then equals its resumed
 * continuation bitwise; it differs from a run that never flushed by the one
 * step of staleness the flush removes). */

/* The latest master weights, m and v of tensor id (numel floats each; any
 * may be NULL); waits for pending updates (including a dpu update that is
 * not flushed yet). Compact moments (state_dtype bf16 or i8) are decoded. */
ZO_API zo_status zo_engine_read_state(zo_engine_t eng, int id, float *master, float *m, float *v);
/* Replace them (any may be NULL: kept). With new master weights the 16-bit
 * parameters are recomputed wherever they live (host copies, device slots,
 * NVMe extents). States on NVMe are written to the chunk's alternate extents
 * and switched to only once durable, so a failed write leaves the previous
 * state intact. ZO_ERR_STATE before finalize (register the values instead)
 * or with a dpu update pending. */
ZO_API zo_status zo_engine_write_state(zo_engine_t eng, int id, const float *master, const float *m,
                                       const float *v);
/* The same with m and v as the engine stores them, in its state_dtype:
 * zo_adam_moment_bytes(state_dtype, numel) bytes each (i8: the numel codes,
 * padded to 4 bytes, then the tensor's block scales, zo_adam_q8_scales), so
 * a checkpoint of compact states restores them bit for bit. write_state
 * encodes fp32 moments instead (bf16 rounding, or i8 blocks of the tensor). */
ZO_API zo_status zo_engine_read_state_raw(zo_engine_t eng, int id, float *master, void *m, void *v);
ZO_API zo_status zo_engine_write_state_raw(zo_engine_t eng, int id, const float *master,
                                           const void *m, const void *v);
/* The engine's state_dtype. */
ZO_API zo_dtype zo_engine_state_dtype(zo_engine_t eng);
/* The format of tensor id's moments (the raw layout above): state_dtype,
 * except ZO_DTYPE_F32 with I8 states for a tensor below
 * ZO_ADAM_Q8_MIN_NUMEL elements (zo/optim.h) or marked by
 * zo_engine_keep_f32_states; ZO_DTYPE_NONE for a bad engine or id. */
ZO_API zo_dtype zo_engine_tensor_state_dtype(zo_engine_t eng, int id);
/* dpu mode: wait for the pending delayed update and apply it (the next step
 * computes with its parameters). A no-op in the other modes. */
ZO_API zo_status zo_engine_flush(zo_engine_t eng);

/* What the step counts and the loss scaler hold between steps. */
typedef struct zo_engine_step_state {
    size_t struct_size;
    int64_t updates;   /* optimizer updates applied: the next update is Adam step updates + 1 */
    int64_t steps;     /* steps ended (skipped fp16 overflow steps count here, not in updates) */
    double loss_scale; /* the fp16 dynamic loss scaler's scale (1 when static; ignored on set) */
    int64_t scaler_iter, scaler_last_overflow_iter; /* its iteration and last overflow */
    int scaler_hysteresis; /* overflows it still tolerates before halving the scale */
} zo_engine_step_state;

#define ZO_ENGINE_STEP_STATE_INIT                                                                  \
    {                                                                                              \
        .struct_size = sizeof(zo_engine_step_state), .loss_scale = 1.0                             \
    }

/* The rank whose optimizer states hold tensor id (its chunk's owner under
 * ZeRO; 0 with one rank); -1 for a bad id or before zo_engine_finalize. */
ZO_API int zo_engine_tensor_owner(zo_engine_t eng, int id);

/* ZeRO stages 1 and 2 (every rank keeps every chunk's 16-bit parameters):
 * after the owners wrote their tensors' master weights (zo_engine_write_state
 * and _raw, as a checkpoint's load does, each rank its own tensors), every
 * rank's 16-bit copy of every chunk from its owner, bitwise. Collective: every
 * rank calls it, between steps. A no-op with one rank (write_state already
 * refreshed them) and at stage 3 (partitioned parameters live with their
 * owner only). */
ZO_API zo_status zo_engine_share_params(zo_engine_t eng);

/* ZO_ERR_STATE with a dpu update pending (flush first) or a step open. */
ZO_API zo_status zo_engine_get_step_state(zo_engine_t eng, zo_engine_step_state *out);
/* Values out of range (negative counts, updates > steps, a scale not finite
 * and > 0, hysteresis < 0) are refused with ZO_ERR_INVALID_ARG naming them. */
ZO_API zo_status zo_engine_set_step_state(zo_engine_t eng, const zo_engine_step_state *in);

/* ---- timelines ----
 *
 * A trace callback sees what the engine's streams, I/O queues and threads
 * did and when, as spans, so that a program can draw who overlaps whom (zo-
 * train writes them as a Chrome/Perfetto trace). */

typedef enum zo_trace_track {
    ZO_TRACK_H2D = 0,          /* the engine's host-to-device copy stream (a copy engine) */
    ZO_TRACK_D2H = 1,          /* its device-to-host copy stream */
    ZO_TRACK_COMPUTE = 2,      /* the caller's compute stream while it waits for parameters */
    ZO_TRACK_NVME = 3,         /* an NVMe request queue, index 0 the optimizer states' store, 1
                                  the parameters', 2 the spilled gradients'; a span per
                                  request, from submission to
                                  completion, so spans overlap (requests in flight) */
    ZO_TRACK_HOST_JOBS = 4,    /* the engine's host job thread: gradient accumulation, norms,
                                  speculative updates (overlap mode) */
    ZO_TRACK_UPDATE = 5,       /* the update of every chunk: at the end of the step, or on the
                                  delayed-update thread (dpu) */
    ZO_TRACK_OPTIM_WORKER = 6, /* worker `index` of the CPU optimizer's pool */
} zo_trace_track;

typedef struct zo_trace_event {
    zo_trace_track track;
    int index;             /* the NVMe store or the optimizer worker; 0 otherwise */
    const char *name;      /* what ran ("h2d", "nvme read", "adam", ...: static strings) */
    uint64_t t0_ns, t1_ns; /* CLOCK_MONOTONIC nanoseconds (zo_now_ns) */
    int layer, chunk;      /* what it was about, or -1 */
    uint64_t bytes;        /* bytes moved (copies, NVMe) or elements (optimizer work); else 0 */
} zo_trace_event;

/* Called on whichever thread ran the work (stream workers, the I/O thread,
 * the engine's and the optimizer's threads): must be thread-safe and quick. */
typedef void (*zo_trace_fn)(void *ctx, const zo_trace_event *ev);

/* Before zo_engine_finalize (ZO_ERR_STATE after); fn NULL turns tracing off.
 * While traced, NVMe reads are verified on the I/O thread (their completion
 * is what the span ends on) instead of the waiting thread. */
ZO_API zo_status zo_engine_set_trace(zo_engine_t eng, zo_trace_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
