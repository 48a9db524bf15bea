#include "models/lm_decode.h"

#include "io/gguf.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const char *lm_phase_name(int i) {
    static const char *const names[LM_NPHASE] = {"qkv", "attention", "wo", "mlp", "lm_head", "other"};
    return i >= 0 && i < LM_NPHASE ? names[i] : "?";
}

/* Adds the time since t to ph[i]; returns now. */
static double lap(double *ph, int i, double t) {
    const double now = omp_get_wtime();
    ph[i] += now - t;
    return now;
}

/* The cache's allocations: the decode side (K/V; bf16: the weights' copy of p), fp32
 * activations, the head lists, the router scratch. */
static int kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, const quant_table *qt,
                   int max_T, moh_error *err) {
    memset(kv, 0, sizeof *kv);
    if (max_T < 1) return moh_fail(err, MOH_E_ARG, "KV cache: %d tokens, expected >= 1", max_T);
    const moh_attn_config *a = &cfg->attn;
    const size_t C = (size_t)cfg->hidden_size, hd = (size_t)a->n_heads * a->head_dim;
    const size_t I = (size_t)cfg->intermediate_size, qd = (size_t)attn_qkv_dim(a);
    const int nt = a->n_heads + 2 * a->n_kv_heads;
    size_t xn = C > hd ? C : hd;
    xn = xn > I ? xn : I;
    const int nkv = cfg->num_hidden_layers * a->n_kv_heads;
    if (qt ? attn_decode_init_quant(&kv->dc, nkv, a->head_dim, max_T, xn, nt, qt, err)
           : attn_decode_init(&kv->dc, nkv, a->head_dim, max_T, xn, nt, p ? p->data : NULL, p ? p->n : 0, err))
        return err->code;
    /* scores: one [max_T] row per query head, so heads can run in parallel */
    const size_t sizes[] = {C, C, qd, hd, C, I, I, (size_t)a->n_heads * max_T};
    float **fields[] = {&kv->x, &kv->xn, &kv->qkv, &kv->og, &kv->tmp, &kv->gate, &kv->up, &kv->scores};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    kv->block = malloc(total * sizeof(float));
    kv->task = malloc(sizeof(int) * (size_t)nt);
    if (!kv->block || !kv->task) {
        lm_kv_free(kv);
        return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate %zu KiB of activations", (total * 4) >> 10);
    }
    float *cur = kv->block;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *fields[i] = cur;
        cur += sizes[i];
    }
    if (attn_cache_init_f32(&kv->router, a, 1, 1, err)) {
        lm_kv_free(kv);
        return err->code;
    }
    kv->have_router = true;
    kv->max_T = max_T;
    return MOH_OK;
}

int lm_kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, int max_T, moh_error *err) {
    return kv_init(kv, cfg, NULL, NULL, max_T, err);
}

int lm_kv_init_bf16(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, int max_T, moh_error *err) {
    return kv_init(kv, cfg, p, NULL, max_T, err);
}

int lm_kv_init_quant(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, const quant_table *qt,
                     int max_T, moh_error *err) {
    if (!qt || qt->base != p->data || qt->nbase != p->n)
        return moh_fail(err, MOH_E_ARG, "quantised KV cache: the table of quantised matrices is not of these parameters");
    return kv_init(kv, cfg, p, qt, max_T, err);
}

typedef struct qmat {
    const float *w;
    int64_t rows, cols;
} qmat;

static int cmp_qmat(const void *a, const void *b) {
    const float *x = ((const qmat *)a)->w, *y = ((const qmat *)b)->w;
    return (x > y) - (x < y);
}

int lm_quant_table(const moh_lm_config *cfg, const lm_params_f32 *p, int type, quant_table *qt, moh_error *err) {
    memset(qt, 0, sizeof *qt);
    if (!quant_supported(type)) return moh_fail(err, MOH_E_ARG, "quantise: ggml type %d, expected " QUANT_TYPE_LIST, type);
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int nm = 5 * L + 1;
    qmat *m = malloc(sizeof *m * (size_t)nm);
    if (!m) return moh_fail(err, MOH_E_NOMEM, "quantise: out of memory");
    int n = 0;
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        m[n++] = (qmat){b->attn.w_qkv, attn_qkv_dim(a), C};
        if (a->head_dim % QUANT_BLOCK == 0) /* W_O is read per head: whole blocks only */
            m[n++] = (qmat){b->attn.w_o, C, (int64_t)a->n_heads * a->head_dim};
        m[n++] = (qmat){b->w_gate, I, C};
        m[n++] = (qmat){b->w_up, I, C};
        m[n++] = (qmat){b->w_down, C, I};
    }
    m[n++] = (qmat){p->lm_head, cfg->vocab_size, C};
    qsort(m, (size_t)n, sizeof *m, cmp_qmat);
    /* the LM head (a tied embedding) gets more bits, rows not of whole blocks llama-quantize's
     * fallback (quant_fit), as moh convert writes them */
    int *ty = malloc(sizeof *ty * (size_t)(n > 0 ? n : 1));
    if (!ty) {
        free(m);
        return moh_fail(err, MOH_E_NOMEM, "quantise: out of memory");
    }
    size_t bytes = 0;
    int keep = 0; /* whole blocks only (another width runs fp32); a tied head once */
    for (int i = 0; i < n; i++) {
        const int t = quant_fit(m[i].w == p->lm_head ? quant_head_type(type) : type, m[i].cols);
        if (t >= 0 && (!keep || m[i].w != m[keep - 1].w)) {
            ty[keep] = t;
            m[keep++] = m[i];
            bytes += (size_t)m[i].rows * quant_row_bytes(t, m[i].cols);
        }
    }
    int rc = quant_table_init(qt, p->data, p->n, keep, bytes, err);
    for (int i = 0; i < keep && !rc; i++)
        rc = quant_table_quantize(qt, (size_t)(m[i].w - p->data), m[i].rows, m[i].cols, ty[i], err);
    free(ty);
    free(m);
    if (rc) quant_table_free(qt);
    return rc;
}

void lm_kv_free(lm_kv_cache *kv) {
    if (kv->have_router) attn_cache_free_f32(&kv->router);
    attn_decode_free(&kv->dc);
    free(kv->block);
    free(kv->task);
    memset(kv, 0, sizeof *kv);
}

void lm_kv_reset(lm_kv_cache *kv) { kv->pos = 0; }

void lm_kv_write(lm_kv_cache *kv, const moh_lm_config *cfg, int l, int g, int pos, int n, const float *k,
                 const float *v) {
    attn_decode_write(&kv->dc, l * cfg->attn.n_kv_heads + g, pos, n, k, v);
}

/* A bf16 cache runs only the parameters it holds the copy of: MOH_E_ARG otherwise. */
static int check_params(const lm_kv_cache *kv, const lm_params_f32 *p, moh_error *err) {
    return attn_decode_check(&kv->dc, p->data, p->n, err);
}

/* x [n, C] = the embedding rows of tok[0..n): from the table t where it holds them (a quantised
 * cache: a tied head, a GGUF token_embd, as llama.cpp's get_rows), else p's float rows. */
static void embed_rows(const quant_table *t, const lm_params_f32 *p, const int *tok, int n, int C, float *x) {
    for (int i = 0; i < n; i++)
        if (!quant_table_row(t, p->embed + (size_t)tok[i] * C, C, x + (size_t)i * C))
            embedding_forward_f32(x + (size_t)i * C, &tok[i], p->embed, 1, C);
}

int lm_kv_calibrate(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, moh_error *err) {
    if (check_params(kv, p, err)) return err->code;
    attn_decode_calibrate(&kv->dc, p->blocks[0].attn.w_qkv, attn_qkv_dim(&cfg->attn), cfg->hidden_size, kv->xn,
                          kv->qkv);
    return MOH_OK;
}

int lm_decode_step(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, int token,
                   float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int h = a->n_heads, hkv = a->n_kv_heads, d = a->head_dim, grp = h / hkv;
    const int qd = attn_qkv_dim(a), pos = kv->pos;
    const float eps = (float)cfg->rms_norm_eps;
    if (pos >= kv->max_T)
        return moh_fail(err, MOH_E_ARG, "KV cache full: %d tokens (raise the context)", kv->max_T);
    if (token < 0 || token >= cfg->vocab_size)
        return moh_fail(err, MOH_E_ARG, "token %d out of range [0, %d)", token, cfg->vocab_size);
    if (check_params(kv, p, err)) return err->code;
    if (kv->dc.par_work <= 0 && lm_kv_calibrate(kv, cfg, p, err)) return err->code;
    attn_decode *dc = &kv->dc;
    double *ph = kv->phase_s, t = omp_get_wtime();
    embed_rows(dc->qt, p, &token, 1, C, kv->x);
    float rstd;
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln1, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        int *sel = kv->task, nsel = 0; /* the heads this token runs */
        if (a->router == MOH_ROUTER_LEARNED) {
            /* the learned router reads x only: route first, then K and V for every KV head and
             * q only for the selected heads (spec §10), in one pass over their W_qkv rows */
            attn_decode_route(a, &b->attn, kv->xn, &kv->router);
            for (int i = 0; i < h; i++)
                if (kv->router.gates[i] != 0.0f) sel[nsel++] = i;
                else memset(kv->qkv + (size_t)i * d, 0, sizeof(float) * d);
            for (int j = 0; j < 2 * hkv; j++) sel[nsel + j] = h + j;
            attn_decode_head_rows(dc, kv->qkv, b->attn.w_qkv, b->attn.b_qkv, kv->xn, sel, nsel + 2 * hkv, d, C);
        } else { /* none: every head; query_norm: every q is needed to choose */
            attn_decode_linear(dc, kv->qkv, kv->xn, b->attn.w_qkv, b->attn.b_qkv, C, qd);
            router_forward_f32(a, &b->attn, kv->xn, kv->qkv, 1, &kv->router);
            for (int i = 0; i < h; i++)
                if (kv->router.gates[i] != 0.0f) sel[nsel++] = i;
        }
        if (a->rope_theta > 0) rope_forward_f32(kv->qkv, 1, qd, h + hkv, &pos, a);
        for (int g = 0; g < hkv; g++) /* head-major: each head's keys are one contiguous stream */
            lm_kv_write(kv, cfg, l, g, pos, 1, kv->qkv + (size_t)(h + g) * d, kv->qkv + (size_t)(h + hkv + g) * d);
        t = lap(ph, LM_PH_QKV, t);
        /* attention of the selected heads only (spec §10), one task per head; og of the others
         * is never read */
        kv->heads_total += h;
        kv->heads_run += nsel;
        attn_decode_attend(dc, l, hkv, grp, sel, nsel, pos, kv->qkv, kv->router.gates, kv->scores, kv->og);
        t = lap(ph, LM_PH_ATTN, t);
        if (nsel < h) attn_decode_blocks(dc, kv->tmp, b->attn.w_o, (long)h * d, b->attn.b_o, kv->og, sel, nsel, d, C);
        else attn_decode_linear(dc, kv->tmp, kv->og, b->attn.w_o, b->attn.b_o, h * d, C);
        t = lap(ph, LM_PH_WO, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln2, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        if (b->w_up == b->w_gate + (size_t)I * C && kv->up == kv->gate + I) /* [2I, C]: one product */
            attn_decode_linear(dc, kv->gate, kv->xn, b->w_gate, NULL, C, 2 * I);
        else {
            attn_decode_linear(dc, kv->gate, kv->xn, b->w_gate, NULL, C, I);
            attn_decode_linear(dc, kv->up, kv->xn, b->w_up, NULL, C, I);
        }
        swiglu_forward_f32(kv->gate, kv->gate, kv->up, I);
        attn_decode_linear(dc, kv->tmp, kv->gate, b->w_down, NULL, I, C);
        t = lap(ph, LM_PH_MLP, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(kv->xn, &rstd, kv->x, p->norm, 1, C, eps);
    attn_decode_linear(dc, logits, kv->xn, p->lm_head, NULL, C, cfg->vocab_size);
    lap(ph, LM_PH_HEAD, t);
    kv->pos++;
    return MOH_OK;
}

int lm_prefill_init(lm_prefill_ws *w, const moh_lm_config *cfg, int max_n, moh_error *err) {
    memset(w, 0, sizeof *w);
    if (max_n < 1) return moh_fail(err, MOH_E_ARG, "prefill: %d tokens, expected >= 1", max_n);
    const size_t n = (size_t)max_n, C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    w->block = malloc(sizeof(float) * (3 * n * C + 2 * n * I + n));
    if (!w->block) return moh_fail(err, MOH_E_NOMEM, "prefill: cannot allocate activations for %d tokens", max_n);
    w->x = w->block;
    w->xn = w->x + n * C;
    w->y = w->xn + n * C;
    w->gate = w->y + n * C;
    w->up = w->gate + n * I;
    w->rstd = w->up + n * I;
    be_ctx_init(&w->cx, NULL);
    if (attn_layer_init_f32(&w->layer, w->cx.be, &cfg->attn, 1, max_n, true, err)) {
        free(w->block);
        w->block = NULL;
        return err->code;
    }
    w->max_n = max_n;
    return MOH_OK;
}

int lm_prefill_set_bf16(lm_prefill_ws *w, const moh_lm_config *cfg, const lm_kv_cache *kv, moh_error *err) {
    if (!kv->dc.bf16) return moh_fail(err, MOH_E_ARG, "prefill: bf16 asked for a float32 KV cache");
    if (be_ctx_set_weights(&w->cx, &kv->dc.w16, err)) return err->code;
    if (attn_layer_set_compute_f32(&w->layer, &cfg->attn, &w->cx, err)) return err->code;
    w->bf16_kv = kv;
    return MOH_OK;
}

/* Floats of the dequantisation scratch: W_qkv + W_O, or one MLP matrix. */
static size_t wq_floats(const moh_lm_config *cfg) {
    const moh_attn_config *a = &cfg->attn;
    const size_t C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size, qd = (size_t)attn_qkv_dim(a);
    const size_t hd = (size_t)a->n_heads * a->head_dim;
    return (qd + hd) * C > I * C ? (qd + hd) * C : I * C;
}

int lm_prefill_set_quant(lm_prefill_ws *w, const moh_lm_config *cfg, const lm_kv_cache *kv, moh_error *err) {
    if (!kv->dc.qt) return moh_fail(err, MOH_E_ARG, "prefill: quantised weights asked for a cache without them");
    if (!w->wq) {
        w->nwq = wq_floats(cfg);
        if (!(w->wq = malloc(sizeof(float) * w->nwq)))
            return moh_fail(err, MOH_E_NOMEM, "prefill: cannot allocate %zu MiB for dequantised weights", (w->nwq * 4) >> 20);
    }
    char why[160];
    if (w->wq16.data || precision_resolve(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16) return MOH_OK;
    if (bf16_mirror_init(&w->wq16, w->wq, w->nwq, err) || be_ctx_set_weights(&w->cx, &w->wq16, err) ||
        attn_layer_set_compute_f32(&w->layer, &cfg->attn, &w->cx, err))
        return err->code;
    return MOH_OK;
}

/* After matrices were dequantised into the scratch: their bf16 copy, when the GEMMs run bf16. */
static void wq_sync(lm_prefill_ws *w) {
    if (w->wq16.data) bf16_mirror_sync(&w->wq16);
}

void lm_prefill_free(lm_prefill_ws *w) {
    bf16_mirror_free(&w->wq16);
    free(w->wq);
    if (w->block) {
        attn_layer_free_f32(&w->layer);
        be_ctx_release(&w->cx);
    }
    free(w->block);
    memset(w, 0, sizeof *w);
}

/* Seconds of the layer's attention and W_O phases since the last call (the rest of its forward
 * counts as q/k/v): into ph[LM_PH_ATTN], ph[LM_PH_WO]; returns their sum. */
static double prefill_phases(attn_layer_f32 *L, double *ph) {
    const char *names[32];
    double sec[32] = {0}, sum = 0;
    const int n = attn_layer_phases_f32(L, names, sec, 32, true);
    for (int i = 0; i < n; i++) {
        const int at = !strcmp(names[i], "attention") ? LM_PH_ATTN : !strcmp(names[i], "wo_scatter") ? LM_PH_WO : -1;
        if (at < 0) continue;
        ph[at] += sec[i];
        sum += sec[i];
    }
    return sum;
}

/* The float rows of W [rows, cols] (in the parameter buffer) from the table's blocks into dst when
 * the table holds every row; returns what to multiply with: dst, or w itself. */
static const float *dequant_rows(const quant_table *t, const float *w, int64_t rows, int64_t cols, float *dst) {
    if (!quant_table_row(t, w, cols, dst)) return w;
    bool all = true;
#pragma omp parallel for schedule(static) reduction(&& : all)
    for (int64_t r = 1; r < rows; r++) all = quant_table_row(t, w + r * cols, cols, dst + r * cols) && all;
    return all ? dst : w;
}

/* Layer l's weights for a batched pass: on a quantised cache (t) W_qkv and W_O the table holds are
 * dequantised into the scratch (and its bf16 copy; the float buffer need not hold them) in *bq;
 * else p's block itself. The MLP's matrices go one at a time through the same scratch (mlp_forward). */
static const lm_block_f32 *layer_weights(const moh_lm_config *cfg, const quant_table *t, lm_prefill_ws *w,
                                         const lm_params_f32 *p, int l, lm_block_f32 *bq) {
    const lm_block_f32 *b = &p->blocks[l];
    if (!t) return b;
    const moh_attn_config *a = &cfg->attn;
    const int64_t C = cfg->hidden_size, qd = attn_qkv_dim(a), hd = (int64_t)a->n_heads * a->head_dim;
    *bq = *b;
    bq->attn.w_qkv = (float *)dequant_rows(t, b->attn.w_qkv, qd, C, w->wq);
    bq->attn.w_o = (float *)dequant_rows(t, b->attn.w_o, C, hd, w->wq + qd * C);
    wq_sync(w);
    return bq;
}

/* An MLP matrix for a batched pass: dequantised into the scratch (and its bf16 copy) when the
 * table t holds it, else m itself (t NULL: always m). */
static const float *mlp_weight(lm_prefill_ws *w, const quant_table *t, const float *m, int64_t rows, int64_t cols) {
    const float *r = dequant_rows(t, m, rows, cols, w->wq);
    if (r == w->wq) wq_sync(w);
    return r;
}

/* y [n, C] = SwiGLU MLP of block b on xn [n, C] (w->gate, w->up [n, I] scratch), each matrix from
 * the table t where it holds it, just before its product. */
static void mlp_forward(const moh_lm_config *cfg, lm_prefill_ws *w, const quant_table *t, const lm_block_f32 *b,
                        const float *xn, int n, float *y) {
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    be_linear_forward_f32(&w->cx, w->gate, xn, mlp_weight(w, t, b->w_gate, I, C), NULL, n, C, I);
    be_linear_forward_f32(&w->cx, w->up, xn, mlp_weight(w, t, b->w_up, I, C), NULL, n, C, I);
    swiglu_forward_f32(w->gate, w->gate, w->up, (long)n * I);
    be_linear_forward_f32(&w->cx, y, w->gate, mlp_weight(w, t, b->w_down, C, I), NULL, n, I, C);
}

int lm_prefill(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
               const int *tok, int n, float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size;
    const int hkv = a->n_kv_heads;
    const float eps = (float)cfg->rms_norm_eps;
    if (n < 1 || n > w->max_n || n > kv->max_T)
        return moh_fail(err, MOH_E_ARG, "prefill: %d tokens, expected 1..%d (workspace) and <= %d (KV cache)", n,
                        w->max_n, kv->max_T);
    if (w->bf16_kv && w->bf16_kv != kv)
        return moh_fail(err, MOH_E_ARG, "prefill: the workspace computes in bf16 for another KV cache");
    if (check_params(kv, p, err)) return err->code;
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= cfg->vocab_size)
            return moh_fail(err, MOH_E_ARG, "prefill: token %d at position %d out of range [0, %d)", tok[i], i,
                            cfg->vocab_size);
    const quant_table *qt = kv->dc.qt;
    if (qt && !w->wq && lm_prefill_set_quant(w, cfg, kv, err)) return err->code;
    lm_kv_reset(kv);
    double *ph = kv->phase_s, t = omp_get_wtime();
    const size_t nC = (size_t)n * C;
    float *x = w->x, *xn = w->xn, *y = w->y, *rstd = w->rstd;
    embed_rows(qt, p, tok, n, C, x);
    for (int l = 0; l < L; l++) {
        lm_block_f32 bq;
        const lm_block_f32 *b = layer_weights(cfg, qt, w, p, l, &bq);
        rmsnorm_forward_f32(xn, rstd, x, b->ln1, n, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        attn_layer_forward_f32(&w->layer, a, &b->attn, xn, 1, n, y);
        /* K (after RoPE) and V of every KV head */
        for (int g = 0; g < hkv; g++) {
            const float *k = NULL, *v = NULL;
            attn_layer_kv_f32(&w->layer, a, g, n, &k, &v);
            lm_kv_write(kv, cfg, l, g, 0, n, k, v);
        }
        kv->heads_run += attn_layer_pairs_f32(&w->layer, a);
        kv->heads_total += (long)n * a->n_heads;
        const double now = omp_get_wtime(), in_layer = prefill_phases(&w->layer, ph);
        ph[LM_PH_QKV] += (now - t) - in_layer;
        t = now;
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
        rmsnorm_forward_f32(xn, rstd, x, b->ln2, n, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        mlp_forward(cfg, w, qt, b, xn, n, y);
        t = lap(ph, LM_PH_MLP, t);
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(xn, rstd, x + (size_t)(n - 1) * C, p->norm, 1, C, eps);
    attn_decode_linear(&kv->dc, logits, xn, p->lm_head, NULL, C, cfg->vocab_size);
    lap(ph, LM_PH_HEAD, t);
    kv->pos = n;
    return MOH_OK;
}

/* Appends tok[0..n) to a cache holding kv->pos > 0 tokens in one batched pass per layer: the
 * projections and the MLP as GEMMs over the n tokens (the workspace's context: fp32, bf16, or a
 * quantised cache's matrices dequantised one at a time), the router per token as decode routes
 * (attn_decode_route / router_forward_f32), K and V into the cache, and each token's selected
 * heads attending over the cache up to its own position (attn_decode_attend, the decode kernels).
 * Scratch: qkv [n, qd], og [n, h d], gates [n, h] in sc. */
static int extend(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
                  const int *tok, int n, float *sc, float *logits) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size;
    const int h = a->n_heads, hkv = a->n_kv_heads, d = a->head_dim, grp = h / hkv, qd = attn_qkv_dim(a);
    const size_t hd = (size_t)h * d, nC = (size_t)n * C;
    const float eps = (float)cfg->rms_norm_eps;
    const quant_table *qt = kv->dc.qt;
    const int pos0 = kv->pos;
    float *x = w->x, *xn = w->xn, *y = w->y, *rstd = w->rstd;
    float *qkv = sc, *og = qkv + (size_t)n * qd, *gates = og + (size_t)n * hd;
    int *pos = kv->task + h + 2 * hkv; /* [n]: after the head lists */
    double *ph = kv->phase_s, t = omp_get_wtime();
    for (int i = 0; i < n; i++) pos[i] = pos0 + i;
    embed_rows(qt, p, tok, n, C, x);
    for (int l = 0; l < L; l++) {
        lm_block_f32 bq;
        const lm_block_f32 *b = layer_weights(cfg, qt, w, p, l, &bq);
        rmsnorm_forward_f32(xn, rstd, x, b->ln1, n, C, eps);
        be_linear_forward_f32(&w->cx, qkv, xn, b->attn.w_qkv, b->attn.b_qkv, n, C, qd);
        for (int i = 0; i < n; i++) { /* the gates of each token, as lm_decode_step chooses them */
            const float *xi = xn + (size_t)i * C;
            if (a->router == MOH_ROUTER_LEARNED) attn_decode_route(a, &b->attn, xi, &kv->router);
            else router_forward_f32(a, &b->attn, xi, qkv + (size_t)i * qd, 1, &kv->router);
            memcpy(gates + (size_t)i * h, kv->router.gates, sizeof(float) * (size_t)h);
        }
        if (a->rope_theta > 0) rope_forward_f32(qkv, n, qd, h + hkv, pos, a);
        for (int i = 0; i < n; i++)
            for (int g = 0; g < hkv; g++)
                lm_kv_write(kv, cfg, l, g, pos0 + i, 1, qkv + (size_t)i * qd + (size_t)(h + g) * d,
                            qkv + (size_t)i * qd + (size_t)(h + hkv + g) * d);
        t = lap(ph, LM_PH_QKV, t);
        memset(og, 0, sizeof(float) * (size_t)n * hd); /* skipped heads add nothing through W_O */
        for (int i = 0; i < n; i++) {
            int *sel = kv->task, nsel = 0;
            for (int k = 0; k < h; k++)
                if (gates[(size_t)i * h + k] != 0.0f) sel[nsel++] = k;
            kv->heads_total += h;
            kv->heads_run += nsel;
            attn_decode_attend(&kv->dc, l, hkv, grp, sel, nsel, pos0 + i, qkv + (size_t)i * qd, gates + (size_t)i * h,
                               kv->scores, og + (size_t)i * hd);
        }
        t = lap(ph, LM_PH_ATTN, t);
        be_linear_forward_f32(&w->cx, y, og, b->attn.w_o, b->attn.b_o, n, (int)hd, C);
        t = lap(ph, LM_PH_WO, t);
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
        rmsnorm_forward_f32(xn, rstd, x, b->ln2, n, C, eps);
        mlp_forward(cfg, w, qt, b, xn, n, y);
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
        t = lap(ph, LM_PH_MLP, t);
    }
    float r;
    rmsnorm_forward_f32(xn, &r, x + (size_t)(n - 1) * C, p->norm, 1, C, eps);
    attn_decode_linear(&kv->dc, logits, xn, p->lm_head, NULL, C, cfg->vocab_size);
    lap(ph, LM_PH_HEAD, t);
    kv->pos = pos0 + n;
    return MOH_OK;
}

int lm_feed(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, const int *tok, int n, float *logits,
            moh_error *err) {
    if (n < 1 || kv->pos + n > kv->max_T)
        return moh_fail(err, MOH_E_ARG, "feed: %d tokens at position %d, expected 1..%d (the KV cache)", n, kv->pos,
                        kv->max_T - kv->pos);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= cfg->vocab_size)
            return moh_fail(err, MOH_E_ARG, "feed: token %d at %d out of range [0, %d)", tok[i], i, cfg->vocab_size);
    if (n < LM_ENCODE_BATCH) {
        for (int i = 0; i < n; i++)
            if (lm_decode_step(cfg, p, kv, tok[i], logits, err)) return err->code;
        return MOH_OK;
    }
    if (check_params(kv, p, err)) return err->code;
    if (kv->dc.par_work <= 0 && lm_kv_calibrate(kv, cfg, p, err)) return err->code;
    lm_prefill_ws w;
    if (lm_prefill_init(&w, cfg, n, err)) return err->code;
    int rc = kv->dc.bf16 ? lm_prefill_set_bf16(&w, cfg, kv, err)
             : kv->dc.qt ? lm_prefill_set_quant(&w, cfg, kv, err) : MOH_OK;
    if (!rc && kv->pos == 0) rc = lm_prefill(cfg, p, kv, &w, tok, n, logits, err);
    else if (!rc) {
        const moh_attn_config *a = &cfg->attn;
        const size_t qd = (size_t)attn_qkv_dim(a), hd = (size_t)a->n_heads * a->head_dim;
        float *sc = malloc(sizeof(float) * (size_t)n * (qd + hd + (size_t)a->n_heads));
        int *task = realloc(kv->task, sizeof(int) * ((size_t)a->n_heads + 2 * (size_t)a->n_kv_heads + (size_t)n));
        if (task) kv->task = task;
        if (!sc || !task) rc = moh_fail(err, MOH_E_NOMEM, "feed: out of memory for %d tokens", n);
        else rc = extend(cfg, p, kv, &w, tok, n, sc, logits);
        free(sc);
    }
    lm_prefill_free(&w);
    return rc;
}

int lm_encode(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, const int *tok, int n, float *logits,
              moh_error *err) {
    if (n < 1 || n > kv->max_T)
        return moh_fail(err, MOH_E_ARG, "encode: %d tokens, expected 1..%d (the KV cache)", n, kv->max_T);
    lm_kv_reset(kv);
    return lm_feed(cfg, p, kv, tok, n, logits, err);
}
