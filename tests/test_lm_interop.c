/* Decoder LM against PyTorch and transformers: every fixture folder in tests/fixtures/lm/ (written
 * by tools/ref/gen_lm_fixtures.py) is a checkpoint directory (config.json, model.safetensors) plus
 * a batch and the expected results of one training step, computed in float64 by an independent
 * PyTorch model (tools/ref/lm_ref.py; the dense fixtures' logits by transformers'
 * LlamaForCausalLM loaded from the same directory). Loads it with model_load, runs the
 * float32 forward and backward through the reference and the head-sparse attention path, and compares logits, ce, lb, the total loss and the gradient of
 * every parameter: relative error max|a-b| / max|b| <= 1e-4 per tensor. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/lm.h"
#include "models/model.h"
#include "test_util.h"

#define FIXDIR "tests/fixtures/lm"
#define TOL 1e-4

typedef struct worst_t {
    double err;
    char name[128];
} worst_t;

/* Compares n floats against the expected tensor `name` of the given shape; tracks the worst. */
static void compare(test_ctx *ctx, const char *fix, const moh_safetensors *want, const char *name,
                    int ndim, const int64_t *shape, const float *got, worst_t *w) {
    moh_error err;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *b = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    const int rc = moh_st_read_f32(want, name, ndim, shape, b, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", fix, err.msg);
    if (rc == MOH_OK) {
        const double e = test_rel_err_f32(got, b, (long)n);
        CHECK(ctx, e <= TOL, "%s: '%s' rel err %.3g > %g", fix, name, e, TOL);
        if (e > w->err || !w->name[0]) {
            w->err = e;
            snprintf(w->name, sizeof w->name, "%s", name);
        }
    }
    free(b);
}

/* tokens/targets [B, T] stored as F32 integers -> int arrays (caller frees). */
static int *read_ids(test_ctx *ctx, const char *fix, const moh_safetensors *st, const char *name,
                     int *B, int *T, int lo, int hi) {
    const moh_st_tensor *t = moh_st_find(st, name);
    CHECK(ctx, t && t->ndim == 2, "%s: batch.safetensors lacks a 2-D '%s'", fix, name);
    if (!t || t->ndim != 2) return NULL;
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    float *f = malloc(sizeof(float) * (size_t)(t->numel + 1));
    int *ids = malloc(sizeof(int) * (size_t)(t->numel + 1));
    moh_error err;
    int ok = moh_st_read_f32(st, name, 2, t->shape, f, &err) == MOH_OK;
    CHECK(ctx, ok, "%s: %s", fix, err.msg);
    for (int64_t i = 0; ok && i < t->numel; i++) {
        ids[i] = (int)f[i];
        if ((float)ids[i] != f[i] || ids[i] < lo || ids[i] >= hi) {
            CHECK(ctx, 0, "%s: %s[%lld] = %g is not an id in [%d, %d)", fix, name, (long long)i, f[i], lo, hi);
            ok = 0;
        }
    }
    free(f);
    if (!ok) {
        free(ids);
        return NULL;
    }
    return ids;
}

static void check_fixture(test_ctx *ctx, const char *fix) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", fix);
    model m = {0};
    moh_lm_config cfg = {0};
    lm_params_f32 p = {0}, g = {0};
    lm_acts_f32 a = {0};
    moh_safetensors batch = {0}, want = {0};
    int *tokens = NULL, *targets = NULL;
    lm_tensor *ts = NULL;
    int B = 0, T = 0, B2 = 0, T2 = 0, nt = 0, n_grads = 0;
    float loss = 0;
    worst_t wf = {0}, wg = {0};
    moh_error err;
    int rc = model_load(&m, dir, &err);
    CHECK(ctx, rc == MOH_OK, "%s: model_load: %s", fix, err.msg);
    if (rc != MOH_OK) return;
    cfg = *(const moh_lm_config *)m.cfg;
    p = *(const lm_params_f32 *)m.params;
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    rc = moh_st_open(&batch, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc != MOH_OK) goto done;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    rc = moh_st_open(&want, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc != MOH_OK) goto done;
    const int V = cfg.vocab_size;
    tokens = read_ids(ctx, fix, &batch, "tokens", &B, &T, 0, V);
    targets = read_ids(ctx, fix, &batch, "targets", &B2, &T2, -1, V);
    if (!tokens || !targets) goto done;
    CHECK(ctx, B == B2 && T == T2, "%s: tokens [%d, %d] but targets [%d, %d]", fix, B, T, B2, T2);
    if (B != B2 || T != T2) goto done;

    ts = lm_tensors(&cfg, &nt);
    CHECK(ctx, ts != NULL, "%s: lm_tensors: out of memory", fix);
    if (!ts) goto done;
    for (int i = 0; i < want.n_tensors; i++) n_grads += !strncmp(want.tensors[i].name, "grad.", 5);
    CHECK(ctx, n_grads == nt, "%s: expected.safetensors has %d gradients, the model %d tensors", fix, n_grads, nt);
    /* both attention paths: the reference one and the head-sparse one */
    for (int sparse = 0; sparse < 2; sparse++) {
    wf = wg = (worst_t){0};
    rc = sparse ? lm_acts_init_sparse_f32(&a, &cfg, B, T, &err) : lm_acts_init_f32(&a, &cfg, B, T, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", fix, err.msg);
    if (rc != MOH_OK) goto done;
    rc = lm_params_init_f32(&g, &cfg, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", fix, err.msg);
    if (rc != MOH_OK) goto done;
    loss = lm_forward_f32(&cfg, &p, &a, tokens, targets, B, T);
    lm_backward_f32(&cfg, &p, &g, &a, tokens, targets);

    const int64_t lshape[3] = {B, T, V}, one[1] = {1};
    compare(ctx, fix, &want, "logits", 3, lshape, a.logits, &wf);
    compare(ctx, fix, &want, "ce", 1, one, &a.ce_loss, &wf);
    compare(ctx, fix, &want, "lb", 1, one, &a.lb_loss, &wf);
    compare(ctx, fix, &want, "loss", 1, one, &loss, &wf);
    for (int i = 0; i < nt; i++) {
        char gname[128];
        snprintf(gname, sizeof gname, "grad.%s", ts[i].name);
        compare(ctx, fix, &want, gname, ts[i].ndim, ts[i].shape, g.data + ts[i].offset, &wg);
    }
    printf("  %-16s %-7s %-9s B=%d T=%d loss %.6f: worst rel err forward %.2e (%s), gradients %.2e (%s)\n",
           fix, cfg.router == MOH_ROUTER_NONE ? "dense" : "moh", sparse ? "sparse" : "reference", B, T,
           (double)loss, wf.err, wf.name, wg.err, wg.name);
    lm_acts_free_f32(&a);
    lm_params_free_f32(&g);
    }
done:
    free(ts);
    free(tokens);
    free(targets);
    moh_st_close(&batch);
    moh_st_close(&want);
    lm_acts_free_f32(&a);
    lm_params_free_f32(&g);
    model_free(&m);
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

int main(void) {
    test_ctx ctx = {0};
    DIR *d = opendir(FIXDIR);
    CHECK(&ctx, d != NULL, "cannot open %s (run from the repository root)", FIXDIR);
    if (!d) return test_finish("test_lm_interop", &ctx);
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof p, FIXDIR "/%s/expected.safetensors", e->d_name);
        if (access(p, R_OK) == 0) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    CHECK(&ctx, n >= 4, "only %d fixtures found in %s", n, FIXDIR);
    for (int i = 0; i < n; i++) {
        check_fixture(&ctx, names[i]);
        free(names[i]);
    }
    return test_finish("test_lm_interop", &ctx);
}
