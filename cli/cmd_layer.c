/* moh layer: run one MoH attention layer on tensors from safetensors files, forward and (with
 * --grad-output) backward, and write everything to a safetensors file. The parity tool for moving
 * weights between PyTorch and moh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"
#include "cli.h"

static const char *LAYER_HELP =
    "usage: moh layer --config LAYER.json --weights W.safetensors --input X.safetensors\n"
    "                 [--grad-output DY.safetensors] --output OUT.safetensors\n"
    "\n"
    "Runs one MoH attention layer (reference path: every head computed, then gated).\n"
    "  --config FILE       layer JSON: hidden_size, num_attention_heads, num_key_value_heads,\n"
    "                      head_dim, shared_heads, top_k, router (learned|query_norm|none),\n"
    "                      causal, qkv_bias, proj_bias, rope_theta, load_balance_coef\n"
    "  --weights FILE      official tensor names, fused (qkv/proj) or split (q_proj/k_proj/\n"
    "                      v_proj/o_proj), plus wg/wg_0/wg_1 as the router needs\n"
    "  --input FILE        tensor 'x' [B, N, hidden_size]\n"
    "  --grad-output FILE  tensor 'dy' [B, N, hidden_size]: also compute gradients of\n"
    "                      L = sum(y * dy) + load_balance_coef * lb_loss\n"
    "  --output FILE       written (F32): y [B,N,C], gates [B,N,h], lb_loss [1], and with\n"
    "                      --grad-output grad.x and grad.<name> for every weight\n";

typedef struct layer_args {
    const char *config, *weights, *input, *grad_output, *output;
} layer_args;

static int parse_args(int argc, char **argv, layer_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            fputs(LAYER_HELP, stdout);
            return 1;
        }
        const char **slot = !strcmp(k, "--config")        ? &a->config
                            : !strcmp(k, "--weights")     ? &a->weights
                            : !strcmp(k, "--input")       ? &a->input
                            : !strcmp(k, "--grad-output") ? &a->grad_output
                            : !strcmp(k, "--output")      ? &a->output
                                                          : NULL;
        if (!slot) {
            fprintf(stderr, "moh layer: unknown option '%s' (see moh layer --help)\n", k);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "moh layer: option %s needs a value\n", k);
            return 2;
        }
        *slot = argv[++i];
    }
    const char *missing = !a->config ? "--config" : !a->weights ? "--weights" : !a->input ? "--input"
                          : !a->output ? "--output" : NULL;
    if (missing) {
        fprintf(stderr, "moh layer: missing required option %s (see moh layer --help)\n", missing);
        return 2;
    }
    return 0;
}

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

int cmd_layer(int argc, char **argv) {
    layer_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc == 1 ? 0 : prc;

    moh_error err = {0};
    int status = 1;
    char ebuf[512];
    size_t len = 0;
    float *wbuf = NULL, *gbuf = NULL, *x = NULL, *dy = NULL, *y = NULL, *dx = NULL;
    attn_cache_f32 cache = {0};
    bool have_cache = false;
    moh_attn_config cfg;
    attn_params_f32 p, g;
    int B = 0, N = 0;
    char *json = cli_read_file(a.config, 1 << 20, &len, ebuf, sizeof ebuf);
    if (!json) {
        fprintf(stderr, "moh layer: %s\n", ebuf);
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
    if (attn_cache_init_f32(&cache, &cfg, B, N, &err)) goto fail;
    have_cache = true;
    y = malloc(sizeof(float) * T * C);
    if (!y) goto oom;
    attn_forward_f32(&cfg, &p, x, B, N, y, &cache);

    moh_st_entry out[3 + ATTN_MAX_TENSORS + 1];
    char names[ATTN_MAX_TENSORS][176];
    int n = 0;
    out[n++] = (moh_st_entry){"y", 3, {B, N, C}, y};
    out[n++] = (moh_st_entry){"gates", 3, {B, N, h}, cache.gates};
    out[n++] = (moh_st_entry){"lb_loss", 1, {1}, &cache.lb_loss};
    if (dy) {
        const size_t np = attn_params_bind_f32(&g, NULL, &cfg);
        gbuf = calloc(np ? np : 1, sizeof(float));
        dx = calloc(T * C, sizeof(float));
        if (!gbuf || !dx) goto oom;
        attn_params_bind_f32(&g, gbuf, &cfg);
        attn_backward_f32(&cfg, &p, &g, &cache, dy, (float)cfg.load_balance_coef, dx);
        out[n++] = (moh_st_entry){"grad.x", 3, {B, N, C}, dx};
        attn_tensor ts[ATTN_MAX_TENSORS];
        const int nt = attn_tensors_f32(&cfg, &g, "", ts);
        for (int i = 0; i < nt; i++) {
            snprintf(names[i], sizeof names[i], "grad.%.160s", ts[i].name);
            out[n] = (moh_st_entry){names[i], ts[i].ndim, {ts[i].shape[0], ts[i].shape[1]}, ts[i].data};
            n++;
        }
    }
    if (moh_st_write(a.output, out, n, &err)) goto fail;
    status = 0;
    goto done;
oom:
    moh_fail(&err, MOH_E_NOMEM, "out of memory (B=%d, N=%d)", B, N);
fail:
    fprintf(stderr, "moh layer: %s\n", err.msg);
done:
    if (have_cache) attn_cache_free_f32(&cache);
    free(wbuf);
    free(gbuf);
    free(x);
    free(dy);
    free(y);
    free(dx);
    return status;
}
