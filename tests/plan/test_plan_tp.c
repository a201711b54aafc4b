/* zo-plan's tensor parallelism (tools/zo-plan/tensor.h) against zo-train
 * --tensor-parallel T run under mpirun on the cpu device:
 * - memory: rank 0's peak_bytes (device, pinned, host, NVMe) equal the
 *   planned stage's engine footprint, byte for byte;
 * - communication: the bytes OpenMPI's pml monitoring counts between the
 *   ranks of each tensor group in one step (a 2-step run less a 1-step run)
 *   equal zo-plan's count for the job, at T = 2 and at T = 2 x D = 2, and at
 *   T = 4 for a Llama model with one key/value head (shared by the 4 ranks:
 *   gathered, its gradient reduce-scattered), biases and a tied head;
 * - the 70B preset on 8 x 24 GiB GPUs of one node with 256 GiB of RAM: a
 *   grid with T > 1 fits, printed beside the best without tensor parallelism;
 * - T that does not split the model, fp16 and a world size the grid does not
 *   divide are refused by name. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan_test_util.h"
#include "zo_test.h"

#if !defined(ZP_EXE) || !defined(ZT_EXE)
#error "ZP_EXE and ZT_EXE (the zo-plan and zo-train executables) must be defined"
#endif

/* zo-plan --json args: the document (exit 0 expected). */
static json_t *plan_json(const char *args)
{
    char cmd[2048], out[300];
    snprintf(out, sizeof out, "%s/plan.json", g_dir);
    snprintf(cmd, sizeof cmd, "%s --json %s >%s 2>%s/plan.err", ZP_EXE, args, out, g_dir);
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: exit status %d", cmd, st);
    char *text = plan_test_read(out);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j)
        fail_msg("zo-plan %s: not JSON (%s)", args, err.text);
    free(text);
    return j;
}

static uint64_t u(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("no integer '%s'", key);
    return (uint64_t)json_integer_value(v);
}

/* Bytes the pml monitoring saw between ranks of one tensor group (ranks
 * r / T alike), over the N ranks' profiles prefix.R.prof, less the comm
 * watchdog's 8-byte heartbeats, whose number depends on the time a run
 * takes: the size histogram's bucket 4 holds messages of 8 to 15 bytes
 * (bucket 0 empty ones, bucket k >= 1 sizes [2^(k-1), 2^k)), and no payload
 * of a step falls there (the exact equality below checks it). */
static uint64_t tp_bytes_seen(const char *prefix, int N, int T)
{
    uint64_t total = 0;
    for (int r = 0; r < N; r++) {
        char path[400];
        snprintf(path, sizeof path, "%s.%d.prof", prefix, r);
        char *text = plan_test_read(path);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            int src, dst;
            unsigned long long bytes, msgs, h[5] = {0};
            if (sscanf(line, "E\t%d\t%d\t%llu bytes\t%llu msgs sent\t%llu,%llu,%llu,%llu,%llu",
                       &src, &dst, &bytes, &msgs, &h[0], &h[1], &h[2], &h[3], &h[4]) != 9)
                continue;
            if (src / T == dst / T)
                total += bytes - 8 * h[4];
        }
        free(text);
    }
    return total;
}

static int have_mpirun(void)
{
    return system("command -v mpirun >/dev/null 2>&1") == 0;
}

/* A Llama model directory (config.json, model.safetensors in fp32):
 * 4 query heads of 32, kv_heads key/value heads, q/k/v/o biases, a tied
 * head, 2 blocks, 256 ids; small pseudo-random weights. */
static void write_llama(const char *dir, int kv_heads)
{
    const int dim = 128, ffn = 256, vocab = 256, kvd = 32 * kv_heads;
    char names[40][64];
    int64_t shape[40][2], n = 0;
#define T2(nm, a, b) (snprintf(names[n], 64, "%s", nm), shape[n][0] = a, shape[n++][1] = b)
    T2("model.embed_tokens.weight", vocab, dim);
    for (int l = 0; l < 2; l++) {
        char p[64];
        const char *suffix[] = {
            "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
            "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
            "self_attn.o_proj.bias"};
        const int64_t rows[] = {dim, dim, kvd, kvd, dim, dim, ffn, ffn, dim, dim, kvd, kvd, dim};
        const int64_t cols[] = {0, dim, dim, dim, dim, 0, dim, dim, ffn, 0, 0, 0, 0};
        for (int k = 0; k < 13; k++) {
            snprintf(p, sizeof p, "model.layers.%d.%s", l, suffix[k]);
            T2(p, rows[k], cols[k]);
        }
    }
    T2("model.norm.weight", dim, 0);
#undef T2
    char header[8192];
    int h = snprintf(header, sizeof header, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)shape[i][0] * (uint64_t)(shape[i][1] ? shape[i][1] : 1) * 4;
        if (shape[i][1])
            h += snprintf(header + h, sizeof header - (size_t)h,
                          "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                          "\"data_offsets\":[%llu,%llu]}",
                          i ? "," : "", names[i], (long long)shape[i][0], (long long)shape[i][1],
                          (unsigned long long)off, (unsigned long long)(off + bytes));
        else
            h += snprintf(header + h, sizeof header - (size_t)h,
                          "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                          "\"data_offsets\":[%llu,%llu]}",
                          i ? "," : "", names[i], (long long)shape[i][0], (unsigned long long)off,
                          (unsigned long long)(off + bytes));
        off += bytes;
    }
    h += snprintf(header + h, sizeof header - (size_t)h, "}");
    while (h % 8)
        header[h++] = ' ';
    char path[400];
    snprintf(path, sizeof path, "mkdir -p %s", dir);
    assert_int_equal(system(path), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = (uint64_t)h;
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, (size_t)h, f);
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        int norm = strstr(names[i], "norm.weight") != NULL;
        for (int64_t e = 0; e < shape[i][0] * (shape[i][1] ? shape[i][1] : 1); e++) {
            x = x * 1664525u + 1013904223u;
            float v = (float)((double)(x >> 8) / (1 << 24) - 0.5) * 0.1f + (norm ? 1.0f : 0.0f);
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
            "\"hidden_size\":%d,\"intermediate_size\":%d,\"num_hidden_layers\":2,"
            "\"num_attention_heads\":4,\"num_key_value_heads\":%d,\"vocab_size\":%d,"
            "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"hidden_act\":\"silu\","
            "\"tie_word_embeddings\":true,\"attention_bias\":true,\"torch_dtype\":"
            "\"float32\"}\n",
            dim, ffn, kv_heads, vocab);
    fclose(f);
}

/* zo-plan's grid of T tensor and D data-parallel ranks for model (zo-plan's
 * and zo-train's flags naming it), its command run for 1 and 2 steps under
 * the pml monitoring. */
static void check_grid_of(int T, int D, const char *plan_model, const char *train_model)
{
    if (!have_mpirun())
        skip(); /* no mpirun: zo-train's ranks cannot be launched here */
    const int N = T * D;
    char args[512];
    snprintf(args, sizeof args,
             "%s --device cpu --seq 32 --micro-batch 2 --grad-accum 2 --host-mem 2GiB "
             "--tensor-parallel %d --world-size %d",
             plan_model, T, N);
    json_t *j = plan_json(args);
    json_t *p = json_array_get(json_object_get(json_object_get(j, "pipeline"), "plans"), 0);
    assert_non_null(p);
    assert_true(json_is_true(json_object_get(p, "fits")));
    assert_int_equal(u(p, "tensor_parallel"), T);
    assert_int_equal(u(p, "data_parallel"), D);
    json_t *fp =
        json_object_get(json_array_get(json_object_get(p, "stage_plans"), 0), "engine_footprint");
    uint64_t planned = u(json_object_get(p, "tp"), "all_groups_step_bytes");
    const char *cmd = json_string_value(json_object_get(p, "command"));
    const char *flags = strstr(cmd, "zo-train ");
    assert_non_null(flags);
    flags += strlen("zo-train ");
    if (geteuid() == 0) { /* a container's root: OpenMPI asks for both */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    uint64_t seen[3] = {0};
    for (int steps = 1; steps <= 2; steps++) {
        char prefix[300], out[320], run[4200];
        static int runs; /* each run's own files */
        snprintf(prefix, sizeof prefix, "%s/mon-t%d-d%d-s%d-%d", g_dir, T, D, steps, ++runs);
        snprintf(out, sizeof out, "%s.json", prefix);
        snprintf(run, sizeof run,
                 "mpirun --oversubscribe -np %d --mca pml_monitoring_enable 1 --mca "
                 "pml_monitoring_enable_output 3 --mca pml_monitoring_filename %s %s %s "
                 "--device cpu --steps %d --val-batches 1 --json %s >%s 2>%s.err",
                 N, prefix, ZT_EXE, train_model, steps, flags, out, prefix);
        int st = system(run);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("%s: exit status %d", run, st);
        seen[steps] = tp_bytes_seen(prefix, N, T);
        if (steps == 2) { /* rank 0's peaks: the plan's footprint */
            char *text = plan_test_read(out);
            json_error_t err;
            json_t *r = json_loads(text, JSON_DISABLE_EOF_CHECK, &err);
            if (!r)
                fail_msg("zo-train's output is not JSON (%s)", err.text);
            json_t *peak = json_object_get(r, "peak_bytes");
            const char *tier[4][2] = {
                {"device", "device"}, {"pinned", "pinned"}, {"host", "host"}, {"nvme", "nvme"}};
            for (int k = 0; k < 4; k++)
                if (u(peak, tier[k][0]) != u(fp, tier[k][1]))
                    fail_msg("T %d D %d: %s peak %llu, planned %llu", T, D, tier[k][0],
                             (unsigned long long)u(peak, tier[k][0]),
                             (unsigned long long)u(fp, tier[k][1]));
            json_decref(r);
            free(text);
        }
    }
    uint64_t step = seen[2] - seen[1];
    if (step != planned)
        fail_msg("T %d D %d: the tensor groups sent %llu bytes in a step, zo-plan counts %llu", T,
                 D, (unsigned long long)step, (unsigned long long)planned);
    json_decref(j);
}

static void check_grid(int T, int D)
{
    check_grid_of(T, D, "--preset tiny", "--preset tiny");
}

static void test_t2_bytes_and_memory(void **state)
{
    (void)state;
    check_grid(2, 1);
}

static void test_t2_d2_bytes_and_memory(void **state)
{
    (void)state;
    check_grid(2, 2);
}

/* --sequence-parallel: the reduce-scatters and all-gathers zo-train issues
 * instead of the all-reduces (and the norms' gradients summed), counted as
 * the pml monitoring counts them, at T 2 and T 4 x D 1, and T 2 x D 2. */
static void test_sequence_parallel_bytes_and_memory(void **state)
{
    (void)state;
    check_grid_of(2, 1, "--preset tiny --sequence-parallel", "--preset tiny");
    check_grid_of(4, 1, "--preset tiny --sequence-parallel", "--preset tiny");
    check_grid_of(2, 2, "--preset tiny --sequence-parallel", "--preset tiny");
}

static void test_t4_shared_kv_head_bytes_and_memory(void **state)
{
    (void)state;
    char dir[300], plan_model[400], train_model[400];
    snprintf(dir, sizeof dir, "%s/llama-kv1", g_dir);
    write_llama(dir, 1);
    snprintf(plan_model, sizeof plan_model, "--hf-config %s/config.json", dir);
    snprintf(train_model, sizeof train_model, "--hf-model %s", dir);
    check_grid_of(4, 1, plan_model, train_model);
}

/* The target: the 70B preset on one node of 8 x 24 GiB GPUs and
 * 256 GiB of RAM (the other speeds assumed). */
static void test_70b_on_eight_24gib_gpus(void **state)
{
    (void)state;
    json_t *j = plan_json("--preset 70b --device cuda --gpu-mem 24GiB --host-mem 256GiB "
                          "--nvme-bytes 8TB --world-size 8 --gpus-per-node 8 --tensor-parallel "
                          "auto --pipeline-stages auto --seq 2048 --micro-batch 1 --grad-accum 1");
    json_t *pl = json_object_get(j, "pipeline");
    json_t *rec = json_object_get(pl, "recommended");
    if (!json_is_object(rec))
        fail_msg("no grid of 8 ranks fits the 70B preset");
    assert_true(u(rec, "tensor_parallel") > 1);
    json_t *plans = json_object_get(pl, "plans");
    double best = 0, best_tp1 = 0;
    for (size_t i = 0; i < json_array_size(plans); i++) {
        json_t *q = json_array_get(plans, i);
        assert_int_equal(u(q, "stages") * u(q, "tensor_parallel") * u(q, "data_parallel"), 8);
        if (!json_is_true(json_object_get(q, "fits")))
            continue;
        double t = json_number_value(json_object_get(q, "tokens_per_s"));
        best = t > best ? t : best;
        if (u(q, "tensor_parallel") == 1)
            best_tp1 = t > best_tp1 ? t : best_tp1;
        if (u(q, "tensor_parallel") > 1) /* the tensor group's all-reduces over its node */
            assert_true(json_is_true(json_object_get(json_object_get(q, "tp"), "intra_node")));
    }
    assert_true(json_number_value(json_object_get(rec, "tokens_per_s")) == best);
    json_t *tp1 = json_object_get(pl, "best_without_tp");
    assert_true(json_is_object(tp1));
    assert_true(json_number_value(json_object_get(tp1, "tokens_per_s")) == best_tp1);
    assert_true(best > best_tp1);
    json_decref(j);
}

/* A refusal: exit status non-zero and stderr naming what. */
static void refused(const char *args, const char *want)
{
    char cmd[1024], err[300];
    snprintf(err, sizeof err, "%s/refused.err", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", ZP_EXE, args, err);
    int st = system(cmd);
    char *text = plan_test_read(err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 0 || !strstr(text, want))
        fail_msg("zo-plan %s: exit %d, stderr '%s' (wanted '%s')", args, st, text, want);
    free(text);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("--preset tiny --device cpu --tensor-parallel 3", "query heads");
    refused("--preset tiny --device cpu --tensor-parallel 2 --dtype fp16", "fp16");
    refused("--preset tiny --device cpu --tensor-parallel 2 --world-size 3", "--tensor-parallel 2");
    refused("--preset tiny --device cpu --tensor-parallel x", "--tensor-parallel");
    refused("--preset tiny --device cpu --tensor-parallel auto", "--world-size");
    refused("--preset tiny --device cpu --tensor-parallel 4 --sequence-parallel --seq 30",
            "--seq 30 is not a multiple of 4: use --seq 28 or 32");
    refused("--preset tiny --device cpu --sequence-parallel", "give --tensor-parallel T|auto");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_70b_on_eight_24gib_gpus),
        cmocka_unit_test(test_t2_bytes_and_memory),
        cmocka_unit_test(test_t2_d2_bytes_and_memory),
        cmocka_unit_test(test_t4_shared_kv_head_bytes_and_memory),
        cmocka_unit_test(test_sequence_parallel_bytes_and_memory),
    };
    return cmocka_run_group_tests(tests, plan_test_make_dir, plan_test_remove_dir);
}
