/* moh layer: run one MoH attention layer on tensors from safetensors files, forward and (with
 * --grad-output) backward, and write everything to a safetensors file. The parity tool for moving
 * weights between PyTorch and moh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"
#include "attn/layer.h"
#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "cuda/host.h"
#include "ops/bf16.h"

/* Reads a [B, N, C] tensor called name; sets *B, *N when they are 0, else checks them. */
static float *read_bnc(const char *path, const char *name, int C, int *B, int *N, moh_error *err) {
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return NULL;
    float *out = NULL;
    const moh_st_tensor *t = moh_st_find(&st, name);
    if (!t) {
        moh_fail(err, MOH_E_SHAPE, "%s: missing tensor '%s' (expected shape [B, N, %d])", path, name, C);
    } else if (t->ndim != 3 || t->shape[2] != C || t->shape[0] < 1 || t->shape[1] < 1 ||
               t->shape[0] > (1 << 20) || t->shape[1] > (1 << 20) ||
               (*B && (t->shape[0] != *B || t->shape[1] != *N))) {
        char want[64];
        if (*B) snprintf(want, sizeof want, "[%d, %d, %d]", *B, *N, C);
        else snprintf(want, sizeof want, "[B, N, %d] with B, N >= 1", C);
        char got[128] = "[";
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        strncat(got, "]", sizeof got - strlen(got) - 1);
        moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' has shape %s, expected %s", path, name, got, want);
    } else {
        *B = (int)t->shape[0];
        *N = (int)t->shape[1];
        out = malloc(sizeof(float) * (size_t)t->numel);
        if (!out) moh_fail(err, MOH_E_NOMEM, "%s: out of memory for '%s'", path, name);
        else if (moh_st_read_f32(&st, name, t->ndim, t->shape, out, err)) {
            free(out);
            out = NULL;
        }
    }
    moh_st_close(&st);
    return out;
}

/* Writes y [B, N, C], gates [B, N, h], lb_loss [1] and, with dx (not NULL), grad.x and
 * grad.<name> of every weight in g to path (F32). */
static int write_outputs(const char *path, const moh_attn_config *cfg, int B, int N, const float *y, const float *gates,
                         float lb, const float *dx, const attn_params_f32 *g, moh_error *err) {
    const int C = cfg->hidden_size, h = cfg->n_heads;
    moh_st_entry out[3 + ATTN_MAX_TENSORS + 1];
    char names[ATTN_MAX_TENSORS][176];
    int n = 0;
    out[n++] = (moh_st_entry){"y", 3, {B, N, C}, y};
    out[n++] = (moh_st_entry){"gates", 3, {B, N, h}, gates};
    out[n++] = (moh_st_entry){"lb_loss", 1, {1}, &lb};
    if (dx) {
        out[n++] = (moh_st_entry){"grad.x", 3, {B, N, C}, dx};
        attn_tensor ts[ATTN_MAX_TENSORS];
        const int nt = attn_tensors_f32(cfg, g, "", ts);
        for (int i = 0; i < nt; i++) {
            snprintf(names[i], sizeof names[i], "grad.%.160s", ts[i].name);
            out[n] = (moh_st_entry){names[i], ts[i].ndim, {ts[i].shape[0], ts[i].shape[1]}, ts[i].data};
            n++;
        }
    }
    return moh_st_write(path, out, n, err);
}

/* The layer on the GPU (moh_cuda.h): inputs rounded to bf16, bf16 compute with fp32 accumulation;
 * y, gates, lb_loss and with dy the gradients into the caller's host arrays (y [T, C], gates
 * [T, h], dx [T, C] zeroed, g zeroed, NULL dy: forward only). */
static int layer_cuda(const moh_attn_config *cfg, const attn_params_f32 *p, const float *x, const float *dy, int B,
                      int N, float *y, float *gates, float *lb, float *dx, const attn_params_f32 *g, moh_error *err) {
    const size_t T = (size_t)B * N, C = (size_t)cfg->hidden_size;
    moh_cuda_layer *l = NULL;
    void *wbuf = NULL, *gbuf = NULL, *dx16 = NULL, *dy16 = NULL, *dy32 = NULL, *y16 = NULL;
    moh_cuda_weights w;
    moh_cuda_grads dg;
    uint16_t *h16 = malloc(T * C * sizeof(uint16_t));
    if (!h16) return moh_fail(err, MOH_E_NOMEM, "out of memory (B=%d, N=%d)", B, N);
    int rc = moh_cuda_layer_new(&l, cfg, B, N, err);
    if (!rc) rc = cu_weights_upload(cfg, p, &wbuf, &w, err);
    if (!rc) rc = cu_dev_alloc(&dx16, T * C * 2, err);
    if (!rc) rc = cu_dev_alloc(&y16, T * C * 2, err);
    if (!rc) {
        for (size_t i = 0; i < T * C; i++) h16[i] = bf16_round(x[i]);
        rc = cu_copy_to_dev(dx16, h16, T * C * 2, err);
    }
    if (!rc) rc = moh_cuda_layer_forward(l, &w, dx16, B, N, y16, NULL, err);
    if (!rc) rc = moh_cuda_layer_lb_loss(l, NULL, lb, err);
    if (!rc) rc = cu_copy_to_host(h16, y16, T * C * 2, err);
    if (!rc) {
        for (size_t i = 0; i < T * C; i++) y[i] = bf16_value(h16[i]);
        rc = cu_copy_to_host(gates, moh_cuda_layer_gates(l), T * (size_t)cfg->n_heads * sizeof(float), err);
    }
    if (!rc && dy) {
        rc = cu_grads_alloc(cfg, &gbuf, &dg, err);
        if (!rc) rc = cu_dev_alloc(&dy16, T * C * 2, err);
        if (!rc) rc = cu_dev_alloc(&dy32, T * C * 4, err);
        if (!rc) rc = cu_dev_memset(dy32, 0, T * C * 4, err);
        if (!rc) {
            for (size_t i = 0; i < T * C; i++) h16[i] = bf16_round(dy[i]);
            rc = cu_copy_to_dev(dy16, h16, T * C * 2, err);
        }
        if (!rc) rc = moh_cuda_layer_backward(l, &w, &dg, dy16, (float)cfg->load_balance_coef, dy32, NULL, err);
        if (!rc) rc = moh_cuda_layer_sync(l, NULL, err);
        if (!rc) rc = cu_copy_to_host(dx, dy32, T * C * 4, err);
        if (!rc) rc = cu_grads_download(cfg, &dg, g, err);
    }
    if (!rc) rc = moh_cuda_layer_sync(l, NULL, err);
    free(h16);
    cu_dev_free(wbuf);
    cu_dev_free(gbuf);
    cu_dev_free(dx16);
    cu_dev_free(dy16);
    cu_dev_free(dy32);
    cu_dev_free(y16);
    moh_cuda_layer_free(l);
    return rc;
}

int cmd_layer(int argc, char **argv) {
    struct {
        const char *config, *weights, *input, *grad_output, *output, *path, *device;
    } a = {0};
    a.path = "sparse";
    a.device = "cpu";
    const arg_spec specs[] = {
        {"--config", ARG_STR, &a.config, "FILE", "layer JSON: hidden_size, num_attention_heads, num_key_value_heads, head_dim, shared_heads, top_k, router (learned|query_norm|none), causal, qkv_bias, proj_bias, rope_theta, load_balance_coef", true, ARG_ANY},
        {"--weights", ARG_STR, &a.weights, "FILE", "safetensors with the official names: qkv/proj (fused) or q_proj/k_proj/v_proj/o_proj (split), plus wg/wg_0/wg_1 as the router needs", true, ARG_ANY},
        {"--input", ARG_STR, &a.input, "FILE", "safetensors with 'x' [B, N, hidden_size]", true, ARG_ANY},
        {"--grad-output", ARG_STR, &a.grad_output, "FILE", "safetensors with 'dy' [B, N, hidden_size]: also compute gradients of L = sum(y * dy) + load_balance_coef * lb_loss", false, ARG_ANY},
        {"--output", ARG_STR, &a.output, "FILE", "written (F32): y [B,N,C], gates [B,N,h], lb_loss [1]; with --grad-output also grad.x and grad.<name> for every weight", true, ARG_ANY},
        {"--path", ARG_CHOICE, &a.path, "sparse|reference", "sparse (default): only routed (token, head) pairs; reference: every head, then gated (the definition)", false, ARG_ANY},
        {"--device", ARG_CHOICE, &a.device, "cpu|cuda", "cpu (default): float32; cuda: the GPU kernels (head-sparse, bf16 operands rounded from the inputs, fp32 accumulation)", false, ARG_ANY},
    };
    int prc = args_parse("layer", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "--config LAYER.json --weights W.safetensors --input X.safetensors [--grad-output DY.safetensors] --output OUT.safetensors",
                         "Runs one MoH attention layer (head-sparse path by default; --path reference computes every\nhead, then gates) and writes its outputs; the parity tool for moving weights between PyTorch\nand moh.\n");
    if (prc) return prc == 1 ? 0 : prc;
    const bool sparse = !strcmp(a.path, "sparse"), cuda = !strcmp(a.device, "cuda");
    if (cuda && !sparse) {
        fprintf(stderr, "moh layer: --path reference runs on the CPU only (--device cuda computes the head-sparse path)\n");
        return 2;
    }
    const char *inputs[] = {a.config, a.weights, a.input, a.grad_output};
    if (!cli_output_ok("layer", "--output", a.output, inputs, 4)) return 2;

    moh_error err = {0};
    int status = 1;
    size_t len = 0;
    float *wbuf = NULL, *gbuf = NULL, *x = NULL, *dy = NULL, *y = NULL, *dx = NULL;
    attn_layer_f32 layer = {0};
    bool have_layer = false;
    moh_attn_config cfg;
    attn_params_f32 p, g;
    int B = 0, N = 0;
    char *json = fs_read_file(a.config, 1 << 20, &len, &err);
    if (!json) {
        fprintf(stderr, "moh layer: %s\n", err.msg);
        return 1;
    }
    int rc = moh_attn_config_parse_json(&cfg, json, len, a.config, &err);
    free(json);
    if (rc) goto fail;
    if (attn_weights_load_f32(&cfg, a.weights, &wbuf, &p, &err)) goto fail;
    const int C = cfg.hidden_size, h = cfg.n_heads;
    if (!(x = read_bnc(a.input, "x", C, &B, &N, &err))) goto fail;
    if (a.grad_output && !(dy = read_bnc(a.grad_output, "dy", C, &B, &N, &err))) goto fail;
    const size_t T = (size_t)B * N;
    if (cuda) {
        float lb = 0.f;
        float *gates = malloc(sizeof(float) * T * h);
        y = malloc(sizeof(float) * T * C);
        const size_t np = attn_params_bind_f32(&g, NULL, &cfg);
        if (dy) {
            gbuf = calloc(np ? np : 1, sizeof(float));
            dx = calloc(T * C, sizeof(float));
        }
        if (!gates || !y || (dy && (!gbuf || !dx))) {
            free(gates);
            goto oom;
        }
        attn_params_bind_f32(&g, gbuf, &cfg);
        rc = layer_cuda(&cfg, &p, x, dy, B, N, y, gates, &lb, dx, &g, &err);
        if (!rc) rc = write_outputs(a.output, &cfg, B, N, y, gates, lb, dy ? dx : NULL, &g, &err);
        free(gates);
        if (rc) goto fail;
        status = 0;
        goto done;
    }
    if (attn_layer_init_f32(&layer, NULL, &cfg, B, N, sparse, &err)) goto fail;
    have_layer = true;
    y = malloc(sizeof(float) * T * C);
    if (!y) goto oom;
    attn_layer_forward_f32(&layer, &cfg, &p, x, B, N, y);
    const attn_cache_f32 *acache = attn_layer_router_f32(&layer);

    float *dxo = NULL;
    if (dy) {
        const size_t np = attn_params_bind_f32(&g, NULL, &cfg);
        gbuf = calloc(np ? np : 1, sizeof(float));
        dx = calloc(T * C, sizeof(float));
        if (!gbuf || !dx) goto oom;
        attn_params_bind_f32(&g, gbuf, &cfg);
        attn_layer_backward_f32(&layer, &cfg, &p, &g, dy, (float)cfg.load_balance_coef, dx);
        dxo = dx;
    }
    if (write_outputs(a.output, &cfg, B, N, y, acache->gates, acache->lb_loss, dxo, &g, &err)) goto fail;
    status = 0;
    goto done;
oom:
    moh_fail(&err, MOH_E_NOMEM, "out of memory (B=%d, N=%d)", B, N);
fail:
    fprintf(stderr, "moh layer: %s\n", err.msg);
done:
    if (have_layer) attn_layer_free_f32(&layer);
    free(wbuf);
    free(gbuf);
    free(x);
    free(dy);
    free(y);
    free(dx);
    return status;
}
