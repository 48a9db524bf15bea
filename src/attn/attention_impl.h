size_t F(attn_params_bind)(F(attn_params) *p, real *buf, const moh_attn_config *cfg) {
    const size_t C = (size_t)cfg->hidden_size, qd = (size_t)attn_qkv_dim(cfg);
    const size_t hd = (size_t)cfg->n_heads * cfg->head_dim, E = (size_t)attn_routed_heads(cfg);
    real **fields[] = {&p->w_qkv, &p->b_qkv, &p->w_o, &p->b_o, &p->w_r, &p->w_h, &p->w_s};
    const size_t sizes[] = {qd * C, cfg->qkv_bias ? qd : 0, C * hd, cfg->proj_bias ? C : 0,
                            attn_has_wg(cfg) ? E * C : 0, attn_has_wg0(cfg) ? 2 * C : 0,
                            attn_has_wg1(cfg) ? (size_t)cfg->shared_heads * C : 0};
    size_t n = 0;
    for (int i = 0; i < 7; i++) {
        *fields[i] = (buf && sizes[i]) ? buf + n : NULL;
        n += sizes[i];
    }
    return n;
}

/* Reference MoH attention template (instantiated by attention.c): every head computed, then
 * gated (spec §1 step 5). The definition the head-sparse path is tested against. With c->bf16
 * (float32) the qkv and W_O projections run as bf16 GEMMs; the per-head products stay fp32. */

int F(attn_cache_init)(F(attn_cache) *c, const moh_attn_config *cfg, int B, int N, moh_error *err) {
    memset(c, 0, sizeof *c);
    const size_t T = (size_t)B * N, h = (size_t)cfg->n_heads, hd = h * cfg->head_dim;
    const size_t qd = (size_t)attn_qkv_dim(cfg), E = (size_t)attn_routed_heads(cfg);
    const size_t hs = (size_t)cfg->shared_heads, W = (size_t)attn_router_width(cfg);
    const size_t NN = (size_t)N * N;
    if (N > 0 && (size_t)B * h > SIZE_MAX / 4 / sizeof(real) / NN)
        return moh_fail(err, MOH_E_NOMEM, "attention cache: B=%d N=%d heads=%zu is too large", B, N, h);
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM;
    real **fields[] = {&c->qkv, &c->q_pre, &c->att, &c->datt, &c->o, &c->og, &c->gates, &c->p,
                       &c->mask, &c->r, &c->denom, &c->s, &c->a, &c->qn, &c->qstd, &c->scratch,
                       &c->dog, &c->dqkv, &c->dgates};
    const size_t sizes[] = {T * qd, qnorm ? T * hd : 0, B * h * NN, B * h * NN, T * hd, T * hd,
                            T * h, T * E, T * E, T * E, T, T * hs, T * 2, T * E, T,
                            T * (E + W + hs + 2), T * hd, T * qd, T * h};
    const int nf = (int)(sizeof sizes / sizeof sizes[0]);
    size_t total = 0;
    for (int i = 0; i < nf; i++) total += sizes[i];
    c->block = malloc(total * sizeof(real) + T * sizeof(int) + 64);
    if (!c->block)
        return moh_fail(err, MOH_E_NOMEM, "attention cache: cannot allocate %zu MiB",
                        (total * sizeof(real)) >> 20);
    real *cur = c->block;
    for (int i = 0; i < nf; i++) {
        *fields[i] = sizes[i] ? cur : NULL;
        cur += sizes[i];
    }
    c->pos = (int *)cur;
    c->B = B;
    c->N = N;
    return MOH_OK;
}

void F(attn_cache_free)(F(attn_cache) *c) {
    free(c->block);
    memset(c, 0, sizeof *c);
}

void F(attn_forward)(const moh_attn_config *cfg, const F(attn_params) *prm, const real *x,
                     int B, int N, real *y, F(attn_cache) *c) {
    const int C = cfg->hidden_size, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int T = B * N, qd = attn_qkv_dim(cfg), hd = h * d, grp = h / hkv;
    const real scale = (real)(1.0 / sqrt((double)d));
    c->x = x;
    c->B = B; /* the cache may be larger than this batch: backward uses these */
    c->N = N;
    F(linear_forward_ctx)(c->bf16, c->qkv, x, prm->w_qkv, prm->b_qkv, T, C, qd);
    if (c->q_pre)
        for (int t = 0; t < T; t++) memcpy(c->q_pre + (long)t * hd, c->qkv + (long)t * qd, sizeof(real) * hd);
    F(router_forward)(cfg, prm, x, c->qkv, T, c);
    if (cfg->rope_theta > 0) {
        for (int t = 0; t < T; t++) c->pos[t] = t % N;
        F(rope_forward)(c->qkv, T, qd, h + hkv, c->pos, cfg);
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < h; i++) {
            const real *base = c->qkv + (long)b * N * qd;
            const real *Q = base + (long)i * d;
            const real *K = base + (long)hd + (long)(i / grp) * d;
            const real *V = base + (long)(h + hkv) * d + (long)(i / grp) * d;
            real *S = c->att + ((long)b * h + i) * N * N;
            F(gemm)(false, true, N, N, d, scale, Q, qd, K, qd, 0, S, N);
            if (cfg->causal)
                for (int n = 0; n < N; n++)
                    for (int m = n + 1; m < N; m++) S[(long)n * N + m] = -INFINITY;
            F(softmax_forward)(S, S, N, N);
            F(gemm)(false, false, N, d, N, 1, S, N, V, qd, 0, c->o + (long)b * N * hd + (long)i * d, hd);
        }
    }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h; i++) {
            const real gi = c->gates[(long)t * h + i];
            const real *o = c->o + (long)t * hd + (long)i * d;
            real *og = c->og + (long)t * hd + (long)i * d;
            for (int e = 0; e < d; e++) og[e] = gi * o[e];
        }
    F(linear_forward_ctx)(c->bf16, y, c->og, prm->w_o, prm->b_o, T, hd, C);
}

void F(attn_backward)(const moh_attn_config *cfg, const F(attn_params) *prm,
                      const F(attn_params) *g, const F(attn_cache) *c, const real *dy,
                      real lb_scale, real *dx) {
    const int C = cfg->hidden_size, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int B = c->B, N = c->N, T = B * N, qd = attn_qkv_dim(cfg), hd = h * d, grp = h / hkv;
    const real scale = (real)(1.0 / sqrt((double)d));
    real *dog = c->dog, *dqkv = c->dqkv, *dgates = c->dgates;
    memset(dog, 0, sizeof(real) * (size_t)T * hd);
    memset(dqkv, 0, sizeof(real) * (size_t)T * qd);
    F(linear_backward_ctx)(c->bf16, dog, g->w_o, g->b_o, dy, c->og, prm->w_o, T, hd, C);
    /* og = gate * o: dgate = <dog, o>, do = gate * dog (in place) */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h; i++) {
            const real *o = c->o + (long)t * hd + (long)i * d;
            real *dq = dog + (long)t * hd + (long)i * d;
            const real gi = c->gates[(long)t * h + i];
            real acc = 0;
            for (int e = 0; e < d; e++) {
                acc += dq[e] * o[e];
                dq[e] *= gi;
            }
            dgates[(long)t * h + i] = acc;
        }
    /* One task per (batch row, KV head): the query heads of a group share dK, dV. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int kv = 0; kv < hkv; kv++) {
            const real *base = c->qkv + (long)b * N * qd;
            real *dbase = dqkv + (long)b * N * qd;
            const real *K = base + (long)hd + (long)kv * d;
            const real *V = base + (long)(h + hkv) * d + (long)kv * d;
            real *dK = dbase + (long)hd + (long)kv * d;
            real *dV = dbase + (long)(h + hkv) * d + (long)kv * d;
            for (int i = kv * grp; i < (kv + 1) * grp; i++) {
                const real *A = c->att + ((long)b * h + i) * N * N;
                real *dA = c->datt + ((long)b * h + i) * N * N;
                const real *dO = dog + (long)b * N * hd + (long)i * d;
                F(gemm)(false, true, N, N, d, 1, dO, hd, V, qd, 0, dA, N);
                F(gemm)(true, false, N, d, N, 1, A, N, dO, hd, 1, dV, qd);
                for (int n = 0; n < N; n++) { /* softmax backward, times the score scale */
                    real *row = dA + (long)n * N;
                    const real *arow = A + (long)n * N;
                    real dot = 0;
                    for (int m = 0; m < N; m++) dot += row[m] * arow[m];
                    for (int m = 0; m < N; m++) row[m] = arow[m] * (row[m] - dot) * scale;
                }
                F(gemm)(false, false, N, d, N, 1, dA, N, K, qd, 1, dbase + (long)i * d, qd);
                F(gemm)(true, false, N, d, N, 1, dA, N, base + (long)i * d, qd, 1, dK, qd);
            }
        }
    }
    if (cfg->rope_theta > 0) F(rope_backward)(dqkv, T, qd, h + hkv, c->pos, cfg);
    F(router_backward)(cfg, prm, g, c, dgates, lb_scale, dx, dqkv, T);
    F(linear_backward_ctx)(c->bf16, dx, g->w_qkv, g->b_qkv, dqkv, c->x, prm->w_qkv, T, C, qd);
}
