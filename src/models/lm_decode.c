#include "models/lm_decode.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
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

/* Attention's cost per (head, key, element), q.k and p v with the softmax between, in multiply-adds
 * of a matrix-vector product (par_work's unit): measured 2.2x (bf16, `moh bench decode --profile`,
 * small model at context 512: 17.5 G such units/s against 39 GMAC/s). */
#define DECODE_ATTN_WORK 4L
/* Rows per task when a matrix-vector product runs on the team. */
#define DECODE_TASK_ROWS 64

/* The bf16 copy of the weights at w (a cache built by lm_kv_init_bf16 for these parameters). */
static const uint16_t *w16(const lm_kv_cache *kv, const float *w) { return bf16_mirror_of(&kv->w16, w); }

/* kv->xb[off .. off + n) = bf16(x[off ..]): the vdpbf16ps kernels' copy of a product's input. */
static void input16(lm_kv_cache *kv, const float *x, size_t off, size_t n) {
    if (kv->bf16 && kv->isa == SPARSE_BF16_DP) bf16_from_f32(kv->xb + off, x + off, n);
}

/* Rows r0 .. r1 of W x over column blocks blk (sparse_decode_gemv_f32 / _bf16 by the cache's
 * precision; x already in kv->xb for bf16). */
static void gemv_rows(const lm_kv_cache *kv, float *out, const float *w, long ldw, const float *b, const float *x,
                      const int *blk, int nblk, int d, int r0, int r1) {
    if (kv->bf16) sparse_decode_gemv_bf16(w16(kv, w), ldw, b, x, kv->xb, blk, nblk, d, r0, r1, out, kv->isa);
    else sparse_decode_gemv_f32(w, ldw, b, x, blk, nblk, d, r0, r1, out);
}

/* The rows of the task heads (task[0..ntask), ascending, d rows each) as ranges: runs of adjacent
 * heads, cut into pieces of at most `piece` rows; pairs (r0, r1) into rr. Returns the count. */
static int head_ranges(int *rr, const int *task, int ntask, int d, int piece) {
    int n = 0;
    for (int t = 0; t < ntask;) {
        int e = t + 1;
        while (e < ntask && task[e] == task[e - 1] + 1) e++;
        for (int r = task[t] * d, end = (task[e - 1] + 1) * d; r < end; n++) {
            rr[2 * n] = r;
            r = rr[2 * n + 1] = end - r <= piece ? end : r + piece;
        }
        t = e;
    }
    return n;
}

/* q/k/v rows for the learned router: the d rows of every task head t (task[0..ntask), ascending:
 * query heads i < h that the token selects, then the KV rows as heads h .. h + 2 h_kv) of W_qkv
 * [qd, C] times x [C] plus the bias, into qkv [qd]. Adjacent heads' rows go in one product (a call
 * per head costs 6-16 % more on the same rows, tools/bench/micro.sh: each call restarts the kernel's
 * prefetch): whole runs on this thread, pieces of DECODE_TASK_ROWS on the team (dynamic: a thread
 * that wakes late does not hold up the rest). */
static void qkv_selected(lm_kv_cache *kv, float *qkv, const float *w, const float *b, const float *x, const int *task,
                         int ntask, int d, int C) {
    static const int whole[1] = {0};
    input16(kv, x, 0, (size_t)C);
    int *rr = kv->ranges;
    if ((long)ntask * d * C < kv->par_work) { /* on this thread, with no OpenMP call (ops_impl.h: OPS_SERIAL) */
        const int n = head_ranges(rr, task, ntask, d, INT_MAX);
        for (int k = 0; k < n; k++) gemv_rows(kv, qkv, w, C, b, x, whole, 1, C, rr[2 * k], rr[2 * k + 1]);
        return;
    }
    const int n = head_ranges(rr, task, ntask, d, DECODE_TASK_ROWS);
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < n; k++) gemv_rows(kv, qkv, w, C, b, x, whole, 1, C, rr[2 * k], rr[2 * k + 1]);
}

/* out[R] = b + sum over the nblk column blocks blk of W[:, blk d .. blk d + d] x[blk d ..]: W [R,
 * ldw] row-major, rows in tasks of DECODE_TASK_ROWS. W_O of the selected heads (x = og [h d]: the W_O
 * columns of skipped heads are never read), and in bf16 every dense product (blk = {0}, d = the
 * input width). b may be NULL. */
static void gemv_blocks(lm_kv_cache *kv, float *out, const float *w, long ldw, const float *b, const float *x,
                        const int *blk, int nblk, int d, int R) {
    for (int k = 0; k < nblk; k++) input16(kv, x, (size_t)blk[k] * d, (size_t)d);
    if ((long)R * nblk * d < kv->par_work) {
        gemv_rows(kv, out, w, ldw, b, x, blk, nblk, d, 0, R);
        return;
    }
    const int nt = (R + DECODE_TASK_ROWS - 1) / DECODE_TASK_ROWS;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < nt; t++) {
        const int r0 = t * DECODE_TASK_ROWS, r1 = r0 + DECODE_TASK_ROWS < R ? r0 + DECODE_TASK_ROWS : R;
        gemv_rows(kv, out, w, ldw, b, x, blk, nblk, d, r0, r1);
    }
}

/* out[O] = W x + b for W [O, I] (nn.Linear, one token): gemv_blocks over the whole row, so the
 * cache's par_work decides whether the team wakes. */
static void linear1(lm_kv_cache *kv, float *out, const float *x, const float *w, const float *b, int I, int O) {
    static const int whole[1] = {0};
    gemv_blocks(kv, out, w, I, b, x, whole, 1, I, O);
}

/* Head i's attention over positions 0 .. pos of the layer whose K/V start at l0 (hstride per KV
 * head), its gated output into og (sparse_decode_attend_f32 / _bf16). */
static void attend_head(lm_kv_cache *kv, size_t l0, size_t hstride, int i, int grp, int d, int pos) {
    const size_t at = l0 + (size_t)(i / grp) * hstride;
    float *q = kv->qkv + (size_t)i * d, *sc = kv->scores + (size_t)i * kv->max_T, *o = kv->og + (size_t)i * d;
    if (kv->bf16) sparse_decode_attend_bf16(q, kv->kb + at, kv->vb + at, d, pos + 1, d, kv->router.gates[i], sc, o, kv->isa);
    else sparse_decode_attend_f32(q, kv->k + at, kv->v + at, d, pos + 1, d, kv->router.gates[i], sc, o);
}

/* The learned router's gates for one token x [C] into r->gates [h] (spec §1, §10): with top_k >= 1
 * the logits z = [wg; wg_0; wg_1] x by fp32 dot products on this thread (one product when
 * attn_params_bind left the three adjacent), then router_learned_rows: router_forward_f32's
 * softmaxes and top-k without a GEMM call or OpenMP region per token, on logits that can differ
 * from its GEMM's in the last bit (another summation order: 1202 of 1680 random logits, C 8..1024),
 * so a near tie may select another head than the full forward does. top_k = 0 (all heads shared)
 * goes through router_forward_f32. The load-balance loss is not computed. */
static void route_token(const moh_attn_config *a, const attn_params_f32 *prm, const float *x, attn_cache_f32 *r) {
    static const int whole[1] = {0};
    const int C = a->hidden_size;
    if (a->top_k < 1 || attn_routed_heads(a) < 1) {
        router_forward_f32(a, prm, x, NULL, 1, r);
        return;
    }
    const int nz = sparse_router_nz(a);
    float *z = r->scratch; /* [E + W + h_s + 2] >= nz */
    bool adjacent = true; /* as attn_params_bind leaves them: one product */
    for (int j = 0; j < nz; j++) adjacent = adjacent && sparse_router_row(a, prm, j) == prm->w_r + (size_t)j * C;
    if (adjacent)
        sparse_decode_gemv_f32(prm->w_r, C, NULL, x, whole, 1, C, 0, nz, z);
    else
        for (int j = 0; j < nz; j++) sparse_decode_gemv_f32(sparse_router_row(a, prm, j), C, NULL, x, whole, 1, C, 0, 1, z + j);
    router_learned_rows_f32(a, r, z, 0, 1);
}

/* The cache's allocations: fp32 activations (and K/V unless bf16), the head lists, the router
 * scratch; bf16: the bf16 K/V, the input scratch and the weights' copy of p. */
static int kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, int max_T, moh_error *err) {
    memset(kv, 0, sizeof *kv);
    if (max_T < 1) return moh_fail(err, MOH_E_ARG, "KV cache: %d tokens, expected >= 1", max_T);
    const moh_attn_config *a = &cfg->attn;
    const bool b16 = p != NULL;
    const size_t L = (size_t)cfg->num_hidden_layers, C = (size_t)cfg->hidden_size;
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim, hd = (size_t)a->n_heads * a->head_dim;
    const size_t I = (size_t)cfg->intermediate_size, qd = (size_t)attn_qkv_dim(a);
    const size_t kvn = b16 ? 0 : L * max_T * kvd, Tp = (size_t)max_T + (max_T & 1);
    /* scores: one [max_T] row per query head, so heads can run in parallel */
    const size_t sizes[] = {kvn, kvn, C, C, qd, hd, C, I, I, (size_t)a->n_heads * max_T};
    float **fields[] = {&kv->k, &kv->v, &kv->x, &kv->xn, &kv->qkv, &kv->og, &kv->tmp, &kv->gate, &kv->up, &kv->scores};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    kv->block = malloc(total * sizeof(float));
    const size_t nt = (size_t)(a->n_heads + 2 * a->n_kv_heads); /* ranges: pieces of runs, see head_ranges */
    const size_t nr = nt * (size_t)a->head_dim / DECODE_TASK_ROWS + nt + 1;
    kv->task = malloc(sizeof(int) * (nt + 2 * nr));
    kv->ranges = kv->task ? kv->task + nt : NULL;
    size_t xn = C > hd ? C : hd;
    xn = xn > I ? xn : I;
    if (b16) { /* zeroed: the unused half of a last odd value pair is never NaN */
        kv->kb = calloc(2 * L * Tp * kvd + xn, sizeof(uint16_t));
        kv->vb = kv->kb ? kv->kb + L * Tp * kvd : NULL;
        kv->xb = kv->kb ? kv->vb + L * Tp * kvd : NULL;
    }
    if (!kv->block || !kv->task || (b16 && !kv->kb)) {
        lm_kv_free(kv);
        return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate %zu MiB for %d tokens",
                        (total * 4 + (b16 ? 4 * L * Tp * kvd : 0)) >> 20, max_T);
    }
    float *cur = kv->block;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *fields[i] = sizes[i] ? cur : NULL;
        cur += sizes[i];
    }
    if (b16) {
        if (bf16_mirror_init(&kv->w16, p->data, p->n, err)) {
            lm_kv_free(kv);
            return err->code;
        }
        bf16_mirror_sync(&kv->w16);
        kv->bf16 = true;
        kv->isa = sparse_bf16_isa_detect();
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
    return kv_init(kv, cfg, NULL, max_T, err);
}

int lm_kv_init_bf16(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, int max_T, moh_error *err) {
    return kv_init(kv, cfg, p, max_T, err);
}

void lm_kv_free(lm_kv_cache *kv) {
    if (kv->have_router) attn_cache_free_f32(&kv->router);
    bf16_mirror_free(&kv->w16);
    free(kv->block);
    free(kv->task);
    free(kv->kb);
    memset(kv, 0, sizeof *kv);
}

void lm_kv_reset(lm_kv_cache *kv) { kv->pos = 0; }

void lm_kv_write(lm_kv_cache *kv, const moh_lm_config *cfg, int l, int g, int pos, int n, const float *k,
                 const float *v) {
    const int d = cfg->attn.head_dim;
    const size_t head = (size_t)l * cfg->attn.n_kv_heads + (size_t)g;
    if (!kv->bf16) {
        const size_t off = (head * kv->max_T + (size_t)pos) * d;
        memcpy(kv->k + off, k, sizeof(float) * (size_t)n * d);
        memcpy(kv->v + off, v, sizeof(float) * (size_t)n * d);
        return;
    }
    const size_t base = head * (size_t)(kv->max_T + (kv->max_T & 1)) * d;
    bf16_from_f32(kv->kb + base + (size_t)pos * d, k, (size_t)n * d);
    uint16_t *vb = kv->vb + base;
    for (int i = 0; i < n; i++) {
        const int t = pos + i;
        uint16_t *dst = vb + (size_t)(t >> 1) * 2 * d + (t & 1);
        for (int e = 0; e < d; e++) dst[2 * e] = bf16_round(v[(size_t)i * d + e]);
    }
}

moh_precision lm_decode_precision(moh_precision asked, char *why, size_t cap) {
    if (cap) why[0] = 0;
    if (asked != MOH_PRECISION_BF16) return MOH_PRECISION_FP32;
    if (sparse_bf16_isa_detect() >= SPARSE_BF16_AVX512) return MOH_PRECISION_BF16;
    snprintf(why, cap, "this CPU has no AVX-512 (bf16 decoding needs AVX-512F/BW, or AVX512-BF16)");
    return MOH_PRECISION_FP32;
}

void lm_kv_describe(const lm_kv_cache *kv, char *out, size_t cap) {
    if (!kv->bf16) snprintf(out, cap, "fp32");
    else
        snprintf(out, cap, "bf16 weights and KV cache, %s kernels, fp32 accumulation (norms, router, softmax fp32)",
                 sparse_bf16_isa_name(kv->isa));
}

/* A bf16 cache runs only the parameters it holds the copy of: MOH_E_ARG otherwise. */
static int check_params(const lm_kv_cache *kv, const lm_params_f32 *p, moh_error *err) {
    if (kv->bf16 && (p->data != kv->w16.src || p->n != kv->w16.n))
        return moh_fail(err, MOH_E_ARG, "bf16 KV cache: parameters other than the %zu values it was built for",
                        kv->w16.n);
    return MOH_OK;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int lm_kv_calibrate(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, moh_error *err) {
    enum { NREG = 15, NGEMV = 9 };
    if (check_params(kv, p, err)) return err->code;
    static const int whole[1] = {0};
    const int C = cfg->hidden_size, qd = attn_qkv_dim(&cfg->attn);
    double reg[NREG], best = 1e30;
    int ran = 0;
    for (int i = 0; i < NREG; i++) { /* back to back: under passive waits each one wakes the team */
        const double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : ran)
        ran += 1; /* next to nothing: the start and the join are what is timed */
        reg[i] = omp_get_wtime() - t0;
    }
    /* the team the regions got, not omp_get_max_threads(): inside a parallel region (nesting off),
     * under OMP_THREAD_LIMIT or OMP_DYNAMIC it can be one thread, which saves nothing */
    const int n = kv->team_size = ran / NREG;
    qsort(reg, NREG, sizeof reg[0], cmp_double);
    for (int c = 0; c < C; c++) kv->xn[c] = (float)((c % 7) - 3) * 0.25f;
    for (int i = 0; i < NGEMV; i++) { /* layer 0's W_qkv on this thread, in the cache's precision */
        const double t0 = omp_get_wtime();
        input16(kv, kv->xn, 0, (size_t)C);
        gemv_rows(kv, kv->qkv, p->blocks[0].attn.w_qkv, C, NULL, kv->xn, whole, 1, C, 0, qd);
        const double dt = omp_get_wtime() - t0;
        best = dt < best ? dt : best;
    }
    kv->team_s = reg[NREG / 2];
    kv->mac_s = best / ((double)qd * C);
    /* split when W mac_s (1 - 1 / n) > team_s: the time the other threads take off exceeds waking them */
    const double w = n > 1 && kv->mac_s > 0 ? kv->team_s / (kv->mac_s * (1.0 - 1.0 / n)) : 1e18;
    kv->par_work = w < 4096 ? 4096 : w > 1e15 ? (long)1e15 : (long)w;
    return MOH_OK;
}

void lm_kv_copy_split(lm_kv_cache *dst, const lm_kv_cache *src) {
    dst->par_work = src->par_work;
    dst->team_s = src->team_s;
    dst->mac_s = src->mac_s;
    dst->team_size = src->team_size;
}

void lm_kv_describe_split(const lm_kv_cache *kv, char *out, size_t cap) {
    if (kv->par_work <= 0 || kv->mac_s <= 0) snprintf(out, cap, "team split not calibrated yet");
    else
        snprintf(out, cap, "team of %d: start-up %.1f us, one thread %.2f GMAC/s: split from %ld multiply-adds",
                 kv->team_size, kv->team_s * 1e6, 1e-9 / kv->mac_s, kv->par_work);
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
    if (kv->par_work <= 0 && lm_kv_calibrate(kv, cfg, p, err)) return err->code;
    /* per KV head: fp32 [max_T, d] rows; bf16 keys [Tp, d], values in position pairs [Tp / 2, d, 2] */
    const size_t hstride = (size_t)(kv->bf16 ? kv->max_T + (kv->max_T & 1) : kv->max_T) * d;
    double *ph = kv->phase_s, t = omp_get_wtime();
    embedding_forward_f32(kv->x, &token, p->embed, 1, C);
    float rstd;
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln1, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        int *sel = kv->task, nsel = 0; /* the heads this token runs */
        if (a->router == MOH_ROUTER_LEARNED) {
            /* the learned router reads x only: route first, then K and V for every KV head and
             * q only for the selected heads (spec §10), in one pass over their W_qkv rows */
            route_token(a, &b->attn, kv->xn, &kv->router);
            for (int i = 0; i < h; i++)
                if (kv->router.gates[i] != 0.0f) sel[nsel++] = i;
                else memset(kv->qkv + (size_t)i * d, 0, sizeof(float) * d);
            for (int j = 0; j < 2 * hkv; j++) sel[nsel + j] = h + j;
            qkv_selected(kv, kv->qkv, b->attn.w_qkv, b->attn.b_qkv, kv->xn, sel, nsel + 2 * hkv, d, C);
        } else { /* none: every head; query_norm: every q is needed to choose */
            linear1(kv, kv->qkv, kv->xn, b->attn.w_qkv, b->attn.b_qkv, C, qd);
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
        const size_t l0 = (size_t)l * hkv * hstride;
        if (DECODE_ATTN_WORK * nsel * (pos + 1) * d < kv->par_work)
            for (int k = 0; k < nsel; k++) attend_head(kv, l0, hstride, sel[k], grp, d, pos);
        else {
#pragma omp parallel for schedule(dynamic, 1)
            for (int k = 0; k < nsel; k++) attend_head(kv, l0, hstride, sel[k], grp, d, pos);
        }
        t = lap(ph, LM_PH_ATTN, t);
        if (nsel < h) gemv_blocks(kv, kv->tmp, b->attn.w_o, (long)h * d, b->attn.b_o, kv->og, sel, nsel, d, C);
        else linear1(kv, kv->tmp, kv->og, b->attn.w_o, b->attn.b_o, h * d, C);
        t = lap(ph, LM_PH_WO, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln2, 1, C, eps);
        t = lap(ph, LM_PH_OTHER, t);
        if (b->w_up == b->w_gate + (size_t)I * C && kv->up == kv->gate + I) /* [2I, C]: one product */
            linear1(kv, kv->gate, kv->xn, b->w_gate, NULL, C, 2 * I);
        else {
            linear1(kv, kv->gate, kv->xn, b->w_gate, NULL, C, I);
            linear1(kv, kv->up, kv->xn, b->w_up, NULL, C, I);
        }
        swiglu_forward_f32(kv->gate, kv->gate, kv->up, I);
        linear1(kv, kv->tmp, kv->gate, b->w_down, NULL, I, C);
        t = lap(ph, LM_PH_MLP, t);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(kv->xn, &rstd, kv->x, p->norm, 1, C, eps);
    linear1(kv, logits, kv->xn, p->lm_head, NULL, C, cfg->vocab_size);
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

int lm_prefill_set_bf16(lm_prefill_ws *w, const moh_lm_config *cfg, const lm_kv_cache *kv, moh_error *err) {
    if (!kv->bf16) return moh_fail(err, MOH_E_ARG, "prefill: bf16 asked for a float32 KV cache");
    if (!w->bf16 && bf16_ctx_new(&w->bf16, &kv->w16, err)) return err->code;
    bf16_ctx_set_weights(w->bf16, &kv->w16);
    if (sparse_cache_set_bf16(&w->sc, &cfg->attn, w->bf16, err)) return err->code;
    w->bf16_kv = kv;
    return MOH_OK;
}

void lm_prefill_free(lm_prefill_ws *w) {
    if (w->block) sparse_cache_free(&w->sc);
    bf16_ctx_free(w->bf16);
    free(w->block);
    memset(w, 0, sizeof *w);
}

/* nn.Linear over the prompt's rows: bf16 GEMMs when the workspace is set to bf16. */
static void prefill_linear(const lm_prefill_ws *w, float *out, const float *x, const float *wt, int n, int I, int O) {
    if (w->bf16) bf16_linear_forward(w->bf16, out, x, wt, NULL, n, I, O);
    else linear_forward_f32(out, x, wt, NULL, n, I, O);
}

int lm_prefill(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
               const int *tok, int n, float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int hkv = a->n_kv_heads, d = a->head_dim;
    const float eps = (float)cfg->rms_norm_eps;
    if (n < 1 || n > w->max_n || n > kv->max_T)
        return moh_fail(err, MOH_E_ARG, "prefill: %d tokens, expected 1..%d (workspace) and <= %d (KV cache)", n,
                        w->max_n, kv->max_T);
    if (w->bf16 && w->bf16_kv != kv)
        return moh_fail(err, MOH_E_ARG, "prefill: the workspace computes in bf16 for another KV cache");
    if (check_params(kv, p, err)) return err->code;
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
        for (int g = 0; g < hkv; g++)
            lm_kv_write(kv, cfg, l, g, 0, n, w->sc.kh + (size_t)g * n * d, w->sc.vh + (size_t)g * n * d);
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
        prefill_linear(w, w->gate, xn, b->w_gate, n, C, I);
        prefill_linear(w, w->up, xn, b->w_up, n, C, I);
        swiglu_forward_f32(w->gate, w->gate, w->up, (long)n * I);
        prefill_linear(w, y, w->gate, b->w_down, n, I, C);
        t = lap(ph, LM_PH_MLP, t);
        for (size_t i = 0; i < nC; i++) x[i] += y[i];
    }
    t = lap(ph, LM_PH_OTHER, t);
    rmsnorm_forward_f32(xn, rstd, x + (size_t)(n - 1) * C, p->norm, 1, C, eps);
    linear1(kv, logits, xn, p->lm_head, NULL, C, cfg->vocab_size);
    lap(ph, LM_PH_HEAD, t);
    kv->pos = n;
    return MOH_OK;
}
