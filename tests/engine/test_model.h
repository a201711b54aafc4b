/* A deterministic test model for the engine tests: L layers of
 * y = tanh(W x + b) and a squared-error loss, forward and backward in plain C
 * float math on 16-bit parameters, run as tasks on the cpu device's compute
 * stream (reading the device pointers the engine hands out), plus a plain-C
 * reference trainer (zo_adam_step per tensor) to check the engine against. */
#ifndef ZO_TEST_MODEL_H
#define ZO_TEST_MODEL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/engine.h"
#include "zo/half.h"
#include "zo_test.h"

#define TM_L        4
#define TM_D        64
#define TM_B        8
#define TM_T        (2 * TM_L) /* tensors: W, b per layer */
#define TM_MAXSTEPS 64

static inline float tm_to32(zo_dtype t, uint16_t h)
{
    return t == ZO_DTYPE_F16 ? zo_f16_to_f32(h) : zo_bf16_to_f32(h);
}

static inline uint16_t tm_from32(zo_dtype t, float f)
{
    return t == ZO_DTYPE_F16 ? zo_f32_to_f16(f) : zo_f32_to_bf16(f);
}

static inline float tm_uniform(uint64_t *s)
{
    return (float)((double)(zo_test_rand(s) >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* Activations and their gradients, owned by the test (host memory the
 * compute stream's tasks read and write in stream order). */
typedef struct tm_acts {
    float act[TM_L + 1][TM_B * TM_D];
    float gact[TM_L + 1][TM_B * TM_D];
    float target[TM_B * TM_D];
    double loss; /* summed over the step's micro-batches */
} tm_acts;

static inline size_t tm_numel(int tensor)
{
    return tensor % 2 == 0 ? (size_t)TM_D * TM_D : TM_D;
}

static inline void tm_init_params(float *params[TM_T])
{
    uint64_t s = 12345;
    for (int t = 0; t < TM_T; t++)
        for (size_t i = 0; i < tm_numel(t); i++)
            params[t][i] = tm_uniform(&s) * (t % 2 == 0 ? 1.5f / sqrtf((float)TM_D) : 0.1f);
}

typedef struct tm_input_arg {
    tm_acts *a;
    int step, micro;
} tm_input_arg;

static inline zo_status tm_input(void *p)
{
    tm_input_arg *x = p;
    uint64_t s = 1000003ull * (uint64_t)x->step + 7919ull * (uint64_t)x->micro + 1;
    for (int i = 0; i < TM_B * TM_D; i++)
        x->a->act[0][i] = tm_uniform(&s);
    for (int i = 0; i < TM_B * TM_D; i++)
        x->a->target[i] = 0.8f * tm_uniform(&s);
    return ZO_OK;
}

typedef struct tm_fwd_arg {
    const uint16_t *W, *b;
    zo_dtype t;
    const float *in;
    float *out;
} tm_fwd_arg;

static inline zo_status tm_forward(void *p)
{
    tm_fwd_arg *x = p;
    for (int n = 0; n < TM_B; n++)
        for (int i = 0; i < TM_D; i++) {
            float z = tm_to32(x->t, x->b[i]);
            for (int j = 0; j < TM_D; j++)
                z += tm_to32(x->t, x->W[i * TM_D + j]) * x->in[n * TM_D + j];
            x->out[n * TM_D + i] = tanhf(z);
        }
    return ZO_OK;
}

typedef struct tm_loss_arg {
    tm_acts *a;
    float scale;
} tm_loss_arg;

static inline zo_status tm_loss(void *p)
{
    tm_loss_arg *x = p;
    double loss = 0.0;
    for (int i = 0; i < TM_B * TM_D; i++) {
        float r = x->a->act[TM_L][i] - x->a->target[i];
        loss += 0.5 * (double)r * r / TM_B;
        x->a->gact[TM_L][i] = r / TM_B * x->scale;
    }
    x->a->loss += loss;
    return ZO_OK;
}

typedef struct tm_bwd_arg {
    const uint16_t *W;
    uint16_t *gW, *gb;
    zo_dtype t;
    const float *in, *out, *gout;
    float *gin;
    int poison; /* write an infinity into the gradient (overflow drills) */
} tm_bwd_arg;

static inline zo_status tm_backward(void *p)
{
    tm_bwd_arg *x = p;
    float dz[TM_B * TM_D];
    for (int k = 0; k < TM_B * TM_D; k++)
        dz[k] = x->gout[k] * (1.0f - x->out[k] * x->out[k]);
    for (int i = 0; i < TM_D; i++) {
        float gb = 0.0f;
        for (int n = 0; n < TM_B; n++)
            gb += dz[n * TM_D + i];
        x->gb[i] = tm_from32(x->t, tm_to32(x->t, x->gb[i]) + gb);
        for (int j = 0; j < TM_D; j++) {
            float g = 0.0f;
            for (int n = 0; n < TM_B; n++)
                g += dz[n * TM_D + i] * x->in[n * TM_D + j];
            x->gW[i * TM_D + j] = tm_from32(x->t, tm_to32(x->t, x->gW[i * TM_D + j]) + g);
        }
    }
    if (x->poison)
        x->gW[3] = tm_from32(x->t, INFINITY);
    for (int n = 0; n < TM_B; n++)
        for (int j = 0; j < TM_D; j++) {
            float g = 0.0f;
            for (int i = 0; i < TM_D; i++)
                g += tm_to32(x->t, x->W[i * TM_D + j]) * dz[n * TM_D + i];
            x->gin[n * TM_D + j] = g;
        }
    return ZO_OK;
}

/* ---- the plain-C reference trainer (bf16, no clipping) ---- */

/* A parameter group's own Adam settings (zo_engine_set_tensor_adam). */
typedef struct tm_group {
    double lr_scale;
    float beta1, beta2, eps;
} tm_group;

typedef struct tm_ref {
    zo_dtype t;
    float *master[TM_T], *m[TM_T], *v[TM_T], *acc[TM_T];
    uint16_t *p16[TM_T], *pub[TM_T], *g16[TM_T];
    tm_acts a;
    double losses[TM_MAXSTEPS];
    unsigned char own_decay[TM_T]; /* tensor k decays by decay[k], not hp->weight_decay */
    float decay[TM_T];
    unsigned char own_adam[TM_T]; /* tensor k's group sets its rate scale, betas and eps */
    tm_group group[TM_T];
} tm_ref;

static inline void tm_ref_init(tm_ref *r, zo_dtype t)
{
    memset(r, 0, sizeof *r);
    r->t = t;
    for (int k = 0; k < TM_T; k++) {
        size_t n = tm_numel(k);
        r->master[k] = calloc(n, sizeof(float));
        r->m[k] = calloc(n, sizeof(float));
        r->v[k] = calloc(n, sizeof(float));
        r->acc[k] = calloc(n, sizeof(float));
        r->p16[k] = calloc(n, 2);
        r->pub[k] = calloc(n, 2);
        r->g16[k] = calloc(n, 2);
    }
    tm_init_params(r->master);
    for (int k = 0; k < TM_T; k++)
        for (size_t i = 0; i < tm_numel(k); i++)
            r->p16[k][i] = r->pub[k][i] = tm_from32(t, r->master[k][i]);
}

static inline void tm_ref_free(tm_ref *r)
{
    for (int k = 0; k < TM_T; k++) {
        free(r->master[k]);
        free(r->m[k]);
        free(r->v[k]);
        free(r->acc[k]);
        free(r->p16[k]);
        free(r->pub[k]);
        free(r->g16[k]);
    }
}

/* One micro-batch through the model with parameters P; gradients into g16. */
static inline void tm_ref_micro(tm_ref *r, uint16_t *P[TM_T], int step, int micro)
{
    tm_input_arg in = {&r->a, step, micro};
    tm_input(&in);
    for (int l = 0; l < TM_L; l++) {
        tm_fwd_arg f = {P[2 * l], P[2 * l + 1], r->t, r->a.act[l], r->a.act[l + 1]};
        tm_forward(&f);
    }
    tm_loss_arg la = {&r->a, 1.0f};
    tm_loss(&la);
    for (int l = TM_L - 1; l >= 0; l--) {
        memset(r->g16[2 * l], 0, tm_numel(2 * l) * 2);
        memset(r->g16[2 * l + 1], 0, tm_numel(2 * l + 1) * 2);
        tm_bwd_arg b = {P[2 * l],        r->g16[2 * l],    r->g16[2 * l + 1], r->t, r->a.act[l],
                        r->a.act[l + 1], r->a.gact[l + 1], r->a.gact[l],      0};
        tm_backward(&b);
    }
}

/* steps of training; dpu: gradients of step t are taken at the parameters
 * published before step t-1's update (one step stale); lrs (NULL: hp->lr)
 * the learning rate of each step's update. */
static inline void tm_ref_train_lrs(tm_ref *r, const zo_adam_params *hp, int steps, int accum,
                                    int dpu, const float *lrs)
{
    for (int s = 0; s < steps; s++) {
        r->a.loss = 0.0;
        uint16_t **P = dpu ? r->pub : r->p16;
        for (int mb = 0; mb < accum; mb++) {
            tm_ref_micro(r, P, s, mb);
            for (int k = 0; k < TM_T; k++)
                for (size_t i = 0; i < tm_numel(k); i++) {
                    float g = tm_to32(r->t, r->g16[k][i]);
                    r->acc[k][i] = mb == 0 ? g : r->acc[k][i] + g;
                }
        }
        r->losses[s] = r->a.loss;
        if (dpu)
            for (int k = 0; k < TM_T; k++)
                memcpy(r->pub[k], r->p16[k], tm_numel(k) * 2);
        for (int k = 0; k < TM_T; k++) {
            zo_adam_params p = *hp;
            p.step = s + 1;
            p.grad_scale = 1.0f;
            if (lrs)
                p.lr = lrs[s];
            if (r->own_decay[k])
                p.weight_decay = r->decay[k];
            if (r->own_adam[k]) { /* the group's rate: the step's times its scale, in double */
                p.lr = (float)((double)p.lr * r->group[k].lr_scale);
                p.beta1 = r->group[k].beta1;
                p.beta2 = r->group[k].beta2;
                p.eps = r->group[k].eps;
            }
            zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
            b.n = tm_numel(k);
            b.grad = accum > 1 ? (const void *)r->acc[k] : r->g16[k];
            b.grad_type = accum > 1 ? ZO_DTYPE_F32 : r->t;
            b.master = r->master[k];
            b.m = r->m[k];
            b.v = r->v[k];
            b.out = r->p16[k];
            b.out_type = r->t;
            assert_int_equal(zo_adam_step(&p, &b), ZO_OK);
        }
    }
}

static inline void tm_ref_train(tm_ref *r, const zo_adam_params *hp, int steps, int accum, int dpu)
{
    tm_ref_train_lrs(r, hp, steps, accum, dpu, NULL);
}

#endif
