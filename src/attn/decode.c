#include "attn/decode.h"

#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows per task when a matrix-vector product runs on the team. */
#define TASK_ROWS 64

/* The store: bf16 K/V (b16) or fp32, the head ranges. */
static int store_init(attn_decode *dc, int nkv, int d, int max_T, size_t max_in, int max_tasks, bool b16,
                      moh_error *err) {
    memset(dc, 0, sizeof *dc);
    if (max_T < 1 || nkv < 1 || d < 1 || max_tasks < 1)
        return moh_fail(err, MOH_E_ARG, "KV cache: %d tokens, %d heads of %d, expected >= 1 each", max_T, nkv, d);
    const size_t Tp = (size_t)max_T + (max_T & 1), heads = (size_t)nkv;
    dc->hstride = (b16 ? Tp : (size_t)max_T) * d;
    const size_t nr = (size_t)max_tasks * (size_t)d / TASK_ROWS + (size_t)max_tasks + 1; /* see head_ranges */
    dc->ranges = malloc(sizeof(int) * 2 * nr);
    if (b16) /* zeroed: the unused half of a last odd value pair is never NaN */
        dc->kb = calloc(2 * heads * dc->hstride + max_in, sizeof(uint16_t));
    else
        dc->k = malloc(sizeof(float) * 2 * heads * dc->hstride);
    if (!dc->ranges || (b16 ? !dc->kb : !dc->k)) {
        attn_decode_free(dc);
        return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate %zu MiB for %d tokens",
                        (2 * heads * dc->hstride * (b16 ? 2 : 4)) >> 20, max_T);
    }
    if (b16) {
        dc->vb = dc->kb + heads * dc->hstride;
        dc->xb = dc->vb + heads * dc->hstride;
        dc->isa = sparse_bf16_isa_detect();
    } else {
        dc->v = dc->k + heads * dc->hstride;
    }
    dc->max_T = max_T;
    dc->d = d;
    dc->nkv = nkv;
    return MOH_OK;
}

int attn_decode_init(attn_decode *dc, int nkv, int d, int max_T, size_t max_in, int max_tasks, const float *params,
                     size_t n, moh_error *err) {
    if (store_init(dc, nkv, d, max_T, max_in, max_tasks, params != NULL, err)) return err->code;
    if (!params) return MOH_OK;
    if (bf16_mirror_init(&dc->w16, params, n, err)) {
        attn_decode_free(dc);
        return err->code;
    }
    bf16_mirror_sync(&dc->w16);
    dc->bf16 = true;
    return MOH_OK;
}

int attn_decode_init_quant(attn_decode *dc, int nkv, int d, int max_T, size_t max_in, int max_tasks,
                           const quant_table *qt, moh_error *err) {
    if (!qt || !qt->base) return moh_fail(err, MOH_E_ARG, "quantised KV cache: no table of quantised matrices");
    if (store_init(dc, nkv, d, max_T, max_in, max_tasks, true, err)) return err->code;
    if (quant_act_init(&dc->xa, max_in, err)) {
        attn_decode_free(dc);
        return err->code;
    }
    dc->qt = qt;
    dc->qisa = quant_isa_detect();
    return MOH_OK;
}

void attn_decode_free(attn_decode *dc) {
    bf16_mirror_free(&dc->w16);
    quant_act_free(&dc->xa);
    free(dc->k);
    free(dc->kb);
    free(dc->ranges);
    memset(dc, 0, sizeof *dc);
}

int attn_decode_check(const attn_decode *dc, const float *params, size_t n, moh_error *err) {
    if (dc->bf16 && (params != dc->w16.src || n != dc->w16.n))
        return moh_fail(err, MOH_E_ARG, "bf16 KV cache: parameters other than the %zu values it was built for",
                        dc->w16.n);
    if (dc->qt && (params != dc->qt->base || n != dc->qt->nbase))
        return moh_fail(err, MOH_E_ARG, "quantised KV cache: parameters other than the %zu values its table was built for",
                        dc->qt->nbase);
    return MOH_OK;
}

void attn_decode_write(attn_decode *dc, int head, int pos, int n, const float *k, const float *v) {
    const int d = dc->d;
    const size_t base = (size_t)head * dc->hstride;
    if (!dc->kb) {
        memcpy(dc->k + base + (size_t)pos * d, k, sizeof(float) * (size_t)n * d);
        memcpy(dc->v + base + (size_t)pos * d, v, sizeof(float) * (size_t)n * d);
        return;
    }
    bf16_from_f32(dc->kb + base + (size_t)pos * d, k, (size_t)n * d);
    uint16_t *vb = dc->vb + base;
    for (int i = 0; i < n; i++) {
        const int t = pos + i;
        uint16_t *dst = vb + (size_t)(t >> 1) * 2 * d + (t & 1);
        for (int e = 0; e < d; e++) dst[2 * e] = bf16_round(v[(size_t)i * d + e]);
    }
}

/* A product's input x[off .. off + n) in the kernels' form: bf16 in xb for the vdpbf16ps kernels,
 * quantised per 32 into xa (off and n multiples of 32; otherwise the product runs fp32). */
static void prepare_input(attn_decode *dc, const float *x, size_t off, size_t n) {
    if (dc->bf16 && dc->isa == SPARSE_BF16_DP) bf16_from_f32(dc->xb + off, x + off, n);
    if (dc->qt && off % QUANT_BLOCK == 0 && n % QUANT_BLOCK == 0) quant_act_set(&dc->xa, x, off, n);
}

/* Rows r0 .. r1 of W x over column blocks blk of width d from the table's blocks: each run of rows
 * one entry holds (whole rows of ldw columns, d a multiple of 32) goes to quant_gemv, anything
 * else to the fp32 product on the float rows (the same values before quantisation). */
static void gemv_rows_quant(const attn_decode *dc, float *out, const float *w, long ldw, const float *b,
                            const float *x, const int *blk, int nblk, int d, int r0, int r1) {
    const quant_table *t = dc->qt;
    while (r0 < r1) {
        const float *row = w + (size_t)r0 * (size_t)ldw;
        const quant_mat *e = quant_table_find(t, row);
        const size_t at = e ? (size_t)(row - t->base) - e->off : 0;
        if (!e || e->cols != ldw || at % (size_t)ldw || d % QUANT_BLOCK) {
            sparse_decode_gemv_f32(w, ldw, b, x, blk, nblk, d, r0, r1, out);
            return;
        }
        const int64_t re = (int64_t)(at / (size_t)ldw), left = e->rows - re;
        const int n = left < r1 - r0 ? (int)left : r1 - r0;
        quant_gemv(e->type, e->data + (size_t)re * e->row_bytes, e->row_bytes, b ? b + r0 : NULL, &dc->xa, blk, nblk,
                   d, n, out + r0, dc->qisa);
        r0 += n;
    }
}

/* Rows r0 .. r1 of W x over column blocks blk, in the store's precision (x already prepared). */
static void gemv_rows(const attn_decode *dc, float *out, const float *w, long ldw, const float *b, const float *x,
                      const int *blk, int nblk, int d, int r0, int r1) {
    if (dc->qt) gemv_rows_quant(dc, out, w, ldw, b, x, blk, nblk, d, r0, r1);
    else if (dc->bf16)
        sparse_decode_gemv_bf16(bf16_mirror_of(&dc->w16, w), ldw, b, x, dc->xb, blk, nblk, d, r0, r1, out, dc->isa);
    else
        sparse_decode_gemv_f32(w, ldw, b, x, blk, nblk, d, r0, r1, out);
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

/* A call per head costs 6-16 % more on the same rows (tools/bench/micro.sh: each call restarts the
 * kernel's prefetch): whole runs on this thread, pieces of TASK_ROWS on the team (dynamic: a
 * thread that wakes late does not hold up the rest). */
void attn_decode_head_rows(attn_decode *dc, float *out, const float *w, const float *b, const float *x,
                           const int *task, int ntask, int d, int C) {
    static const int whole[1] = {0};
    prepare_input(dc, x, 0, (size_t)C);
    int *rr = dc->ranges;
    if ((long)ntask * d * C < dc->par_work) { /* on this thread, with no OpenMP call */
        const int n = head_ranges(rr, task, ntask, d, INT_MAX);
        for (int k = 0; k < n; k++) gemv_rows(dc, out, w, C, b, x, whole, 1, C, rr[2 * k], rr[2 * k + 1]);
        return;
    }
    const int n = head_ranges(rr, task, ntask, d, TASK_ROWS);
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < n; k++) gemv_rows(dc, out, w, C, b, x, whole, 1, C, rr[2 * k], rr[2 * k + 1]);
}

void attn_decode_blocks(attn_decode *dc, float *out, const float *w, long ldw, const float *b, const float *x,
                        const int *blk, int nblk, int d, int R) {
    for (int k = 0; k < nblk; k++) prepare_input(dc, x, (size_t)blk[k] * d, (size_t)d);
    if ((long)R * nblk * d < dc->par_work) {
        gemv_rows(dc, out, w, ldw, b, x, blk, nblk, d, 0, R);
        return;
    }
    const int nt = (R + TASK_ROWS - 1) / TASK_ROWS;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < nt; t++) {
        const int r0 = t * TASK_ROWS, r1 = r0 + TASK_ROWS < R ? r0 + TASK_ROWS : R;
        gemv_rows(dc, out, w, ldw, b, x, blk, nblk, d, r0, r1);
    }
}

void attn_decode_linear(attn_decode *dc, float *out, const float *x, const float *w, const float *b, int I, int O) {
    static const int whole[1] = {0};
    attn_decode_blocks(dc, out, w, I, b, x, whole, 1, I, O);
}

/* The query heads sel[k0 .. k1) (one KV head's, at `at`) over npos positions: their gated outputs
 * into og [i d ..]; K and V read once for all of them where the kernels group. */
static void attend_group(const attn_decode *dc, size_t at, const int *sel, int k0, int k1, int npos, const float *q,
                         const float *gates, float *scores, float *og) {
    const int d = dc->d;
    const float *qs[SPARSE_DECODE_GROUP];
    float gs[SPARSE_DECODE_GROUP], *sc[SPARSE_DECODE_GROUP], *os[SPARSE_DECODE_GROUP];
    for (int c = k0; c < k1; c += SPARSE_DECODE_GROUP) {
        const int G = k1 - c < SPARSE_DECODE_GROUP ? k1 - c : SPARSE_DECODE_GROUP;
        for (int g = 0; g < G; g++) {
            const int i = sel[c + g];
            qs[g] = q + (size_t)i * d;
            gs[g] = gates[i];
            sc[g] = scores + (size_t)i * dc->max_T;
            os[g] = og + (size_t)i * d;
        }
        if (dc->kb) sparse_decode_attend_group(G, qs, dc->kb + at, dc->vb + at, true, d, npos, d, gs, sc, os, dc->isa);
        else sparse_decode_attend_group(G, qs, dc->k + at, dc->v + at, false, d, npos, d, gs, sc, os, dc->isa);
    }
}

/* Task t of attn_decode_attend: KV head t's selected heads (grouped: sel ascending, so a group's
 * heads are adjacent), or the t-th selected head alone. */
static void attend_task(const attn_decode *dc, size_t l0, int grp, bool grouped, int t, const int *sel, int nsel,
                        int pos, const float *q, const float *gates, float *scores, float *og) {
    int k0 = t, k1 = t + 1;
    if (grouped) {
        for (k0 = 0; k0 < nsel && sel[k0] / grp < t;) k0++;
        for (k1 = k0; k1 < nsel && sel[k1] / grp == t;) k1++;
        if (k0 == k1) return;
    }
    attend_group(dc, l0 + (size_t)(sel[k0] / grp) * dc->hstride, sel, k0, k1, pos + 1, q, gates, scores, og);
}

void attn_decode_attend(attn_decode *dc, int l, int n_kv_heads, int grp, const int *sel, int nsel, int pos,
                        const float *q, const float *gates, float *scores, float *og) {
    const size_t l0 = (size_t)l * n_kv_heads * dc->hstride;
    /* one task per KV head where the kernels read K and V once for its heads, else one per head */
    const bool grouped = grp > 1 && sparse_decode_groups(dc->d, dc->kb != NULL, dc->isa);
    const int ntask = grouped ? n_kv_heads : nsel;
    if (ATTN_DECODE_WORK * nsel * (pos + 1) * dc->d < dc->par_work) {
        for (int t = 0; t < ntask; t++) attend_task(dc, l0, grp, grouped, t, sel, nsel, pos, q, gates, scores, og);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) attend_task(dc, l0, grp, grouped, t, sel, nsel, pos, q, gates, scores, og);
}

void attn_decode_route(const moh_attn_config *a, const attn_params_f32 *p, const float *x, attn_cache_f32 *r) {
    static const int whole[1] = {0};
    const int C = a->hidden_size;
    if (a->top_k < 1 || attn_routed_heads(a) < 1) {
        router_forward_f32(a, p, x, NULL, 1, r);
        return;
    }
    const int nz = sparse_router_nz(a);
    float *z = r->scratch; /* [E + W + h_s + 2] >= nz */
    bool adjacent = true; /* as attn_params_bind leaves them: one product */
    for (int j = 0; j < nz; j++) adjacent = adjacent && sparse_router_row(a, p, j) == p->w_r + (size_t)j * C;
    if (adjacent)
        sparse_decode_gemv_f32(p->w_r, C, NULL, x, whole, 1, C, 0, nz, z);
    else
        for (int j = 0; j < nz; j++) sparse_decode_gemv_f32(sparse_router_row(a, p, j), C, NULL, x, whole, 1, C, 0, 1, z + j);
    router_learned_rows_f32(a, r, z, 0, 1);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void attn_decode_calibrate(attn_decode *dc, const float *w, int rows, int C, float *x, float *out) {
    enum { NREG = 15, NGEMV = 9 };
    static const int whole[1] = {0};
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
    const int n = dc->team_size = ran / NREG;
    qsort(reg, NREG, sizeof reg[0], cmp_double);
    for (int c = 0; c < C; c++) x[c] = (float)((c % 7) - 3) * 0.25f;
    for (int i = 0; i < NGEMV; i++) { /* on this thread, in the store's precision */
        const double t0 = omp_get_wtime();
        prepare_input(dc, x, 0, (size_t)C);
        gemv_rows(dc, out, w, C, NULL, x, whole, 1, C, 0, rows);
        const double dt = omp_get_wtime() - t0;
        best = dt < best ? dt : best;
    }
    dc->team_s = reg[NREG / 2];
    dc->mac_s = best / ((double)rows * C);
    /* split when W mac_s (1 - 1 / n) > team_s: the time the other threads take off exceeds waking them */
    const double wk = n > 1 && dc->mac_s > 0 ? dc->team_s / (dc->mac_s * (1.0 - 1.0 / n)) : 1e18;
    dc->par_work = wk < 4096 ? 4096 : wk > 1e15 ? (long)1e15 : (long)wk;
}

void attn_decode_copy_split(attn_decode *dst, const attn_decode *src) {
    dst->par_work = src->par_work;
    dst->team_s = src->team_s;
    dst->mac_s = src->mac_s;
    dst->team_size = src->team_size;
}

void attn_decode_describe_split(const attn_decode *dc, char *out, size_t cap) {
    if (dc->par_work <= 0 || dc->mac_s <= 0) snprintf(out, cap, "team split not calibrated yet");
    else
        snprintf(out, cap, "team of %d: start-up %.1f us, one thread %.2f GMAC/s: split from %ld multiply-adds",
                 dc->team_size, dc->team_s * 1e6, 1e-9 / dc->mac_s, dc->par_work);
}

void attn_decode_describe(const attn_decode *dc, char *out, size_t cap) {
    if (dc->qt) {
        char m[160];
        quant_table_describe(dc->qt, m, sizeof m);
        snprintf(out, cap, "quantised matrices %s, %s kernels; bf16 KV cache (%s%s); fp32 accumulation, other "
                 "matrices fp32", m, quant_isa_name(dc->qisa),
                 sparse_decode_groups(dc->d, true, dc->isa) ? "AVX2, grouped-KV" : sparse_bf16_isa_name(dc->isa),
                 sparse_decode_groups(dc->d, true, dc->isa) ? "" : ", per head");
    } else if (!dc->bf16) snprintf(out, cap, "fp32");
    else
        snprintf(out, cap, "bf16 weights and KV cache, %s kernels, fp32 accumulation (norms, router, softmax fp32)",
                 sparse_bf16_isa_name(dc->isa));
}

moh_precision attn_decode_precision(moh_precision asked, char *why, size_t cap) {
    if (cap) why[0] = 0;
    if (asked != MOH_PRECISION_BF16) return MOH_PRECISION_FP32;
    if (sparse_bf16_isa_detect() >= SPARSE_BF16_AVX512) return MOH_PRECISION_BF16;
    snprintf(why, cap, "this CPU has no AVX-512 (bf16 decoding needs AVX-512F/BW, or AVX512-BF16)");
    return MOH_PRECISION_FP32;
}
