/* ViT template (instantiated by vit.c for float and double): timm VisionTransformer forward and
 * backward with MoH attention. Shapes and names: vit.h, vit_decl.h. */

int F(vit_params_init)(F(vit_params) *p, const moh_vit_config *cfg, moh_error *err) {
    memset(p, 0, sizeof *p);
    const int L = cfg->depth;
    const size_t D = (size_t)cfg->embed_dim, Hm = (size_t)cfg->mlp_hidden, K = (size_t)cfg->num_classes;
    const size_t na = F(attn_params_bind)(&(F(attn_params)){0}, NULL, &cfg->attn);
    const size_t per_block = 2 * D + na + 2 * D + Hm * D + Hm + D * Hm + D;
    p->n = (cfg->class_token ? D : 0) + (size_t)cfg->num_tokens * D + D * (size_t)cfg->patch_dim + D +
           (size_t)L * per_block + 2 * D + K * D + K;
    p->data = calloc(p->n, sizeof(real));
    p->blocks = calloc((size_t)L, sizeof *p->blocks);
    if (!p->data || !p->blocks) {
        F(vit_params_free)(p);
        return moh_fail(err, MOH_E_NOMEM, "vit: cannot allocate %zu parameters", p->n);
    }
    real *cur = p->data;
    if (cfg->class_token) { p->cls_token = cur; cur += D; }
    p->pos_embed = cur; cur += (size_t)cfg->num_tokens * D;
    p->pe_w = cur; cur += D * (size_t)cfg->patch_dim;
    p->pe_b = cur; cur += D;
    for (int l = 0; l < L; l++) {
        F(vit_block) *b = &p->blocks[l];
        b->ln1_w = cur; cur += D;
        b->ln1_b = cur; cur += D;
        F(attn_params_bind)(&b->attn, cur, &cfg->attn); cur += na;
        b->ln2_w = cur; cur += D;
        b->ln2_b = cur; cur += D;
        b->fc1_w = cur; cur += Hm * D;
        b->fc1_b = cur; cur += Hm;
        b->fc2_w = cur; cur += D * Hm;
        b->fc2_b = cur; cur += D;
    }
    p->norm_w = cur; cur += D;
    p->norm_b = cur; cur += D;
    p->head_w = cur; cur += K * D;
    p->head_b = cur;
    return MOH_OK;
}

void F(vit_params_free)(F(vit_params) *p) {
    free(p->data);
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

int F(vit_acts_init)(F(vit_acts) *a, const moh_vit_config *cfg, int Bmax, moh_error *err) {
    return F(vit_acts_init_attn)(a, cfg, Bmax, false, err);
}

int F(vit_acts_init_attn)(F(vit_acts) *a, const moh_vit_config *cfg, int Bmax, bool sparse,
                          moh_error *err) {
    memset(a, 0, sizeof *a);
    if (Bmax < 1) return moh_fail(err, MOH_E_ARG, "vit: batch size %d, expected >= 1", Bmax);
    const size_t L = (size_t)cfg->depth, B = (size_t)Bmax, BT = B * (size_t)cfg->num_tokens;
    const size_t D = (size_t)cfg->embed_dim, Hm = (size_t)cfg->mlp_hidden, K = (size_t)cfg->num_classes;
    const size_t BNp = B * (size_t)cfg->num_patches;
    real **fields[] = {&a->patches, &a->resid, &a->mid, &a->ln1, &a->ln1_mean, &a->ln1_rstd,
                       &a->attn_out, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fc1, &a->act,
                       &a->pooled, &a->fnorm, &a->fnorm_mean, &a->fnorm_rstd, &a->logits,
                       &a->probs, &a->dres, &a->dtmp, &a->dff, &a->dlogits, &a->dfnorm,
                       &a->dpooled};
    const size_t sizes[] = {BNp * (size_t)cfg->patch_dim, (L + 1) * BT * D, L * BT * D, L * BT * D,
                            L * BT, L * BT, L * BT * D, L * BT * D, L * BT, L * BT, L * BT * Hm,
                            L * BT * Hm, B * D, B * D, B, B, B * K, B * K, BT * D, BT * D,
                            2 * BT * Hm, B * K, B * D, B * D};
    a->Bmax = Bmax;
    return F(attn_stack_init_acts)(&a->attn, fields, sizes, sizeof sizes / sizeof sizes[0], (int)L, &cfg->attn,
                                   false, Bmax, cfg->num_tokens, sparse, "vit", err);
}

void F(vit_acts_free)(F(vit_acts) *a) {
    F(attn_stack_free)(&a->attn); /* the layers, their compute context, the activation block */
    memset(a, 0, sizeof *a);
}

/* out[i] = x[i] + y[i] for n values. */
static void F(vit_add)(real *out, const real *x, const real *y, size_t n) {
#pragma omp parallel for if (n >= 65536) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

/* patches[(b Np + gy grid + gx), (c p + ky) p + kx] = img[b, c, gy p + ky, gx p + kx]: the
 * im2col of timm's PatchEmbed Conv2d (kernel = stride = p), flatten(2).transpose(1, 2) order. */
static void F(vit_patchify)(const moh_vit_config *cfg, real *patches, const real *img, int B) {
    const int p = cfg->patch_size, G = cfg->grid, Cin = cfg->in_chans, H = cfg->img_size;
    const int P = cfg->patch_dim, Np = cfg->num_patches;
#pragma omp parallel for if ((long)B * Np * P >= 65536) schedule(static)
    for (int b = 0; b < B; b++)
        for (int gy = 0; gy < G; gy++)
            for (int gx = 0; gx < G; gx++) {
                real *row = patches + ((size_t)b * Np + (size_t)gy * G + gx) * P;
                for (int c = 0; c < Cin; c++)
                    for (int ky = 0; ky < p; ky++) {
                        const real *src = img + (((size_t)b * Cin + c) * H + (size_t)gy * p + ky) * H + (size_t)gx * p;
                        for (int kx = 0; kx < p; kx++) row[(c * p + ky) * p + kx] = src[kx];
                    }
            }
}

real F(vit_forward)(const moh_vit_config *cfg, const F(vit_params) *p, F(vit_acts) *a,
                    const real *images, const int *labels, int B) {
    const int L = cfg->depth, D = cfg->embed_dim, Hm = cfg->mlp_hidden, K = cfg->num_classes;
    const int Ntok = cfg->num_tokens, Np = cfg->num_patches, pre = cfg->class_token ? 1 : 0;
    const int BT = B * Ntok;
    const size_t nD = (size_t)BT * D, nH = (size_t)BT * Hm;
    const real eps = (real)1e-6;
    a->B = B;
    /* patch embedding (into dtmp as [B Np, D]), class token, position embedding */
    F(vit_patchify)(cfg, a->patches, images, B);
    F(be_linear_forward)(&a->attn.cx, a->dtmp, a->patches, p->pe_w, p->pe_b, B * Np, cfg->patch_dim, D);
#pragma omp parallel for if (nD >= 65536) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Ntok; t++) {
            real *x = a->resid + ((size_t)b * Ntok + t) * D;
            const real *src = t < pre ? p->cls_token : a->dtmp + ((size_t)b * Np + t - pre) * D;
            const real *pos = p->pos_embed + (size_t)t * D;
            for (int c = 0; c < D; c++) x[c] = src[c] + pos[c];
        }
    }
    int routing = 0;
    double lb = 0.0;
    for (int l = 0; l < L; l++) {
        const F(vit_block) *b = &p->blocks[l];
        real *x = a->resid + (size_t)l * nD, *xo = a->resid + (size_t)(l + 1) * nD;
        real *ln1 = a->ln1 + (size_t)l * nD, *ao = a->attn_out + (size_t)l * nD;
        real *mid = a->mid + (size_t)l * nD, *ln2 = a->ln2 + (size_t)l * nD;
        real *fc1 = a->fc1 + (size_t)l * nH, *act = a->act + (size_t)l * nH;
        F(be_layernorm_forward)(&a->attn.cx, ln1, a->ln1_mean + (size_t)l * BT, a->ln1_rstd + (size_t)l * BT, x,
                             b->ln1_w, b->ln1_b, BT, D, eps);
        F(attn_layer_forward)(&a->attn.layer[l], &cfg->attn, &b->attn, ln1, B, Ntok, ao);
        if (attn_routed_heads(&cfg->attn) > 0 && cfg->attn.top_k > 0) {
            lb += F(attn_layer_router)(&a->attn.layer[l])->lb_loss;
            routing++;
        }
        F(vit_add)(mid, x, ao, nD);
        F(be_layernorm_forward)(&a->attn.cx, ln2, a->ln2_mean + (size_t)l * BT, a->ln2_rstd + (size_t)l * BT, mid,
                             b->ln2_w, b->ln2_b, BT, D, eps);
        F(be_linear_forward)(&a->attn.cx, fc1, ln2, b->fc1_w, b->fc1_b, BT, D, Hm);
        F(be_gelu_erf_forward)(&a->attn.cx, act, fc1, (long)nH);
        F(be_linear_forward)(&a->attn.cx, a->dtmp, act, b->fc2_w, b->fc2_b, BT, Hm, D); /* dtmp: MLP output */
        F(vit_add)(xo, mid, a->dtmp, nD);
    }
    a->lb_loss = routing ? (real)(lb / routing) : 0;
    /* pool, then norm (token: timm `norm` is per token, so norm-then-pick == pick-then-norm) or
     * fc_norm (avg), then the head */
    const real *xf = a->resid + (size_t)L * nD;
    for (int b = 0; b < B; b++) {
        real *pb = a->pooled + (size_t)b * D;
        if (cfg->global_pool == VIT_POOL_TOKEN) {
            memcpy(pb, xf + (size_t)b * Ntok * D, sizeof(real) * (size_t)D);
            continue;
        }
        for (int c = 0; c < D; c++) pb[c] = 0;
        for (int t = pre; t < Ntok; t++) {
            const real *row = xf + ((size_t)b * Ntok + t) * D;
            for (int c = 0; c < D; c++) pb[c] += row[c];
        }
        for (int c = 0; c < D; c++) pb[c] /= (real)Np;
    }
    F(be_layernorm_forward)(&a->attn.cx, a->fnorm, a->fnorm_mean, a->fnorm_rstd, a->pooled, p->norm_w, p->norm_b, B, D, eps);
    F(be_linear_forward)(&a->attn.cx, a->logits, a->fnorm, p->head_w, p->head_b, B, D, K);
    if (!labels) {
        a->ce_loss = 0;
        return 0;
    }
    a->ce_loss = F(be_cross_entropy_forward)(&a->attn.cx, a->probs, a->logits, labels, B, K, (real)cfg->label_smoothing);
    return a->ce_loss + (real)cfg->load_balance_coef * a->lb_loss;
}

void F(vit_backward)(const moh_vit_config *cfg, const F(vit_params) *p, const F(vit_params) *g,
                     F(vit_acts) *a, const int *labels) {
    const int L = cfg->depth, D = cfg->embed_dim, Hm = cfg->mlp_hidden, K = cfg->num_classes;
    const int Ntok = cfg->num_tokens, Np = cfg->num_patches, pre = cfg->class_token ? 1 : 0;
    const int B = a->B, BT = B * Ntok;
    const size_t nD = (size_t)BT * D, nH = (size_t)BT * Hm;
    int routing = 0;
    for (int l = 0; l < L; l++) routing += attn_routed_heads(&cfg->attn) > 0 && cfg->attn.top_k > 0;
    const real lb_scale = routing ? (real)(cfg->load_balance_coef / routing) : 0;
    real *dres = a->dres, *dtmp = a->dtmp, *dff = a->dff;
    /* head, final norm, pooling */
    memset(a->dlogits, 0, sizeof(real) * (size_t)B * K);
    F(be_cross_entropy_backward)(&a->attn.cx, a->dlogits, a->probs, labels, B, K, (real)cfg->label_smoothing, 1);
    memset(a->dfnorm, 0, sizeof(real) * (size_t)B * D);
    F(be_linear_backward)(&a->attn.cx, a->dfnorm, 1, g->head_w, g->head_b, a->dlogits, a->fnorm, p->head_w, B, D, K);
    memset(a->dpooled, 0, sizeof(real) * (size_t)B * D);
    F(be_layernorm_backward)(&a->attn.cx, a->dpooled, g->norm_w, g->norm_b, a->dfnorm, a->pooled, p->norm_w,
                          a->fnorm_mean, a->fnorm_rstd, B, D);
    memset(dres, 0, sizeof(real) * nD);
    for (int b = 0; b < B; b++) {
        const real *dp = a->dpooled + (size_t)b * D;
        if (cfg->global_pool == VIT_POOL_TOKEN) {
            memcpy(dres + (size_t)b * Ntok * D, dp, sizeof(real) * (size_t)D);
            continue;
        }
        for (int t = pre; t < Ntok; t++) {
            real *row = dres + ((size_t)b * Ntok + t) * D;
            for (int c = 0; c < D; c++) row[c] = dp[c] / (real)Np;
        }
    }
    for (int l = L - 1; l >= 0; l--) {
        const F(vit_block) *b = &p->blocks[l];
        const F(vit_block) *gb = &g->blocks[l];
        /* MLP branch of x_{l+1} = mid + fc2(gelu(fc1(norm2(mid)))) */
        real *dact = dff, *dfc1 = dff + nH;
        memset(dff, 0, sizeof(real) * 2 * nH);
        F(be_linear_backward)(&a->attn.cx, dact, 1, gb->fc2_w, gb->fc2_b, dres, a->act + (size_t)l * nH, b->fc2_w, BT, Hm, D);
        F(be_gelu_erf_backward)(&a->attn.cx, dfc1, dact, a->fc1 + (size_t)l * nH, (long)nH);
        memset(dtmp, 0, sizeof(real) * nD);
        F(be_linear_backward)(&a->attn.cx, dtmp, 1, gb->fc1_w, gb->fc1_b, dfc1, a->ln2 + (size_t)l * nD, b->fc1_w, BT, D, Hm);
        F(be_layernorm_backward)(&a->attn.cx, dres, gb->ln2_w, gb->ln2_b, dtmp, a->mid + (size_t)l * nD, b->ln2_w,
                              a->ln2_mean + (size_t)l * BT, a->ln2_rstd + (size_t)l * BT, BT, D);
        /* attention branch of mid = x_l + attn(norm1(x_l)) */
        memset(dtmp, 0, sizeof(real) * nD);
        F(attn_layer_backward)(&a->attn.layer[l], &cfg->attn, &b->attn, &gb->attn, dres, lb_scale, dtmp);
        F(be_layernorm_backward)(&a->attn.cx, dres, gb->ln1_w, gb->ln1_b, dtmp, a->resid + (size_t)l * nD, b->ln1_w,
                              a->ln1_mean + (size_t)l * BT, a->ln1_rstd + (size_t)l * BT, BT, D);
    }
    /* embeddings: x0[b, t] = (t < pre ? cls : pe[b, t - pre]) + pos[t] */
#pragma omp parallel for if (nD >= 65536) schedule(static)
    for (int t = 0; t < Ntok; t++) { /* sums over the batch in a fixed order */
        real *dpos = g->pos_embed + (size_t)t * D;
        for (int bb = 0; bb < B; bb++) {
            const real *d = dres + ((size_t)bb * Ntok + t) * D;
            for (int c = 0; c < D; c++) dpos[c] += d[c];
        }
    }
    if (pre) {
        for (int bb = 0; bb < B; bb++) {
            const real *d = dres + (size_t)bb * Ntok * D;
            for (int c = 0; c < D; c++) g->cls_token[c] += d[c];
        }
    }
    for (int bb = 0; bb < B; bb++) /* gather the patch rows: dtmp = d pe [B Np, D] */
        memcpy(dtmp + (size_t)bb * Np * D, dres + ((size_t)bb * Ntok + pre) * D, sizeof(real) * (size_t)Np * D);
    F(be_linear_backward)(&a->attn.cx, NULL, 1, g->pe_w, g->pe_b, dtmp, a->patches, p->pe_w, B * Np, cfg->patch_dim, D);
}
