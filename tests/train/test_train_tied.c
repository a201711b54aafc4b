/* A tied head (tie_word_embeddings) trained as one tensor with the embedding.
 *
 * - Its gradient is the untied model's head and embedding gradients summed,
 *   head + embedding (bitwise in fp32, with the untied head set to the
 *   embedding's values); the final norm's is the untied head norm's; every
 *   other gradient and the loss are the untied model's.
 * - The engine holds one tensor fewer, and 8 steps give bitwise the same
 *   losses and weights in every placement (device, host, NVMe, the smallest
 *   device budget) in sync and overlap modes, with layer-major groups (layer
 *   inputs on the device or the host), and in dpu mode across placements.
 * - A checkpoint keeps it tied: resumed, the run continues bitwise; an
 *   untied run refuses it naming the head. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "model.h"
#include "train_test_util.h"
#include "trainer.h"
#include "zo_test.h"
#include "zt_error.h"

#define STEPS 8

static char g_dir[256];

static zt_options tied_options(void)
{
    zt_options o = zt_test_small_options(g_dir, STEPS);
    o.shape.tied = 1;
    o.grad_accum = 2;
    o.chunk_bytes = 16u << 10; /* several chunks per block */
    return o;
}

/* ---- the gradient: head + embedding ---- */

typedef struct side {
    zt_resident *r;
    zt_model *m;
} side;

static void side_init(side *x, zo_device_t dev, zo_stream_t s, const zt_shape *sh)
{
    zt_model_config mc = {*sh, 16, 2, 1, ZO_DTYPE_F32, 0, {0}, 0, 0};
    ZO_ASSERT_OK(zt_model_init(&x->m, dev, s, &mc));
    ZO_ASSERT_OK(zt_resident_init(&x->r, dev, s, sh, ZO_DTYPE_F32, 5, 0.05f));
}

static float *tensor(const side *x, zo_stream_t s, const zt_shape *sh, int l, int i, int grad)
{
    float *w = malloc(zt_tensor_numel(sh, l, i) * sizeof *w);
    assert_non_null(w);
    ZO_ASSERT_OK(zt_resident_read(x->r, s, l, i, grad, w));
    return w;
}

/* The tied model takes the untied one's weights; the untied head becomes the embedding. */
static void share_weights(side *u, side *t, zo_stream_t s, const zt_shape *su)
{
    const int L = su->n_layers;
    for (int l = 0; l <= L; l++)
        for (int i = 0; i < zt_layer_tensors(su, l); i++) {
            float *w = tensor(u, s, su, l, i, 0);
            ZO_ASSERT_OK(zt_resident_write(t->r, s, l, i, w));
            if (l == 0)
                ZO_ASSERT_OK(zt_resident_write(u->r, s, L + 1, ZT_HEAD_OUT, w));
            free(w);
        }
    float *norm = tensor(u, s, su, L + 1, ZT_HEAD_NORM, 0);
    ZO_ASSERT_OK(zt_resident_write(t->r, s, 0, ZT_TIED_NORM, norm));
    free(norm);
}

static void train_once(side *x, zo_stream_t s, const int32_t *tok, float *loss)
{
    ZO_ASSERT_OK(zt_resident_zero_grads(x->r, s));
    ZO_ASSERT_OK(zt_model_set_batch(x->m, tok, tok + 32, 1));
    zt_param_source src = zt_resident_source(x->r);
    ZO_ASSERT_OK(zt_model_train_micro(x->m, &src, 0, 1.0f));
    ZO_ASSERT_OK(zt_model_read_losses(x->m, loss, 1));
}

static void assert_same_tensor(const float *a, const float *b, size_t n, const char *what)
{
    if (memcmp(a, b, n * sizeof *a) != 0)
        fail_msg("%s differs", what);
}

static void test_gradient_is_head_plus_embedding(void **state)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_device_t dev;
    zo_stream_t s;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    zt_shape su = tied_options().shape, st = su;
    su.tied = 0;
    side u = {0}, t = {0};
    side_init(&u, dev, s, &su);
    side_init(&t, dev, s, &st);
    share_weights(&u, &t, s, &su);
    int32_t tok[64];
    for (int i = 0; i < 64; i++)
        tok[i] = (i * 37 + 11) % 256;
    tok[5] = tok[9] = tok[20] = 7; /* a repeated token: its embedding rows are summed */
    float lu, lt;
    train_once(&u, s, tok, &lu);
    train_once(&t, s, tok, &lt);
    assert_memory_equal(&lu, &lt, sizeof lu);
    const int L = su.n_layers;
    for (int l = 1; l <= L; l++)
        for (int i = 0; i < zt_layer_tensors(&su, l); i++) {
            float *a = tensor(&u, s, &su, l, i, 1), *b = tensor(&t, s, &st, l, i, 1);
            assert_same_tensor(a, b, zt_tensor_numel(&su, l, i), "a block's gradient");
            free(a), free(b);
        }
    size_t n = zt_tensor_numel(&su, 0, 0);
    float *emb = tensor(&u, s, &su, 0, 0, 1), *head = tensor(&u, s, &su, L + 1, ZT_HEAD_OUT, 1);
    float *tied = tensor(&t, s, &st, 0, ZT_EMBEDDING, 1);
    for (size_t i = 0; i < n; i++)
        emb[i] = head[i] + emb[i]; /* autograd's order: the head's, then the embedding's */
    assert_same_tensor(emb, tied, n, "the tied matrix's gradient");
    float *norm = tensor(&u, s, &su, L + 1, ZT_HEAD_NORM, 1);
    float *tnorm = tensor(&t, s, &st, 0, ZT_TIED_NORM, 1);
    assert_same_tensor(norm, tnorm, (size_t)su.dim, "the final norm's gradient");
    free(emb), free(head), free(tied), free(norm), free(tnorm);
    zt_model_free(u.m), zt_model_free(t.m);
    zt_resident_free(u.r), zt_resident_free(t.r);
    zo_stream_destroy(s);
    zo_device_free(dev);
}

/* ---- through the engine ---- */

typedef struct run_result {
    float losses[STEPS];
    float *weights[ZT_MAX_LAYER_TENSORS * 3]; /* [layer * ZT_MAX_LAYER_TENSORS + idx]: 3 layers */
    int clipped, rollbacks, n_tensors;
} run_result;

static void read_weights(zt_trainer *t, const zt_shape *s, run_result *r)
{
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            float *w = malloc(zt_tensor_numel(s, l, i) * sizeof *w);
            assert_non_null(w);
            ZO_ASSERT_OK(zt_trainer_read_weights(t, l, i, w));
            r->weights[l * ZT_MAX_LAYER_TENSORS + i] = w;
        }
}

static void run_free(run_result *r)
{
    for (size_t k = 0; k < sizeof r->weights / sizeof r->weights[0]; k++)
        free(r->weights[k]);
}

static zt_trainer *trainer_of(const zt_options *o)
{
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    return t;
}

static void steps(zt_trainer *t, run_result *r, int from, int to)
{
    for (int i = from; i < to; i++) {
        zo_step_stats s;
        if (zt_trainer_step(t, &r->losses[i], &s) < 0)
            fail_msg("step %d: %s", i, zt_last_error());
        r->clipped += s.clipped;
        r->rollbacks += s.rollbacks;
    }
}

static void train_run(const zt_options *o, run_result *r)
{
    memset(r, 0, sizeof *r);
    zt_trainer *t = trainer_of(o);
    r->n_tensors = zo_engine_n_tensors(zt_trainer_engine(t));
    steps(t, r, 0, STEPS);
    read_weights(t, &o->shape, r);
    zt_trainer_free(t);
}

static void assert_same_run(const run_result *a, const run_result *b, const zt_shape *s,
                            const char *what)
{
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&a->losses[i], &b->losses[i], sizeof(float)) != 0)
            fail_msg("%s: step %d loss %.9g differs from the reference's %.9g", what, i,
                     (double)b->losses[i], (double)a->losses[i]);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            int k = l * ZT_MAX_LAYER_TENSORS + i;
            if (memcmp(a->weights[k], b->weights[k], zt_tensor_numel(s, l, i) * sizeof(float)))
                fail_msg("%s: final weights of layer %d tensor %d differ", what, l, i);
        }
}

typedef struct place_case {
    const char *name;
    zo_tier param, optim;
    zo_optim_mode mode;
    int smallest, micro_group, act_home;
} place_case;

static void test_placements_and_modes_are_bitwise_identical(void **state)
{
    zt_options base = tied_options();
    base.param_home = base.optim_home = ZO_TIER_DEVICE;
    run_result ref;
    train_run(&base, &ref);
    zt_options untied = base;
    untied.shape.tied = 0;
    zt_trainer *u = trainer_of(&untied);
    assert_int_equal(ref.n_tensors, zo_engine_n_tensors(zt_trainer_engine(u)) - 1);
    zt_trainer_free(u);
    assert_true(ref.clipped > 0); /* the overlap runs roll back clipped steps */
    assert_true(ref.losses[STEPS - 1] < ref.losses[0]);
    const place_case cases[] = {
        {"optimizer on host", ZO_TIER_DEVICE, ZO_TIER_HOST, ZO_OPTIM_SYNC, 0, 0, 0},
        {"params host, optimizer nvme", ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC, 0, 0, 0},
        {"all nvme, smallest budget", ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC, 1, 0, 0},
        {"host, smallest budget", ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC, 1, 0, 0},
        {"overlap, host", ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_OVERLAP, 0, 0, 0},
        {"overlap, all nvme", ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_OVERLAP, 0, 0, 0},
        {"groups, inputs on device", ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC, 0, 2,
         ZT_ACT_DEVICE},
        {"groups, inputs on host, nvme", ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC, 0, 2,
         ZT_ACT_HOST},
        {"groups, overlap", ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP, 0, 2, ZT_ACT_HOST},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        zt_options o = base;
        o.param_home = cases[c].param;
        o.optim_home = cases[c].optim;
        o.mode = cases[c].mode;
        o.micro_group = cases[c].micro_group;
        o.act_home = cases[c].act_home;
        if (cases[c].smallest)
            o.device_mem = zt_test_smallest_budget(o);
        run_result r;
        train_run(&o, &r);
        assert_same_run(&ref, &r, &o.shape, cases[c].name);
        if (o.mode == ZO_OPTIM_OVERLAP)
            assert_true(r.rollbacks > 0);
        run_free(&r);
    }
    run_free(&ref);
}

/* dpu computes with the parameters of the step before: its own reference. */
static void test_dpu_placements_agree(void **state)
{
    zt_options a = tied_options();
    a.mode = ZO_OPTIM_DPU;
    a.param_home = a.optim_home = ZO_TIER_HOST;
    zt_options b = a;
    b.param_home = b.optim_home = ZO_TIER_NVME;
    b.micro_group = 2;
    run_result ra, rb;
    train_run(&a, &ra);
    train_run(&b, &rb);
    assert_same_run(&ra, &rb, &a.shape, "dpu: all nvme with groups vs host");
    run_free(&ra), run_free(&rb);
}

/* Saved after 4 steps and resumed, the run ends as the uninterrupted one. */
static void test_checkpoint_keeps_it_tied(void **state)
{
    zt_options o = tied_options();
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_NVME;
    run_result whole, split;
    train_run(&o, &whole);
    memset(&split, 0, sizeof split);
    char save[300], ckpt[400];
    snprintf(save, sizeof save, "%s/ckpt", g_dir);
    zt_trainer *t = trainer_of(&o);
    steps(t, &split, 0, STEPS / 2);
    ZO_ASSERT_OK(zt_ckpt_save(t, save, ckpt, sizeof ckpt));
    zt_trainer_free(t);
    t = trainer_of(&o);
    ZO_ASSERT_OK(zt_ckpt_load(t, ckpt));
    steps(t, &split, STEPS / 2, STEPS);
    read_weights(t, &o.shape, &split);
    zt_trainer_free(t);
    assert_same_run(&whole, &split, &o.shape, "resumed at step 4");
    zt_options untied = o;
    untied.shape.tied = 0;
    t = trainer_of(&untied);
    assert_int_equal(zt_ckpt_load(t, ckpt), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "tied to the embedding"));
    zt_trainer_free(t);
    run_free(&whole), run_free(&split);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "%s/zt-tied-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_is_head_plus_embedding),
        cmocka_unit_test(test_placements_and_modes_are_bitwise_identical),
        cmocka_unit_test(test_dpu_placements_agree),
        cmocka_unit_test(test_checkpoint_keeps_it_tied),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
