/* Head-sparse MoH attention, float32 (spec §1, §10): see sparse.h for what is computed.
 *
 * Layout of the work:
 *  - selected pairs are listed per (batch row b, head i) in token order (pair_off / pair_pos);
 *    every per-pair tensor (q, o, og, lse, dQ, dO) is [P, d] in that order, so the rows of one head
 *    are contiguous and a query tile is a slice;
 *  - products run on one register-tile kernel family (sparse_kernels.h), C[R x n] (+)= A[R x K]
 *    B[K x n] with R <= 6, n <= 64, where A rows, B rows and C rows are given by pointer arrays:
 *    gathers and scatters cost nothing, and the same kernel serves projections, QK^T, PV and every
 *    gradient;
 *  - each step is a task function over a slice [t0, t1) of its task list with the thread's
 *    scratch; sp_run hands the slices out (static or dynamic) and is the only place that threads
 *    or times anything. Tasks own their output rows; sums over tokens run inside one task in a
 *    fixed order. Nothing depends on the thread count.
 * Tile sizes: SPARSE_BK keys per key tile (its K^T block, d x SPARSE_BK, and its V rows stay in
 * L1/L2 while the 6-row groups of a query tile stream past), SPARSE_BQ queries per query tile.
 * Sections: cache layout, scheduler, shared steps (weight packing, per-head scatter), forward,
 * backward. */
#include "attn/sparse.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/sparse_kernels.h"
#include "ops/bf16.h"

/* Clock of the phase timers (a build may substitute a CPU-time clock for profiling). */
#ifndef SP_CLOCK
#define SP_CLOCK() omp_get_wtime()
#endif

#define SP_TC 96         /* tokens per task when scattering into y / dx rows */
#define SP_KC 256        /* tokens per chunk of a weight-gradient reduction */
#define SP_CB 96         /* output rows per weight-gradient task (multiple of SP_MR) */
#define SP_BWD_TASKS 32  /* target task count of the attention backward: fixes the key split */
#define SP_NPTR 11       /* pointer arrays per thread */

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int round16(int v) { return (v + 15) & ~15; }

/* ------------------------------------------------------------------------------------------------
 * Cache layout
 * ---------------------------------------------------------------------------------------------- */

int sparse_active_heads(const moh_attn_config *cfg) {
    if (cfg->router == MOH_ROUTER_NONE || attn_routed_heads(cfg) == 0 || cfg->top_k == 0)
        return cfg->n_heads;
    return cfg->shared_heads + cfg->top_k;
}

/* Per-thread scratch, carved from the thread's float and pointer slices (tws_get): score tiles
 * s, ds [BQ, BK]; oacc [BQ, dpad]; m, nv [BQ]; l [BQ, 16]; dkt, dvt [BK, dpad]; operand pointer
 * arrays pa .. pc, pa16 [ptr_cap]; sc / sa, dsc / dsa: the rows of s, ds. */
typedef struct sp_tws {
    float *s, *ds, *oacc, *m, *l, *dkt, *dvt;
    int *nv;
    const float **pa, **pb, **pb2, **pb3, **pa2, **sa, **dsa;
    float **pc, **sc, **dsc;
    const uint16_t **pa16; /* bf16 operand rows */
    uint16_t *pbf, *qb; /* bf16 tiles: probabilities [SP_MR, BK]; operand rows (queries
                         * [BQ, 2 ceil(d/2)], gathered x [BQ, 2 ceil(C/2)], og [SP_TC, 2 ceil(d/2)]) */
    uint16_t *bw;       /* bf16 backward: P and dS pair-interleaved over rows [BQ / 2, BK, 2] each,
                         * dS rows [BQ, BK] */
} sp_tws;

static int sp_dpad(const moh_attn_config *cfg) { return round16(cfg->head_dim); }
static int sp_ncb(const moh_attn_config *cfg) { return (cfg->hidden_size + SP_NR - 1) / SP_NR; }
static int sp_ptr_cap(const moh_attn_config *cfg) {
    int v = imax(cfg->hidden_size, cfg->head_dim);
    v = imax(v, imax(SPARSE_BQ, SPARSE_BK));
    v = imax(v, imax(SP_KC, SP_TC));
    return v + 8;
}
static size_t sp_ws_floats(const moh_attn_config *cfg) {
    const size_t dp = (size_t)sp_dpad(cfg);
    /* s, ds [BQ, BK]; oacc [BQ, dp]; m, nv [BQ]; l [BQ, 16]; dkt, dvt [BK, dp] */
    return 2 * (size_t)SPARSE_BQ * SPARSE_BK + (size_t)SPARSE_BQ * dp + 2 * (size_t)round16(SPARSE_BQ) +
           16 * (size_t)SPARSE_BQ + 2 * (size_t)SPARSE_BK * dp + 64;
}

/* Walks the buffers in a fixed order; assigns pointers when base != NULL. Returns total bytes. */
typedef struct sp_carver {
    char *base;
    size_t off;
} sp_carver;
static void *carve(sp_carver *cv, size_t bytes) {
    cv->off = (cv->off + 63) & ~(size_t)63;
    void *p = cv->base && bytes ? cv->base + cv->off : NULL;
    cv->off += bytes;
    return p;
}

static int sp_nkt(int N) { return (N + SPARSE_BK - 1) / SPARSE_BK; }
static int sp_max_tasks(const moh_attn_config *cfg, int B, int N) {
    return B * cfg->n_heads * ((N + SPARSE_BQ - 1) / SPARSE_BQ);
}
/* Key chunks of the attention backward: a function of B, h_kv, N only (never of the thread
 * count), so dQ's summation order is fixed. */
static int sp_nparts(const moh_attn_config *cfg, int B, int N) {
    const int bk = B * cfg->n_kv_heads;
    int np = (SP_BWD_TASKS + bk - 1) / bk;
    np = imin(np, sp_nkt(N));
    return imax(np, 1);
}

/* The backward's products in bf16: attention tiles, d og, dx, dW_q, dW_O (head_dim <= SPARSE_BK:
 * the tiles' scratch). */
static bool sp_bwd16(const moh_attn_config *cfg, const sparse_cache *c) {
    return c->bf16_tiles && cfg->head_dim <= SPARSE_BK;
}

static size_t sp_layout(sparse_cache *c, const moh_attn_config *cfg, int B, int N, int nthreads,
                        char *base) {
    sp_carver cv = {base, 0};
    const size_t T = (size_t)B * N, h = (size_t)cfg->n_heads, d = (size_t)cfg->head_dim;
    const size_t hd = h * d, kvd = (size_t)cfg->n_kv_heads * d, qd = (size_t)attn_qkv_dim(cfg);
    const size_t E = (size_t)attn_routed_heads(cfg), hs = (size_t)cfg->shared_heads;
    const size_t W = (size_t)attn_router_width(cfg);
    const size_t P = T * (size_t)sparse_active_heads(cfg);
    const size_t nkt = (size_t)sp_nkt(N), kvt = (size_t)B * cfg->n_kv_heads * nkt * d * SPARSE_BK;
    const bool qn = cfg->router == MOH_ROUTER_QUERY_NORM, rope = cfg->rope_theta > 0;
    const size_t half = d / 2, F = sizeof(float);
    const size_t wp = h * d * (size_t)sp_ncb(cfg) * SP_NR;
    const size_t nparts = (size_t)sp_nparts(cfg, B, N);
    sparse_cache tmp;
    sparse_cache *o = c ? c : &tmp;
    attn_cache_f32 *rc = &o->rc;
    rc->gates = carve(&cv, T * h * F);
    rc->p = carve(&cv, T * E * F);
    rc->mask = carve(&cv, T * E * F);
    rc->r = carve(&cv, T * E * F);
    rc->denom = carve(&cv, T * F);
    rc->s = carve(&cv, T * hs * F);
    rc->a = carve(&cv, T * 2 * F);
    rc->qn = carve(&cv, T * E * F);
    rc->qstd = carve(&cv, T * F);
    rc->scratch = carve(&cv, T * (E + W + hs + 2) * F);
    rc->q_pre = carve(&cv, qn ? T * hd * F : 0);
    o->dgates = carve(&cv, T * h * F);
    o->rdz = carve(&cv, T * (E + 2 + hs) * F);
    o->lbv = carve(&cv, (E + 1) * F);
    o->pair_off = carve(&cv, ((size_t)B * h + 1) * sizeof(int));
    o->pair_pos = carve(&cv, P * sizeof(int));
    o->tasks = carve(&cv, (size_t)sp_max_tasks(cfg, B, N) * 4 * sizeof(int));
    o->q = carve(&cv, P * d * F);
    o->o = carve(&cv, P * d * F);
    o->og = carve(&cv, P * d * F);
    o->smax = carve(&cv, P * F);
    o->lse = carve(&cv, P * F);
    o->kv = carve(&cv, T * 2 * kvd * F);
    o->kh = carve(&cv, T * kvd * F);
    o->vh = carve(&cv, T * kvd * F);
    o->kt = carve(&cv, kvt * F);
    o->vt = carve(&cv, kvt * F);
    o->qkv = carve(&cv, qn ? T * qd * F : 0);
    o->dqkv = carve(&cv, qn ? T * qd * F : 0);
    o->rope_cos = carve(&cv, rope ? (size_t)N * half * F : 0);
    o->rope_sin = carve(&cv, rope ? (size_t)N * half * F : 0);
    o->wpack1 = carve(&cv, wp * F);
    o->wpack2 = carve(&cv, wp * F);
    o->dq = carve(&cv, nparts * P * d * F);
    o->dout = carve(&cv, P * d * F);
    o->ddot = carve(&cv, P * F);
    o->dkh = carve(&cv, T * kvd * F);
    o->dvh = carve(&cv, T * kvd * F);
    o->ws_floats = sp_ws_floats(cfg);
    o->ws = carve(&cv, (size_t)nthreads * o->ws_floats * F);
    o->ptr_cap = sp_ptr_cap(cfg);
    o->wptr = carve(&cv, (size_t)nthreads * SP_NPTR * (size_t)o->ptr_cap * sizeof(void *));
    return cv.off + 64;
}

size_t sparse_cache_bytes(const moh_attn_config *cfg, int B, int N, int nthreads) {
    return sp_layout(NULL, cfg, B, N, nthreads, NULL);
}

static void rope_tables(sparse_cache *c, const moh_attn_config *cfg, int N) {
    if (!c->rope_cos) return;
    const int d = cfg->head_dim, half = d / 2;
    /* exactly ops' rope: its inv_freq_j (theta and rope scaling), angle = n * inv_freq_j in float */
    for (int j = 0; j < half; j++) {
        const float inv = rope_inv_freq_f32(cfg, j);
        for (int n = 0; n < N; n++) {
            const float ang = (float)n * inv;
            c->rope_cos[(size_t)n * half + j] = cosf(ang);
            c->rope_sin[(size_t)n * half + j] = sinf(ang);
        }
    }
}

int sparse_cache_init(sparse_cache *c, const moh_attn_config *cfg, int B, int N, moh_error *err) {
    memset(c, 0, sizeof *c);
    if (B < 1 || N < 1)
        return moh_fail(err, MOH_E_ARG, "sparse attention cache: B=%d N=%d, both must be >= 1", B, N);
    if (cfg->rope_theta > 0 && cfg->head_dim % 2)
        return moh_fail(err, MOH_E_CONFIG, "sparse attention: RoPE needs an even head_dim, got %d", cfg->head_dim);
    if ((double)B * N * cfg->n_heads * imax(cfg->head_dim, 1) > (double)INT32_MAX)
        return moh_fail(err, MOH_E_NOMEM, "sparse attention cache: B=%d N=%d heads=%d is too large", B, N, cfg->n_heads);
    const int nthreads = imax(omp_get_max_threads(), 1);
    const size_t bytes = sp_layout(NULL, cfg, B, N, nthreads, NULL);
    c->block = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!c->block)
        return moh_fail(err, MOH_E_NOMEM, "sparse attention cache: cannot allocate %zu MiB", bytes >> 20);
    sp_layout(c, cfg, B, N, nthreads, c->block);
    c->bytes = bytes;
    c->maxB = B;
    c->maxN = N;
    c->B = B;
    c->N = N;
    c->nthreads = nthreads;
    c->nparts = sp_nparts(cfg, B, N);
    c->vec = sp_vec_detect();
    rope_tables(c, cfg, N);
    return MOH_OK;
}

/* Per-thread bf16 operand rows of the forward (uint16 count): queries, gathered x, og. */
static size_t sp_rows16(const moh_attn_config *cfg) {
    const size_t C2 = 2 * (size_t)((cfg->hidden_size + 1) / 2), d2 = 2 * (size_t)((cfg->head_dim + 1) / 2);
    return ((size_t)imax(SPARSE_BQ, SP_TC) * (C2 > d2 ? C2 : d2) + 31) & ~(size_t)31;
}

int sparse_cache_set_bf16(sparse_cache *c, const moh_attn_config *cfg, bf16_ctx *ctx, moh_error *err) {
    return sparse_cache_set_bf16_tiles(c, cfg, ctx, -1, err);
}

int sparse_cache_set_bf16_tiles(sparse_cache *c, const moh_attn_config *cfg, bf16_ctx *ctx, int tiles_isa,
                                moh_error *err) {
    const bool vec = bf16_detect().avx512_bf16, tiles = ctx && (vec || tiles_isa >= 0);
    if (tiles && !c->bblock) {
        const size_t d2 = 2 * (size_t)((cfg->head_dim + 1) / 2), dp = (size_t)sp_dpad(cfg);
        const size_t tiles_n = (size_t)c->maxB * cfg->n_kv_heads * sp_nkt(c->maxN);
        const size_t nk = tiles_n * d2 * SPARSE_BK, nv = tiles_n * SPARSE_BK * dp;
        const size_t C2 = 2 * (size_t)((cfg->hidden_size + 1) / 2), hw = (size_t)cfg->n_heads * cfg->head_dim;
        const size_t nwq = hw * C2, nwo = (size_t)cfg->n_heads * d2 * (size_t)cfg->hidden_size;
        const size_t bws_n = ((size_t)SP_MR * SPARSE_BK + sp_rows16(cfg) + 3 * (size_t)SPARSE_BQ * SPARSE_BK + 31) &
                             ~(size_t)31;
        const size_t capP = (size_t)c->maxB * c->maxN * sparse_active_heads(cfg);
        const size_t nrow = capP * d2, ntr = capP * (size_t)cfg->head_dim + 32; /* + a finite pad */
        const size_t ntok = 2 * (size_t)c->maxB * c->maxN * C2; /* x, then dy */
        uint16_t *blk = calloc(2 * (nk + nv) + 2 * (nwq + nwo) + 2 * nrow + 4 * ntr + ntok + (size_t)c->nthreads * bws_n,
                               sizeof(uint16_t));
        if (!blk) return moh_fail(err, MOH_E_NOMEM, "sparse attention: cannot allocate the bf16 key/value tiles");
        c->bblock = blk;
        c->ktb = blk;
        c->vtb = blk + nk;
        c->vtbt = blk + nk + nv;
        c->ktbk = c->vtbt + nk;
        c->qb16 = c->ktbk + nv;
        c->dob16 = c->qb16 + nrow;
        c->qt16 = c->dob16 + nrow;
        c->dot16 = c->qt16 + ntr;
        c->wqb = c->dot16 + ntr;
        c->wob = c->wqb + nwq;
        c->wob2 = c->wob + nwo;
        c->wqb2 = c->wob2 + nwq;
        c->dqt16 = c->wqb2 + nwo;
        c->ogt16 = c->dqt16 + ntr;
        c->tok16 = c->ogt16 + ntr;
        c->bws = c->tok16 + ntok;
        c->bws_n = bws_n;
    }
    if (!tiles && c->bblock) {
        free(c->bblock);
        c->bblock = NULL;
        c->ktb = c->vtb = c->vtbt = c->ktbk = c->qb16 = c->dob16 = c->qt16 = c->dot16 = NULL;
        c->wqb = c->wob = c->wob2 = c->wqb2 = c->dqt16 = c->ogt16 = c->tok16 = c->bws = NULL;
        c->bws_n = 0;
    }
    c->bf16 = ctx;
    c->bf16_tiles = tiles;
    c->tiles_isa = !tiles ? (int)SP_TILES_PORTABLE : tiles_isa >= 0 ? tiles_isa : (int)sp_tiles_detect();
    c->bf16_vec = tiles && vec;
    return MOH_OK;
}

void sparse_cache_free(sparse_cache *c) {
    free(c->bblock);
    free(c->block);
    memset(c, 0, sizeof *c);
}

static sp_tws tws_get(const sparse_cache *c, const moh_attn_config *cfg, int tid) {
    sp_tws w;
    const size_t dp = (size_t)sp_dpad(cfg), bq = (size_t)round16(SPARSE_BQ);
    float *f = c->ws + (size_t)tid * c->ws_floats;
    w.s = f;
    f += (size_t)SPARSE_BQ * SPARSE_BK;
    w.ds = f;
    f += (size_t)SPARSE_BQ * SPARSE_BK;
    w.oacc = f;
    f += (size_t)SPARSE_BQ * dp;
    w.m = f;
    f += bq;
    w.l = f;
    f += 16 * (size_t)SPARSE_BQ;
    w.nv = (int *)(void *)f;
    f += bq;
    w.dkt = f;
    f += (size_t)SPARSE_BK * dp;
    w.dvt = f;
    void **p = c->wptr + (size_t)tid * SP_NPTR * c->ptr_cap;
    const size_t cap = (size_t)c->ptr_cap;
    w.pa = (const float **)(void *)(p + 0 * cap);
    w.pb = (const float **)(void *)(p + 1 * cap);
    w.pb2 = (const float **)(void *)(p + 2 * cap);
    w.pb3 = (const float **)(void *)(p + 3 * cap);
    w.pa2 = (const float **)(void *)(p + 4 * cap);
    w.sa = (const float **)(void *)(p + 5 * cap);
    w.dsa = (const float **)(void *)(p + 6 * cap);
    w.pc = (float **)(void *)(p + 7 * cap);
    w.sc = (float **)(void *)(p + 8 * cap);
    w.dsc = (float **)(void *)(p + 9 * cap);
    w.pa16 = (const uint16_t **)(void *)(p + 10 * cap);
    for (int r = 0; r < SPARSE_BQ; r++) {
        w.sc[r] = w.s + (size_t)r * SPARSE_BK;
        w.sa[r] = w.sc[r];
        w.dsc[r] = w.ds + (size_t)r * SPARSE_BK;
        w.dsa[r] = w.dsc[r];
    }
    w.pbf = c->bws ? c->bws + (size_t)tid * c->bws_n : NULL;
    w.qb = w.pbf ? w.pbf + (size_t)SP_MR * SPARSE_BK : NULL;
    w.bw = w.qb ? w.qb + sp_rows16(cfg) : NULL;
    return w;
}

/* How this cache's bf16 tile products run (sp_tiles). */
static sp_tiles sp_isa(const sparse_cache *c) { return (sp_tiles)c->tiles_isa; }

/* RoPE of one head row v[d] at position n from the tables (sign -1: the inverse rotation), the
 * same arithmetic as ops' rope_forward / rope_backward. */
static void rope_row(float *v, const sparse_cache *c, int n, int d, int sign) {
    const int half = d / 2;
    const float *cs = c->rope_cos + (size_t)n * half, *sn = c->rope_sin + (size_t)n * half;
    for (int j = 0; j < half; j++) {
        const float co = cs[j], s = sign < 0 ? -sn[j] : sn[j];
        const float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * co + (-x2) * s;
        v[j + half] = x2 * co + x1 * s;
    }
}

/* First index in a[0..n) with a[i] >= v (a ascending). */
static int lower_bound(const int *a, int n, int v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* ------------------------------------------------------------------------------------------------
 * Scheduler: the only place that starts threads or reads the phase clock
 * ---------------------------------------------------------------------------------------------- */

/* A step: tasks [t0, t1) of its list, with the calling thread's scratch (NULL when serial). */
typedef void sp_task_fn(const void *arg, int t0, int t1, sp_tws *w);

typedef enum {
    SP_SERIAL,  /* fn(arg, 0, ntasks, NULL) on the calling thread (it may call threaded libraries) */
    SP_STATIC,  /* thread ith of nth gets the contiguous slice [ntasks ith / nth, ntasks (ith+1) / nth) */
    SP_DYNAMIC, /* one task at a time, first come first served (tiles of uneven cost) */
} sp_sched;

/* Runs fn over tasks [0, ntasks) on c->nthreads threads as `how` says, and adds the wall time to
 * c->phase_s[ph]. Tasks own their outputs, so the result never depends on the hand-out. */
static void sp_run(sparse_cache *c, const moh_attn_config *cfg, int ph, sp_task_fn *fn,
                   const void *arg, int ntasks, sp_sched how) {
    const double t0 = SP_CLOCK();
    if (how == SP_SERIAL) {
        fn(arg, 0, ntasks, NULL);
    } else if (ntasks > 0) {
#pragma omp parallel num_threads(c->nthreads)
        {
            const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
            sp_tws w = tws_get(c, cfg, ith);
            if (how == SP_DYNAMIC) {
#pragma omp for schedule(dynamic, 1)
                for (int t = 0; t < ntasks; t++) fn(arg, t, t + 1, &w);
            } else {
                const int lo = (int)((long)ntasks * ith / nth), hi = (int)((long)ntasks * (ith + 1) / nth);
                if (lo < hi) fn(arg, lo, hi, &w);
            }
        }
    }
    c->phase_s[ph] += SP_CLOCK() - t0;
}

/* Everything a step reads: the call's arguments (forward or backward; unused fields NULL). */
typedef struct sp_ctx {
    const moh_attn_config *cfg;
    const attn_params_f32 *prm, *g; /* parameters; gradients (backward) */
    sparse_cache *c;
    const float *x;                 /* [T, C] input */
    const float *dy;                /* [T, C] backward: dL/dy */
    float *dx;                      /* [T, C] backward: dL/dx, accumulated (may be NULL) */
    float lb_scale;
    int B, N;
    int np;                         /* backward: key parts of the attention backward */
} sp_ctx;

/* Query tile ti of c->tasks: pair rows p0 .. p0 + nr of head i in batch row b. */
typedef struct sp_qtile {
    int b, i, p0, nr;
} sp_qtile;
static sp_qtile qtile(const sparse_cache *c, int h, int ti) {
    const int *tk = c->tasks + 4 * ti;
    const int b = tk[0], i = tk[1], r0 = tk[2];
    const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
    return (sp_qtile){b, i, off + r0, imin(SPARSE_BQ, cnt - r0)};
}

/* Columns of token t's K and V rows in the projection buffer: qkv [T, qd] (query_norm: K at
 * h d, V at h d + kvd) or kv [T, 2 kvd] (K at 0, V at kvd). */
typedef struct sp_kvcols {
    int ld, koff, voff;
} sp_kvcols;
static sp_kvcols kv_cols(const moh_attn_config *cfg) {
    const int hd = cfg->n_heads * cfg->head_dim, kvd = cfg->n_kv_heads * cfg->head_dim;
    if (cfg->router == MOH_ROUTER_QUERY_NORM) return (sp_kvcols){attn_qkv_dim(cfg), hd, hd + kvd};
    return (sp_kvcols){2 * kvd, 0, kvd};
}

/* ------------------------------------------------------------------------------------------------
 * Shared steps: weight packing and the per-head scatter-add (forward: y, backward: dx)
 * ---------------------------------------------------------------------------------------------- */

/* Head i of a weight as a [d, C] matrix: A_i(e, k) = w[i hs + e es + k ks]. */
typedef struct sp_wview {
    const float *w;
    size_t hs, es, ks;
} sp_wview;
/* W_q^i: rows i d + e of w_qkv [qd, C]. */
static sp_wview wq_view(const moh_attn_config *cfg, const attn_params_f32 *prm) {
    const size_t d = (size_t)cfg->head_dim, C = (size_t)cfg->hidden_size;
    return (sp_wview){prm->w_qkv, d * C, C, 1};
}
/* W_O^i transposed: columns i d + e of w_o [C, h d]. */
static sp_wview wo_view(const moh_attn_config *cfg, const attn_params_f32 *prm) {
    const size_t d = (size_t)cfg->head_dim;
    return (sp_wview){prm->w_o, d, 1, (size_t)cfg->n_heads * d};
}

typedef struct sp_pack {
    const moh_attn_config *cfg;
    sp_wview v;
    float *dst;
} sp_pack;

/* Tasks: heads. dst [h, C, d]: dst[i][k][e] = A_i(e, k) (B operand of a product with C-wide
 * rows: q = x W_q^i^T, d og = dy W_O^i). */
static void pack_cd_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_pack *a = arg;
    const int C = a->cfg->hidden_size, d = a->cfg->head_dim;
    const sp_wview v = a->v;
    for (int i = t0; i < t1; i++)
        for (int k = 0; k < C; k++)
            for (int e = 0; e < d; e++)
                a->dst[((size_t)i * C + k) * d + e] = v.w[(size_t)i * v.hs + (size_t)e * v.es + (size_t)k * v.ks];
}

/* Tasks: heads. The bf16 weights of a head-sparse product (bf16_tiles), per head A_i [d, C] of
 * the view: dim_pairs: [ceil(d/2), C, 2] (pairs of head dims: the B operand of a product into
 * C-wide rows: W_O^i in the forward's y, W_q^i in dx), else [ceil(C/2), d, 2] (pairs of inputs:
 * B of a product of C-wide rows: W_q^i in q, W_O^i in d og); zero padded. */
typedef struct sp_pack16 {
    const moh_attn_config *cfg;
    sp_wview v;
    uint16_t *dst;
    bool dim_pairs;
} sp_pack16;
static void pack_bf16_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_pack16 *a = arg;
    const int C = a->cfg->hidden_size, d = a->cfg->head_dim, C2 = (C + 1) / 2, d2 = (d + 1) / 2;
    const sp_wview v = a->v;
    for (int i = t0; i < t1; i++) {
        uint16_t *dst = a->dst + (size_t)i * (a->dim_pairs ? (size_t)d2 * 2 * C : (size_t)C2 * 2 * d);
        for (int e = 0; e < 2 * d2; e++)
            for (int k = 0; k < 2 * C2; k++) {
                const uint16_t x = e < d && k < C ? bf16_round(v.w[(size_t)i * v.hs + (size_t)e * v.es + (size_t)k * v.ks]) : 0;
                if (a->dim_pairs) {
                    if (k < C) dst[((size_t)(e / 2) * C + k) * 2 + (e & 1)] = x;
                } else if (e < d) {
                    dst[((size_t)(k / 2) * d + e) * 2 + (k & 1)] = x;
                }
            }
    }
}

/* Tasks: heads. dst [h, ncb, d, SP_NR]: dst[i][cb][e][j] = A_i(e, cb SP_NR + j), 0 past C (B
 * operand of a product into C-wide rows, one [d, SP_NR] block per column block). */
static void pack_blk_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_pack *a = arg;
    const int C = a->cfg->hidden_size, d = a->cfg->head_dim, ncb = sp_ncb(a->cfg);
    const sp_wview v = a->v;
    for (int i = t0; i < t1; i++)
        for (int cb = 0; cb < ncb; cb++)
            for (int e = 0; e < d; e++)
                for (int jj = 0; jj < SP_NR; jj++) {
                    const int col = cb * SP_NR + jj;
                    a->dst[(((size_t)i * ncb + cb) * d + e) * SP_NR + jj] =
                        col < C ? v.w[(size_t)i * v.hs + (size_t)e * v.es + (size_t)col * v.ks] : 0.0f;
                }
}

typedef struct sp_scatter {
    const sp_ctx *x;
    const float *src; /* [P, d] per-pair rows */
    float *dst;       /* [T, C] token rows */
    bool init;        /* set dst rows to bias (NULL: 0) first; else accumulate */
    const float *bias;
    const uint16_t *w16; /* bf16: src rows rounded to bf16 times these [h, ceil(d/2), C, 2] weights
                          * (c->wob: W_O^i in the forward; c->wqb2: W_q^i for dx); NULL: fp32 */
} sp_scatter;

/* Tasks: (b, chunk of SP_TC tokens). dst[t] (+)= sum over heads i in order of src_p W_i for the
 * pairs p = (t, i), W_i the [d, C] blocks of c->wpack2 (pack_blk_task). */
static void scatter_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_scatter *a = arg;
    const moh_attn_config *cfg = a->x->cfg;
    const sparse_cache *c = a->x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, ncb = sp_ncb(cfg);
    const int N = a->x->N, nch = (N + SP_TC - 1) / SP_TC;
    for (int task = t0; task < t1; task++) {
        const int b = task / nch, n0 = (task % nch) * SP_TC, n1 = imin(N, n0 + SP_TC);
        if (a->init)
            for (int n = n0; n < n1; n++) {
                float *yr = a->dst + ((size_t)b * N + n) * C;
                if (a->bias) memcpy(yr, a->bias, sizeof(float) * C);
                else memset(yr, 0, sizeof(float) * C);
            }
        for (int i = 0; i < h; i++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            const int *pp = c->pair_pos + off;
            const int lo = lower_bound(pp, cnt, n0), hi = lower_bound(pp, cnt, n1), m = hi - lo;
            if (m <= 0) continue;
            for (int r = 0; r < m; r++) {
                w->pa[r] = a->src + (size_t)(off + lo + r) * d;
                w->pc[r] = a->dst + ((size_t)b * N + pp[lo + r]) * C;
            }
            if (a->w16) { /* rows of src are consecutive pairs: one bf16 block [m, 2 d2] */
                const int d2 = (d + 1) / 2;
                for (int r = 0; r < m; r++) {
                    uint16_t *ob = w->qb + (size_t)r * 2 * d2;
                    bf16_from_f32(ob, w->pa[r], (size_t)d);
                    if (d & 1) ob[d] = 0;
                }
                sp_mm_bf16(sp_isa(c), m, C, d2, w->qb, 2 * d2, a->w16 + (size_t)i * d2 * 2 * C, 2 * C, w->pc, true);
                continue;
            }
            for (int cb = 0; cb < ncb; cb++) {
                for (int e = 0; e < d; e++) w->pb[e] = c->wpack2 + (((size_t)i * ncb + cb) * d + e) * SP_NR;
                sp_mm(c->vec, 0, m, imin(SP_NR, C - cb * SP_NR), d, w->pa, 0, w->pb, 0, w->pc,
                      (long)cb * SP_NR, true);
            }
        }
    }
}

static int scatter_tasks(const sp_ctx *x) { return x->B * ((x->N + SP_TC - 1) / SP_TC); }

/* The bf16 token rows [T, 2 ceil(C/2)] of x (forward) and dy (backward) in c->tok16. */
static uint16_t *sp_x16(const sparse_cache *c) { return c->tok16; }
static uint16_t *sp_dy16(const sparse_cache *c, const moh_attn_config *cfg) {
    return c->tok16 + (size_t)c->maxB * c->maxN * 2 * ((cfg->hidden_size + 1) / 2);
}

/* Tasks: tokens. dst [T, 2 ceil(C/2)] = src [T, C] in bf16 (sp_x16, sp_dy16): the gathered rows
 * of q = x W_q^i^T, d og = dy W_O^i, dW_q and dW_O. */
typedef struct sp_tok16 {
    uint16_t *dst;
    const float *src;
    int C;
} sp_tok16;
static void tok16_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_tok16 *a = arg;
    const size_t C = (size_t)a->C, C2 = 2 * ((C + 1) / 2);
    for (int t = t0; t < t1; t++) {
        uint16_t *dst = a->dst + (size_t)t * C2;
        bf16_from_f32(dst, a->src + (size_t)t * C, C);
        if (C & 1) dst[C] = 0;
    }
}

/* ------------------------------------------------------------------------------------------------
 * Forward
 * ---------------------------------------------------------------------------------------------- */

static int cmp_task_desc(const void *pa, const void *pb) {
    const int *a = pa, *b = pb;
    if (a[3] != b[3]) return a[3] > b[3] ? -1 : 1;
    for (int k = 0; k < 3; k++)
        if (a[k] != b[k]) return a[k] < b[k] ? -1 : 1;
    return 0;
}

/* Selected pairs per (b, head) in token order, and the query-tile task list (causal: the most
 * expensive tiles first, for the dynamic schedule; the order never changes any result). */
static void build_pairs(const moh_attn_config *cfg, sparse_cache *c, int B, int N) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, E = attn_routed_heads(cfg);
    const bool masked = E > 0 && cfg->top_k > 0;
    int p = 0, nt = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < h; i++) {
            c->pair_off[b * h + i] = p;
            const int p0 = p;
            for (int n = 0; n < N; n++) {
                const long t = (long)b * N + n;
                if (!masked || i < hs || c->rc.mask[t * E + (i - hs)] != 0.0f) c->pair_pos[p++] = n;
            }
            for (int r0 = 0; r0 < p - p0; r0 += SPARSE_BQ) {
                int *tk = c->tasks + 4 * nt++;
                tk[0] = b;
                tk[1] = i;
                tk[2] = r0;
                tk[3] = cfg->causal ? c->pair_pos[p0 + imin(r0 + SPARSE_BQ, p - p0) - 1] : 0;
            }
        }
    c->pair_off[B * h] = p;
    c->ntasks = nt;
    if (cfg->causal) qsort(c->tasks, (size_t)nt, 4 * sizeof(int), cmp_task_desc);
}

/* Serial: the router (query_norm: on the dense pre-RoPE q it needs anyway), then the pair lists. */
static void fwd_router_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int C = cfg->hidden_size, hd = cfg->n_heads * cfg->head_dim, qd = attn_qkv_dim(cfg);
    const int T = x->B * x->N;
    if (cfg->router == MOH_ROUTER_QUERY_NORM) {
        if (c->bf16) bf16_linear_forward(c->bf16, c->qkv, x->x, x->prm->w_qkv, x->prm->b_qkv, T, C, qd);
        else linear_forward_f32(c->qkv, x->x, x->prm->w_qkv, x->prm->b_qkv, T, C, qd);
        for (int t = 0; t < T; t++) memcpy(c->rc.q_pre + (size_t)t * hd, c->qkv + (size_t)t * qd, sizeof(float) * hd);
    }
    router_forward_f32(cfg, x->prm, x->x, c->qkv, T, &c->rc);
    build_pairs(cfg, c, x->B, x->N);
}

/* The learned router (top_k >= 1) split over tokens (bf16 compute), nz = E + nh + ns logits per
 * token (wg x | wg_0 x | wg_1 x). */
int sparse_router_nz(const moh_attn_config *cfg) {
    const int hs = cfg->shared_heads;
    return attn_routed_heads(cfg) + (hs >= 1 ? 2 : 0) + (hs >= 2 ? hs : 0);
}
static bool sp_router_split(const moh_attn_config *cfg, const sparse_cache *c) {
    if (!c->bf16 || cfg->router != MOH_ROUTER_LEARNED || cfg->top_k < 1 || attn_routed_heads(cfg) < 1) return false;
    const int nz = sparse_router_nz(cfg); /* W^T fits c->wpack1, SP_TC rows of dz fit w->s */
    return nz <= cfg->n_heads * cfg->head_dim && (size_t)SP_TC * nz <= (size_t)SPARSE_BQ * SPARSE_BK;
}
float *sparse_router_row(const moh_attn_config *cfg, const attn_params_f32 *p, int j) {
    const int E = attn_routed_heads(cfg), C = cfg->hidden_size;
    const int nh = cfg->shared_heads >= 1 ? 2 : 0;
    if (j < E) return p->w_r + (size_t)j * C;
    if (j < E + nh) return p->w_h + (size_t)(j - E) * C;
    return p->w_s + (size_t)(j - E - nh) * C;
}

/* Serial: wg | wg_0 | wg_1 transposed into c->wpack1 [C, nz]. */
static void router_pack_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const int C = x->cfg->hidden_size, nz = sparse_router_nz(x->cfg);
    for (int j = 0; j < nz; j++) {
        const float *wr = sparse_router_row(x->cfg, x->prm, j);
        for (int k = 0; k < C; k++) x->c->wpack1[(size_t)k * nz + j] = wr[k];
    }
}

/* Tasks: chunks of SP_TC tokens. The router's logits z = x W^T (fp32 register tiles, into
 * rc.scratch [T, nz]), then its scores and gates (router_learned_rows). */
static void router_fwd_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    const int C = x->cfg->hidden_size, nz = sparse_router_nz(x->cfg), T = x->B * x->N;
    for (int k = 0; k < C; k++) w->pb[k] = c->wpack1 + (size_t)k * nz;
    for (int task = t0; task < t1; task++) {
        const int r0 = task * SP_TC, nr = imin(SP_TC, T - r0);
        for (int r = 0; r < nr; r++) {
            w->pa[r] = x->x + (size_t)(r0 + r) * C;
            w->pc[r] = c->rc.scratch + (size_t)(r0 + r) * nz;
        }
        sp_mm(c->vec, 0, nr, nz, C, w->pa, 0, w->pb, 0, w->pc, 0, false);
        router_learned_rows_f32(x->cfg, &c->rc, c->rc.scratch, r0, r0 + nr);
    }
}

/* Serial: load-balance loss and the pair lists (after router_fwd_task). */
static void router_lb_pairs_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    c->rc.lb_loss = router_load_balance_f32(c->rc.p, c->rc.mask, x->B * x->N, attn_routed_heads(x->cfg));
    build_pairs(x->cfg, c, x->B, x->N);
}

/* Serial: kv [T, 2 kvd] = x W_{k|v}^T (query_norm has them in qkv already). */
static void fwd_kv_gemm_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const int C = x->cfg->hidden_size, hd = x->cfg->n_heads * x->cfg->head_dim;
    const int kvd = x->cfg->n_kv_heads * x->cfg->head_dim;
    if (x->c->bf16)
        bf16_gemm(x->c->bf16, false, true, x->B * x->N, 2 * kvd, C, x->x, C, x->prm->w_qkv + (size_t)hd * C, C,
                  0.0f, x->c->kv, 2 * kvd);
    else
        gemm_f32(false, true, x->B * x->N, 2 * kvd, C, 1.0f, x->x, C, x->prm->w_qkv + (size_t)hd * C, C, 0.0f,
                 x->c->kv, 2 * kvd);
}

/* The bf16 key and value tiles of (b, KV head g, key tile kt) with nk keys, from kh / vh and
 * the tile's K^T (c->kt) and V^T (vtr [d, SPARSE_BK]) in fp32: keys and values pair-interleaved
 * over dimensions (ktb, vtbt: rows of K^T / V^T in pairs) and over keys (vtb, ktbk: rows of V / K
 * in pairs). Pads past nk and d are never read (the odd row of a pair is written as zero). */
static void kv_tile_bf16(sparse_cache *c, const moh_attn_config *cfg, const float *vtr, int b, int g, int kt,
                         int nk, int N, sp_tws *w) {
    const int hkv = cfg->n_kv_heads, d = cfg->head_dim, d2 = (d + 1) / 2, dp = sp_dpad(cfg), nkt = sp_nkt(N);
    const size_t tile = ((size_t)b * hkv + g) * nkt + kt, hb = ((size_t)b * hkv + g) * N;
    const size_t ko = tile * (size_t)d2 * SPARSE_BK * 2, vo = tile * (size_t)SPARSE_BK * dp;
    const float *ktr = c->kt + tile * d * SPARSE_BK;
    const int j0 = kt * SPARSE_BK;
    for (int e = 0; e < d; e++) {
        w->pa[e] = ktr + (size_t)e * SPARSE_BK;
        w->pa2[e] = vtr + (size_t)e * SPARSE_BK;
    }
    sp_bf16_row_pairs(c->bf16_vec, d, nk, w->pa, c->ktb + ko, 2 * SPARSE_BK);
    sp_bf16_row_pairs(c->bf16_vec, d, nk, w->pa2, c->vtbt + ko, 2 * SPARSE_BK);
    for (int jj = 0; jj < nk; jj++) {
        w->pa[jj] = c->kh + (hb + j0 + jj) * d;
        w->pa2[jj] = c->vh + (hb + j0 + jj) * d;
    }
    sp_bf16_row_pairs(c->bf16_vec, nk, d, w->pa2, c->vtb + vo, 2 * dp);
    sp_bf16_row_pairs(c->bf16_vec, nk, d, w->pa, c->ktbk + vo, 2 * dp);
}

/* Tasks: (b, KV head g, key tile). K, V rows (+ bias, RoPE on K) from the projection buffer into
 * head-contiguous kh / vh [B, h_kv, N, d] and the transposed key tile kt. */
static void kv_tile_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int hkv = cfg->n_kv_heads, d = cfg->head_dim, kvd = hkv * d, N = x->N, nkt = sp_nkt(N);
    const bool rope = cfg->rope_theta > 0, qnorm = cfg->router == MOH_ROUTER_QUERY_NORM;
    const sp_kvcols kc = kv_cols(cfg);
    const float *src = qnorm ? c->qkv : c->kv;
    const float *bias = !qnorm && x->prm->b_qkv ? x->prm->b_qkv + cfg->n_heads * d : NULL;
    for (int task = t0; task < t1; task++) {
        const int b = task / (hkv * nkt), g = (task / nkt) % hkv, kt = task % nkt;
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const size_t hb = ((size_t)b * hkv + g) * N;
        float *ktile = c->kt + (((size_t)b * hkv + g) * nkt + kt) * d * SPARSE_BK;
        for (int jj = 0; jj < nk; jj++) {
            const int j = j0 + jj;
            const float *row = src + ((size_t)b * N + j) * kc.ld;
            float *kr = c->kh + (hb + j) * d, *vr = c->vh + (hb + j) * d;
            const float *ks = row + kc.koff + g * d, *vs = row + kc.voff + g * d;
            if (bias) {
                const float *kb = bias + g * d, *vb = bias + kvd + g * d;
#pragma omp simd
                for (int e = 0; e < d; e++) {
                    kr[e] = ks[e] + kb[e];
                    vr[e] = vs[e] + vb[e];
                }
            } else {
                memcpy(kr, ks, sizeof(float) * (size_t)d);
                memcpy(vr, vs, sizeof(float) * (size_t)d);
            }
            if (rope) rope_row(kr, c, j, d, 1);
            for (int e = 0; e < d; e++) ktile[(size_t)e * SPARSE_BK + jj] = kr[e];
            if (c->bf16_tiles)
                for (int e = 0; e < d; e++) w->dkt[(size_t)e * SPARSE_BK + jj] = vr[e];
        }
        if (c->bf16_tiles) kv_tile_bf16(c, cfg, w->dkt, b, g, kt, nk, N, w); /* V^T in w->dkt */
    }
}

/* Tasks: query tiles. q rows of the tile's pairs: gathered x rows times W_q^i (c->wpack1,
 * pack_cd_task), + bias (query_norm: copied from the dense qkv), then RoPE at their positions. */
static void fwd_q_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, qd = attn_qkv_dim(cfg);
    const int C2 = (C + 1) / 2;
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM, rope = cfg->rope_theta > 0;
    const float *bq = x->prm->b_qkv;
    for (int ti = t0; ti < t1; ti++) {
        const sp_qtile q = qtile(c, h, ti);
        for (int r = 0; r < q.nr; r++) {
            const size_t t = (size_t)q.b * x->N + c->pair_pos[q.p0 + r];
            float *qr = c->q + (size_t)(q.p0 + r) * d;
            w->pc[r] = qr;
            if (qnorm) memcpy(qr, c->qkv + t * qd + (size_t)q.i * d, sizeof(float) * d);
            else w->pa[r] = x->x + t * C;
            w->pa16[r] = c->tok16 ? sp_x16(c) + t * 2 * C2 : NULL;
        }
        if (!qnorm && c->bf16_tiles) { /* gathered x rows in bf16 times W_q^i in bf16 */
            sp_mm_bf16_rows(sp_isa(c), q.nr, d, C2, w->pa16, c->wqb + (size_t)q.i * C2 * 2 * d, 2 * d, w->pc, false);
        } else if (!qnorm) {
            for (int k = 0; k < C; k++) w->pb[k] = c->wpack1 + ((size_t)q.i * C + k) * d;
            sp_mm(c->vec, 0, q.nr, d, C, w->pa, 0, w->pb, 0, w->pc, 0, false);
        }
        for (int r = 0; r < q.nr; r++) {
            float *qr = w->pc[r];
            if (!qnorm && bq)
                for (int e = 0; e < d; e++) qr[e] += bq[q.i * d + e];
            if (rope) rope_row(qr, c, c->pair_pos[q.p0 + r], d, 1);
        }
    }
}

/* Rows rg .. rg + R of a query tile against key tile `tile` (nk keys) in bf16: S = q K^T
 * (vdpbf16ps, fp32 sums), the fp32 online softmax, then oacc += bf16(P) V. */
static void attn_fwd_rows_bf16(sparse_cache *c, sp_tws *w, size_t tile, int rg, int R, int nk, int d, int dp,
                               float cl2) {
    const int d2 = (d + 1) / 2, nk2 = (nk + 1) / 2;
    const uint16_t *kb = c->ktb + tile * (size_t)d2 * SPARSE_BK * 2, *vb = c->vtb + tile * (size_t)SPARSE_BK * dp;
    sp_mm_bf16(sp_isa(c), R, nk, d2, w->qb + (size_t)rg * 2 * d2, 2 * d2, kb, 2 * SPARSE_BK, w->sc, false);
    sp_fwd_softmax(c->vec, R, nk, w->sc, w->nv, cl2, w->m + rg, w->l + 16 * rg, w->pc + rg, d);
    for (int r = 0; r < R; r++) {
        uint16_t *pr = w->pbf + (size_t)r * SPARSE_BK;
        bf16_from_f32(pr, w->sc[r], (size_t)nk);
        if (nk & 1) pr[nk] = 0;
    }
    sp_mm_bf16(sp_isa(c), R, d, nk2, w->pbf, SPARSE_BK, vb, 2 * dp, w->pc + rg, true);
}

/* AMX: the same for rows rs .. nr of the tile at once (w->nv of every row set; none fully masked),
 * so that each product covers whole 16-row tiles: S for all rows, the softmax in groups of SP_MR,
 * P of all rows in bf16 (w->bw), then one P V product. */
static void attn_fwd_block_bf16(sparse_cache *c, sp_tws *w, size_t tile, int rs, int nr, int nk, int d, int dp,
                                float cl2) {
    const int d2 = (d + 1) / 2, nk2 = (nk + 1) / 2, R = nr - rs;
    const uint16_t *kb = c->ktb + tile * (size_t)d2 * SPARSE_BK * 2, *vb = c->vtb + tile * (size_t)SPARSE_BK * dp;
    sp_mm_bf16(sp_isa(c), R, nk, d2, w->qb + (size_t)rs * 2 * d2, 2 * d2, kb, 2 * SPARSE_BK, w->sc + rs, false);
    for (int g = rs; g < nr; g += SP_MR)
        sp_fwd_softmax(c->vec, imin(SP_MR, nr - g), nk, w->sc + g, w->nv + g, cl2, w->m + g, w->l + 16 * g,
                       w->pc + g, d);
    uint16_t *pb = w->bw;
    for (int r = rs; r < nr; r++) {
        uint16_t *pr = pb + (size_t)(r - rs) * SPARSE_BK;
        bf16_from_f32(pr, w->sc[r], (size_t)nk);
        if (nk & 1) pr[nk] = 0;
    }
    sp_mm_bf16(sp_isa(c), R, d, nk2, pb, SPARSE_BK, vb, 2 * dp, w->pc + rs, true);
}

/* One query tile: flash-attention forward over the key tiles; writes o, og = gate o, smax, lse. */
static void attn_fwd_tile(const moh_attn_config *cfg, sparse_cache *c, sp_qtile qt, int N, sp_tws *w) {
    const int h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, grp = h / hkv;
    const int b = qt.b, i = qt.i, g = i / grp, nkt = sp_nkt(N);
    const int nr = qt.nr, p0 = qt.p0, dp = sp_dpad(cfg);
    const int *pos = c->pair_pos + p0;
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const size_t hb = (size_t)b * hkv + g;
    const int vec = c->vec;
    const bool b16 = c->bf16_tiles;
    const int d2 = (d + 1) / 2;
    for (int r = 0; r < nr; r++) {
        w->pa[r] = c->q + (size_t)(p0 + r) * d;
        if (b16) {
            uint16_t *qb = w->qb + (size_t)r * 2 * d2;
            bf16_from_f32(qb, w->pa[r], (size_t)d);
            if (d & 1) qb[d] = 0;
        }
        w->pc[r] = w->oacc + (size_t)r * dp;
        memset(w->pc[r], 0, sizeof(float) * (size_t)d);
        w->m[r] = -INFINITY;
        memset(w->l + 16 * r, 0, 16 * sizeof(float));
    }
    const int nkeys = cfg->causal ? pos[nr - 1] + 1 : N;
    const int ntile = (nkeys + SPARSE_BK - 1) / SPARSE_BK;
    for (int kt = 0; kt < ntile; kt++) {
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const float *ktile = c->kt + (hb * nkt + kt) * d * SPARSE_BK;
        for (int e = 0; e < d; e++) w->pb[e] = ktile + (size_t)e * SPARSE_BK;
        for (int j = 0; j < nk; j++) w->pb2[j] = c->vh + (hb * N + j0 + j) * d;
        if (b16 && (sp_isa(c) == SP_TILES_AMX || sp_isa(c) == SP_TILES_AMX_EMU)) {
            int rs = 0; /* groups of rows before every key of the tile (a prefix: pos ascends) */
            while (rs < nr && cfg->causal && pos[imin(rs + SP_MR, nr) - 1] < j0) rs += SP_MR;
            if (rs >= nr) continue;
            for (int r = rs; r < nr; r++) w->nv[r] = cfg->causal ? imin(nk, pos[r] - j0 + 1) : nk;
            attn_fwd_block_bf16(c, w, hb * nkt + kt, rs, nr, nk, d, dp, cl2);
            continue;
        }
        for (int rg = 0; rg < nr; rg += SP_MR) {
            const int R = imin(SP_MR, nr - rg);
            if (cfg->causal && pos[rg + R - 1] < j0) continue;
            for (int r = 0; r < R; r++) w->nv[r] = cfg->causal ? imin(nk, pos[rg + r] - j0 + 1) : nk;
            if (b16) {
                attn_fwd_rows_bf16(c, w, hb * nkt + kt, rg, R, nk, d, dp, cl2);
                continue;
            }
            sp_mm(vec, 0, R, nk, d, w->pa + rg, 0, w->pb, 0, w->sc, 0, false);
            sp_fwd_softmax(vec, R, nk, w->sc, w->nv, cl2, w->m + rg, w->l + 16 * rg, w->pc + rg, d);
            sp_mm(vec, 0, R, d, nk, w->sa, 0, w->pb2, 0, w->pc + rg, 0, true);
        }
    }
    for (int r = 0; r < nr; r++) {
        float lsum = 0.0f; /* the 16 partial sums, pairwise in a fixed order */
        float part[16];
        memcpy(part, w->l + 16 * r, sizeof part);
        for (int width = 8; width >= 1; width /= 2)
            for (int q = 0; q < width; q++) part[q] += part[q + width];
        lsum = part[0];
        const float inv = 1.0f / lsum;
        const float gate = c->rc.gates[((size_t)b * N + pos[r]) * h + i];
        float *orow = c->o + (size_t)(p0 + r) * d, *og = c->og + (size_t)(p0 + r) * d;
        const float *acc = w->pc[r];
        for (int e = 0; e < d; e++) {
            orow[e] = acc[e] * inv;
            og[e] = gate * orow[e];
        }
        c->smax[p0 + r] = w->m[r];
        c->lse[p0 + r] = log2f(lsum);
    }
}

/* Tasks: query tiles (attn_fwd_tile). */
static void fwd_attn_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    for (int ti = t0; ti < t1; ti++) attn_fwd_tile(x->cfg, x->c, qtile(x->c, x->cfg->n_heads, ti), x->N, w);
}

void sparse_forward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm, const float *x,
                        int B, int N, float *y, sparse_cache *c) {
    const int h = cfg->n_heads, nkt = sp_nkt(N);
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM;
    c->x = x;
    c->B = B;
    c->N = N;
    c->rc.x = x;
    c->rc.B = B;
    c->rc.N = N;
    const sp_ctx cx = {.cfg = cfg, .prm = prm, .c = c, .x = x, .B = B, .N = N};
    /* 1. router, pair lists and query tiles */
    if (sp_router_split(cfg, c)) {
        sp_run(c, cfg, SPARSE_PH_ROUTER, router_pack_step, &cx, 1, SP_SERIAL);
        sp_run(c, cfg, SPARSE_PH_ROUTER, router_fwd_task, &cx, (B * N + SP_TC - 1) / SP_TC, SP_STATIC);
        sp_run(c, cfg, SPARSE_PH_ROUTER, router_lb_pairs_step, &cx, 1, SP_SERIAL);
    } else {
        sp_run(c, cfg, SPARSE_PH_ROUTER, fwd_router_step, &cx, 1, SP_SERIAL);
    }
    /* 2. K, V of every token and KV head (dense GEMM), RoPE on K, key tiles */
    if (!qnorm) sp_run(c, cfg, SPARSE_PH_KV, fwd_kv_gemm_step, &cx, 1, SP_SERIAL);
    sp_run(c, cfg, SPARSE_PH_KV, kv_tile_task, &cx, B * cfg->n_kv_heads * nkt, SP_STATIC);
    /* 3. Q of the selected pairs */
    if (!qnorm && c->bf16_tiles) {
        const sp_pack16 pq = {cfg, wq_view(cfg, prm), c->wqb, false};
        const sp_tok16 xt = {sp_x16(c), x, cfg->hidden_size};
        sp_run(c, cfg, SPARSE_PH_Q, pack_bf16_task, &pq, h, SP_STATIC);
        sp_run(c, cfg, SPARSE_PH_Q, tok16_task, &xt, B * N, SP_STATIC);
    } else if (!qnorm) {
        const sp_pack pq = {cfg, wq_view(cfg, prm), c->wpack1};
        sp_run(c, cfg, SPARSE_PH_Q, pack_cd_task, &pq, h, SP_STATIC);
    }
    sp_run(c, cfg, SPARSE_PH_Q, fwd_q_task, &cx, c->ntasks, SP_DYNAMIC);
    /* 4. attention of the selected pairs (flash tiles), o, og = gate * o, lse */
    sp_run(c, cfg, SPARSE_PH_ATTN, fwd_attn_task, &cx, c->ntasks, SP_DYNAMIC);
    /* 5. y = b_o + sum_i og_i W_O^i, heads in order */
    if (c->bf16_tiles) {
        const sp_pack16 po = {cfg, wo_view(cfg, prm), c->wob, true};
        sp_run(c, cfg, SPARSE_PH_WO, pack_bf16_task, &po, h, SP_STATIC);
    } else {
        const sp_pack po = {cfg, wo_view(cfg, prm), c->wpack2};
        sp_run(c, cfg, SPARSE_PH_WO, pack_blk_task, &po, h, SP_STATIC);
    }
    const sp_scatter sy = {&cx, c->og, y, true, prm->b_o, c->bf16_tiles ? c->wob : NULL};
    sp_run(c, cfg, SPARSE_PH_WO, scatter_task, &sy, scatter_tasks(&cx), SP_DYNAMIC);
}

/* ------------------------------------------------------------------------------------------------
 * Backward
 * ---------------------------------------------------------------------------------------------- */

/* First key tile of part p out of np (part p covers [bound(p), bound(p + 1))). Bidirectional:
 * equal tile counts; causal: balanced by the queries at or after each tile (~ N - j0). */
static int part_bound(const moh_attn_config *cfg, int N, int p, int np) {
    const int nkt = sp_nkt(N);
    if (p <= 0) return 0;
    if (p >= np) return nkt;
    if (!cfg->causal) return (int)((long)nkt * p / np);
    double total = 0.0;
    for (int kt = 0; kt < nkt; kt++) total += N - kt * SPARSE_BK;
    const double target = total * p / np;
    double acc = 0.0;
    int kt = 0;
    while (kt < nkt && acc + 0.5 * (N - kt * SPARSE_BK) < target) acc += N - (kt++) * SPARSE_BK;
    return kt;
}

/* dK, dV of key tiles [kt0, kt1) of KV head g in batch row b, and the matching part of dQ of every
 * query head of the group (into dq, a [P, d] buffer of this part). */
/* One query block of the bf16 attention backward: key tile `tile` (nk keys), nr pairs from p0
 * (row rb of the cnt pairs of its (b, head) block starting at pair off). */
typedef struct sp_blk16 {
    size_t tile;
    int nr, nk, p0, rb, off, cnt;
} sp_blk16;

/* The block in bf16 (rows w->pc: dQ, nv set): S = Q K^T and dP = dO V^T, P and dS in fp32
 * (sp_bwd_ds), then dV^T += dO^T P, dK^T += Q^T dS (into the rows e of dvt / dkt [d, BK]) and
 * dQ += dS K, every product on bf16 operands with fp32 accumulation. */
static void attn_bwd_rows_bf16(sparse_cache *c, sp_tws *w, const sp_blk16 *k, int d, int dp, float cl2,
                               float scale, float *const *dkt, float *const *dvt) {
    const int d2 = (d + 1) / 2, nr = k->nr, nk = k->nk, p0 = k->p0;
    const size_t ko = k->tile * (size_t)d2 * SPARSE_BK * 2, vo = k->tile * (size_t)SPARSE_BK * dp;
    uint16_t *pil = w->bw, *dsil = pil + (size_t)SPARSE_BQ * SPARSE_BK, *dsb = dsil + (size_t)SPARSE_BQ * SPARSE_BK;
    sp_mm_bf16(sp_isa(c), nr, nk, d2, c->qb16 + (size_t)p0 * 2 * d2, 2 * d2, c->ktb + ko, 2 * SPARSE_BK, w->sc, false);
    sp_mm_bf16(sp_isa(c), nr, nk, d2, c->dob16 + (size_t)p0 * 2 * d2, 2 * d2, c->vtbt + ko, 2 * SPARSE_BK, w->dsc, false);
    sp_bwd_ds(c->vec, nr, nk, w->sc, w->dsc, w->nv, cl2, scale, c->smax + p0, c->lse + p0, c->ddot + p0);
    sp_bf16_row_pairs(c->bf16_vec, nr, nk, w->sa, pil, 2 * SPARSE_BK);
    sp_bf16_row_pairs(c->bf16_vec, nr, nk, w->dsa, dsil, 2 * SPARSE_BK);
    for (int r = 0; r < nr; r++) {
        bf16_from_f32(dsb + (size_t)r * SPARSE_BK, w->dsc[r], (size_t)nk);
        if (nk & 1) dsb[(size_t)r * SPARSE_BK + nk] = 0;
    }
    /* row e of Q^T / dO^T from pair rb on; an odd nr reads one finite value past the block, times
     * the zero pad row of P / dS */
    const size_t tr = (size_t)k->off * d + (size_t)k->rb;
    sp_mm_bf16(sp_isa(c), d, nk, (nr + 1) / 2, c->dot16 + tr, k->cnt, pil, 2 * SPARSE_BK, dvt, true);
    sp_mm_bf16(sp_isa(c), d, nk, (nr + 1) / 2, c->qt16 + tr, k->cnt, dsil, 2 * SPARSE_BK, dkt, true);
    sp_mm_bf16(sp_isa(c), nr, d, (nk + 1) / 2, dsb, SPARSE_BK, c->ktbk + vo, 2 * dp, w->pc, true);
}

/* Tasks: (b, head). q and dL/do of the head's pairs in bf16: rows (qb16, dob16) and transposed
 * (qt16, dot16), for the bf16 attention backward. */
static void bwd16_rows_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    const int d = x->cfg->head_dim, d2 = (d + 1) / 2;
    for (int bi = t0; bi < t1; bi++) {
        const int off = c->pair_off[bi], cnt = c->pair_off[bi + 1] - off;
        for (int r = 0; r < cnt; r++) {
            const size_t p = (size_t)off + r;
            uint16_t *qr = c->qb16 + p * 2 * d2, *orow = c->dob16 + p * 2 * d2;
            bf16_from_f32(qr, c->q + p * d, (size_t)d);
            bf16_from_f32(orow, c->dout + p * d, (size_t)d);
            if (d & 1) qr[d] = orow[d] = 0;
        }
        sp_bf16_transpose(c->bf16_vec, cnt, d, c->q + (size_t)off * d, d, c->qt16 + (size_t)off * d, cnt);
        sp_bf16_transpose(c->bf16_vec, cnt, d, c->dout + (size_t)off * d, d, c->dot16 + (size_t)off * d, cnt);
    }
}

/* Tasks: (b, head). og and dQ (not for query_norm) of the head's pairs in bf16, transposed per
 * (b, head) as qt16 (ogt16, dqt16): the A operands of dW_O and dW_q. */
static void bwd16_t_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    const size_t d = (size_t)x->cfg->head_dim;
    for (int bi = t0; bi < t1; bi++) {
        const int off = c->pair_off[bi], cnt = c->pair_off[bi + 1] - off;
        sp_bf16_transpose(c->bf16_vec, cnt, (int)d, c->og + off * d, (long)d, c->ogt16 + off * d, cnt);
        if (x->cfg->router != MOH_ROUTER_QUERY_NORM) /* query_norm: dW_q in the dense backward */
            sp_bf16_transpose(c->bf16_vec, cnt, (int)d, c->dq + off * d, (long)d, c->dqt16 + off * d, cnt);
    }
}

/* Tasks: (head i, block of SP_NR columns of C), bf16. G^i [d, C]: G^i(e, c) = sum over the head's
 * pairs p (token t) of A_p(e) X_t(c), with A the per-pair rows transposed in bf16 (at: dqt16 or
 * ogt16) and X the bf16 token rows (sp_x16, sp_dy16) paired per chunk of SP_KC pairs; fp32
 * accumulation in pair order. wo: dW_O^i [C, d] += G^T (dy, og); else dW_q^i += G (x, dQ). */
typedef struct sp_dw16 {
    const sp_ctx *x;
    const uint16_t *at;
    const uint16_t *rows; /* [T, 2 ceil(C/2)] token rows in bf16 */
    bool wo;
} sp_dw16;
static void bwd_dw16_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_dw16 *a = arg;
    const sp_ctx *x = a->x;
    const moh_attn_config *cfg = x->cfg;
    const sparse_cache *c = x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, hd = h * d, N = x->N, ncb = sp_ncb(cfg);
    const size_t C2 = 2 * (size_t)((C + 1) / 2);
    float *tmp = w->s; /* wo: G^i block [d, SP_NR] (d <= SPARSE_BK) */
    for (int task = t0; task < t1; task++) {
        const int i = task / ncb, c0 = (task % ncb) * SP_NR, nc = imin(SP_NR, C - c0);
        for (int e = 0; e < d; e++)
            w->pc[e] = a->wo ? tmp + (size_t)e * SP_NR : x->g->w_qkv + ((size_t)i * d + e) * C + c0;
        if (a->wo) memset(tmp, 0, sizeof(float) * (size_t)d * SP_NR);
        for (int b = 0; b < x->B; b++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            for (int k0 = 0; k0 < cnt; k0 += SP_KC) { /* an odd last chunk: its A pad value (finite)
                                                         meets the zero pad row of X */
                const int kk = imin(SP_KC, cnt - k0);
                for (int k = 0; k < kk; k++) w->pa16[k] = a->rows + ((size_t)b * N + c->pair_pos[off + k0 + k]) * C2 + c0;
                sp_bf16_row_pairs16(c->bf16_vec, kk, nc, w->pa16, w->bw, 2 * SP_NR);
                sp_mm_bf16(sp_isa(c), d, nc, (kk + 1) / 2, a->at + (size_t)off * d + k0, cnt, w->bw, 2 * SP_NR, w->pc, true);
            }
        }
        if (a->wo)
            for (int r = 0; r < nc; r++) {
                float *gr = x->g->w_o + (size_t)(c0 + r) * hd + (size_t)i * d;
                for (int e = 0; e < d; e++) gr[e] += tmp[(size_t)e * SP_NR + r];
            }
    }
}

static void attn_bwd_part(const moh_attn_config *cfg, sparse_cache *c, int b, int g, int kt0,
                          int kt1, float *dq, int N, sp_tws *w) {
    const int h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, grp = h / hkv;
    const int nkt = sp_nkt(N), dp = sp_dpad(cfg);
    const float scale = (float)(1.0 / sqrt((double)d));
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const size_t hb = (size_t)b * hkv + g;
    const int vec = c->vec;
    const bool b16 = sp_bwd16(cfg, c);
    float *dkrow[SPARSE_BK], *dvrow[SPARSE_BK];
    for (int j = 0; j < SPARSE_BK; j++) { /* bf16: rows e of dK^T, dV^T [d, BK] instead */
        dkrow[j] = w->dkt + (size_t)j * (b16 ? SPARSE_BK : dp);
        dvrow[j] = w->dvt + (size_t)j * (b16 ? SPARSE_BK : dp);
    }
    for (int kt = kt0; kt < kt1; kt++) {
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const float *ktile = c->kt + (hb * nkt + kt) * d * SPARSE_BK;
        const float *vtile = c->vt + (hb * nkt + kt) * d * SPARSE_BK;
        for (int e = 0; e < d; e++) {
            w->pb[e] = ktile + (size_t)e * SPARSE_BK;
            w->pb2[e] = vtile + (size_t)e * SPARSE_BK;
        }
        if (b16) {
            memset(w->dkt, 0, sizeof(float) * (size_t)d * SPARSE_BK);
            memset(w->dvt, 0, sizeof(float) * (size_t)d * SPARSE_BK);
        }
        for (int j = 0; j < nk; j++) {
            w->pb3[j] = c->kh + (hb * N + j0 + j) * d;
            if (b16) continue;
            memset(dkrow[j], 0, sizeof(float) * (size_t)d);
            memset(dvrow[j], 0, sizeof(float) * (size_t)d);
        }
        for (int i = g * grp; i < (g + 1) * grp; i++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            const int *pos = c->pair_pos + off;
            const int first = cfg->causal ? lower_bound(pos, cnt, j0) : 0;
            for (int rb = first; rb < cnt; rb += SPARSE_BQ) {
                const int nr = imin(SPARSE_BQ, cnt - rb), p0 = off + rb;
                for (int r = 0; r < nr; r++) {
                    w->pa[r] = c->q + (size_t)(p0 + r) * d;
                    w->pa2[r] = c->dout + (size_t)(p0 + r) * d;
                    w->pc[r] = dq + (size_t)(p0 + r) * d;
                    w->nv[r] = cfg->causal ? imin(nk, pos[rb + r] - j0 + 1) : nk;
                }
                if (b16) {
                    const sp_blk16 bk = {hb * nkt + kt, nr, nk, p0, rb, off, cnt};
                    attn_bwd_rows_bf16(c, w, &bk, d, dp, cl2, scale, dkrow, dvrow);
                    continue;
                }
                /* S = Q K^T, dP = dO V^T, then P and dS in place */
                sp_mm(vec, 0, nr, nk, d, w->pa, 0, w->pb, 0, w->sc, 0, false);
                sp_mm(vec, 0, nr, nk, d, w->pa2, 0, w->pb2, 0, w->dsc, 0, false);
                sp_bwd_ds(vec, nr, nk, w->sc, w->dsc, w->nv, cl2, scale, c->smax + p0, c->lse + p0, c->ddot + p0);
                /* dV += P^T dO, dK += dS^T Q (A transposed: one pointer per query row) */
                sp_mm(vec, 1, nk, d, nr, w->sa, 0, w->pa2, 0, dvrow, 0, true);
                sp_mm(vec, 1, nk, d, nr, w->dsa, 0, w->pa, 0, dkrow, 0, true);
                /* dQ += dS K */
                sp_mm(vec, 0, nr, d, nk, w->dsa, 0, w->pb3, 0, w->pc, 0, true);
            }
        }
        for (int j = 0; j < nk; j++) {
            float *dk = c->dkh + (hb * N + j0 + j) * d, *dv = c->dvh + (hb * N + j0 + j) * d;
            if (b16) { /* from the transposed accumulators */
                for (int e = 0; e < d; e++) {
                    dk[e] = dkrow[e][j];
                    dv[e] = dvrow[e][j];
                }
                continue;
            }
            memcpy(dk, dkrow[j], sizeof(float) * (size_t)d);
            memcpy(dv, dvrow[j], sizeof(float) * (size_t)d);
        }
    }
}

/* Serial: db_o = column sums of dy; dgates zeroed (pairs not selected keep 0). */
static void bwd_bo_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const int T = x->B * x->N, C = x->cfg->hidden_size;
    if (x->g->b_o) linear_backward_f32(NULL, NULL, x->g->b_o, x->dy, NULL, NULL, T, 0, C);
    memset(x->c->dgates, 0, sizeof(float) * (size_t)T * x->cfg->n_heads);
}

/* Tasks: query tiles. Per pair: d og = dy W_O^i (c->wpack1, pack_cd_task; bf16: c->wob2);
 * dgate = <d og, o>;
 * dO = gate d og (into dout); D = <dO, o> (into ddot). */
static void bwd_dout_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, N = x->N;
    for (int ti = t0; ti < t1; ti++) {
        const sp_qtile q = qtile(c, h, ti);
        for (int r = 0; r < q.nr; r++) {
            w->pa[r] = x->dy + ((size_t)q.b * N + c->pair_pos[q.p0 + r]) * C;
            w->pc[r] = c->dout + (size_t)(q.p0 + r) * d;
        }
        if (sp_bwd16(cfg, c)) {
            const int C2 = (C + 1) / 2;
            const uint16_t *dy16 = sp_dy16(c, cfg);
            for (int r = 0; r < q.nr; r++) w->pa16[r] = dy16 + ((size_t)q.b * N + c->pair_pos[q.p0 + r]) * 2 * C2;
            sp_mm_bf16_rows(sp_isa(c), q.nr, d, C2, w->pa16, c->wob2 + (size_t)q.i * C2 * 2 * d, 2 * d, w->pc, false);
        } else {
            for (int k = 0; k < C; k++) w->pb[k] = c->wpack1 + ((size_t)q.i * C + k) * d;
            sp_mm(c->vec, 0, q.nr, d, C, w->pa, 0, w->pb, 0, w->pc, 0, false);
        }
        for (int r = 0; r < q.nr; r++) {
            const size_t t = (size_t)q.b * N + c->pair_pos[q.p0 + r];
            const float gate = c->rc.gates[t * h + q.i];
            float *dor = w->pc[r];
            const float *orow = c->o + (size_t)(q.p0 + r) * d;
            float dg = 0.0f, dd = 0.0f;
            for (int e = 0; e < d; e++) { /* D with the kernels' fused multiply-adds in e order: */
                dg += dor[e] * orow[e];      /* when o equals a value row exactly (one key), */
                dor[e] *= gate;              /* dP - D is exactly 0, as in exact arithmetic */
                dd = fmaf(dor[e], orow[e], dd);
            }
            c->dgates[t * h + q.i] = dg;
            c->ddot[q.p0 + r] = dd;
        }
    }
}

/* Tasks: (head i, block of SP_CB rows of C). dW_O^i [C, d] += sum over the head's pairs of
 * dy_t^T og_p, in pair order, chunks of SP_KC. */
static void bwd_dwo_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    const sparse_cache *c = x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, hd = h * d, N = x->N;
    const int ncr = (C + SP_CB - 1) / SP_CB;
    for (int task = t0; task < t1; task++) {
        const int i = task / ncr, c0 = (task % ncr) * SP_CB, nc = imin(SP_CB, C - c0);
        for (int r = 0; r < nc; r++) w->pc[r] = x->g->w_o + (size_t)(c0 + r) * hd + (size_t)i * d;
        for (int b = 0; b < x->B; b++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            for (int k0 = 0; k0 < cnt; k0 += SP_KC) {
                const int kk = imin(SP_KC, cnt - k0);
                for (int k = 0; k < kk; k++) {
                    w->pa[k] = x->dy + ((size_t)b * N + c->pair_pos[off + k0 + k]) * C;
                    w->pb[k] = c->og + (size_t)(off + k0 + k) * d;
                }
                sp_mm(c->vec, 1, nc, d, kk, w->pa, c0, w->pb, 0, w->pc, 0, true);
            }
        }
    }
}

/* Tasks: (b, KV head, key tile). Transposed value tile vt from vh. */
static void vt_tile_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    const int hkv = x->cfg->n_kv_heads, d = x->cfg->head_dim, N = x->N, nkt = sp_nkt(N);
    for (int task = t0; task < t1; task++) {
        const int b = task / (hkv * nkt), gg = (task / nkt) % hkv, kt = task % nkt;
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const size_t hb = (size_t)b * hkv + gg;
        float *vtile = c->vt + (hb * nkt + kt) * d * SPARSE_BK;
        for (int jj = 0; jj < nk; jj++)
            for (int e = 0; e < d; e++) vtile[(size_t)e * SPARSE_BK + jj] = c->vh[(hb * N + j0 + jj) * d + e];
    }
}

/* Serial: zero the np dQ parts [np, P, d] (and query_norm's dense dqkv). */
static void bwd_zero_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    const size_t P = (size_t)c->pair_off[x->B * x->cfg->n_heads];
    memset(c->dq, 0, sizeof(float) * (size_t)x->np * P * x->cfg->head_dim);
    if (x->cfg->router == MOH_ROUTER_QUERY_NORM)
        memset(c->dqkv, 0, sizeof(float) * (size_t)x->B * x->N * attn_qkv_dim(x->cfg));
}

/* Tasks: (key part, b, KV head), part-major (with causal parts balanced, every part costs about
 * the same). attn_bwd_part into dQ part `part`. */
static void bwd_attn_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int hkv = cfg->n_kv_heads, B = x->B, N = x->N, np = x->np;
    const size_t P = (size_t)c->pair_off[B * cfg->n_heads];
    for (int task = t0; task < t1; task++) {
        const int part = task / (B * hkv), bg = task % (B * hkv);
        const int kt0 = part_bound(cfg, N, part, np), kt1 = part_bound(cfg, N, part + 1, np);
        attn_bwd_part(cfg, c, bg / hkv, bg % hkv, kt0, kt1, c->dq + (size_t)part * P * cfg->head_dim, N, w);
    }
}

/* Tasks: pairs. dQ = sum of the parts (in part order), then the inverse RoPE. */
static void dq_reduce_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const sparse_cache *c = x->c;
    const int d = x->cfg->head_dim, P = c->pair_off[x->B * x->cfg->n_heads];
    const bool rope = x->cfg->rope_theta > 0;
    for (int p = t0; p < t1; p++) {
        float *dr = c->dq + (size_t)p * d;
        for (int part = 1; part < x->np; part++) {
            const float *src = c->dq + ((size_t)part * P + p) * d;
            for (int e = 0; e < d; e++) dr[e] += src[e];
        }
        if (rope) rope_row(dr, c, c->pair_pos[p], d, -1);
    }
}

/* Tasks: tokens. dK (inverse RoPE) and dV rows from dkh / dvh into the projection-gradient buffer
 * (dqkv or kv, columns as kv_cols). */
static void dkv_rows_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    const sparse_cache *c = x->c;
    const int hkv = cfg->n_kv_heads, d = cfg->head_dim, N = x->N;
    const bool rope = cfg->rope_theta > 0;
    const sp_kvcols kc = kv_cols(cfg);
    float *dkv = cfg->router == MOH_ROUTER_QUERY_NORM ? c->dqkv : c->kv;
    for (int t = t0; t < t1; t++) {
        const int b = t / N, n = t % N;
        for (int gg = 0; gg < hkv; gg++) {
            const size_t src = (((size_t)b * hkv + gg) * N + n) * d;
            float *kr = dkv + (size_t)t * kc.ld + kc.koff + (size_t)gg * d;
            float *vr = dkv + (size_t)t * kc.ld + kc.voff + (size_t)gg * d;
            memcpy(kr, c->dkh + src, sizeof(float) * d);
            memcpy(vr, c->dvh + src, sizeof(float) * d);
            if (rope) rope_row(kr, c, n, d, -1);
        }
    }
}

/* Tasks: (b, head) rows. query_norm: dQ rows into the q columns of the dense dqkv. */
static void dq_to_qkv_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const sparse_cache *c = x->c;
    const int h = x->cfg->n_heads, d = x->cfg->head_dim, qd = attn_qkv_dim(x->cfg);
    for (int bi = t0; bi < t1; bi++) {
        const int b = bi / h, i = bi % h;
        for (int p = c->pair_off[bi]; p < c->pair_off[bi + 1]; p++)
            memcpy(c->dqkv + ((size_t)b * x->N + c->pair_pos[p]) * qd + (size_t)i * d, c->dq + (size_t)p * d,
                   sizeof(float) * d);
    }
}

/* Serial: the router's backward (query_norm: adds its d q into dqkv). */
static void bwd_router_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    sparse_cache *c = x->c;
    float *dqkv = x->cfg->router == MOH_ROUTER_QUERY_NORM ? c->dqkv : NULL;
    router_backward_f32(x->cfg, x->prm, x->g, &c->rc, c->dgates, x->lb_scale, x->dx, dqkv, x->B * x->N);
}

/* Serial: the load-balance term of dL/dp per routed head (c->lbv [E]). */
static void router_lbv_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const int E = attn_routed_heads(x->cfg), T = x->B * x->N;
    for (int i = 0; i < E; i++) x->c->lbv[i] = x->lb_scale != 0 ? router_lb_dp_f32(&x->c->rc, x->lb_scale, T, E, i) : 0.0f;
}

/* Tasks: chunks of SP_TC tokens. The router's backward by rows as router_backward (dp, ds, da in
 * rc.scratch at its offsets), its three softmax backwards (dz of wg x, wg_0 x, wg_1 x, each by
 * rows in the thread's w->s) side by side into c->rdz [T, nz] (the logits' order), then
 * dx += dz W (fp32 register tiles, one pass over dx). */
static void router_bwd_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    sparse_cache *c = x->c;
    const int C = cfg->hidden_size, E = attn_routed_heads(cfg), hs = cfg->shared_heads, T = x->B * x->N;
    const int nz = sparse_router_nz(cfg), W = attn_router_width(cfg);
    const int width[3] = {E, hs >= 1 ? 2 : 0, hs >= 2 ? hs : 0};
    float *dp = c->rc.scratch, *ds = dp + (size_t)T * E + (size_t)T * W, *da = ds + (size_t)T * hs;
    const float *grad[3] = {dp, da, ds}, *prob[3] = {c->rc.p, c->rc.a, c->rc.s};
    for (int k = 0; k < nz; k++) w->pb[k] = sparse_router_row(cfg, x->prm, k);
    for (int task = t0; task < t1; task++) {
        const int r0 = task * SP_TC, nr = imin(SP_TC, T - r0);
        for (int t = r0; t < r0 + nr; t++) memcpy(dp + (size_t)t * E, c->lbv, sizeof(float) * E);
        router_learned_grad_rows_f32(cfg, &c->rc, c->dgates, dp, ds, da, r0, r0 + nr);
        for (int grp = 0, j0 = 0; grp < 3; j0 += width[grp], grp++) {
            const int wd = width[grp];
            if (!wd) continue;
            memset(w->s, 0, sizeof(float) * (size_t)nr * wd);
            softmax_backward_f32(w->s, grad[grp] + (size_t)r0 * wd, prob[grp] + (size_t)r0 * wd, nr, wd);
            for (int r = 0; r < nr; r++)
                memcpy(c->rdz + (size_t)(r0 + r) * nz + j0, w->s + (size_t)r * wd, sizeof(float) * wd);
        }
        if (!x->dx) continue;
        for (int r = 0; r < nr; r++) {
            w->pa[r] = c->rdz + (size_t)(r0 + r) * nz;
            w->pc[r] = x->dx + (size_t)(r0 + r) * C;
        }
        sp_mm(c->vec, 0, nr, C, nz, w->pa, 0, w->pb, 0, w->pc, 0, true);
    }
}

/* Tasks: blocks of SP_NR columns of C. d(wg | wg_0 | wg_1) += dz^T x, tokens in order, chunks of
 * SP_KC. */
static void router_dw_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    const sparse_cache *c = x->c;
    const int C = cfg->hidden_size, T = x->B * x->N, nz = sparse_router_nz(cfg);
    for (int task = t0; task < t1; task++) {
        const int c0 = task * SP_NR, nc = imin(SP_NR, C - c0);
        for (int j = 0; j < nz; j++) w->pc[j] = sparse_router_row(cfg, x->g, j) + c0;
        for (int k0 = 0; k0 < T; k0 += SP_KC) {
            const int kk = imin(SP_KC, T - k0);
            for (int k = 0; k < kk; k++) {
                w->pa[k] = c->rdz + (size_t)(k0 + k) * nz;
                w->pb[k] = x->x + (size_t)(k0 + k) * C + c0;
            }
            sp_mm(c->vec, 1, nz, nc, kk, w->pa, 0, w->pb, 0, w->pc, 0, true);
        }
    }
}

/* The router's backward: split over tokens (sp_router_split) or serial. */
static void sp_router_backward(sparse_cache *c, const moh_attn_config *cfg, const sp_ctx *cx) {
    if (!sp_router_split(cfg, c)) {
        sp_run(c, cfg, SPARSE_PH_B_ROUTER, bwd_router_step, cx, 1, SP_SERIAL);
        return;
    }
    const int T = cx->B * cx->N;
    sp_run(c, cfg, SPARSE_PH_B_ROUTER, router_lbv_step, cx, 1, SP_SERIAL);
    sp_run(c, cfg, SPARSE_PH_B_ROUTER, router_bwd_task, cx, (T + SP_TC - 1) / SP_TC, SP_STATIC);
    if (cx->g->w_r) sp_run(c, cfg, SPARSE_PH_B_ROUTER, router_dw_task, cx, sp_ncb(cfg), SP_DYNAMIC);
}

/* Serial: dense projection backward: query_norm: all of dqkv [T, qd]; else the K|V rows of kv. */
static void bwd_proj_step(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    const attn_params_f32 *g = x->g;
    const int C = cfg->hidden_size, hd = cfg->n_heads * cfg->head_dim, T = x->B * x->N;
    const int kvd = cfg->n_kv_heads * cfg->head_dim;
    bf16_ctx *b16 = x->c->bf16;
    if (cfg->router == MOH_ROUTER_QUERY_NORM) {
        if (b16) bf16_linear_backward(b16, x->dx, g->w_qkv, g->b_qkv, x->c->dqkv, x->x, x->prm->w_qkv, T, C, attn_qkv_dim(cfg));
        else linear_backward_f32(x->dx, g->w_qkv, g->b_qkv, x->c->dqkv, x->x, x->prm->w_qkv, T, C, attn_qkv_dim(cfg));
        return;
    }
    float *gw = g->w_qkv ? g->w_qkv + (size_t)hd * C : NULL, *gb = g->b_qkv ? g->b_qkv + hd : NULL;
    if (b16) bf16_linear_backward(b16, x->dx, gw, gb, x->c->kv, x->x, x->prm->w_qkv + (size_t)hd * C, T, C, 2 * kvd);
    else linear_backward_f32(x->dx, gw, gb, x->c->kv, x->x, x->prm->w_qkv + (size_t)hd * C, T, C, 2 * kvd);
}

/* Tasks: heads. db_q^i += sum of the head's dQ rows, in pair order. */
static void dbq_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const sparse_cache *c = x->c;
    const int h = x->cfg->n_heads, d = x->cfg->head_dim;
    float *gb = x->g->b_qkv;
    for (int i = t0; i < t1; i++)
        for (int b = 0; b < x->B; b++)
            for (int p = c->pair_off[b * h + i]; p < c->pair_off[b * h + i + 1]; p++)
                for (int e = 0; e < d; e++) gb[i * d + e] += c->dq[(size_t)p * d + e];
}

/* Tasks: (head i, block of SP_NR columns of C). dW_q^i [d, C] += sum over the head's pairs of
 * dQ_p^T x_t, in pair order, chunks of SP_KC. */
static void bwd_dwq_task(const void *arg, int t0, int t1, sp_tws *w) {
    const sp_ctx *x = arg;
    const moh_attn_config *cfg = x->cfg;
    const sparse_cache *c = x->c;
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim, ncb = sp_ncb(cfg), N = x->N;
    for (int task = t0; task < t1; task++) {
        const int i = task / ncb, c0 = (task % ncb) * SP_NR, nc = imin(SP_NR, C - c0);
        for (int r = 0; r < d; r++) w->pc[r] = x->g->w_qkv + ((size_t)i * d + r) * C + c0;
        for (int b = 0; b < x->B; b++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            for (int k0 = 0; k0 < cnt; k0 += SP_KC) {
                const int kk = imin(SP_KC, cnt - k0);
                for (int k = 0; k < kk; k++) {
                    w->pa[k] = c->dq + (size_t)(off + k0 + k) * d;
                    w->pb[k] = x->x + ((size_t)b * N + c->pair_pos[off + k0 + k]) * C + c0;
                }
                sp_mm(c->vec, 1, d, nc, kk, w->pa, 0, w->pb, 0, w->pc, 0, true);
            }
        }
    }
}

void sparse_backward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm,
                         const attn_params_f32 *g, sparse_cache *c, const float *dy,
                         float lb_scale, float *dx) {
    const int C = cfg->hidden_size, h = cfg->n_heads, hkv = cfg->n_kv_heads;
    const int B = c->B, N = c->N, P = c->pair_off[B * h];
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM;
    /* key parts of the attention backward: sp_nparts, unless dQ's np parts outgrow the buffer */
    const size_t capP = (size_t)c->maxB * c->maxN * sparse_active_heads(cfg);
    int np = sp_nparts(cfg, B, N);
    if ((size_t)np * P > (size_t)c->nparts * capP) np = (int)((size_t)c->nparts * capP / (P ? P : 1));
    np = imax(np, 1);
    const sp_ctx cx = {.cfg = cfg, .prm = prm, .g = g, .c = c, .x = c->x, .dy = dy, .dx = dx,
                       .lb_scale = lb_scale, .B = B, .N = N, .np = np};
    /* 1. b_o; d og = dy W_O^i, dgates, dO, D; dW_O (bf16: after step 2) */
    const bool b16 = sp_bwd16(cfg, c);
    sp_run(c, cfg, SPARSE_PH_B_WO, bwd_bo_step, &cx, 1, SP_SERIAL);
    if (b16) {
        const sp_pack16 po = {cfg, wo_view(cfg, prm), c->wob2, false};
        const sp_tok16 dyt = {sp_dy16(c, cfg), dy, C};
        sp_run(c, cfg, SPARSE_PH_B_WO, pack_bf16_task, &po, h, SP_STATIC);
        sp_run(c, cfg, SPARSE_PH_B_WO, tok16_task, &dyt, B * N, SP_STATIC);
    } else {
        const sp_pack po = {cfg, wo_view(cfg, prm), c->wpack1};
        sp_run(c, cfg, SPARSE_PH_B_WO, pack_cd_task, &po, h, SP_STATIC);
    }
    sp_run(c, cfg, SPARSE_PH_B_WO, bwd_dout_task, &cx, c->ntasks, SP_DYNAMIC);
    if (g->w_o && !b16) sp_run(c, cfg, SPARSE_PH_B_WO, bwd_dwo_task, &cx, h * ((C + SP_CB - 1) / SP_CB), SP_DYNAMIC);
    /* 2. V^T tiles, attention backward per (key part, b, KV head), dQ reduced, dK|dV rows */
    if (!b16) sp_run(c, cfg, SPARSE_PH_B_ATTN, vt_tile_task, &cx, B * hkv * sp_nkt(N), SP_STATIC);
    sp_run(c, cfg, SPARSE_PH_B_ATTN, bwd_zero_step, &cx, 1, SP_SERIAL);
    if (b16) sp_run(c, cfg, SPARSE_PH_B_ATTN, bwd16_rows_task, &cx, B * h, SP_STATIC);
    sp_run(c, cfg, SPARSE_PH_B_ATTN, bwd_attn_task, &cx, B * hkv * np, SP_DYNAMIC);
    sp_run(c, cfg, SPARSE_PH_B_ATTN, dq_reduce_task, &cx, P, SP_STATIC);
    sp_run(c, cfg, SPARSE_PH_B_ATTN, dkv_rows_task, &cx, B * N, SP_STATIC);
    if (b16) { /* og and dQ transposed in bf16; dW_O */
        sp_run(c, cfg, SPARSE_PH_B_WO, bwd16_t_task, &cx, B * h, SP_STATIC);
        const sp_dw16 wo = {&cx, c->ogt16, sp_dy16(c, cfg), true};
        if (g->w_o) sp_run(c, cfg, SPARSE_PH_B_WO, bwd_dw16_task, &wo, h * sp_ncb(cfg), SP_DYNAMIC);
    }
    /* 3. projections */
    if (qnorm) { /* dense q: dQ into the q columns, the router's d q added, one dense backward */
        sp_run(c, cfg, SPARSE_PH_B_ROUTER, dq_to_qkv_task, &cx, B * h, SP_STATIC);
        sp_run(c, cfg, SPARSE_PH_B_ROUTER, bwd_router_step, &cx, 1, SP_SERIAL);
        sp_run(c, cfg, SPARSE_PH_B_KV, bwd_proj_step, &cx, 1, SP_SERIAL);
        return;
    }
    sp_run(c, cfg, SPARSE_PH_B_KV, bwd_proj_step, &cx, 1, SP_SERIAL);
    if (g->b_qkv) sp_run(c, cfg, SPARSE_PH_B_Q, dbq_task, &cx, h, SP_STATIC);
    if (dx) { /* dx += dQ_i W_q^i, heads in order */
        if (b16) {
            const sp_pack16 pq = {cfg, wq_view(cfg, prm), c->wqb2, true};
            sp_run(c, cfg, SPARSE_PH_B_Q, pack_bf16_task, &pq, h, SP_STATIC);
        } else {
            const sp_pack pq = {cfg, wq_view(cfg, prm), c->wpack2};
            sp_run(c, cfg, SPARSE_PH_B_Q, pack_blk_task, &pq, h, SP_STATIC);
        }
        const sp_scatter sx = {&cx, c->dq, dx, false, NULL, b16 ? c->wqb2 : NULL};
        sp_run(c, cfg, SPARSE_PH_B_Q, scatter_task, &sx, scatter_tasks(&cx), SP_DYNAMIC);
    }
    if (b16 && g->w_qkv) {
        const sp_dw16 wq = {&cx, c->dqt16, sp_x16(c), false};
        sp_run(c, cfg, SPARSE_PH_B_Q, bwd_dw16_task, &wq, h * sp_ncb(cfg), SP_DYNAMIC);
    } else if (g->w_qkv) {
        sp_run(c, cfg, SPARSE_PH_B_Q, bwd_dwq_task, &cx, h * sp_ncb(cfg), SP_DYNAMIC);
    }
    sp_router_backward(c, cfg, &cx);
}

const char *sparse_phase_name(int i) {
    static const char *const names[SPARSE_NPHASE] = {"router", "kv_gemm", "q_gather_gemm", "attention",
                                                     "wo_scatter", "bwd_wo", "bwd_attention", "bwd_kv_gemm",
                                                     "bwd_q", "bwd_router"};
    return i >= 0 && i < SPARSE_NPHASE ? names[i] : "?";
}

long sparse_pairs(const moh_attn_config *cfg, const sparse_cache *c) {
    return c->pair_off ? c->pair_off[c->B * cfg->n_heads] : 0;
}

double sparse_key_visits(const moh_attn_config *cfg, const sparse_cache *c) {
    const int h = cfg->n_heads, P = c->pair_off[c->B * h];
    if (!cfg->causal) return (double)P * c->N;
    double v = 0.0;
    for (int p = 0; p < P; p++) v += c->pair_pos[p] + 1.0;
    return v;
}
