#include "models/lm_decode.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn/sparse.h"

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

/* Work (multiply-adds) below which a decode matrix-vector product runs on the calling thread:
 * waking a sleeping OpenMP team costs more than the product below it. */
#define DECODE_PAR_WORK 262144L
/* Rows of W_O per task of wo_selected. */
#define DECODE_WO_ROWS 64

/* q/k/v rows for the learned router: the d rows of every task head t (task[0..ntask): query heads
 * i < h that the token selects, then the KV rows as heads h .. h + 2 h_kv) of W_qkv [qd, C] times x
 * [C] plus the bias, into qkv [qd]; one parallel region (dynamic: a thread that wakes late does
 * not hold up the rest). */
static void qkv_selected(float *qkv, const float *w, const float *b, const float *x, const int *task, int ntask,
                         int d, int C) {
    static const int whole[1] = {0};
#pragma omp parallel for schedule(dynamic, 1) if ((long)ntask * d * C >= DECODE_PAR_WORK)
    for (int t = 0; t < ntask; t++)
        sparse_decode_gemv_f32(w, C, b, x, whole, 1, C, task[t] * d, (task[t] + 1) * d, qkv);
}

/* out[C] = b + sum over the nsel selected heads of W_O[:, i d:(i+1) d] og_i: the W_O columns of
 * skipped heads are never read. W_O [C, h d] row-major; b may be NULL. */
static void wo_selected(float *out, const float *w_o, const float *b, const float *og, const int *sel, int nsel,
                        int C, int h, int d) {
    const int nt = (C + DECODE_WO_ROWS - 1) / DECODE_WO_ROWS;
#pragma omp parallel for schedule(dynamic, 1) if ((long)C * nsel * d >= DECODE_PAR_WORK)
    for (int t = 0; t < nt; t++) {
        const int r0 = t * DECODE_WO_ROWS, r1 = r0 + DECODE_WO_ROWS < C ? r0 + DECODE_WO_ROWS : C;
        sparse_decode_gemv_f32(w_o, (long)h * d, b, og, sel, nsel, d, r0, r1, out);
    }
}

int lm_kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, int max_T, moh_error *err) {
    memset(kv, 0, sizeof *kv);
    const moh_attn_config *a = &cfg->attn;
    const size_t L = (size_t)cfg->num_hidden_layers, C = (size_t)cfg->hidden_size;
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim, hd = (size_t)a->n_heads * a->head_dim;
    const size_t I = (size_t)cfg->intermediate_size, qd = (size_t)attn_qkv_dim(a);
    /* scores: one [max_T] row per query head, so heads can run in parallel */
    const size_t sizes[] = {L * max_T * kvd, L * max_T * kvd, C, C, qd, hd, C, I, I,
                            (size_t)a->n_heads * max_T};
    float **fields[] = {&kv->k, &kv->v, &kv->x, &kv->xn, &kv->qkv, &kv->og, &kv->tmp, &kv->gate, &kv->up, &kv->scores};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    kv->block = malloc(total * sizeof(float));
    if (!kv->block) return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate %zu MiB", (total * 4) >> 20);
    float *cur = kv->block;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *fields[i] = cur;
        cur += sizes[i];
    }
    kv->task = malloc(sizeof(int) * (size_t)(a->n_heads + 2 * a->n_kv_heads));
    if (!kv->task) {
        free(kv->block);
        kv->block = NULL;
        return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate the head lists");
    }
    if (attn_cache_init_f32(&kv->router, a, 1, 1, err)) {
        free(kv->block);
        free(kv->task);
        kv->block = NULL;
        kv->task = NULL;
        return err->code;
    }
    kv->max_T = max_T;
    return MOH_OK;
}

void lm_kv_free(lm_kv_cache *kv) {
    if (kv->block) attn_cache_free_f32(&kv->router);
    free(kv->block);
    free(kv->task);
    memset(kv, 0, sizeof *kv);
}

void lm_kv_reset(lm_kv_cache *kv) { kv->pos = 0; }

int lm_decode_step(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, int token,
                   float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int h = a->n_heads, hkv = a->n_kv_heads, d = a->head_dim, grp = h / hkv;
    const int qd = attn_qkv_dim(a), kvd = hkv * d, pos = kv->pos;
    const float eps = (float)cfg->rms_norm_eps;
    if (pos >= kv->max_T)
        return moh_fail(err, MOH_E_ARG, "KV cache full: %d tokens (raise the context)", kv->max_T);
    if (token < 0 || token >= cfg->vocab_size)
        return moh_fail(err, MOH_E_ARG, "token %d out of range [0, %d)", token, cfg->vocab_size);
    double *ph = kv->phase_s, t = omp_get_wtime();
    embedding_forward_f32(kv->x, &token, p->embed, 1, C);
    float rstd;
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        float *K = kv->k + ((size_t)l * kv->max_T) * kvd, *V = kv->v + ((size_t)l * kv->max_T) * kvd;
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln1, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        int *sel = kv->task, nsel = 0; /* the heads this token runs */
        if (a->router == MOH_ROUTER_LEARNED) {
            /* the learned router reads x only: route first, then K and V for every KV head and
             * q only for the selected heads (spec §10), in one pass over their W_qkv rows */
            router_forward_f32(a, &b->attn, kv->xn, NULL, 1, &kv->router);
            for (int i = 0; i < h; i++)
                if (kv->router.gates[i] != 0.0f) sel[nsel++] = i;
                else memset(kv->qkv + (size_t)i * d, 0, sizeof(float) * d);
            for (int j = 0; j < 2 * hkv; j++) sel[nsel + j] = h + j;
            qkv_selected(kv->qkv, b->attn.w_qkv, b->attn.b_qkv, kv->xn, sel, nsel + 2 * hkv, d, C);
        } else { /* none: every head; query_norm: every q is needed to choose */
            linear_forward_f32(kv->qkv, kv->xn, b->attn.w_qkv, b->attn.b_qkv, 1, C, qd);
            router_forward_f32(a, &b->attn, kv->xn, kv->qkv, 1, &kv->router);
            for (int i = 0; i < h; i++)
                if (kv->router.gates[i] != 0.0f) sel[nsel++] = i;
        }
        if (a->rope_theta > 0) rope_forward_f32(kv->qkv, 1, qd, h + hkv, &pos, a);
        for (int g = 0; g < hkv; g++) { /* head-major: each head's keys are one contiguous stream */
            memcpy(K + ((size_t)g * kv->max_T + pos) * d, kv->qkv + (size_t)(h + g) * d, sizeof(float) * d);
            memcpy(V + ((size_t)g * kv->max_T + pos) * d, kv->qkv + (size_t)(h + hkv + g) * d, sizeof(float) * d);
        }
        t = lap(ph, LM_PH_QKV, t);
        /* attention of the selected heads only (spec §10), one task per head; og of the others
         * is never read */
        kv->heads_total += h;
        kv->heads_run += nsel;
#pragma omp parallel for schedule(dynamic, 1) if ((long)nsel * (pos + 1) * d >= 65536)
        for (int k = 0; k < nsel; k++) {
            const int i = sel[k], kvh = i / grp;
            sparse_decode_attend_f32(kv->qkv + (size_t)i * d, K + (size_t)kvh * kv->max_T * d,
                                     V + (size_t)kvh * kv->max_T * d, d, pos + 1, d, kv->router.gates[i],
                                     kv->scores + (size_t)i * kv->max_T, kv->og + (size_t)i * d);
        }
        t = lap(ph, LM_PH_ATTN, t);
        if (nsel < h) wo_selected(kv->tmp, b->attn.w_o, b->attn.b_o, kv->og, sel, nsel, C, h, d);
        else linear_forward_f32(kv->tmp, kv->og, b->attn.w_o, b->attn.b_o, 1, h * d, C);
        t = lap(ph, LM_PH_WO, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln2, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        if (b->w_up == b->w_gate + (size_t)I * C && kv->up == kv->gate + I) /* [2I, C]: one product */
            linear_forward_f32(kv->gate, kv->xn, b->w_gate, NULL, 1, C, 2 * I);
        else {
            linear_forward_f32(kv->gate, kv->xn, b->w_gate, NULL, 1, C, I);
            linear_forward_f32(kv->up, kv->xn, b->w_up, NULL, 1, C, I);
        }
        swiglu_forward_f32(kv->gate, kv->gate, kv->up, I);
        linear_forward_f32(kv->tmp, kv->gate, b->w_down, NULL, 1, I, C);
        t = lap(ph, LM_PH_MLP, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(kv->xn, &rstd, kv->x, p->norm, 1, C, eps);
    linear_forward_f32(logits, kv->xn, p->lm_head, NULL, 1, C, cfg->vocab_size);
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
    if (sparse_cache_init(&w->sc, &cfg->attn, 1, max_n, err)) {
        free(w->block);
        w->block = NULL;
        return err->code;
    }
    w->max_n = max_n;
    return MOH_OK;
}

void lm_prefill_free(lm_prefill_ws *w) {
    if (w->block) sparse_cache_free(&w->sc);
    free(w->block);
    memset(w, 0, sizeof *w);
}

int lm_prefill(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
               const int *tok, int n, float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int hkv = a->n_kv_heads, d = a->head_dim, kvd = hkv * d;
    const float eps = (float)cfg->rms_norm_eps;
    if (n < 1 || n > w->max_n || n > kv->max_T)
        return moh_fail(err, MOH_E_ARG, "prefill: %d tokens, expected 1..%d (workspace) and <= %d (KV cache)", n,
                        w->max_n, kv->max_T);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= cfg->vocab_size)
            return moh_fail(err, MOH_E_ARG, "prefill: token %d at position %d out of range [0, %d)", tok[i], i,
                            cfg->vocab_size);
    lm_kv_reset(kv);
    double *ph = kv->phase_s, t = omp_get_wtime();
    const size_t nC = (size_t)n * C;
    float *x = w->x, *xn = w->xn, *y = w->y, *rstd = w->rstd;
    embedding_forward_f32(x, tok, p->embed, n, C);
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        rmsnorm_forward_f32(xn, rstd, x, b->ln1, n, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        const double a0 = w->sc.phase_s[SPARSE_PH_ATTN], o0 = w->sc.phase_s[SPARSE_PH_WO];
        sparse_forward_f32(a, &b->attn, xn, 1, n, y, &w->sc);
        /* K (after RoPE) and V of every KV head: the sparse cache holds them head-major [h_kv, n, d] */
        float *K = kv->k + (size_t)l * kv->max_T * kvd, *V = kv->v + (size_t)l * kv->max_T * kvd;
        for (int g = 0; g < hkv; g++) {
            memcpy(K + (size_t)g * kv->max_T * d, w->sc.kh + (size_t)g * n * d, sizeof(float) * (size_t)n * d);
            memcpy(V + (size_t)g * kv->max_T * d, w->sc.vh + (size_t)g * n * d, sizeof(float) * (size_t)n * d);
        }
        kv->heads_run += sparse_pairs(a, &w->sc);
        kv->heads_total += (long)n * a->n_heads;
        const double now = omp_get_wtime();
        ph[LM_PH_ATTN] += w->sc.phase_s[SPARSE_PH_ATTN] - a0;
        ph[LM_PH_WO] += w->sc.phase_s[SPARSE_PH_WO] - o0;
        ph[LM_PH_QKV] += (now - t) - (w->sc.phase_s[SPARSE_PH_ATTN] - a0) - (w->sc.phase_s[SPARSE_PH_WO] - o0);
        t = now;
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
        rmsnorm_forward_f32(xn, rstd, x, b->ln2, n, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        linear_forward_f32(w->gate, xn, b->w_gate, NULL, n, C, I);
        linear_forward_f32(w->up, xn, b->w_up, NULL, n, C, I);
        swiglu_forward_f32(w->gate, w->gate, w->up, (long)n * I);
        linear_forward_f32(y, w->gate, b->w_down, NULL, n, I, C);
        t = lap(ph, LM_PH_MLP, t);
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(xn, rstd, x + (size_t)(n - 1) * C, p->norm, 1, C, eps);
    linear_forward_f32(logits, xn, p->lm_head, NULL, 1, C, cfg->vocab_size);
    lap(ph, LM_PH_HEAD, t);
    kv->pos = n;
    return MOH_OK;
}
