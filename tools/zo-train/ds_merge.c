/* zo-train's flags and defaults merged into a DeepSpeed config before it is
 * resolved, as Hugging Face's Trainer fills "auto" (see ds_merge.h). */
#include "ds_merge.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "zt_error.h"

typedef struct merge {
    zo_config_t c;
    const json_t *doc; /* the file as written */
    const char *path;
    const zt_config_flags *f;
    const zt_options *d;
    zt_config_report *rep;
} merge;

/* doc's value at a dotted key, or NULL. */
static const json_t *value_at(const json_t *doc, const char *key)
{
    char buf[ZO_CONFIG_KEY_CAP];
    snprintf(buf, sizeof buf, "%s", key);
    const json_t *v = doc;
    char *save = NULL;
    for (char *seg = strtok_r(buf, ".", &save); v && seg; seg = strtok_r(NULL, ".", &save))
        v = json_is_object(v) ? json_object_get(v, seg) : NULL;
    return v;
}

static int is_auto(const json_t *v)
{
    return json_is_string(v) && strcmp(json_string_value(v), "auto") == 0;
}

static void note(zt_config_report *r, const char *key, const char *value, const char *from)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->items[i].key, key) == 0)
            return;
    if (r->n == ZT_MAX_RESOLVED)
        return;
    snprintf(r->items[r->n].key, sizeof r->items[0].key, "%s", key);
    snprintf(r->items[r->n].value, sizeof r->items[0].value, "%s", value);
    snprintf(r->items[r->n].from, sizeof r->items[0].from, "%s", from);
    r->n++;
}

static zo_status set(merge *m, const char *key, const char *value)
{
    zo_status st = zo_config_set(m->c, key, value);
    return st < 0 ? zt_fail(st, "configuration error in %s: %s", m->path, zt_lib_message()) : ZO_OK;
}

/* Hugging Face's fill: only where the file says "auto". */
static zo_status fill(merge *m, const char *key, const char *value, const char *from)
{
    if (!is_auto(value_at(m->doc, key)))
        return ZO_OK;
    note(m->rep, key, value, from);
    return set(m, key, value);
}

static void fmt_float(char *buf, size_t cap, double v)
{
    snprintf(buf, cap, "%.7g", v); /* zo-train's options are floats */
}

/* A flag given on the command line wins over the file's value; a concrete
 * value it replaces is named once. */
static zo_status flag_wins(merge *m, const char *key, const char *value, const char *flag)
{
    const json_t *v = value_at(m->doc, key);
    if (is_auto(v))
        note(m->rep, key, value, flag);
    else if (json_is_number(v) && json_number_value(v) != strtod(value, NULL))
        fprintf(stderr, "zo-train: warning: %s %s replaces '%s' %.9g from %s\n", flag, value, key,
                json_number_value(v), m->path);
    return set(m, key, value);
}

/* ---- batch sizes ---- */

/* The file's concrete value of a batch key; 0 when absent, "auto", null or
 * no count zo-train can run (the parser then names what is wrong). */
static int64_t file_int(const merge *m, const char *key)
{
    const json_t *v = value_at(m->doc, key);
    double x = json_is_number(v) ? json_number_value(v) : 0;
    return x >= 1 && x <= INT_MAX && x == floor(x) ? (int64_t)x : 0;
}

static zo_status set_int(merge *m, const char *key, int64_t v, const char *from)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    if (is_auto(value_at(m->doc, key)) || !value_at(m->doc, key))
        note(m->rep, key, buf, from);
    return set(m, key, buf);
}

/* The one warning a contradicting batch flag gets: the global batch. */
static void warn_global_batch(const merge *m, int64_t mb, int64_t ga, int64_t file_tb)
{
    fprintf(stderr,
            "zo-train: warning: --micro-batch/--grad-accum replace %s's batch keys: the global "
            "batch is %lld sequences (micro-batch %lld x %lld accumulated)",
            m->path, (long long)(mb * ga), (long long)mb, (long long)ga);
    if (file_tb && file_tb != mb * ga)
        fprintf(stderr, ", not the file's train_batch_size %lld", (long long)file_tb);
    fputc('\n', stderr);
}

/* With the file's train_batch_size and one of micro-batch and accumulation
 * known, the other is derived from it as DeepSpeed derives it; it must divide. */
static zo_status check_divides(const merge *m, int64_t tb, int64_t known, const char *flag)
{
    if (tb % known == 0)
        return ZO_OK;
    return zt_fail(ZO_ERR_CONFIG,
                   "configuration error in %s: %s %lld does not divide the file's "
                   "train_batch_size %lld; pass both --micro-batch and --grad-accum, or a value "
                   "that divides it",
                   m->path, flag, (long long)known, (long long)tb);
}

/* Nothing says the micro-batch, or "auto" does: zo-train's default, as the
 * Trainer fills its per-device batch size. An "auto" accumulation beside a
 * train_batch_size is left for DeepSpeed's derivation. */
static zo_status batch_defaults(merge *m, int64_t tb, int64_t *m2, int64_t *a2)
{
    const char *const kM = "train_micro_batch_size_per_gpu", *const kA =
                                                                 "gradient_accumulation_steps";
    if (!*m2 && (!tb || is_auto(value_at(m->doc, kM))))
        ZT_TRY(set_int(m, kM, *m2 = m->d->micro_batch, "--micro-batch's default"));
    if (!tb && !*a2 && is_auto(value_at(m->doc, kA)))
        ZT_TRY(set_int(m, kA, *a2 = m->d->grad_accum, "--grad-accum's default"));
    return ZO_OK;
}

static zo_status merge_batch(merge *m)
{
    const char *const kT = "train_batch_size", *const kM = "train_micro_batch_size_per_gpu",
                      *const kA = "gradient_accumulation_steps";
    int64_t tb = file_int(m, kT), mb = file_int(m, kM), ga = file_int(m, kA);
    int64_t fm = m->f->micro_batch, fa = m->f->grad_accum;
    int contradicts = (fm && mb && fm != mb) || (fa && ga && fa != ga);
    int64_t m2 = fm ? fm : mb, a2 = fa ? fa : ga;
    if (fm)
        ZT_TRY(set_int(m, kM, fm, "--micro-batch"));
    if (fa)
        ZT_TRY(set_int(m, kA, fa, "--grad-accum"));
    ZT_TRY(batch_defaults(m, tb, &m2, &a2));
    if (!fm && !fa) /* the file's own batch keys: the parser checks them */
        return ZO_OK;
    if (tb && m2 && !a2)
        ZT_TRY(check_divides(m, tb, m2, fm ? "--micro-batch" : kM));
    if (tb && a2 && !m2)
        ZT_TRY(check_divides(m, tb, a2, fa ? "--grad-accum" : kA));
    if (tb && m2 && a2 && tb != m2 * a2) {
        ZT_TRY(set(m, kT, "null"));
        contradicts = 1;
    }
    if (contradicts) {
        int64_t mm = m2 ? m2 : tb / a2, aa = a2 ? a2 : tb / m2;
        warn_global_batch(m, mm, aa, tb);
    }
    return ZO_OK;
}

/* ---- optimizer, clipping, schedule, precision ---- */

static zo_status own_optimizer(merge *m, const char *lr, const char *wd)
{
    char json[256], eps[32], b1[32], b2[32];
    fmt_float(eps, sizeof eps, m->d->eps);
    fmt_float(b1, sizeof b1, m->d->beta1);
    fmt_float(b2, sizeof b2, m->d->beta2);
    snprintf(json, sizeof json,
             "{\"type\": \"AdamW\", \"params\": {\"lr\": %s, \"betas\": [%s, %s], \"eps\": %s, "
             "\"weight_decay\": %s}}",
             lr, b1, b2, eps, wd);
    char value[64];
    snprintf(value, sizeof value, "AdamW lr %s", lr);
    note(m->rep, "optimizer", value, "no optimizer section: zo-train's own");
    return set(m, "optimizer", json);
}

static zo_status merge_optimizer(merge *m)
{
    char dlr[32], dwd[32], betas[80], b1[32], b2[32], eps[32];
    fmt_float(dlr, sizeof dlr, m->d->lr);
    fmt_float(dwd, sizeof dwd, m->d->weight_decay);
    const char *lr = m->f->lr ? m->f->lr : dlr, *wd = m->f->weight_decay ? m->f->weight_decay : dwd;
    if (!json_is_object(value_at(m->doc, "optimizer")))
        return own_optimizer(m, lr, wd);
    if (m->f->lr)
        ZT_TRY(flag_wins(m, "optimizer.params.lr", lr, "--lr"));
    else
        ZT_TRY(fill(m, "optimizer.params.lr", lr, "--lr's default"));
    if (m->f->weight_decay)
        ZT_TRY(flag_wins(m, "optimizer.params.weight_decay", wd, "--weight-decay"));
    else
        ZT_TRY(fill(m, "optimizer.params.weight_decay", wd, "--weight-decay's default"));
    fmt_float(b1, sizeof b1, m->d->beta1);
    fmt_float(b2, sizeof b2, m->d->beta2);
    snprintf(betas, sizeof betas, "[%s, %s]", b1, b2);
    ZT_TRY(fill(m, "optimizer.params.betas", betas, "zo-train's"));
    fmt_float(eps, sizeof eps, m->d->eps);
    return fill(m, "optimizer.params.eps", eps, "zo-train's");
}

static zo_status merge_clipping(merge *m)
{
    if (m->f->max_grad_norm)
        return flag_wins(m, "gradient_clipping", m->f->max_grad_norm, "--max-grad-norm");
    char clip[32];
    fmt_float(clip, sizeof clip, m->d->max_grad_norm);
    return fill(m, "gradient_clipping", clip, "--max-grad-norm's default");
}

/* WarmupDecayLR and WarmupCosineLR need total_num_steps: absent or "auto",
 * it is the run's length, as the Trainer fills it. */
static zo_status merge_schedule(merge *m)
{
    const json_t *sched = value_at(m->doc, "scheduler");
    const char *type = json_string_value(json_object_get(sched, "type"));
    if (!type)
        return ZO_OK;
    ZT_TRY(fill(m, "scheduler.params.warmup_min_lr", "0", "Hugging Face's"));
    ZT_TRY(fill(m, "scheduler.params.warmup_num_steps", "0", "Hugging Face's default warmup"));
    const json_t *total = value_at(m->doc, "scheduler.params.total_num_steps");
    if (strcasecmp(type, "WarmupLR") == 0 || json_is_number(total))
        return ZO_OK;
    char steps[32];
    snprintf(steps, sizeof steps, "%d", m->f->steps);
    note(m->rep, "scheduler.params.total_num_steps", steps, "--steps");
    return set(m, "scheduler.params.total_num_steps", steps);
}

static zo_status merge_precision(merge *m)
{
    zo_dtype t = m->f->dtype_given ? m->f->dtype : m->d->dtype;
    const char *from = m->f->dtype_given ? "--dtype" : "--dtype's default";
    const char *f16 = t == ZO_DTYPE_F16 ? "true" : "false",
               *bf16 = t == ZO_DTYPE_BF16 ? "true" : "false";
    ZT_TRY(fill(m, "fp16.enabled", f16, from));
    ZT_TRY(fill(m, "bf16.enabled", bf16, from));
    return fill(m, "bfloat16.enabled", bf16, from);
}

zo_status zt_config_merge_flags(zo_config_t c, const json_t *doc, const char *path,
                                const zt_config_flags *f, const zt_options *d,
                                zt_config_report *rep)
{
    merge m = {c, doc, path, f, d, rep};
    ZT_TRY(merge_batch(&m));
    ZT_TRY(merge_optimizer(&m));
    ZT_TRY(merge_clipping(&m));
    ZT_TRY(merge_schedule(&m));
    return merge_precision(&m);
}

/* ---- the report ---- */

static void effective_value(const json_t *eff, const char *key, char *buf, size_t cap)
{
    const json_t *v = value_at(eff, key);
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    snprintf(buf, cap, "%s", text ? text : "no effect here");
    free(text);
}

void zt_config_report_finish(zt_config_report *rep, const zo_train_config *cfg, FILE *f)
{
    char *text = NULL;
    json_t *eff = NULL;
    if (zo_train_config_to_json(cfg, 0, &text) >= 0)
        eff = json_loads(text, 0, NULL);
    free(text);
    for (int64_t i = 0; i < cfg->n_auto; i++) {
        char value[64];
        effective_value(eff, cfg->auto_keys[i], value, sizeof value);
        const char *key = cfg->auto_keys[i];
        const char *from = strcmp(key, "train_batch_size") == 0 ? "derived"
                           : strcmp(key, "scheduler.params.warmup_max_lr") == 0
                               ? "the optimizer's lr"
                               : "DeepSpeed's default";
        note(rep, key, value, from);
    }
    json_decref(eff);
    for (int i = 0; i < rep->n; i++)
        fprintf(f, "zo-train: '%s' -> %s (%s)\n", rep->items[i].key, rep->items[i].value,
                rep->items[i].from);
}

json_t *zt_config_report_json(const zt_config_report *rep)
{
    json_t *o = json_object();
    for (int i = 0; o && i < rep->n; i++) {
        char s[160];
        snprintf(s, sizeof s, "%s (%s)", rep->items[i].value, rep->items[i].from);
        json_object_set_new(o, rep->items[i].key, json_string(s));
    }
    return o;
}
