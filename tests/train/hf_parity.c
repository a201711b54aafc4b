/* The parity test's zo-train side (tests/train/hf_parity.py runs it): the
 * model of a Hugging Face directory in fp32 (or bf16) on the cpu device, one
 * forward and backward of one sequence with the dense or the fused attention
 * op, written as safetensors: "loss" [1]
 * and each tensor's gradient under its Hugging Face name, in fp32 (a tied
 * model has one matrix: its gradient is the head's and the embedding's).
 *
 *   hf_parity MODEL_DIR TOKENS OUT.safetensors [fp32|bf16 [dense|flash]]
 *
 * TOKENS: seq + 1 little-endian int32 ids; inputs are the first seq, targets
 * the last seq. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_io.h"
#include "model.h"
#include "zo/device.h"
#include "zo/safetensors.h"
#include "zt_error.h"

typedef struct parity {
    zo_device_t dev;
    zo_stream_t s;
    zt_resident *r;
    zt_model *m;
    zt_shape shape;
    int seq;
    zo_dtype dt; /* parameters, gradients and activations */
    int flash;   /* the fused attention op (the only one with a sliding window) */
    int32_t *tok;
} parity;

static zo_status put_resident(void *ctx, int layer, int idx, const char *name, const float *w)
{
    parity *p = ctx;
    return zt_resident_write(p->r, p->s, layer, idx, w);
}

static zo_status read_tokens(parity *p, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zt_fail(ZO_ERR_IO, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    p->seq = (int)(bytes / 4) - 1;
    p->tok = malloc((size_t)bytes);
    int ok = p->seq > 0 && p->tok && fread(p->tok, 4, (size_t)p->seq + 1, f) == (size_t)p->seq + 1;
    fclose(f);
    return ok ? ZO_OK : zt_fail(ZO_ERR_IO, "%s: expected seq + 1 int32 ids", path);
}

static zo_status setup(parity *p, const char *dir)
{
    ZT_TRY(zt_hf_read_shape(dir, &p->shape));
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 1u << 30;
    ZT_LIB(zo_device_init(&p->dev, &dc));
    ZT_LIB(zo_stream_create(p->dev, &p->s));
    zt_model_config mc = {p->shape, p->seq, 1, 1, p->dt, p->flash, {0}, 0, 0};
    ZT_TRY(zt_model_init(&p->m, p->dev, p->s, &mc));
    ZT_TRY(zt_resident_init(&p->r, p->dev, p->s, &p->shape, p->dt, 1, 0.02f));
    return zt_hf_read_weights(dir, &p->shape, put_resident, p);
}

static zo_status write_grads(parity *p, const char *out, float loss)
{
    const zt_shape *s = &p->shape;
    zo_st_writer_t w = NULL;
    ZT_LIB(zo_st_writer_init(&w, out));
    int64_t one = 1;
    char name[160];
    int ndim;
    int64_t shape[2];
    zo_status st = zo_st_writer_declare(w, "loss", ZO_DTYPE_F32, 1, &one);
    for (int l = 0; st >= 0 && l < zt_engine_layers(s); l++)
        for (int i = 0; st >= 0 && i < zt_layer_tensors(s, l); i++) {
            zt_tensor_hf(s, l, i, name, sizeof name, &ndim, shape);
            st = zo_st_writer_declare(w, name, ZO_DTYPE_F32, ndim, shape);
        }
    if (st >= 0)
        st = zo_st_writer_write(w, "loss", &loss, sizeof loss);
    float *g = malloc(zt_largest_tensor(s) * sizeof *g);
    for (int l = 0; st >= 0 && l < zt_engine_layers(s); l++)
        for (int i = 0; st >= 0 && i < zt_layer_tensors(s, l); i++) {
            zt_tensor_hf(s, l, i, name, sizeof name, &ndim, shape);
            if ((st = zt_resident_read(p->r, p->s, l, i, 1, g)) >= 0)
                st = zo_st_writer_write(w, name, g, zt_tensor_numel(s, l, i) * sizeof *g);
        }
    if (st >= 0)
        st = zo_st_writer_commit(w);
    free(g);
    zo_st_writer_free(w);
    return st < 0 ? zt_lib_fail(st, "writing the gradients") : ZO_OK;
}

static zo_status run(parity *p, const char *dir, const char *tokens, const char *out)
{
    ZT_TRY(read_tokens(p, tokens));
    ZT_TRY(setup(p, dir));
    ZT_TRY(zt_resident_zero_grads(p->r, p->s));
    ZT_TRY(zt_model_set_batch(p->m, p->tok, p->tok + 1, 1));
    zt_param_source src = zt_resident_source(p->r);
    ZT_TRY(zt_model_train_micro(p->m, &src, 0, 1.0f));
    float loss;
    ZT_TRY(zt_model_read_losses(p->m, &loss, 1));
    return write_grads(p, out, loss);
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 6 ||
        (argc >= 5 && strcmp(argv[4], "fp32") != 0 && strcmp(argv[4], "bf16") != 0) ||
        (argc == 6 && strcmp(argv[5], "dense") != 0 && strcmp(argv[5], "flash") != 0)) {
        fprintf(stderr,
                "usage: hf_parity MODEL_DIR TOKENS OUT.safetensors [fp32|bf16 [dense|flash]]\n");
        return 2;
    }
    parity p = {0};
    p.dt = argc >= 5 && strcmp(argv[4], "bf16") == 0 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
    p.flash = argc == 6 && strcmp(argv[5], "flash") == 0;
    zo_status st = run(&p, argv[1], argv[2], argv[3]);
    if (st < 0)
        fprintf(stderr, "hf_parity: %s\n", zt_last_error());
    zt_model_free(p.m);
    zt_resident_free(p.r);
    if (p.s)
        zo_stream_destroy(p.s);
    if (p.dev)
        zo_device_free(p.dev);
    free(p.tok);
    return st < 0 ? 1 : 0;
}
