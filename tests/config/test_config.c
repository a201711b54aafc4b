/* The DeepSpeed-style config: a table of valid and invalid configs (each
 * invalid one checked for its exact message), the batch-size arithmetic,
 * command-line overrides, warnings for ignored keys, and round trips through
 * the serializer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zo_test.h"

#include "zo/config.h"
#include "zo/log.h"

/* The message without zo_last_error()'s "file:line: configuration error: ". */
static const char *error_text(void)
{
    const char *e = zo_last_error();
    const char *tag = strstr(e, ": configuration error: ");
    return tag ? tag + strlen(": configuration error: ") : e;
}

static zo_status resolve_text(const char *json, int64_t world, zo_train_config *out,
                              const char *const *overrides)
{
    zo_config_t c = NULL;
    zo_status st = zo_config_init(&c);
    if (st == ZO_OK)
        st = zo_config_load_string(c, json, "<test>");
    for (size_t i = 0; st == ZO_OK && overrides && overrides[i]; i++)
        st = zo_config_set_arg(c, overrides[i]);
    if (st == ZO_OK)
        st = zo_config_resolve(c, world, out);
    zo_config_free(c);
    return st;
}

/* ---- invalid configs: exact messages ---- */

typedef struct bad_case {
    const char *json;
    const char *message;
} bad_case;

static const bad_case bad_cases[] = {
    {"{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": {\"devcie\": "
     "\"cpu\"}}}",
     "unknown key 'zero_optimization.offload_optimizer.devcie'; did you mean 'device'?"},
    {"{\"train_batch_size\": 8, \"fp16\": {\"enabeld\": true}}",
     "unknown key 'fp16.enabeld'; did you mean 'enabled'?"},
    {"{\"train_batch_sise\": 8}",
     "unknown key 'train_batch_sise'; did you mean 'train_batch_size'?"},
    {"{\"Train_Batch_Size\": 8}",
     "unknown key 'Train_Batch_Size'; did you mean 'train_batch_size'?"},
    {"{\"train_batch_size\": 8, \"wall_clock_breakdwn\": false}",
     "unknown key 'wall_clock_breakdwn'; did you mean 'wall_clock_breakdown'?"},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"qq\": 1}}",
     "unknown key 'zoffload.qq'; the nearest valid key is 'host_mem'"},
    {"{\"train_batch_size\": 8, \"aio\": {\"queue_dpeth\": 8}}",
     "unknown key 'aio.queue_dpeth'; did you mean 'queue_depth'?"},
    {"{\"train_batch_size\": \"8\"}",
     "'train_batch_size': expected an integer >= 1 or \"auto\" or null, found string \"8\""},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": "
     "\"1e-4\"}}}",
     "'optimizer.params.lr': expected a number >= 0 or \"auto\", found string \"1e-4\""},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adamm\"}}",
     "'optimizer.type': expected one of Adam, AdamW, found string \"Adamm\""},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"params\": {}}}",
     "'optimizer.type' is required: one of Adam, AdamW"},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, "
     "1.0]}}}",
     "'optimizer.params.betas[1]': expected a number in [0, 1), found 1"},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": "
     "0.9}}}",
     "'optimizer.params.betas': expected an array of two numbers in [0, 1) or \"auto\", found 0.9"},
    {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": "
     "true}}}",
     "'optimizer.params.amsgrad': expected false (the true variant is not supported), found true"},
    {"{\"train_batch_size\": 8, \"fp16\": {\"hysteresis\": 0}}",
     "'fp16.hysteresis': expected an integer >= 1, found 0"},
    {"{\"train_batch_size\": 8, \"fp16\": {\"min_loss_scale\": 0}}",
     "'fp16.min_loss_scale': expected a number > 0, found 0"},
    {"{\"train_batch_size\": 8, \"fp16\": true}", "'fp16': expected an object, found true"},
    {"{\"train_batch_size\": 8, \"fp16\": {\"enabled\": 1}}",
     "'fp16.enabled': expected true or false or \"auto\", found 1"},
    {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}",
     "'zero_optimization.stage': expected an integer in [0, 3], found 4"},
    {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2.5}}",
     "'zero_optimization.stage': expected an integer in [0, 3], found 2.5"},
    {"{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_param\": {\"device\": "
     "\"NVMe\"}}}",
     "'zero_optimization.offload_param.device': expected one of none, cpu, nvme, found string "
     "\"NVMe\""},
    {"{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": {\"device\": "
     "\"nvme\"}}}",
     "'zero_optimization.offload_optimizer.nvme_path' is required when "
     "'zero_optimization.offload_optimizer.device' is 'nvme' (or list drives in "
     "'zoffload.nvme_paths')"},
    {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
     "{\"total_num_steps\": 100, \"warmup_max_lr\": 0.1}}}",
     "'scheduler.params.warmup_max_lr' is not a parameter of WarmupCosineLR (its parameters: "
     "total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type, "
     "last_batch_iteration)"},
    {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
     "{\"warmup_num_step\": 5}}}",
     "unknown key 'scheduler.params.warmup_num_step'; did you mean 'warmup_num_steps'?"},
    {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\"}}",
     "'scheduler.params.total_num_steps' is required by WarmupDecayLR (set it in the file or on "
     "the "
     "command line)"},
    {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLRR\"}}",
     "'scheduler.type': expected one of WarmupLR, WarmupDecayLR, WarmupCosineLR, found string "
     "\"WarmupLRR\""},
    {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
     "{\"warmup_type\": \"cos\"}}}",
     "'scheduler.params.warmup_type': expected one of log, linear, found string \"cos\""},
    {"{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
     "'fp16.enabled' and 'bf16.enabled' are both true; enable at most one"},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"device_mem\": \"24 parsecs\"}}",
     "'zoffload.device_mem': expected an integer >= 0 (bytes, or a string such as \"24GiB\"), "
     "found "
     "string \"24 parsecs\""},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"optimizer_mode\": \"async\"}}",
     "'zoffload.optimizer_mode': expected one of sync, overlap, dpu, found string \"async\""},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"nvme_paths\": \"/mnt/a\"}}",
     "'zoffload.nvme_paths': expected an array of at most 16 path strings, found string "
     "\"/mnt/a\""},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"nvme_paths\": [\"/a\", 1]}}",
     "'zoffload.nvme_paths[1]': expected a path string, found 1"},
    {"{\"train_batch_size\": 8, \"steps_per_print\": \"auto\"}",
     "'steps_per_print': expected an integer >= 1, found string \"auto\""},
    {"{\"train_batch_size\": 8, \"zoffload\": {\"prefetch_lookahead\": 1e30}}",
     "'zoffload.prefetch_lookahead': expected an integer in [0, 64], found 1e+30"},
    {"{\"train_batch_size\": 8,}", "<test>:1:24: invalid JSON: string or '}' expected near '}'"},
    {"{\"train_batch_size\": 8, \"train_batch_size\": 4}",
     "<test>:1:42: invalid JSON: duplicate object key near '\"train_batch_size\"'"},
    {"[1, 2]", "<test>: the top level must be a JSON object, found an array"},
    {"{\"gradient_accumulation_steps\": 4}",
     "either 'train_batch_size' or 'train_micro_batch_size_per_gpu' must be given"},
    {"{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}",
     "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size: 10 != "
     "3 "
     "* 3 * 1"},
    {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, "
     "\"gradient_accumulation_steps\": 4}",
     "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size: 32 != "
     "4 "
     "* 4 * 1"},
    {"{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 8}",
     "gradient_accumulation_steps derived as 0, which is < 1 (train_batch_size 4, "
     "train_micro_batch_size_per_gpu 8, world_size 1)"},
    {"{\"train_batch_size\": 4, \"gradient_accumulation_steps\": 8}",
     "train_micro_batch_size_per_gpu derived as 0, which is < 1 (train_batch_size 4, "
     "gradient_accumulation_steps 8, world_size 1)"},
};

static void expect_bad_cases(const bad_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zo_train_config cfg = ZO_TRAIN_CONFIG_INIT;
        zo_train_config before = cfg;
        zo_status st = resolve_text(cases[i].json, 1, &cfg, NULL);
        if (st != ZO_ERR_CONFIG)
            fail_msg("case %zu (%s): status %d, expected ZO_ERR_CONFIG: %s", i, cases[i].json, st,
                     zo_last_error());
        if (strcmp(error_text(), cases[i].message) != 0)
            fail_msg("case %zu (%s):\n  got      '%s'\n  expected '%s'", i, cases[i].json,
                     error_text(), cases[i].message);
        /* A failed resolve leaves the output untouched. */
        assert_memory_equal(&cfg, &before, sizeof cfg);
    }
}

static void test_invalid_configs(void **state)
{
    (void)state;
    expect_bad_cases(bad_cases, sizeof bad_cases / sizeof bad_cases[0]);
}

/* DeepSpeed's sparse_attention: its key names and defaults, present means
 * on (absent: not emitted, so that a round trip stays off), and what a
 * causal decoder or the layouts cannot take refused by name. */
static void test_sparse_attention(void **state)
{
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8}", 1, &c, NULL));
    assert_int_equal(c.sparse_attention.enabled, 0);
    char *json = NULL;
    ZO_ASSERT_OK(zo_train_config_to_json(&c, 2, &json));
    assert_null(strstr(json, "sparse_attention"));
    free(json);
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"sparse_attention\": {}}", 1, &c, NULL));
    const zo_sparse_attention_config *sa = &c.sparse_attention;
    assert_true(sa->enabled && sa->mode == ZO_SPARSE_FIXED && sa->block == 16);
    assert_true(sa->num_local_blocks == 4 && sa->num_global_blocks == 1);
    assert_true(sa->num_sliding_window_blocks == 3 && sa->num_random_blocks == 0);
    ZO_ASSERT_OK(resolve_text(
        "{\"train_batch_size\": 8, \"sparse_attention\": {\"mode\": \"bigbird\", \"block\": 32, "
        "\"different_layout_per_head\": false, \"num_random_blocks\": 2, "
        "\"num_sliding_window_blocks\": 5, \"num_global_blocks\": 3, \"attention\": "
        "\"unidirectional\", \"seed\": 9, \"local_window_blocks\": [4]}}",
        1, &c, NULL));
    assert_true(sa->mode == ZO_SPARSE_BIGBIRD && sa->block == 32 && sa->num_random_blocks == 2);
    assert_true(sa->num_sliding_window_blocks == 5 && sa->num_global_blocks == 3 && sa->seed == 9);
    ZO_ASSERT_OK(zo_train_config_to_json(&c, 2, &json)); /* emitted, and read back the same */
    zo_train_config back = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(json, 1, &back, NULL));
    free(json);
    assert_memory_equal(&back.sparse_attention, sa, sizeof *sa);
    const bad_case bad[] = {
        {"{\"train_batch_size\": 8, \"sparse_attention\": {\"mode\": \"fixed\", \"attention\": "
         "\"bidirectional\"}}",
         "'sparse_attention.attention' is \"bidirectional\" (DeepSpeed's default, BERT's); "
         "zo-train's models are causal decoders: set \"unidirectional\""},
        {"{\"train_batch_size\": 8, \"sparse_attention\": {\"mode\": \"variable\"}}",
         "'sparse_attention.mode': expected one of dense, fixed, bigbird, sliding_window, found "
         "string \"variable\""},
        {"{\"train_batch_size\": 8, \"sparse_attention\": {\"num_local_block\": 4}}",
         "unknown key 'sparse_attention.num_local_block'; did you mean 'num_local_blocks'?"},
        {"{\"train_batch_size\": 8, \"sparse_attention\": {\"block\": 24}}",
         "'sparse_attention.block' 24 must be a multiple of 16 (16..512)"},
        {"{\"train_batch_size\": 8, \"sparse_attention\": {\"num_local_blocks\": 4, "
         "\"num_global_blocks\": 3}}",
         "'sparse_attention.num_local_blocks' 4 must be a multiple of 'num_global_blocks' 3 (>= 1) "
         "in mode fixed, as DeepSpeed requires"},
    };
    expect_bad_cases(bad, sizeof bad / sizeof bad[0]);
    zo_train_config t = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 8, \"sparse_attention\": "
                              "{\"different_layout_per_head\": true}}",
                              1, &t, NULL),
                 ZO_ERR_CONFIG);
    assert_non_null(strstr(error_text(), "different_layout_per_head"));
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 8, \"sparse_attention\": "
                              "{\"num_different_global_patterns\": 4}}",
                              1, &t, NULL),
                 ZO_ERR_CONFIG);
    assert_non_null(strstr(error_text(), "num_different_global_patterns"));
}

/* ---- valid configs ---- */

static const char *full_config =
    "{\n"
    "  \"train_batch_size\": 64,\n"
    "  \"train_micro_batch_size_per_gpu\": 4,\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 50,\n"
    "  \"wall_clock_breakdown\": false,\n"
    "  \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95],\n"
    "                \"eps\": 1e-6, \"weight_decay\": 0.1, \"torch_adam\": false}},\n"
    "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 10000,\n"
    "                \"warmup_num_steps\": 200, \"warmup_min_ratio\": 0.01, \"cos_min_ratio\": "
    "0.1,\n"
    "                \"warmup_type\": \"linear\"}},\n"
    "  \"bf16\": {\"enabled\": true},\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 3, \"overlap_comm\": true, \"contiguous_gradients\": true,\n"
    "    \"stage3_prefetch_bucket_size\": 5e7, \"stage3_max_live_parameters\": 1e9,\n"
    "    \"sub_group_size\": 1e8,\n"
    "    \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/mnt/nvme0\", "
    "\"pin_memory\": true,\n"
    "                          \"buffer_count\": 4, \"pipeline_read\": true, \"pipeline_write\": "
    "true,\n"
    "                          \"fast_init\": false},\n"
    "    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true, \"buffer_count\": 5,\n"
    "                      \"buffer_size\": 1e8, \"max_in_cpu\": 1e9}\n"
    "  },\n"
    "  \"aio\": {\"block_size\": 262144, \"queue_depth\": 32, \"thread_count\": 2,\n"
    "          \"single_submit\": false, \"overlap_events\": true},\n"
    "  \"zoffload\": {\"device_mem\": \"20GiB\", \"host_mem\": 68719476736, \"chunk_size\": "
    "\"64MiB\",\n"
    "               \"optimizer_mode\": \"overlap\", \"prefetch_lookahead\": 3,\n"
    "               \"nvme_paths\": [\"/mnt/nvme0\", \"/mnt/nvme1\"], \"optimizer_state_dtype\": "
    "\"bf16\"}\n"
    "}\n";

static void check_full(const zo_train_config *c, int64_t world)
{
    assert_int_equal(c->world_size, world);
    assert_int_equal(c->train_batch_size, 64);
    assert_int_equal(c->train_micro_batch_size_per_gpu, 4);
    assert_int_equal(c->gradient_accumulation_steps, 16 / world);
    assert_true(c->gradient_clipping == 1.0);
    assert_int_equal(c->steps_per_print, 50);
    assert_int_equal(c->optimizer.type, ZO_OPTIMIZER_ADAMW);
    assert_true(c->optimizer.lr == 3e-4 && c->optimizer.betas[0] == 0.9 &&
                c->optimizer.betas[1] == 0.95);
    assert_true(c->optimizer.eps == 1e-6 && c->optimizer.weight_decay == 0.1);
    assert_int_equal(c->optimizer.decoupled_weight_decay, 1);
    assert_int_equal(c->scheduler.type, ZO_SCHEDULER_WARMUP_COSINE_LR);
    assert_int_equal(c->scheduler.total_num_steps, 10000);
    assert_int_equal(c->scheduler.warmup_num_steps, 200);
    assert_true(c->scheduler.warmup_min_ratio == 0.01 && c->scheduler.cos_min_ratio == 0.1);
    assert_int_equal(c->scheduler.warmup_type, ZO_WARMUP_LINEAR);
    assert_int_equal(c->scheduler.last_batch_iteration, -1);
    assert_int_equal(c->bf16.enabled, 1);
    assert_int_equal(c->fp16.enabled, 0);
    assert_int_equal(c->zero_optimization.stage, 3);
    assert_int_equal(c->zero_optimization.stage3_prefetch_bucket_size, 50000000);
    assert_int_equal(c->zero_optimization.stage3_max_live_parameters, 1000000000);
    assert_int_equal(c->zero_optimization.sub_group_size, 100000000);
    assert_int_equal(c->zero_optimization.offload_optimizer.device, ZO_OFFLOAD_NVME);
    assert_string_equal(c->zero_optimization.offload_optimizer.nvme_path, "/mnt/nvme0");
    assert_int_equal(c->zero_optimization.offload_optimizer.pin_memory, 1);
    assert_int_equal(c->zero_optimization.offload_optimizer.pipeline_read, 1);
    assert_int_equal(c->zero_optimization.offload_optimizer.pipeline_write, 1);
    assert_int_equal(c->zero_optimization.offload_param.device, ZO_OFFLOAD_CPU);
    assert_string_equal(c->zero_optimization.offload_param.nvme_path, "");
    assert_int_equal(c->zero_optimization.offload_param.buffer_size, 100000000);
    assert_int_equal(c->zero_optimization.offload_param.max_in_cpu, 1000000000);
    assert_int_equal(c->aio.block_size, 262144);
    assert_int_equal(c->aio.queue_depth, 32);
    assert_int_equal(c->aio.intra_op_parallelism, 2);
    assert_int_equal(c->aio.overlap_events, 1);
    assert_int_equal(c->zoffload.device_mem, 20LL << 30);
    assert_int_equal(c->zoffload.host_mem, 64LL << 30);
    assert_int_equal(c->zoffload.chunk_size, 64LL << 20);
    assert_int_equal(c->zoffload.optimizer_mode, ZO_OPTIM_OVERLAP);
    assert_int_equal(c->zoffload.prefetch_lookahead, 3);
    assert_int_equal(c->zoffload.n_nvme_paths, 2);
    assert_string_equal(c->zoffload.nvme_paths[1], "/mnt/nvme1");
    assert_int_equal(c->zoffload.optimizer_state_dtype, ZO_DTYPE_BF16);
}

typedef struct warn_log {
    int n;
    char last[256];
} warn_log;

static void capture_warnings(zo_log_level level, const char *subsys, const char *msg, void *user)
{
    warn_log *w = user;
    if (level == ZO_LOG_WARN && strcmp(subsys, "config") == 0) {
        w->n++;
        snprintf(w->last, sizeof w->last, "%s", msg);
    }
}

static void test_full_config_and_ignored_keys(void **state)
{
    (void)state;
    warn_log w = {0};
    zo_log_set_callback(capture_warnings, &w);
    zo_train_config cfg = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(full_config, 1, &cfg, NULL));
    zo_log_set_callback(NULL, NULL);
    check_full(&cfg, 1);
    /* Keys with no effect that ask for nothing (false, or DeepSpeed's
     * default true) are accepted silently. */
    assert_int_equal(cfg.n_ignored, 0);
    assert_int_equal(w.n, 0);
    /* One warning per ignored key that asks for something, and the same keys
     * listed in the result. */
    const char *const on[] = {"zero_optimization.reduce_bucket_size=5e8",
                              "wall_clock_breakdown=true", "flops_profiler={\"enabled\": true}",
                              "qqq_note=1", NULL};
    zo_log_set_callback(capture_warnings, &w);
    zo_train_config c3 = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(full_config, 1, &c3, on));
    zo_log_set_callback(NULL, NULL);
    assert_int_equal(c3.n_ignored, 4);
    assert_int_equal(w.n, 4);
    assert_string_equal(c3.ignored[0], "qqq_note"); /* unknown, no near-miss */
    assert_string_equal(c3.ignored[1], "zero_optimization.reduce_bucket_size");
    assert_string_equal(c3.ignored[2], "wall_clock_breakdown");
    assert_string_equal(c3.ignored[3], "flops_profiler");
    assert_string_equal(
        w.last, "'flops_profiler' is a DeepSpeed option that has no effect in zoffload; ignored");

    zo_train_config cfg2 = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(full_config, 2, &cfg2, NULL));
    check_full(&cfg2, 2);
}

static void test_defaults_and_variants(void **state)
{
    (void)state;
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_micro_batch_size_per_gpu\": 2}", 1, &c, NULL));
    /* DeepSpeed's defaults. */
    assert_int_equal(c.train_batch_size, 2);
    assert_int_equal(c.gradient_accumulation_steps, 1);
    assert_int_equal(c.steps_per_print, 10);
    assert_true(c.gradient_clipping == 0.0);
    assert_int_equal(c.optimizer.type, ZO_OPTIMIZER_ADAM);
    assert_true(c.optimizer.lr == 1e-3 && c.optimizer.eps == 1e-8 && c.optimizer.betas[1] == 0.999);
    assert_int_equal(c.optimizer.decoupled_weight_decay,
                     1); /* DeepSpeed's Adam is AdamW by default */
    assert_int_equal(c.scheduler.type, ZO_SCHEDULER_NONE);
    assert_true(c.fp16.loss_scale == 0.0);
    assert_int_equal(c.fp16.initial_scale_power, 16);
    assert_int_equal(c.fp16.loss_scale_window, 1000);
    assert_int_equal(c.fp16.hysteresis, 2);
    assert_true(c.fp16.min_loss_scale == 1.0);
    assert_int_equal(c.zero_optimization.stage, 0);
    assert_int_equal(c.zero_optimization.offload_optimizer.device, ZO_OFFLOAD_NONE);
    assert_int_equal(c.zero_optimization.offload_optimizer.buffer_count, 4);
    assert_int_equal(c.zero_optimization.offload_param.buffer_count, 5);
    assert_int_equal(c.aio.block_size, 1048576);
    assert_int_equal(c.aio.queue_depth, 8);
    assert_int_equal(c.aio.single_submit, 0);
    assert_int_equal(c.aio.overlap_events, 1);
    assert_int_equal(c.zoffload.optimizer_mode, ZO_OPTIM_SYNC);
    assert_int_equal(c.n_ignored, 0);

    /* Adam with adam_w_mode false is classic Adam (L2 in the gradient). */
    zo_train_config a = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"ADAM\", "
                              "\"params\": {\"adam_w_mode\": false, \"amsgrad\": false}}}",
                              1, &a, NULL));
    assert_int_equal(a.optimizer.type, ZO_OPTIMIZER_ADAM);
    assert_int_equal(a.optimizer.decoupled_weight_decay, 0);

    /* Hugging Face "auto" values, the bfloat16 alias, WarmupDecayLR. */
    zo_train_config h = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(
        "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 4, "
        "\"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", "
        "\"bfloat16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"AdamW\", "
        "\"params\": {\"lr\": \"auto\", \"betas\": \"auto\", \"weight_decay\": 0.01}}, "
        "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_max_lr\": "
        "\"auto\", \"warmup_num_steps\": 10, \"total_num_steps\": 100}}, "
        "\"zero_optimization\": {\"stage3_prefetch_bucket_size\": \"auto\"}}",
        4, &h, NULL));
    assert_int_equal(h.train_batch_size, 16);
    assert_int_equal(h.gradient_accumulation_steps, 1);
    assert_int_equal(h.bf16.enabled, 1);
    assert_true(h.optimizer.lr == 1e-3 && h.optimizer.betas[0] == 0.9 &&
                h.optimizer.weight_decay == 0.01);
    assert_int_equal(h.scheduler.type, ZO_SCHEDULER_WARMUP_DECAY_LR);
    assert_true(h.scheduler.warmup_max_lr == 1e-3);
    assert_int_equal(h.scheduler.total_num_steps, 100);
    assert_int_equal(h.zero_optimization.stage3_prefetch_bucket_size, 50000000);
}

/* DeepSpeedZeroConfig's field names and their stage3_ aliases, its value
 * ranges, "auto" on any zero_optimization key, the deprecated cpu_offload
 * keys as DeepSpeed maps them. */
static void test_deepspeed_names_and_aliases(void **state)
{
    (void)state;
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(
        "{\"train_batch_size\": 8, \"torch_autocast\": {\"enabled\": false}, "
        "\"bf16\": {\"enabled\": true, \"check_grad_overflow\": false}, "
        "\"zero_optimization\": {\"stage\": 3, \"max_live_parameters\": 7, "
        "\"stage3_max_reuse_distance\": 9, \"prefetch_bucket_size\": 11, "
        "\"param_persistence_threshold\": 13, \"stage3_model_persistence_threshold\": 1, "
        "\"sub_group_size\": 0, \"module_granularity_threshold\": 0, "
        "\"allgather_sequential\": false, \"stage3_use_all_reduce_for_fetch_params\": false, "
        "\"enable_sanity_checks\": false, \"zeropp_loco_param\": null, "
        "\"offload_param\": {\"device\": \"cpu\", \"buffer_size\": \"auto\", "
        "\"buffer_count\": 0}, \"offload_optimizer\": {\"device\": \"cpu\", "
        "\"super_offload\": false, \"pin_memory\": \"auto\"}, \"reduce_bucket_size\": \"auto\"}}",
        1, &c, NULL));
    assert_int_equal(c.zero_optimization.stage3_max_live_parameters, 7);
    assert_int_equal(c.zero_optimization.stage3_max_reuse_distance, 9);
    assert_int_equal(c.zero_optimization.stage3_prefetch_bucket_size, 11);
    assert_int_equal(c.zero_optimization.stage3_param_persistence_threshold, 13);
    assert_int_equal(c.zero_optimization.sub_group_size, 0);
    assert_int_equal(c.zero_optimization.offload_param.buffer_size, 100000000);
    assert_int_equal(c.zero_optimization.offload_param.buffer_count, 0);
    assert_int_equal(c.n_auto, 3);
    assert_string_equal(c.auto_keys[0], "zero_optimization.offload_optimizer.pin_memory");
    assert_string_equal(c.auto_keys[1], "zero_optimization.offload_param.buffer_size");
    assert_string_equal(c.auto_keys[2], "zero_optimization.reduce_bucket_size");

    /* cpu_offload: the optimizer on the host; cpu_offload_param: the params. */
    const char *const deprecated[] = {"\"cpu_offload\": true",
                                      "\"cpu_offload_param\": true, \"cpu_offload\": false"};
    for (int i = 0; i < 2; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, %s}}",
                 deprecated[i]);
        zo_train_config o = ZO_TRAIN_CONFIG_INIT;
        ZO_ASSERT_OK(resolve_text(json, 1, &o, NULL));
        assert_int_equal(o.zero_optimization.offload_optimizer.device,
                         i == 0 ? ZO_OFFLOAD_CPU : ZO_OFFLOAD_NONE);
        assert_int_equal(o.zero_optimization.offload_param.device,
                         i == 1 ? ZO_OFFLOAD_CPU : ZO_OFFLOAD_NONE);
    }

    static const bad_case bad[] = {
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"max_live_parameters\": 1, "
         "\"stage3_max_live_parameters\": 2}}",
         "'zero_optimization.max_live_parameters' and 'stage3_max_live_parameters' name the "
         "same setting; give only one"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"cpu_offload\": true, "
         "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}}",
         "'zero_optimization.cpu_offload' (deprecated) and 'zero_optimization.offload_optimizer' "
         "are both given; give only 'zero_optimization.offload_optimizer'"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"cpu_offload_params\": true}}",
         "unknown key 'zero_optimization.cpu_offload_params'; did you mean 'cpu_offload_param'?"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"sub_group_size\": -1}}",
         "'zero_optimization.sub_group_size': expected an integer >= 0, found -1"},
    };
    expect_bad_cases(bad, sizeof bad / sizeof bad[0]);
}

/* Features zoffload lacks: refused by name when on, with the nearest
 * alternative; silent when off; trained without when the user says so. */
static void test_unsupported_features(void **state)
{
    (void)state;
    static const bad_case bad[] = {
        {"{\"train_batch_size\": 8, \"sequence_parallel_size\": 2}",
         "'sequence_parallel_size' is on, but sequence parallelism (Ulysses: all-to-all over the "
         "heads) is not supported by zoffload; the nearest it has is "
         "'tensor_parallel.autotp_size' with 'zoffload.sequence_parallel' (Megatron's sequence "
         "parallelism inside the tensor-parallel group), or a longer --seq on one rank; remove "
         "it or turn it off, or set 'zoffload.ignore_unsupported' to true to train without it"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"zenflow\": {\"topk_ratio\": 0.1}}}",
         "'zero_optimization.zenflow' is on, but ZenFlow's stall-free offloading that updates "
         "only the top-k gradients per step is not supported by zoffload; the nearest it has is "
         "'zoffload.optimizer_mode': \"overlap\" (exact) or \"dpu\"; remove it or turn it off, or "
         "set 'zoffload.ignore_unsupported' to true to train without it"},
        {"{\"train_batch_size\": 8, \"bf16\": {\"enabled\": true, "
         "\"bf16_master_weights_and_grads\": true}}",
         "'bf16.bf16_master_weights_and_grads' is on, but bf16 master weights and gradients is "
         "not supported by zoffload; the nearest it has is zoffload's fp32 master weights (the "
         "default); remove it or turn it off, or set 'zoffload.ignore_unsupported' to true to "
         "train without it"},
        {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
         "{\"max_grad_norm\": 1.0}}}",
         "'optimizer.params.max_grad_norm' is not supported by zoffload (DeepSpeed refuses it as "
         "an optimizer parameter too); use 'gradient_clipping'"},
        {"{\"train_batch_size\": 8, \"compression_training\": {\"weight_quantization\": "
         "{\"shared_parameters\": {\"enabled\": true}}}}",
         "'compression_training' is on, but quantization-aware training, pruning and layer "
         "reduction is not supported by zoffload; remove it or turn it off, or set "
         "'zoffload.ignore_unsupported' to true to train without it"},
        {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitAdam\"}}",
         "'optimizer.type' \"OneBitAdam\" is not supported by zoffload, which trains with Adam and "
         "AdamW (its CPU Adam); use \"AdamW\""},
        {"{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"OneCycle\"}}",
         "'scheduler.type' \"OneCycle\" is not supported by zoffload; its schedules are WarmupLR, "
         "WarmupDecayLR and WarmupCosineLR"},
    };
    expect_bad_cases(bad, sizeof bad / sizeof bad[0]);
    /* Off: accepted without a word. */
    warn_log w = {0};
    zo_log_set_callback(capture_warnings, &w);
    zo_train_config off = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(
        "{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": 1}, "
        "\"sequence_parallel_size\": 1, \"progressive_layer_drop\": {\"enabled\": false, "
        "\"theta\": 0.5}, \"compression_training\": {\"weight_quantization\": "
        "{\"shared_parameters\": {\"enabled\": false}, \"different_groups\": {\"wq1\": "
        "{\"params\": {\"start_bits\": 8}}}}}, \"torch_autocast\": {\"enabled\": false}, "
        "\"amp\": {\"enabled\": false}, \"bf16\": {\"bf16_master_weights_and_grads\": false}}",
        1, &off, NULL));
    assert_int_equal(w.n, 0);
    assert_int_equal(off.n_ignored, 0);
    /* zoffload.ignore_unsupported: trained without, warned, listed. */
    zo_train_config ig = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"sequence_parallel_size\": 4, "
                              "\"zoffload\": {\"ignore_unsupported\": true}}",
                              1, &ig, NULL));
    zo_log_set_callback(NULL, NULL);
    assert_int_equal(ig.zoffload.ignore_unsupported, 1);
    assert_int_equal(ig.n_ignored, 1);
    assert_string_equal(ig.ignored[0], "sequence_parallel_size");
    assert_int_equal(w.n, 1);
    assert_string_equal(w.last, "'sequence_parallel_size' (sequence parallelism (Ulysses: "
                                "all-to-all over the heads)) is not supported by zoffload; "
                                "training without it, as 'zoffload.ignore_unsupported' asks");
}

/* DeepSpeed's tensor_parallel section sets zo-train's --tensor-parallel:
 * autotp_size (AutoTP training) or its inference name tp_size, "auto" or
 * absent for none; zoffload.sequence_parallel its --sequence-parallel. */
static void test_tensor_parallel_keys(void **state)
{
    (void)state;
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(
        resolve_text("{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": 4}, "
                     "\"zoffload\": {\"sequence_parallel\": true}}",
                     1, &c, NULL));
    assert_int_equal(c.tensor_parallel.autotp_size, 4);
    assert_int_equal(c.zoffload.sequence_parallel, 1);
    zo_train_config a = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"tensor_parallel\": {\"tp_size\": 2}}", 1,
                              &a, NULL));
    assert_int_equal(a.tensor_parallel.autotp_size, 2);
    assert_int_equal(a.zoffload.sequence_parallel, 0);
    zo_train_config n = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(
        resolve_text("{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": \"auto\"}}",
                     1, &n, NULL));
    assert_int_equal(n.tensor_parallel.autotp_size, 0);
    static const bad_case bad[] = {
        {"{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": 128}}",
         "'tensor_parallel.autotp_size': expected an integer in [0, 64] or \"auto\", found 128"},
        {"{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": 2, \"tp_size\": 2}}",
         "'tensor_parallel.tp_size' and 'autotp_size' name the same setting; give only one"},
        {"{\"train_batch_size\": 8, \"tensor_parallel\": {\"autotp_size\": \"2\"}}",
         "'tensor_parallel.autotp_size': expected an integer in [0, 64] or \"auto\", found string "
         "\"2\""},
        {"{\"train_batch_size\": 8, \"tensor_parallel\": {\"tp_sise\": 2}}",
         "unknown key 'tensor_parallel.tp_sise'; did you mean 'tp_size'?"},
        {"{\"train_batch_size\": 8, \"zoffload\": {\"sequence_parallel\": 2}}",
         "'zoffload.sequence_parallel': expected true or false, found 2"},
    };
    expect_bad_cases(bad, sizeof bad / sizeof bad[0]);
}

/* zoffload.mlp_chunk_bytes: bytes or a unit string as zo-train's
 * --mlp-chunk-bytes, "auto" and 0 its default (0); written back by
 * zo_train_config_to_json as read. */
static void test_mlp_chunk_bytes_key(void **state)
{
    (void)state;
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"zoffload\": "
                              "{\"mlp_chunk_bytes\": \"1MiB\"}}",
                              1, &c, NULL));
    assert_int_equal(c.zoffload.mlp_chunk_bytes, 1 << 20);
    char *json = NULL;
    ZO_ASSERT_OK(zo_train_config_to_json(&c, 2, &json));
    assert_non_null(strstr(json, "\"mlp_chunk_bytes\": 1048576"));
    free(json);
    zo_train_config a = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"zoffload\": "
                              "{\"mlp_chunk_bytes\": \"auto\"}}",
                              1, &a, NULL));
    assert_int_equal(a.zoffload.mlp_chunk_bytes, 0);
    static const bad_case bad[] = {
        {"{\"train_batch_size\": 8, \"zoffload\": {\"mlp_chunk_bytes\": -4096}}",
         "'zoffload.mlp_chunk_bytes': expected an integer >= 0 (bytes, or a string such as "
         "\"24GiB\") or \"auto\", found -4096"},
        {"{\"train_batch_size\": 8, \"zoffload\": {\"mlp_chunk_bytes\": \"1 MiBs\"}}",
         "'zoffload.mlp_chunk_bytes': expected an integer >= 0 (bytes, or a string such as "
         "\"24GiB\") or \"auto\", found string \"1 MiBs\""},
    };
    expect_bad_cases(bad, sizeof bad / sizeof bad[0]);
}

/* Unknown top-level keys: a warning when they are no near-miss of a real
 * key (DeepSpeed ignores them), an error when they look like a typo. */
static void test_unknown_top_level_keys(void **state)
{
    (void)state;
    warn_log w = {0};
    zo_log_set_callback(capture_warnings, &w);
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8, \"_comment\": \"x\", "
                              "\"cuda_visible_devices\": \"0,1\"}",
                              1, &c, NULL));
    zo_log_set_callback(NULL, NULL);
    assert_int_equal(c.n_ignored, 2);
    assert_string_equal(c.ignored[0], "_comment");
    assert_string_equal(c.ignored[1], "cuda_visible_devices");
    assert_int_equal(w.n, 2);
    assert_string_equal(w.last, "unknown top-level key 'cuda_visible_devices' ignored (it is no "
                                "DeepSpeed key zoffload knows)");
    zo_train_config t = ZO_TRAIN_CONFIG_INIT;
    assert_int_equal(
        resolve_text("{\"train_batch_size\": 8, \"gradient_cliping\": 1}", 1, &t, NULL),
        ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "unknown key 'gradient_cliping'; did you mean 'gradient_clipping'?");
}

/* DeepSpeed's WarmupLR and WarmupDecayLR rise to the optimizer's lr when
 * warmup_max_lr is absent or "auto" (Hugging Face fills the same lr). */
static void test_warmup_max_lr_is_the_optimizer_lr(void **state)
{
    (void)state;
    const char *fmt = "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", "
                      "\"params\": {\"lr\": 5e-5}}, \"scheduler\": {\"type\": \"WarmupLR\", "
                      "\"params\": {%s}}}";
    const char *params[] = {"", "\"warmup_max_lr\": \"auto\"", "\"warmup_max_lr\": 0.002"};
    const double want[] = {5e-5, 5e-5, 0.002};
    for (int i = 0; i < 3; i++) {
        char json[512];
        snprintf(json, sizeof json, fmt, params[i]);
        zo_train_config c = ZO_TRAIN_CONFIG_INIT;
        ZO_ASSERT_OK(resolve_text(json, 1, &c, NULL));
        assert_true(c.scheduler.warmup_max_lr == want[i]);
        assert_int_equal(c.n_auto, i == 1);
    }
}

/* ---- batch-size arithmetic, as DeepSpeed does it ---- */

typedef struct batch_case {
    int64_t tb, mb, ga, world;         /* 0 = not given */
    int64_t want_tb, want_mb, want_ga; /* 0 = an error is expected */
} batch_case;

static const batch_case batch_cases[] = {
    {32, 4, 8, 1, 32, 4, 8}, {32, 4, 0, 1, 32, 4, 8}, {32, 4, 0, 2, 32, 4, 4},
    {32, 0, 4, 2, 32, 4, 4}, {0, 4, 4, 2, 32, 4, 4},  {32, 0, 0, 4, 32, 8, 1},
    {0, 4, 0, 4, 16, 4, 1},  {12, 0, 0, 8, 0, 0, 0},  {10, 3, 0, 1, 0, 0, 0},
    {33, 4, 0, 2, 0, 0, 0},  {32, 0, 3, 2, 0, 0, 0},  {32, 4, 4, 2, 32, 4, 4},
    {32, 4, 4, 4, 0, 0, 0},  {0, 0, 4, 1, 0, 0, 0},   {7, 7, 0, 1, 7, 7, 1},
    {24, 0, 3, 4, 24, 2, 3},
};

static void test_batch_arithmetic(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof batch_cases / sizeof batch_cases[0]; i++) {
        const batch_case *b = &batch_cases[i];
        char json[256];
        int n = snprintf(json, sizeof json, "{\"steps_per_print\": 1");
        if (b->tb)
            n += snprintf(json + n, sizeof json - (size_t)n, ", \"train_batch_size\": %lld",
                          (long long)b->tb);
        if (b->mb)
            n += snprintf(json + n, sizeof json - (size_t)n,
                          ", \"train_micro_batch_size_per_gpu\": %lld", (long long)b->mb);
        if (b->ga)
            n += snprintf(json + n, sizeof json - (size_t)n,
                          ", \"gradient_accumulation_steps\": %lld", (long long)b->ga);
        snprintf(json + n, sizeof json - (size_t)n, "}");
        zo_train_config c = ZO_TRAIN_CONFIG_INIT;
        zo_status st = resolve_text(json, b->world, &c, NULL);
        if (!b->want_tb) {
            if (st != ZO_ERR_CONFIG)
                fail_msg("case %zu (%s, world %lld) resolved", i, json, (long long)b->world);
            continue;
        }
        if (st != ZO_OK)
            fail_msg("case %zu (%s): %s", i, json, zo_last_error());
        assert_int_equal(c.train_batch_size, b->want_tb);
        assert_int_equal(c.train_micro_batch_size_per_gpu, b->want_mb);
        assert_int_equal(c.gradient_accumulation_steps, b->want_ga);
        assert_int_equal(c.train_batch_size, c.train_micro_batch_size_per_gpu *
                                                 c.gradient_accumulation_steps * b->world);
    }
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 12}", 8, &c, NULL), ZO_ERR_CONFIG);
    assert_string_equal(error_text(), "train_batch_size is not equal to micro_batch_per_gpu * "
                                      "gradient_acc_step * world_size: 12 != 1 * 1 * 8");
}

/* ---- command-line overrides ---- */

static void test_overrides(void **state)
{
    (void)state;
    const char *file =
        "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, "
        "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}";
    const char *ov[] = {"zero_optimization.offload_optimizer.device=nvme",
                        "zero_optimization.offload_optimizer.nvme_path=/mnt/fast",
                        "train_micro_batch_size_per_gpu=8",
                        "zoffload.device_mem=8GiB",
                        "optimizer.type=AdamW",
                        "optimizer.params.lr=1e-4",
                        "fp16.enabled=true",
                        "zero_optimization.stage=1",
                        "zero_optimization.stage=3", /* the last one wins */
                        NULL};
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(file, 1, &c, ov));
    assert_int_equal(c.zero_optimization.offload_optimizer.device, ZO_OFFLOAD_NVME);
    assert_string_equal(c.zero_optimization.offload_optimizer.nvme_path, "/mnt/fast");
    assert_int_equal(c.train_micro_batch_size_per_gpu, 8);
    assert_int_equal(c.gradient_accumulation_steps,
                     4); /* re-derived from the overridden micro batch */
    assert_int_equal(c.zoffload.device_mem, 8LL << 30);
    assert_int_equal(c.optimizer.type, ZO_OPTIMIZER_ADAMW);
    assert_true(c.optimizer.lr == 1e-4);
    assert_int_equal(c.fp16.enabled, 1);
    assert_int_equal(c.zero_optimization.stage, 3);

    /* Overrides are checked like the file. */
    const char *typo[] = {"zoffload.devce_mem=1GiB", NULL};
    ZO_ASSERT_ST(resolve_text(file, 1, &c, typo), ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "unknown key 'zoffload.devce_mem'; did you mean 'device_mem'?");
    const char *bad_type[] = {"zero_optimization.stage=three", NULL};
    ZO_ASSERT_ST(resolve_text(file, 1, &c, bad_type), ZO_ERR_CONFIG);
    assert_string_equal(
        error_text(),
        "'zero_optimization.stage': expected an integer in [0, 3], found string \"three\"");
    const char *into_scalar[] = {"zero_optimization.stage.x=1", NULL};
    ZO_ASSERT_ST(resolve_text(file, 1, &c, into_scalar), ZO_ERR_CONFIG);
    assert_string_equal(
        error_text(),
        "override 'zero_optimization.stage.x': 'stage' in the config is 2, not an object");
    const char *no_eq[] = {"fp16.enabled", NULL};
    ZO_ASSERT_ST(resolve_text(file, 1, &c, no_eq), ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "override 'fp16.enabled': expected KEY=VALUE, e.g. 'fp16.enabled=true'");
    const char *bad_path[] = {"fp16..enabled=true", NULL};
    ZO_ASSERT_ST(resolve_text(file, 1, &c, bad_path), ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "override key 'fp16..enabled': expected a dotted path such as "
                        "'zero_optimization.offload_optimizer.device'");
    /* A total_num_steps left to the command line. */
    const char *steps[] = {"scheduler.params.total_num_steps=500", NULL};
    ZO_ASSERT_OK(
        resolve_text("{\"train_batch_size\": 1, \"scheduler\": {\"type\": \"WarmupDecayLR\", "
                     "\"params\": {\"total_num_steps\": \"auto\"}}}",
                     1, &c, steps));
    assert_int_equal(c.scheduler.total_num_steps, 500);
}

/* ---- serialization round trips ---- */

static char *to_json(const zo_train_config *c)
{
    char *s = NULL;
    ZO_ASSERT_OK(zo_train_config_to_json(c, 2, &s));
    return s;
}

static void round_trip(const char *json, int64_t world)
{
    zo_train_config a = ZO_TRAIN_CONFIG_INIT, b = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(json, world, &a, NULL));
    char *sa = to_json(&a);
    ZO_ASSERT_OK(resolve_text(sa, world, &b, NULL));
    char *sb = to_json(&b);
    assert_string_equal(sa, sb);
    assert_int_equal(b.n_ignored, 0); /* the effective config has no ignored keys */
    /* Every effective field survives, doubles bit for bit. */
    b.n_ignored = a.n_ignored;
    memcpy(b.ignored, a.ignored, sizeof a.ignored);
    assert_int_equal(a.train_batch_size, b.train_batch_size);
    assert_int_equal(a.gradient_accumulation_steps, b.gradient_accumulation_steps);
    assert_memory_equal(&a.optimizer, &b.optimizer, sizeof a.optimizer);
    assert_memory_equal(&a.scheduler, &b.scheduler, sizeof a.scheduler);
    assert_memory_equal(&a.fp16, &b.fp16, sizeof a.fp16);
    assert_memory_equal(&a.zero_optimization, &b.zero_optimization, sizeof a.zero_optimization);
    assert_memory_equal(&a.aio, &b.aio, sizeof a.aio);
    assert_memory_equal(&a.zoffload, &b.zoffload, sizeof a.zoffload);
    free(sa);
    free(sb);
}

static void test_round_trip(void **state)
{
    (void)state;
    round_trip(full_config, 1);
    round_trip(full_config, 2);
    round_trip("{\"train_micro_batch_size_per_gpu\": 1}", 1);
    round_trip("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale\": 128.5, "
               "\"consecutive_hysteresis\": true}, \"optimizer\": {\"type\": \"Adam\", \"params\": "
               "{\"lr\": 0.1, \"eps\": 1.2345678901234567e-7, \"adam_w_mode\": false}}, "
               "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1e-6}}}",
               1);
    /* Readable output: shortest exact reals. */
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8}", 1, &c, NULL));
    char *s = NULL;
    ZO_ASSERT_OK(zo_train_config_to_json(&c, 0, &s));
    assert_non_null(strstr(s, "\"betas\":[0.9,0.999]"));
    assert_non_null(strstr(s, "\"nvme_path\":null"));
    assert_null(strstr(s, "\"scheduler\""));
    free(s);
    /* int8 states: ZO_DTYPE_I8 in the struct, "int8" in the JSON */
    round_trip("{\"train_batch_size\": 8, \"zoffload\": {\"optimizer_state_dtype\": \"int8\"}}", 1);
    c = (zo_train_config)ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8}", 1, &c, NULL));
    const char *ov[] = {"zoffload.optimizer_state_dtype=int8", NULL};
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8}", 1, &c, ov));
    assert_int_equal(c.zoffload.optimizer_state_dtype, ZO_DTYPE_I8);
    ZO_ASSERT_OK(zo_train_config_to_json(&c, 0, &s));
    assert_non_null(strstr(s, "\"optimizer_state_dtype\":\"int8\""));
    free(s);
}

/* ---- files and argument errors ---- */

/* zoffload.placement: "auto", or per-state byte caps per tier; strict keys
 * with suggestions; overrides reach into it; it survives a round trip. */
static void test_placement(void **state)
{
    (void)state;
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    const char *caps =
        "{\"train_batch_size\": 8, \"zoffload\": {\"placement\": {\"optimizer\": "
        "{\"host\": \"8GiB\", \"device\": 4096}, \"params\": {\"host\": \"2GiB\"}}}}";
    ZO_ASSERT_OK(resolve_text(caps, 1, &c, NULL));
    assert_int_equal(c.zoffload.placement.is_auto, 0);
    assert_int_equal(c.zoffload.placement.optimizer.host, 8LL << 30);
    assert_int_equal(c.zoffload.placement.optimizer.device, 4096);
    assert_int_equal(c.zoffload.placement.params.host, 2LL << 30);
    assert_int_equal(c.zoffload.placement.params.device, 0);
    round_trip(caps, 1);
    const char *aut = "{\"train_batch_size\": 8, \"zoffload\": {\"placement\": \"auto\"}}";
    zo_train_config d = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text(aut, 1, &d, NULL));
    assert_int_equal(d.zoffload.placement.is_auto, 1);
    round_trip(aut, 1);
    const char *ov[] = {"zoffload.placement.params.device=1MiB", NULL};
    zo_train_config e = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(resolve_text("{\"train_batch_size\": 8}", 1, &e, ov));
    assert_int_equal(e.zoffload.placement.params.device, 1LL << 20);
    zo_train_config f = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_ST(
        resolve_text("{\"train_batch_size\": 8, \"zoffload\": {\"placement\": {\"optimizer\": "
                     "{\"hots\": 1}}}}",
                     1, &f, NULL),
        ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "unknown key 'zoffload.placement.optimizer.hots'; did you mean 'host'?");
    ZO_ASSERT_ST(
        resolve_text(
            "{\"train_batch_size\": 8, \"zoffload\": {\"placement\": {\"optimiser\": {}}}}", 1, &f,
            NULL),
        ZO_ERR_CONFIG);
    assert_string_equal(error_text(),
                        "unknown key 'zoffload.placement.optimiser'; did you mean 'optimizer'?");
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 8, \"zoffload\": {\"placement\": \"fast\"}}",
                              1, &f, NULL),
                 ZO_ERR_CONFIG);
    if (!strstr(error_text(), "'zoffload.placement': expected \"auto\" or an object"))
        fail_msg("%s", error_text());
}

static void test_files_and_args(void **state)
{
    (void)state;
    char path[] = "/tmp/zo_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": tru}\n}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_ST(zo_train_config_load(path, 1, &c), ZO_ERR_CONFIG);
    char want[256];
    snprintf(want, sizeof want, "%s:3:25: invalid JSON: invalid token near 'tru'", path);
    assert_string_equal(error_text(), want);
    unlink(path);
    ZO_ASSERT_ST(zo_train_config_load("/nonexistent/zo.json", 1, &c), ZO_ERR_NOT_FOUND);

    zo_train_config small = ZO_TRAIN_CONFIG_INIT;
    small.struct_size = 8;
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 8}", 1, &small, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(resolve_text("{\"train_batch_size\": 8}", 0, &c, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_config_init(NULL), ZO_ERR_INVALID_ARG);
    zo_config_free(NULL);
    /* A caller-built struct with an invalid enum is refused by the serializer. */
    zo_train_config bad = ZO_TRAIN_CONFIG_INIT;
    bad.zero_optimization.offload_param.device = (zo_offload_device)7;
    char *json = NULL;
    ZO_ASSERT_ST(zo_train_config_to_json(&bad, 0, &json), ZO_ERR_INVALID_ARG);
    assert_non_null(
        strstr(zo_last_error(),
               "'zero_optimization.offload_param.device' holds 7, which is not a valid value"));
    bad = (zo_train_config)ZO_TRAIN_CONFIG_INIT;
    bad.scheduler.type = ZO_SCHEDULER_WARMUP_LR;
    bad.scheduler.warmup_type = (zo_warmup_type)-1;
    ZO_ASSERT_ST(zo_train_config_to_json(&bad, 0, &json), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "'scheduler.params.warmup_type' holds -1"));
    assert_null(json);
    assert_string_equal(zo_offload_device_name(ZO_OFFLOAD_NVME), "nvme");
    assert_string_equal(zo_scheduler_type_name(ZO_SCHEDULER_WARMUP_COSINE_LR), "WarmupCosineLR");
    assert_string_equal(zo_optim_mode_name(ZO_OPTIM_DPU), "dpu");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_configs),
        cmocka_unit_test(test_sparse_attention),
        cmocka_unit_test(test_full_config_and_ignored_keys),
        cmocka_unit_test(test_defaults_and_variants),
        cmocka_unit_test(test_deepspeed_names_and_aliases),
        cmocka_unit_test(test_unsupported_features),
        cmocka_unit_test(test_tensor_parallel_keys),
        cmocka_unit_test(test_mlp_chunk_bytes_key),
        cmocka_unit_test(test_unknown_top_level_keys),
        cmocka_unit_test(test_warmup_max_lr_is_the_optimizer_lr),
        cmocka_unit_test(test_batch_arithmetic),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_files_and_args),
        cmocka_unit_test(test_placement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
