/* Router template (instantiated by router.c for float and double). Spec §1, §2, §3, §10. */

/* Marks the k largest of v[0..n) in mask (1/0); ties go to the lower index (spec §10). */
static void F(topk_mask)(real *mask, const real *v, int n, int k) {
    for (int j = 0; j < n; j++) mask[j] = 0;
    for (int sel = 0; sel < k; sel++) {
        int best = -1;
        for (int j = 0; j < n; j++)
            if (mask[j] == 0 && (best < 0 || v[j] > v[best])) best = j;
        mask[best] = 1;
    }
}

/* out[T, n] = x[T, C] @ w[n, C]^T followed by a row softmax. tmp: [T, n] scratch. */
static void F(linear_softmax)(real *out, real *tmp, const real *x, const real *w, int T, int C, int n) {
    F(linear_forward)(tmp, x, w, NULL, T, C, n);
    F(softmax_forward)(out, tmp, T, n);
}

/* lb = E * sum_i P_i f_i, P_i = mean_t p[t,i], f_i = mean_t mask[t,i] (spec §2). */
real F(router_load_balance)(const real *p, const real *mask, int T, int E) {
    double lb = 0.0;
    for (int i = 0; i < E; i++) {
        double P = 0.0, f = 0.0;
        for (int t = 0; t < T; t++) {
            P += p[(long)t * E + i];
            f += mask[(long)t * E + i];
        }
        lb += (P / T) * (f / T);
    }
    return (real)(E * lb);
}

/* Learned router, top_k >= 1, rows [t0, t1) with p, s, a set: top-k mask, r and the gates. */
static void F(router_gate_rows)(const moh_attn_config *cfg, F(attn_cache) *c, int t0, int t1) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, K = cfg->top_k, E = attn_routed_heads(cfg);
    real *g = c->gates;
    const real eps = (real)FLT_EPSILON; /* torch.finfo(float32).eps, as the official clamp */
    for (int t = t0; t < t1; t++) {
        const real *p = c->p + (long)t * E;
        real *m = c->mask + (long)t * E, *r = c->r + (long)t * E, *gt = g + (long)t * h;
        F(topk_mask)(m, p, E, K);
        real sum = 0;
        for (int j = 0; j < E; j++) sum += p[j] * m[j];
        c->denom[t] = sum > eps ? sum : eps;
        for (int j = 0; j < E; j++) r[j] = K * (p[j] * m[j]) / c->denom[t];
        if (hs == 0) {
            for (int j = 0; j < E; j++) gt[j] = r[j];
            continue;
        }
        const real a0 = 2 * c->a[2 * t], a1 = 2 * c->a[2 * t + 1];
        for (int i = 0; i < hs; i++) gt[i] = a0 * (hs >= 2 ? hs * c->s[(long)t * hs + i] : 1);
        for (int j = 0; j < E; j++) gt[hs + j] = a1 * r[j];
    }
}

void F(router_learned_rows)(const moh_attn_config *cfg, F(attn_cache) *c, const real *z, int t0, int t1) {
    const int hs = cfg->shared_heads, E = attn_routed_heads(cfg);
    const int nh = hs >= 1 ? 2 : 0, ns = hs >= 2 ? hs : 0, nz = E + nh + ns;
    for (int t = t0; t < t1; t++) { /* the logits by rows into r, s, a; the softmaxes in place */
        const real *zt = z + (size_t)t * nz;
        memcpy(c->r + (size_t)t * E, zt, sizeof(real) * E);
        if (ns) memcpy(c->s + (size_t)t * ns, zt + E + nh, sizeof(real) * ns);
        if (nh) memcpy(c->a + (size_t)t * 2, zt + E, sizeof(real) * 2);
    }
    const int m = t1 - t0;
    F(softmax_forward)(c->p + (size_t)t0 * E, c->r + (size_t)t0 * E, m, E);
    if (ns) F(softmax_forward)(c->s + (size_t)t0 * ns, c->s + (size_t)t0 * ns, m, ns);
    if (nh) F(softmax_forward)(c->a + (size_t)t0 * 2, c->a + (size_t)t0 * 2, m, 2);
    F(router_gate_rows)(cfg, c, t0, t1);
}

void F(router_forward)(const moh_attn_config *cfg, const F(attn_params) *prm, const real *x,
                       const real *qkv, int T, F(attn_cache) *c) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, K = cfg->top_k, C = cfg->hidden_size;
    const int d = cfg->head_dim, E = attn_routed_heads(cfg), qd = attn_qkv_dim(cfg);
    real *g = c->gates;
    c->lb_loss = 0;
    if (cfg->router == MOH_ROUTER_NONE) {
        for (long i = 0; i < (long)T * h; i++) g[i] = 1;
        return;
    }
    if (cfg->router == MOH_ROUTER_QUERY_NORM) {
        for (int t = 0; t < T; t++) {
            real *qn = c->qn + (long)t * E, *p = c->p + (long)t * E;
            double mean = 0.0, var = 0.0;
            for (int j = 0; j < E; j++) {
                const real *q = qkv + (long)t * qd + (long)(hs + j) * d;
                double ss = 0.0;
                for (int e = 0; e < d; e++) ss += (double)q[e] * q[e];
                qn[j] = (real)sqrt(ss);
                mean += qn[j];
            }
            mean /= E;
            for (int j = 0; j < E; j++) var += ((double)qn[j] - mean) * ((double)qn[j] - mean);
            c->qstd[t] = E > 1 ? (real)sqrt(var / (E - 1)) : 0;
            /* E == 1 or all norms equal: the scores are uniform (the limit of the softmax). */
            if (c->qstd[t] > 0) {
                for (int j = 0; j < E; j++) p[j] = qn[j] / c->qstd[t];
                F(softmax_forward)(p, p, 1, E);
            } else {
                for (int j = 0; j < E; j++) p[j] = (real)1 / E;
            }
            /* Select on the norms themselves: same order as p, and exact where p saturates. */
            F(topk_mask)(c->mask + (long)t * E, qn, E, K);
            for (int i = 0; i < hs; i++) g[(long)t * h + i] = 1;
            for (int j = 0; j < E; j++) g[(long)t * h + hs + j] = c->mask[(long)t * E + j];
        }
        c->lb_loss = F(router_load_balance)(c->p, c->mask, T, E);
        return;
    }
    /* learned */
    if (K == 0) { /* all heads shared: gates = h * softmax(wg_1 x), or 1 when h == 1 */
        if (hs >= 2) {
            F(linear_softmax)(c->s, g, x, prm->w_s, T, C, hs);
            for (long i = 0; i < (long)T * hs; i++) g[i] = c->s[i] * hs;
        } else {
            for (long i = 0; i < (long)T * h; i++) g[i] = 1;
        }
        return;
    }
    const int nh = hs >= 1 ? 2 : 0, ns = hs >= 2 ? hs : 0, nz = E + nh + ns;
    if ((!nh || prm->w_h == prm->w_r + (size_t)E * C) && (!ns || prm->w_s == prm->w_r + (size_t)(E + nh) * C)) {
        /* wg | wg_0 | wg_1 adjacent (attn_params_bind): one GEMM reads x once for all three
         * (each logit the same dot product as in its own GEMM), then the softmaxes */
        real *z = c->scratch; /* [T, nz] (backward scratch, free here) */
        F(linear_forward)(z, x, prm->w_r, NULL, T, C, nz);
        F(router_learned_rows)(cfg, c, z, 0, T);
        c->lb_loss = F(router_load_balance)(c->p, c->mask, T, E);
        return;
    }
    F(linear_softmax)(c->p, c->r, x, prm->w_r, T, C, E);
    if (hs >= 2) F(linear_softmax)(c->s, g, x, prm->w_s, T, C, hs);
    if (hs >= 1) F(linear_softmax)(c->a, g, x, prm->w_h, T, C, 2);
    F(router_gate_rows)(cfg, c, 0, T);
    c->lb_loss = F(router_load_balance)(c->p, c->mask, T, E);
}

/* dz = J_softmax^T dp, accumulated through w: dx += dz @ w, dw += dz^T @ x. dz: [T, n] scratch. */
static void F(softmax_linear_backward)(real *dx, real *dw, real *dz, const real *dp,
                                       const real *prob, const real *x, const real *w, int T,
                                       int C, int n) {
    for (long i = 0; i < (long)T * n; i++) dz[i] = 0;
    F(softmax_backward)(dz, dp, prob, T, n);
    F(linear_backward)(dx, dw, NULL, dz, x, w, T, C, n);
}

real F(router_lb_dp)(const F(attn_cache) *c, real lb_scale, int T, int E, int i) {
    double f = 0.0;
    for (int t = 0; t < T; t++) f += c->mask[(long)t * E + i];
    return (real)(lb_scale * E * (f / T) / T);
}

void F(router_learned_grad_rows)(const moh_attn_config *cfg, const F(attn_cache) *c, const real *dgates,
                                 real *dp, real *ds, real *da, int t0, int t1) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, K = cfg->top_k, E = attn_routed_heads(cfg);
    for (int t = t0; t < t1; t++) {
        const real *dg = dgates + (long)t * h;
        const real *m = c->mask + (long)t * E, *r = c->r + (long)t * E;
        real *dpt = dp + (long)t * E;
        real a1 = 1;
        if (hs >= 1) {
            const real a0 = 2 * c->a[2 * t];
            a1 = 2 * c->a[2 * t + 1];
            real da0 = 0, da1 = 0;
            for (int i = 0; i < hs; i++) {
                const real si = hs >= 2 ? hs * c->s[(long)t * hs + i] : 1;
                da0 += dg[i] * si;
                if (hs >= 2) ds[(long)t * hs + i] = dg[i] * a0 * hs;
            }
            for (int j = 0; j < E; j++) da1 += dg[hs + j] * r[j];
            da[2 * t] = 2 * da0;
            da[2 * t + 1] = 2 * da1;
        }
        /* r_j = K p_j m_j / D, D = max(sum_l p_l m_l, eps):
         * dp_j = (K m_j / D) (dr_j - sum_l dr_l r_l / K), written with r so that the two terms
         * cancel exactly where they should (top-1: r = p / p = 1). Clamped D is a constant. */
        const real D = c->denom[t];
        const bool clamped = !(D > (real)FLT_EPSILON);
        real rdot = 0;
        for (int j = 0; j < E; j++) rdot += dg[hs + j] * a1 * r[j];
        for (int j = 0; j < E; j++) {
            if (m[j] == 0) continue;
            const real dr = dg[hs + j] * a1;
            dpt[j] += K / D * (dr - (clamped ? 0 : rdot / K));
        }
    }
}

void F(router_backward)(const moh_attn_config *cfg, const F(attn_params) *prm,
                        const F(attn_params) *g, const F(attn_cache) *c, const real *dgates,
                        real lb_scale, real *dx, real *dqkv, int T) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, K = cfg->top_k, C = cfg->hidden_size;
    const int d = cfg->head_dim, E = attn_routed_heads(cfg), qd = attn_qkv_dim(cfg);
    if (cfg->router == MOH_ROUTER_NONE) return;
    if (cfg->router == MOH_ROUTER_LEARNED && K == 0) {
        if (hs < 2) return;
        real *ds = c->scratch, *dz = ds + (long)T * hs;
        for (long i = 0; i < (long)T * hs; i++) ds[i] = dgates[i] * hs;
        F(softmax_linear_backward)(dx, g->w_s, dz, ds, c->s, c->x, prm->w_s, T, C, hs);
        return;
    }
    /* d lb / d p[t,i] = E f_i / T (f constant, spec §2). */
    /* scratch: dp [T, E], dz [T, W], ds [T, h_s], da [T, 2], W = max(E, h_s, 2) */
    const int W = attn_router_width(cfg);
    real *dp = c->scratch, *dz = dp + (long)T * E, *ds = dz + (long)T * W, *da = ds + (long)T * hs;
    for (long i = 0; i < (long)T * E; i++) dp[i] = 0;
    if (lb_scale != 0) {
        for (int i = 0; i < E; i++) {
            const real v = F(router_lb_dp)(c, lb_scale, T, E, i);
            for (int t = 0; t < T; t++) dp[(long)t * E + i] = v;
        }
    }
    if (cfg->router == MOH_ROUTER_QUERY_NORM) {
        /* Straight-through (spec §10): the binary gate of a selected routed head acts as its
         * score in backward, dp_j += m_j dL/dg_j. Unselected heads pass nothing: their outputs
         * are never computed on the head-sparse path. */
        if (cfg->straight_through)
            for (long i = 0; i < (long)T * E; i++) {
                const long t = i / E, j = i % E;
                dp[i] += c->mask[i] * dgates[t * h + hs + j];
            }
        if ((lb_scale == 0 && !cfg->straight_through) || !dqkv) return;
        for (long i = 0; i < (long)T * E; i++) dz[i] = 0;
        for (int t = 0; t < T; t++) {
            const real sd = c->qstd[t];
            if (!(sd > 0)) continue; /* uniform scores: no gradient */
            const real *qn = c->qn + (long)t * E;
            real *dzt = dz + (long)t * E;
            F(softmax_backward)(dzt, dp + (long)t * E, c->p + (long)t * E, 1, E);
            /* z_j = n_j / sd, sd = sqrt(sum_l (n_l - mean)^2 / (E - 1)). */
            double mean = 0.0, zdot = 0.0;
            for (int j = 0; j < E; j++) mean += qn[j];
            mean /= E;
            for (int j = 0; j < E; j++) zdot += (double)dzt[j] * qn[j];
            for (int j = 0; j < E; j++) {
                const double dsd_dn = ((double)qn[j] - mean) / ((E - 1) * (double)sd);
                const double dn = dzt[j] / (double)sd - zdot / ((double)sd * sd) * dsd_dn;
                if (!(qn[j] > 0)) continue;
                const real *q = c->q_pre + (long)t * h * d + (long)(hs + j) * d;
                real *dq = dqkv + (long)t * qd + (long)(hs + j) * d;
                for (int e = 0; e < d; e++) dq[e] += (real)(dn * q[e] / qn[j]);
            }
        }
        return;
    }
    /* learned, K >= 1 */
    F(router_learned_grad_rows)(cfg, c, dgates, dp, ds, da, 0, T);
    F(softmax_linear_backward)(dx, g->w_r, dz, dp, c->p, c->x, prm->w_r, T, C, E);
    if (hs >= 2) F(softmax_linear_backward)(dx, g->w_s, dz, ds, c->s, c->x, prm->w_s, T, C, hs);
    if (hs >= 1) F(softmax_linear_backward)(dx, g->w_h, dz, da, c->a, c->x, prm->w_h, T, C, 2);
}
