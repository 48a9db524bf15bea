/* The public model API (include/moh.h, moh_model_*), used as an embedding program would: this file
 * includes <moh.h> and libc only (CMake gives it no src/ include path). On the committed
 * checkpoints tests/fixtures/lm/moh_75 and tests/fixtures/vit/moh_token: load, getters against
 * model.safetensors, forward logits and losses against the float64 PyTorch references of the
 * fixtures (expected.safetensors, io.safetensors; 1e-4 relative), router gates, training steps
 * lowering the loss on a repeated batch, the non-finite guard, save + reload bit for bit, and
 * one-line MOH_E_* errors for bad inputs. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#endif
#include <math.h>
#include <moh.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#define LM_DIR "tests/fixtures/lm/moh_75"
#define VIT_DIR "tests/fixtures/vit/moh_token"
#define TOL 1e-4

/* A message is one non-empty line. */
static bool one_line(const moh_error *e) { return e->msg[0] && !strchr(e->msg, '\n'); }

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

/* Tensor `name` of an opened file, as float32 (numel values, caller frees); NULL on error. */
static float *read_all(test_ctx *ctx, const moh_safetensors *st, const char *name, int64_t *numel) {
    const moh_st_tensor *t = moh_st_find(st, name);
    CHECK(ctx, t != NULL, "%s lacks '%s'", st->path, name);
    if (!t) return NULL;
    float *x = malloc(sizeof(float) * (size_t)(t->numel + 1));
    moh_error err;
    const int rc = moh_st_read_f32(st, name, t->ndim, t->shape, x, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) {
        free(x);
        return NULL;
    }
    if (numel) *numel = t->numel;
    return x;
}

/* F32-stored integers -> int (caller frees). */
static int *read_ids(test_ctx *ctx, const moh_safetensors *st, const char *name, int64_t *numel) {
    float *f = read_all(ctx, st, name, numel);
    if (!f) return NULL;
    int *ids = malloc(sizeof(int) * (size_t)(*numel + 1));
    for (int64_t i = 0; i < *numel; i++) ids[i] = (int)f[i];
    free(f);
    return ids;
}

static double scalar(test_ctx *ctx, const moh_safetensors *st, const char *name) {
    int64_t n = 0;
    float *x = read_all(ctx, st, name, &n);
    const double v = x && n == 1 ? x[0] : NAN;
    free(x);
    return v;
}

/* Plain mean cross-entropy of logits [M, V] (float64) over targets other than -1. */
static double ref_ce(const float *logits, const int *tgt, long M, int V) {
    double sum = 0.0;
    long n = 0;
    for (long r = 0; r < M; r++) {
        if (tgt[r] < 0) continue;
        const float *x = logits + (size_t)r * V;
        double mx = x[0], s = 0.0;
        for (int v = 1; v < V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++) s += exp(x[v] - mx);
        sum += mx + log(s) - x[tgt[r]];
        n++;
    }
    return sum / (double)n;
}

/* The parameters of m equal every tensor of dir/model.safetensors, bit for bit, in registry order
 * (offsets tile the buffer). */
static void check_params_match_file(test_ctx *ctx, moh_model *m, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moh_safetensors st;
    moh_error err;
    const int rc = moh_st_open(&st, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) return;
    const float *p = moh_model_params(m);
    const int nt = moh_model_num_tensors(m);
    size_t off = 0, bad = 0;
    for (int i = 0; i < nt; i++) {
        moh_tensor_info t;
        CHECK(ctx, moh_model_tensor(m, i, &t, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, t.offset == off, "%s: offset %zu, expected %zu", t.name, t.offset, off);
        CHECK(ctx, moh_model_find_tensor(m, t.name) == i, "find_tensor(%s)", t.name);
        float *want = malloc(sizeof(float) * t.numel);
        if (moh_st_read_f32(&st, t.name, t.ndim, t.shape, want, &err) != MOH_OK ||
            memcmp(want, p + t.offset, sizeof(float) * t.numel) != 0)
            bad++;
        free(want);
        off += t.numel;
    }
    CHECK(ctx, bad == 0, "%zu tensors of %s differ from the loaded parameters", bad, path);
    CHECK(ctx, off == moh_model_num_params(m), "tensors cover %zu of %zu params", off, moh_model_num_params(m));
    CHECK(ctx, nt == st.n_tensors, "%d registry tensors, %s has %d", nt, path, st.n_tensors);
    moh_st_close(&st);
}

/* Saves m into a fresh temporary directory, reloads it: identical parameters, config and logits. */
static void check_save_reload(test_ctx *ctx, moh_model *m, const moh_input *in) {
    char dir[] = "/tmp/moh_test_api_XXXXXX", path[128];
    if (!mkdtemp(dir)) {
        CHECK(ctx, 0, "mkdtemp failed");
        return;
    }
    moh_error err;
    moh_model *r = NULL;
    int rc = moh_model_save(m, dir, &err);
    CHECK(ctx, rc == MOH_OK, "save: %s", err.msg);
    if (!rc) rc = moh_model_load(&r, dir, &err);
    CHECK(ctx, rc == MOH_OK, "reload: %s", err.msg);
    if (!rc) {
        const size_t n = moh_model_num_params(m);
        CHECK(ctx, moh_model_num_params(r) == n && !memcmp(moh_model_params(r), moh_model_params(m), n * sizeof(float)),
              "%s: reloaded parameters differ", moh_model_type(m));
        char *a = moh_model_config_json(m), *b = moh_model_config_json(r);
        CHECK(ctx, a && b && !strcmp(a, b), "%s: reloaded config differs", moh_model_type(m));
        free(a);
        free(b);
        const size_t nl = moh_model_logits_count(m, in);
        float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
        CHECK(ctx, moh_model_forward(m, in, la, NULL, &err) == MOH_OK && moh_model_forward(r, in, lb, NULL, &err) == MOH_OK,
              "%s", err.msg);
        CHECK(ctx, !memcmp(la, lb, nl * sizeof(float)), "%s: logits of the reloaded model differ", moh_model_type(m));
        free(la);
        free(lb);
        CHECK(ctx, moh_model_steps(r) == 0, "steps after reload %ld", moh_model_steps(r));
    }
    moh_model_free(r);
    /* a directory of a training run (optimizer.safetensors) is refused, its files untouched */
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
    rc = moh_model_save(m, dir, &err);
    CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "optimizer.safetensors"), "save over a run: %d %s", rc, err.msg);
    const char *files[] = {"optimizer.safetensors", "model.safetensors", "config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* n training steps on the same batch with opt: the loss falls from the first to the last. */
static void check_training(test_ctx *ctx, moh_model *m, const moh_input *in, const moh_optim *opt, int n) {
    moh_error err;
    moh_losses l0, l;
    const long steps0 = moh_model_steps(m);
    CHECK(ctx, moh_model_forward(m, in, NULL, &l0, &err) == MOH_OK, "%s", err.msg);
    double prev = l0.loss;
    int falls = 0;
    for (int s = 0; s < n; s++) {
        const int rc = moh_model_train_step(m, in, opt, &l, &err);
        CHECK(ctx, rc == MOH_OK, "step %d: %s", s, err.msg);
        CHECK(ctx, isfinite(l.grad_norm) && l.grad_norm > 0, "step %d: grad norm %g", s, l.grad_norm);
        if (s == 0) CHECK(ctx, rel(l.loss, l0.loss) < 1e-6, "first step's loss %.8f, forward %.8f", l.loss, l0.loss);
        falls += l.loss < prev;
        prev = l.loss;
    }
    moh_losses end;
    CHECK(ctx, moh_model_forward(m, in, NULL, &end, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, end.loss < l0.loss - 0.05, "%s: loss %.5f -> %.5f after %d steps", moh_model_type(m), l0.loss, end.loss, n);
    CHECK(ctx, falls >= n - 1, "%s: loss fell in only %d of %d steps", moh_model_type(m), falls, n);
    CHECK(ctx, moh_model_steps(m) == steps0 + n, "steps %ld, expected %ld", moh_model_steps(m), steps0 + n);
    printf("  %-5s %d AdamW steps (lr %g) on one batch: loss %.5f -> %.5f\n", moh_model_type(m), n, opt->lr, l0.loss,
           end.loss);
}

/* A NaN weight: the step is refused with MOH_E_NONFINITE, nothing changes; then training resumes. */
static void check_guard(test_ctx *ctx, moh_model *m, const moh_input *in, const moh_optim *opt, const char *tensor) {
    moh_error err;
    moh_tensor_info t;
    const int i = moh_model_find_tensor(m, tensor);
    CHECK(ctx, i >= 0 && moh_model_tensor(m, i, &t, &err) == MOH_OK, "no tensor %s", tensor);
    if (i < 0) return;
    float *p = moh_model_params(m);
    const size_t n = moh_model_num_params(m), k = t.offset + t.numel / 2;
    const float keep = p[k];
    p[k] = NAN;
    float *before = malloc(n * sizeof(float));
    memcpy(before, p, n * sizeof(float));
    const long steps = moh_model_steps(m);
    moh_losses l;
    const int rc = moh_model_train_step(m, in, opt, &l, &err);
    CHECK(ctx, rc == MOH_E_NONFINITE && one_line(&err) && strstr(err.msg, "not applied"), "NaN weight: %d %s", rc, err.msg);
    CHECK(ctx, !isfinite(l.loss) || !isfinite(l.grad_norm), "NaN weight gave loss %g, norm %g", l.loss, l.grad_norm);
    CHECK(ctx, !memcmp(before, p, n * sizeof(float)), "a refused step changed the weights");
    CHECK(ctx, moh_model_steps(m) == steps, "a refused step counted");
    p[k] = keep;
    CHECK(ctx, moh_model_train_step(m, in, opt, &l, &err) == MOH_OK && isfinite(l.loss), "after the guard: %s", err.msg);
    free(before);
}

static void test_lm(test_ctx *ctx) {
    moh_error err;
    moh_model *m = NULL;
    int rc = moh_model_load(&m, LM_DIR, &err);
    CHECK(ctx, rc == MOH_OK && m, "load %s: %s", LM_DIR, err.msg);
    if (rc) return;
    CHECK(ctx, !strcmp(moh_model_type(m), "llama"), "type %s", moh_model_type(m));
    CHECK(ctx, moh_model_num_layers(m) == 2 && moh_model_num_heads(m) == 8 && moh_model_num_outputs(m) == 256 &&
                   moh_model_max_seq_len(m) == 64,
          "L %d h %d V %d T %d", moh_model_num_layers(m), moh_model_num_heads(m), moh_model_num_outputs(m),
          moh_model_max_seq_len(m));
    const moh_attn_config *a = moh_model_attn(m);
    CHECK(ctx, a->shared_heads == 2 && a->top_k == 4 && a->router == MOH_ROUTER_LEARNED, "attn %d %d %d",
          a->shared_heads, a->top_k, (int)a->router);
    int C = -1;
    moh_model_image_shape(m, &C, NULL, NULL);
    CHECK(ctx, C == 0, "text model image C %d", C);
    CHECK(ctx, moh_model_image_norm(m, 0, NULL, NULL, &err) == MOH_E_ARG && one_line(&err), "image_norm on LM");
    const int e = moh_model_find_tensor(m, "model.embed_tokens.weight");
    moh_tensor_info t;
    CHECK(ctx, e >= 0 && moh_model_tensor(m, e, &t, &err) == MOH_OK && t.ndim == 2 && t.shape[0] == 256 && t.shape[1] == 32,
          "embed_tokens");
    CHECK(ctx, moh_model_tensor(m, moh_model_num_tensors(m), &t, &err) == MOH_E_ARG && one_line(&err), "tensor index past end");
    check_params_match_file(ctx, m, LM_DIR);
    CHECK(ctx, moh_model_router_gates(m, 0, NULL, NULL, &err) == MOH_E_ARG && one_line(&err), "gates before a forward");

    moh_safetensors bst, est;
    if (moh_st_open(&bst, LM_DIR "/batch.safetensors", &err) || moh_st_open(&est, LM_DIR "/expected.safetensors", &err)) {
        CHECK(ctx, 0, "%s", err.msg);
        moh_model_free(m);
        return;
    }
    int64_t nt = 0, ng = 0, nl = 0;
    int *tok = read_ids(ctx, &bst, "tokens", &nt), *tgt = read_ids(ctx, &bst, "targets", &ng);
    float *want_logits = read_all(ctx, &est, "logits", &nl);
    const int B = 2, T = 16, V = 256;
    if (tok && tgt && want_logits && nt == B * T && ng == B * T && nl == (int64_t)B * T * V) {
        moh_input in = {.B = B, .T = T, .tokens = tok, .targets = tgt};
        CHECK(ctx, moh_model_logits_count(m, &in) == (size_t)B * T * V, "logits count");
        float *logits = malloc(sizeof(float) * (size_t)nl), *logits2 = malloc(sizeof(float) * (size_t)nl);
        moh_losses l;
        rc = moh_model_forward(m, &in, logits, &l, &err);
        CHECK(ctx, rc == MOH_OK, "forward: %s", err.msg);
        const double le = test_rel_err_f32(logits, want_logits, (long)nl);
        const double ce = scalar(ctx, &est, "ce"), lb = scalar(ctx, &est, "lb"), loss = scalar(ctx, &est, "loss");
        long counted = 0;
        for (int i = 0; i < B * T; i++) counted += tgt[i] >= 0;
        CHECK(ctx, le <= TOL, "LM logits rel err %.3g", le);
        CHECK(ctx, rel(l.ce, ce) <= TOL && rel(l.lb, lb) <= TOL && rel(l.loss, loss) <= TOL,
              "LM ce %.7f/%.7f lb %.7f/%.7f loss %.7f/%.7f", l.ce, ce, l.lb, lb, l.loss, loss);
        CHECK(ctx, l.n == counted && isnan(l.grad_norm), "n %ld (expected %ld), grad_norm %g", l.n, counted, l.grad_norm);
        printf("  llama forward of %s: loss %.6f (reference %.6f), ce %.6f, lb %.6f, logits rel err %.2e\n", LM_DIR,
               l.loss, loss, l.ce, l.lb, le);
        /* every token: the shared heads and exactly top_k routed heads have a non-zero gate */
        const float *g = NULL;
        long ntok = 0, bad = 0;
        CHECK(ctx, moh_model_router_gates(m, 1, &g, &ntok, &err) == MOH_OK && ntok == B * T, "gates: %s", err.msg);
        for (long s = 0; g && s < ntok; s++) {
            int on = 0;
            for (int i = 0; i < 8; i++) on += g[s * 8 + i] != 0.0f;
            bad += on != 6 || g[s * 8] == 0.0f || g[s * 8 + 1] == 0.0f;
        }
        CHECK(ctx, bad == 0, "%ld tokens without 2 shared + 4 routed heads on", bad);
        double share[8], sum = 0.0;
        CHECK(ctx, moh_model_head_share(m, 0, share, &err) == MOH_OK, "%s", err.msg);
        for (int i = 0; i < 8; i++) sum += share[i];
        CHECK(ctx, share[0] == 1.0 && share[1] == 1.0 && fabs(sum - 6.0) < 1e-9, "head share %g %g sum %g", share[0],
              share[1], sum);
        CHECK(ctx, moh_model_head_share(m, 2, share, &err) == MOH_E_ARG && one_line(&err), "layer 2 of 2");
        /* without targets: same logits, no loss */
        moh_input nt_in = in;
        nt_in.targets = NULL;
        CHECK(ctx, moh_model_forward(m, &nt_in, logits2, &l, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, !memcmp(logits, logits2, sizeof(float) * (size_t)nl) && isnan(l.loss) && isnan(l.ce) && l.n == 0,
              "forward without targets: loss %g n %ld", l.loss, l.n);

        /* bad inputs */
        moh_input bad_in = in;
        bad_in.B = 0;
        rc = moh_model_forward(m, &bad_in, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "B is 0"), "B=0: %d %s", rc, err.msg);
        bad_in = in;
        bad_in.T = 65;
        rc = moh_model_forward(m, &bad_in, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "1..64"), "T=65: %d %s", rc, err.msg);
        int *tok_bad = malloc(sizeof(int) * (size_t)(B * T));
        memcpy(tok_bad, tok, sizeof(int) * (size_t)(B * T));
        tok_bad[T + 3] = 256;
        bad_in = in;
        bad_in.tokens = tok_bad;
        rc = moh_model_forward(m, &bad_in, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "tokens[19]") && strstr(err.msg, "0..255"),
              "token 256: %d %s", rc, err.msg);
        tok_bad[T + 3] = -1;
        rc = moh_model_forward(m, &bad_in, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && strstr(err.msg, "is -1"), "token -1: %d %s", rc, err.msg);
        bad_in = in;
        bad_in.targets = tok_bad; /* -1 is a valid target */
        CHECK(ctx, moh_model_forward(m, &bad_in, NULL, NULL, &err) == MOH_OK, "target -1: %s", err.msg);
        tok_bad[0] = -2;
        rc = moh_model_forward(m, &bad_in, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "targets[0]"), "target -2: %d %s", rc, err.msg);
        bad_in = in;
        bad_in.tokens = NULL;
        CHECK(ctx, moh_model_forward(m, &bad_in, NULL, NULL, &err) == MOH_E_ARG && one_line(&err), "tokens NULL");
        for (int i = 0; i < B * T; i++) tok_bad[i] = -1;
        bad_in = in;
        bad_in.targets = tok_bad;
        moh_optim opt;
        moh_optim_defaults(m, &opt);
        CHECK(ctx, opt.lr > 0 && opt.beta2 == 0.95 && opt.eps == 1e-8 && opt.grad_clip == 1.0, "LM defaults");
        rc = moh_model_train_step(m, &bad_in, &opt, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "nothing to train"), "all -1: %d %s", rc, err.msg);
        CHECK(ctx, moh_model_train_step(m, &nt_in, &opt, NULL, &err) == MOH_E_ARG && one_line(&err), "train without targets");
        moh_optim o2 = opt;
        o2.beta1 = 1.0;
        rc = moh_model_train_step(m, &in, &o2, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "beta1"), "beta1 1: %d %s", rc, err.msg);
        CHECK(ctx, moh_model_steps(m) == 0, "refused steps counted: %ld", moh_model_steps(m));
        free(tok_bad);

        /* a shorter batch after a longer one (activations re-sized) matches a fresh model */
        moh_input short_in = {.B = 1, .T = 8, .tokens = tok + T, .targets = tgt + T};
        moh_model *f = NULL;
        float sl[8 * 256], fl[8 * 256];
        CHECK(ctx, moh_model_forward(m, &short_in, sl, NULL, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, moh_model_load(&f, LM_DIR, &err) == MOH_OK && moh_model_forward(f, &short_in, fl, NULL, &err) == MOH_OK,
              "%s", err.msg);
        CHECK(ctx, !memcmp(sl, fl, sizeof sl), "B=1 T=8 logits depend on the earlier forward");
        moh_model_free(f);

        opt.lr = 1e-2;
        check_training(ctx, m, &in, &opt, 6);
        check_guard(ctx, m, &in, &opt, "lm_head.weight");
        check_save_reload(ctx, m, &in);
        free(logits);
        free(logits2);
    }
    free(tok);
    free(tgt);
    free(want_logits);
    moh_st_close(&bst);
    moh_st_close(&est);
    moh_model_free(m);
}

static void test_vit(test_ctx *ctx) {
    moh_error err;
    moh_model *m = NULL;
    int rc = moh_model_load(&m, VIT_DIR, &err);
    CHECK(ctx, rc == MOH_OK && m, "load %s: %s", VIT_DIR, err.msg);
    if (rc) return;
    int C = 0, H = 0, W = 0;
    moh_model_image_shape(m, &C, &H, &W);
    CHECK(ctx, !strcmp(moh_model_type(m), "vit") && C == 1 && H == 28 && W == 28 && moh_model_num_outputs(m) == 10 &&
                   moh_model_max_seq_len(m) == 0 && moh_model_num_layers(m) == 2 && moh_model_num_heads(m) == 4,
          "vit getters: %s %d %d %d", moh_model_type(m), C, H, W);
    double mean = NAN, sd = NAN;
    CHECK(ctx, moh_model_image_norm(m, 0, &mean, &sd, &err) == MOH_OK && isfinite(mean) && sd > 0, "norm %g %g", mean, sd);
    CHECK(ctx, moh_model_image_norm(m, 1, &mean, &sd, &err) == MOH_E_ARG && one_line(&err), "channel 1 of 1");
    check_params_match_file(ctx, m, VIT_DIR);
    moh_safetensors io;
    if (moh_st_open(&io, VIT_DIR "/io.safetensors", &err)) {
        CHECK(ctx, 0, "%s", err.msg);
        moh_model_free(m);
        return;
    }
    int64_t ni = 0, nlab = 0, nl = 0;
    float *img = read_all(ctx, &io, "images", &ni), *want = read_all(ctx, &io, "logits", &nl);
    int *lab = read_ids(ctx, &io, "labels", &nlab);
    const int B = 4, K = 10;
    if (img && want && lab && ni == B * 28 * 28 && nlab == B && nl == B * K) {
        moh_input in = {.B = B, .C = 1, .H = 28, .W = 28, .images = img, .labels = lab};
        float logits[4 * 10];
        moh_losses l;
        CHECK(ctx, moh_model_logits_count(m, &in) == (size_t)B * K, "logits count");
        rc = moh_model_forward(m, &in, logits, &l, &err);
        CHECK(ctx, rc == MOH_OK, "forward: %s", err.msg);
        const double le = test_rel_err_f32(logits, want, B * K);
        const double loss = scalar(ctx, &io, "loss"), lb = scalar(ctx, &io, "lb"), ce = ref_ce(want, lab, B, K);
        CHECK(ctx, le <= TOL, "ViT logits rel err %.3g", le);
        CHECK(ctx, rel(l.loss, loss) <= TOL && fabs(l.lb - lb) <= TOL * fmax(1.0, lb), "ViT loss %.7f/%.7f lb %.6f/%.6f",
              l.loss, loss, l.lb, lb);
        CHECK(ctx, rel(l.ce, ce) <= TOL && l.n == B, "ViT plain ce %.7f, from the reference logits %.7f (n %ld)", l.ce, ce, l.n);
        printf("  vit   forward of %s: loss %.6f (reference %.6f), plain ce %.6f (reference %.6f), logits rel err %.2e\n",
               VIT_DIR, l.loss, loss, l.ce, ce, le);
        const float *g = NULL;
        long ntok = 0;
        CHECK(ctx, moh_model_router_gates(m, 0, &g, &ntok, &err) == MOH_OK && ntok == B * 50, "ViT gates tokens %ld", ntok);

        moh_input bad = in;
        bad.H = 27;
        rc = moh_model_forward(m, &bad, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "[B, 1, 28, 28]"), "H 27: %d %s", rc, err.msg);
        int lab_bad[4] = {1, 2, 10, 3};
        bad = in;
        bad.labels = lab_bad;
        rc = moh_model_forward(m, &bad, NULL, NULL, &err);
        CHECK(ctx, rc == MOH_E_ARG && one_line(&err) && strstr(err.msg, "labels[2] is 10"), "label 10: %d %s", rc, err.msg);
        bad = in;
        bad.images = NULL;
        CHECK(ctx, moh_model_forward(m, &bad, NULL, NULL, &err) == MOH_E_ARG && one_line(&err), "images NULL");
        bad = in;
        bad.B = -3;
        CHECK(ctx, moh_model_forward(m, &bad, NULL, NULL, &err) == MOH_E_ARG && one_line(&err), "B -3");

        moh_optim opt;
        moh_optim_defaults(m, &opt);
        CHECK(ctx, opt.beta2 == 0.999, "ViT beta2 %g", opt.beta2);
        opt.lr = 3e-3;
        check_training(ctx, m, &in, &opt, 6);
        check_guard(ctx, m, &in, &opt, "head.weight");
        check_save_reload(ctx, m, &in);
    }
    free(img);
    free(want);
    free(lab);
    moh_st_close(&io);
    moh_model_free(m);
}

/* moh_model_new: deterministic in the seed, a random-init LM predicts near-uniformly. */
static void test_new(test_ctx *ctx) {
    moh_error err;
    moh_model *a = NULL, *b = NULL, *c = NULL;
    int rc = moh_model_new(&a, LM_DIR "/config.json", 7, &err);
    if (!rc) rc = moh_model_new(&b, LM_DIR "/config.json", 7, &err);
    if (!rc) rc = moh_model_new(&c, LM_DIR "/config.json", 8, &err);
    CHECK(ctx, rc == MOH_OK, "new: %s", err.msg);
    if (!rc) {
        const size_t n = moh_model_num_params(a);
        CHECK(ctx, !memcmp(moh_model_params(a), moh_model_params(b), n * sizeof(float)), "same seed, other params");
        CHECK(ctx, memcmp(moh_model_params(a), moh_model_params(c), n * sizeof(float)) != 0, "seed ignored");
        test_rng r = {0x9E3779B97F4A7C15ULL};
        int tok[3 * 20], tgt[3 * 20];
        for (int i = 0; i < 60; i++) {
            tok[i] = (int)(test_rng_u64(&r) % 256);
            tgt[i] = (int)(test_rng_u64(&r) % 256);
        }
        moh_input in = {.B = 3, .T = 20, .tokens = tok, .targets = tgt};
        moh_losses l;
        CHECK(ctx, moh_model_forward(a, &in, NULL, &l, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, fabs(l.ce - log(256.0)) < 0.05 && l.n == 60, "random-init ce %.4f, expected ~ln 256 = %.4f", l.ce,
              log(256.0));
    }
    moh_model_free(a);
    moh_model_free(b);
    moh_model_free(c);
    CHECK(ctx, moh_model_new(&a, "tests/fixtures/no_such_config.json", 1, &err) == MOH_E_IO && !a && one_line(&err) &&
                   strstr(err.msg, "no_such_config.json"),
          "missing config: %s", err.msg);
}

static void test_load_errors(test_ctx *ctx) {
    moh_error err;
    moh_model *m = (moh_model *)&err; /* set to NULL on error */
    int rc = moh_model_load(&m, "tests/fixtures/lm/no_such_checkpoint", &err);
    CHECK(ctx, rc == MOH_E_IO && m == NULL && one_line(&err) && strstr(err.msg, "no_such_checkpoint"), "missing dir: %d %s",
          rc, err.msg);
    rc = moh_model_load(&m, "tests/fixtures/lm", &err); /* a folder without config.json */
    CHECK(ctx, rc == MOH_E_IO && one_line(&err) && strstr(err.msg, "config.json"), "no config: %d %s", rc, err.msg);
    CHECK(ctx, moh_model_load(NULL, LM_DIR, &err) == MOH_E_ARG && one_line(&err), "NULL out");
    moh_model_free(NULL);
}

int main(void) {
    test_ctx ctx = {0};
    test_lm(&ctx);
    test_vit(&ctx);
    test_new(&ctx);
    test_load_errors(&ctx);
    return test_finish("test_api", &ctx);
}
