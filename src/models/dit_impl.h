/* DiT template (instantiated by dit.c for float and double): official DiT / MoH-DiT forward and
 * backward. Shapes and names: dit.h, dit_decl.h. */

int F(dit_params_init)(F(dit_params) *p, const moh_dit_config *cfg, moh_error *err) {
    memset(p, 0, sizeof *p);
    const int L = cfg->depth;
    const size_t D = (size_t)cfg->hidden_size, Hm = (size_t)cfg->mlp_hidden, P = (size_t)cfg->patch_dim;
    const size_t N = (size_t)cfg->num_patches, Y = (size_t)cfg->num_classes + 1;
    size_t n = N * D + D * P + D + D * DIT_FREQ_DIM + D + D * D + D + Y * D;
    for (int l = 0; l < L; l++)
        n += F(attn_params_bind)(&(F(attn_params)){0}, NULL, &cfg->attn[l]) + Hm * D + Hm + D * Hm + D +
             6 * D * D + 6 * D;
    n += P * D + P + 2 * D * D + 2 * D;
    p->n = n;
    p->data = calloc(n, sizeof(real));
    p->blocks = calloc((size_t)L, sizeof *p->blocks);
    if (!p->data || !p->blocks) {
        F(dit_params_free)(p);
        return moh_fail(err, MOH_E_NOMEM, "dit: cannot allocate %zu parameters", n);
    }
    real *cur = p->data;
    p->pos_embed = cur; cur += N * D;
    p->xe_w = cur; cur += D * P;
    p->xe_b = cur; cur += D;
    p->t0_w = cur; cur += D * DIT_FREQ_DIM;
    p->t0_b = cur; cur += D;
    p->t2_w = cur; cur += D * D;
    p->t2_b = cur; cur += D;
    p->y_table = cur; cur += Y * D;
    for (int l = 0; l < L; l++) {
        F(dit_block) *b = &p->blocks[l];
        cur += F(attn_params_bind)(&b->attn, cur, &cfg->attn[l]);
        b->fc1_w = cur; cur += Hm * D;
        b->fc1_b = cur; cur += Hm;
        b->fc2_w = cur; cur += D * Hm;
        b->fc2_b = cur; cur += D;
        b->ada_w = cur; cur += 6 * D * D;
        b->ada_b = cur; cur += 6 * D;
    }
    p->fl_w = cur; cur += P * D;
    p->fl_b = cur; cur += P;
    p->fa_w = cur; cur += 2 * D * D;
    p->fa_b = cur;
    return MOH_OK;
}

void F(dit_params_free)(F(dit_params) *p) {
    free(p->data);
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

int F(dit_acts_init)(F(dit_acts) *a, const moh_dit_config *cfg, int Bmax, bool sparse, moh_error *err) {
    memset(a, 0, sizeof *a);
    if (Bmax < 1) return moh_fail(err, MOH_E_ARG, "dit: batch size %d, expected >= 1", Bmax);
    const size_t L = (size_t)cfg->depth, B = (size_t)Bmax, BN = B * (size_t)cfg->num_patches;
    const size_t D = (size_t)cfg->hidden_size, Hm = (size_t)cfg->mlp_hidden, P = (size_t)cfg->patch_dim;
    real **fields[] = {&a->patches, &a->tfreq, &a->th, &a->ts, &a->cond, &a->csilu, &a->mod, &a->fmod,
                       &a->resid, &a->mid, &a->n1, &a->mean1, &a->rstd1, &a->h1, &a->ao, &a->n2, &a->mean2,
                       &a->rstd2, &a->h2, &a->fc1, &a->act, &a->f2, &a->nf, &a->meanf, &a->rstdf, &a->hf, &a->out_tok, &a->out,
                       &a->dres, &a->dtmp, &a->dh, &a->dff, &a->dtok, &a->dmod, &a->dsc, &a->dcond, &a->dth};
    const size_t sizes[] = {BN * P, B * DIT_FREQ_DIM, B * D, B * D, B * D, B * D, L * B * 6 * D, B * 2 * D,
                            (L + 1) * BN * D, L * BN * D, L * BN * D, L * BN, L * BN, L * BN * D, L * BN * D,
                            L * BN * D, L * BN, L * BN, L * BN * D, L * BN * Hm, L * BN * Hm, L * BN * D, BN * D,
                            BN, BN, BN * D, BN * P, BN * P, BN * D, BN * D, BN * D, 2 * BN * Hm, BN * P, B * 6 * D,
                            B * D, B * D, 2 * B * D};
    a->Bmax = Bmax;
    return F(attn_stack_init_acts)(&a->attn, fields, sizes, sizeof sizes / sizeof sizes[0], (int)L, cfg->attn,
                                   true, Bmax, cfg->num_patches, sparse, "dit", err);
}

void F(dit_acts_free)(F(dit_acts) *a) {
    F(attn_stack_free)(&a->attn); /* the layers, their compute context, the activation block */
    memset(a, 0, sizeof *a);
}

/* ---- ops ------------------------------------------------------------------------------------ */

void F(dit_timestep_freq)(real *out, const int *t, int B) {
    const int half = DIT_FREQ_DIM / 2;
    const float lmax = (float)-log(10000.0);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < half; i++) {
            /* torch: exp(-log(max_period) * arange(half, float32) / half), all float32 */
            const float w = expf(lmax * (float)i / (float)half);
            const real arg = (real)((float)t[b] * w);
            out[(size_t)b * DIT_FREQ_DIM + i] = (real)cos((double)arg);
            out[(size_t)b * DIT_FREQ_DIM + half + i] = (real)sin((double)arg);
        }
}

void F(dit_temb_forward)(const moh_dit_config *cfg, const F(dit_params) *p, const be_ctx *cx, real *temb,
                         real *th, real *ts, const real *freq, int B) {
    const int D = cfg->hidden_size;
    F(be_linear_forward)(cx, th, freq, p->t0_w, p->t0_b, B, DIT_FREQ_DIM, D);
    F(be_silu_forward)(cx, ts, th, (long)B * D);
    F(be_linear_forward)(cx, temb, ts, p->t2_w, p->t2_b, B, D, D);
}

void F(dit_temb_backward)(const moh_dit_config *cfg, const F(dit_params) *p, const F(dit_params) *g,
                          const be_ctx *cx, const real *dtemb, const real *th, const real *ts, const real *freq,
                          real *dth, int B) {
    const int D = cfg->hidden_size;
    real *dts = dth + (size_t)B * D; /* second half of the scratch */
    memset(dth, 0, sizeof(real) * 2 * (size_t)B * D);
    F(be_linear_backward)(cx, dts, 1, g->t2_w, g->t2_b, dtemb, ts, p->t2_w, B, D, D);
    F(be_silu_backward)(cx, dth, dts, th, (long)B * D);
    F(be_linear_backward)(cx, NULL, 1, g->t0_w, g->t0_b, dth, freq, p->t0_w, B, DIT_FREQ_DIM, D);
}

void F(dit_patchify)(const moh_dit_config *cfg, real *patches, const real *img, int B) {
    const int p = cfg->patch_size, G = cfg->grid, C = cfg->in_channels, H = cfg->input_size;
    const int P = cfg->patch_dim, N = cfg->num_patches;
    for (int b = 0; b < B; b++)
        for (int gy = 0; gy < G; gy++)
            for (int gx = 0; gx < G; gx++) {
                real *row = patches + ((size_t)b * N + (size_t)gy * G + gx) * P;
                for (int c = 0; c < C; c++)
                    for (int ky = 0; ky < p; ky++)
                        for (int kx = 0; kx < p; kx++)
                            row[(c * p + ky) * p + kx] =
                                img[(((size_t)b * C + c) * H + (size_t)gy * p + ky) * H + (size_t)gx * p + kx];
            }
}

void F(dit_unpatchify)(const moh_dit_config *cfg, real *img, real *tok, int B, int inverse) {
    const int p = cfg->patch_size, G = cfg->grid, C = cfg->in_channels, H = cfg->input_size;
    const int P = cfg->patch_dim, N = cfg->num_patches;
    for (int b = 0; b < B; b++)
        for (int gy = 0; gy < G; gy++)
            for (int gx = 0; gx < G; gx++) {
                real *row = tok + ((size_t)b * N + (size_t)gy * G + gx) * P;
                for (int ky = 0; ky < p; ky++)
                    for (int kx = 0; kx < p; kx++)
                        for (int c = 0; c < C; c++) {
                            real *px = img + (((size_t)b * C + c) * H + (size_t)gy * p + ky) * H + (size_t)gx * p + kx;
                            real *v = row + (ky * p + kx) * C + c;
                            if (inverse) *v = *px;
                            else *px = *v;
                        }
            }
}

static bool F(dit_layer_routes)(const moh_dit_config *cfg, int l) {
    return attn_routed_heads(&cfg->attn[l]) > 0 && cfg->attn[l].top_k > 0;
}

real F(dit_forward)(const moh_dit_config *cfg, const F(dit_params) *p, F(dit_acts) *a, const real *x,
                    const int *t, const int *y, const real *noise, int B) {
    const int L = cfg->depth, D = cfg->hidden_size, Hm = cfg->mlp_hidden, N = cfg->num_patches;
    const int P = cfg->patch_dim, BN = B * N, D6 = 6 * D;
    const size_t nD = (size_t)BN * D, nH = (size_t)BN * Hm;
    a->B = B;
    /* x_embedder + pos_embed */
    F(dit_patchify)(cfg, a->patches, x, B);
    F(be_linear_forward)(&a->attn.cx, a->resid, a->patches, p->xe_w, p->xe_b, BN, P, D);
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            real *r = a->resid + ((size_t)b * N + n) * D;
            const real *pe = p->pos_embed + (size_t)n * D;
            for (int c = 0; c < D; c++) r[c] += pe[c];
        }
    /* c = t_embedder(t) + y_embedder(y); SiLU(c) feeds every adaLN */
    F(dit_timestep_freq)(a->tfreq, t, B);
    F(dit_temb_forward)(cfg, p, &a->attn.cx, a->cond, a->th, a->ts, a->tfreq, B);
    for (int b = 0; b < B; b++) {
        const real *e = p->y_table + (size_t)y[b] * D;
        for (int c = 0; c < D; c++) a->cond[(size_t)b * D + c] += e[c];
    }
    F(be_silu_forward)(&a->attn.cx, a->csilu, a->cond, (long)B * D);
    double lb = 0.0;
    for (int l = 0; l < L; l++) {
        const F(dit_block) *bk = &p->blocks[l];
        real *xi = a->resid + (size_t)l * nD, *xo = a->resid + (size_t)(l + 1) * nD, *mid = a->mid + (size_t)l * nD;
        real *mod = a->mod + (size_t)l * B * D6;
        real *n1 = a->n1 + (size_t)l * nD, *h1 = a->h1 + (size_t)l * nD, *ao = a->ao + (size_t)l * nD;
        real *n2 = a->n2 + (size_t)l * nD, *h2 = a->h2 + (size_t)l * nD, *f2 = a->f2 + (size_t)l * nD;
        real *fc1 = a->fc1 + (size_t)l * nH, *act = a->act + (size_t)l * nH;
        F(be_linear_forward)(&a->attn.cx, mod, a->csilu, bk->ada_w, bk->ada_b, B, D, D6);
        /* attention branch: x + gate1 * attn(modulate(LN(x), shift1, scale1)) */
        F(be_layernorm_forward)(&a->attn.cx, n1, a->mean1 + (size_t)l * BN, a->rstd1 + (size_t)l * BN, xi, NULL, NULL, BN,
                                D, (real)DIT_LN_EPS);
        F(be_modulate_forward)(&a->attn.cx, h1, n1, mod, mod + D, D6, B, N, D);
        F(attn_layer_forward)(&a->attn.layer[l], &cfg->attn[l], &bk->attn, h1, B, N, ao);
        if (F(dit_layer_routes)(cfg, l)) lb += F(attn_layer_router)(&a->attn.layer[l])->lb_loss;
        memcpy(mid, xi, sizeof(real) * nD);
        F(be_gated_add_forward)(&a->attn.cx, mid, mod + 2 * D, ao, D6, B, N, D);
        /* MLP branch: mid + gate2 * fc2(gelu_tanh(fc1(modulate(LN(mid), shift2, scale2)))) */
        F(be_layernorm_forward)(&a->attn.cx, n2, a->mean2 + (size_t)l * BN, a->rstd2 + (size_t)l * BN, mid, NULL, NULL, BN,
                                D, (real)DIT_LN_EPS);
        F(be_modulate_forward)(&a->attn.cx, h2, n2, mod + 3 * D, mod + 4 * D, D6, B, N, D);
        F(be_linear_forward)(&a->attn.cx, fc1, h2, bk->fc1_w, bk->fc1_b, BN, D, Hm);
        F(be_gelu_tanh_forward)(&a->attn.cx, act, fc1, (long)nH);
        F(be_linear_forward)(&a->attn.cx, f2, act, bk->fc2_w, bk->fc2_b, BN, Hm, D);
        memcpy(xo, mid, sizeof(real) * nD);
        F(be_gated_add_forward)(&a->attn.cx, xo, mod + 5 * D, f2, D6, B, N, D);
    }
    a->lb_loss = cfg->routing_layers ? (real)(lb / cfg->routing_layers) : 0;
    /* final layer, unpatchify */
    F(be_linear_forward)(&a->attn.cx, a->fmod, a->csilu, p->fa_w, p->fa_b, B, D, 2 * D);
    F(be_layernorm_forward)(&a->attn.cx, a->nf, a->meanf, a->rstdf, a->resid + (size_t)L * nD, NULL, NULL, BN, D,
                            (real)DIT_LN_EPS);
    F(be_modulate_forward)(&a->attn.cx, a->hf, a->nf, a->fmod, a->fmod + D, 2 * D, B, N, D);
    F(be_linear_forward)(&a->attn.cx, a->out_tok, a->hf, p->fl_w, p->fl_b, BN, D, P);
    F(dit_unpatchify)(cfg, a->out, a->out_tok, B, 0);
    if (!noise) {
        a->mse = 0;
        return 0;
    }
    const size_t n = (size_t)BN * P;
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a->out[i] - (double)noise[i];
        s += d * d;
    }
    a->mse = (real)(s / (double)n);
    return a->mse + (real)cfg->load_balance_coef * a->lb_loss;
}

void F(dit_backward)(const moh_dit_config *cfg, const F(dit_params) *p, const F(dit_params) *g, F(dit_acts) *a,
                     const int *y, const real *noise) {
    const int L = cfg->depth, D = cfg->hidden_size, Hm = cfg->mlp_hidden, N = cfg->num_patches;
    const int P = cfg->patch_dim, B = a->B, BN = B * N, D6 = 6 * D;
    const size_t nD = (size_t)BN * D, nH = (size_t)BN * Hm, npx = (size_t)BN * P;
    const real lb_scale = cfg->routing_layers ? (real)(cfg->load_balance_coef / cfg->routing_layers) : 0;
    real *dres = a->dres, *dtmp = a->dtmp, *dh = a->dh, *dsc = a->dsc;
    /* d mse / d out = 2 (out - eps) / n, gathered into token order */
    real *dimg = a->out; /* the prediction is not needed after this: reuse it for its gradient */
    for (size_t i = 0; i < npx; i++) dimg[i] = (real)2 * (dimg[i] - noise[i]) / (real)npx;
    F(dit_unpatchify)(cfg, dimg, a->dtok, B, 1);
    /* final layer */
    memset(dh, 0, sizeof(real) * nD);
    F(be_linear_backward)(&a->attn.cx, dh, 1, g->fl_w, g->fl_b, a->dtok, a->hf, p->fl_w, BN, D, P);
    memset(a->dmod, 0, sizeof(real) * (size_t)B * 2 * D);
    memset(dtmp, 0, sizeof(real) * nD);
    F(be_modulate_backward)(&a->attn.cx, dtmp, a->dmod, a->dmod + D, dh, a->nf, a->fmod + D, 2 * D, B, N, D);
    memset(dres, 0, sizeof(real) * nD);
    F(be_layernorm_backward)(&a->attn.cx, dres, NULL, NULL, dtmp, a->resid + (size_t)L * nD, NULL, a->meanf, a->rstdf,
                             BN, D);
    memset(dsc, 0, sizeof(real) * (size_t)B * D);
    F(be_linear_backward)(&a->attn.cx, dsc, 1, g->fa_w, g->fa_b, a->dmod, a->csilu, p->fa_w, B, D, 2 * D);
    for (int l = L - 1; l >= 0; l--) {
        const F(dit_block) *bk = &p->blocks[l];
        const F(dit_block) *gb = &g->blocks[l];
        const real *mod = a->mod + (size_t)l * B * D6;
        real *dmod = a->dmod;
        memset(dmod, 0, sizeof(real) * (size_t)B * D6);
        /* MLP branch: xo = mid + gate2 * f2; dres holds d xo and becomes d mid */
        real *dact = a->dff, *dfc1 = a->dff + nH;
        F(be_gated_add_backward)(&a->attn.cx, dtmp, dmod + 5 * D, dres, mod + 5 * D, a->f2 + (size_t)l * nD, D6, B, N, D);
        memset(a->dff, 0, sizeof(real) * 2 * nH);
        F(be_linear_backward)(&a->attn.cx, dact, 1, gb->fc2_w, gb->fc2_b, dtmp, a->act + (size_t)l * nH, bk->fc2_w, BN, Hm, D);
        F(be_gelu_tanh_backward)(&a->attn.cx, dfc1, dact, a->fc1 + (size_t)l * nH, (long)nH);
        memset(dh, 0, sizeof(real) * nD);
        F(be_linear_backward)(&a->attn.cx, dh, 1, gb->fc1_w, gb->fc1_b, dfc1, a->h2 + (size_t)l * nD, bk->fc1_w, BN, D, Hm);
        memset(dtmp, 0, sizeof(real) * nD);
        F(be_modulate_backward)(&a->attn.cx, dtmp, dmod + 3 * D, dmod + 4 * D, dh, a->n2 + (size_t)l * nD, mod + 4 * D, D6, B, N, D);
        F(be_layernorm_backward)(&a->attn.cx, dres, NULL, NULL, dtmp, a->mid + (size_t)l * nD, NULL,
                                 a->mean2 + (size_t)l * BN, a->rstd2 + (size_t)l * BN, BN, D);
        /* attention branch: mid = x + gate1 * ao; dres holds d mid and becomes d x */
        F(be_gated_add_backward)(&a->attn.cx, dtmp, dmod + 2 * D, dres, mod + 2 * D, a->ao + (size_t)l * nD, D6, B, N, D);
        memset(dh, 0, sizeof(real) * nD);
        F(attn_layer_backward)(&a->attn.layer[l], &cfg->attn[l], &bk->attn, &gb->attn, dtmp, lb_scale, dh);
        memset(dtmp, 0, sizeof(real) * nD);
        F(be_modulate_backward)(&a->attn.cx, dtmp, dmod, dmod + D, dh, a->n1 + (size_t)l * nD, mod + D, D6, B, N, D);
        F(be_layernorm_backward)(&a->attn.cx, dres, NULL, NULL, dtmp, a->resid + (size_t)l * nD, NULL,
                                 a->mean1 + (size_t)l * BN, a->rstd1 + (size_t)l * BN, BN, D);
        F(be_linear_backward)(&a->attn.cx, dsc, 1, gb->ada_w, gb->ada_b, dmod, a->csilu, bk->ada_w, B, D, D6);
    }
    /* conditioning: c = t_emb + y_emb, SiLU(c) */
    memset(a->dcond, 0, sizeof(real) * (size_t)B * D);
    F(be_silu_backward)(&a->attn.cx, a->dcond, dsc, a->cond, (long)B * D);
    for (int b = 0; b < B; b++) {
        real *row = g->y_table + (size_t)y[b] * D;
        for (int c = 0; c < D; c++) row[c] += a->dcond[(size_t)b * D + c];
    }
    F(dit_temb_backward)(cfg, p, g, &a->attn.cx, a->dcond, a->th, a->ts, a->tfreq, a->dth, B);
    /* x_embedder (pos_embed is fixed: no gradient) */
    F(be_linear_backward)(&a->attn.cx, NULL, 1, g->xe_w, g->xe_b, dres, a->patches, p->xe_w, BN, P, D);
}
