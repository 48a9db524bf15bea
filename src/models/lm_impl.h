/* Decoder LM template (instantiated by lm.c): LLaMA-style blocks of RMSNorm -> MoH attention ->
 * residual -> RMSNorm -> SwiGLU MLP -> residual, final RMSNorm, LM head. */

int F(lm_params_init)(F(lm_params) *p, const moh_lm_config *cfg, moh_error *err) {
    memset(p, 0, sizeof *p);
    const int L = cfg->num_hidden_layers;
    const size_t C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size, V = (size_t)cfg->vocab_size;
    const size_t na = F(attn_params_bind)(&(F(attn_params)){0}, NULL, &cfg->attn);
    const size_t per_block = C + na + C + 3 * I * C;
    p->n = V * C + (size_t)L * per_block + C + (cfg->tie_word_embeddings ? 0 : V * C);
    p->data = calloc(p->n, sizeof(real));
    p->blocks = calloc((size_t)L, sizeof *p->blocks);
    if (!p->data || !p->blocks) {
        F(lm_params_free)(p);
        return moh_fail(err, MOH_E_NOMEM, "model: cannot allocate %zu parameters", p->n);
    }
    real *cur = p->data;
    p->embed = cur; cur += V * C;
    for (int l = 0; l < L; l++) {
        F(lm_block) *b = &p->blocks[l];
        b->ln1 = cur; cur += C;
        F(attn_params_bind)(&b->attn, cur, &cfg->attn); cur += na;
        b->ln2 = cur; cur += C;
        b->w_gate = cur; cur += I * C;
        b->w_up = cur; cur += I * C;
        b->w_down = cur; cur += C * I;
    }
    p->norm = cur; cur += C;
    p->lm_head = cfg->tie_word_embeddings ? p->embed : cur;
    return MOH_OK;
}

void F(lm_params_free)(F(lm_params) *p) {
    free(p->data);
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

/* Allocates the activations, attention on the head-sparse path when sparse (float32 only). */
static int F(lm_acts_alloc)(F(lm_acts) *a, const moh_lm_config *cfg, int B, int T, bool sparse,
                            moh_error *err) {
    memset(a, 0, sizeof *a);
    const size_t L = (size_t)cfg->num_hidden_layers, BT = (size_t)B * T;
    const size_t C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size, V = (size_t)cfg->vocab_size;
    real **fields[] = {&a->resid, &a->mid, &a->ln1, &a->ln1_rstd, &a->attn_out, &a->ln2, &a->ln2_rstd,
                       &a->gate, &a->up, &a->act, &a->sig, &a->lnf, &a->lnf_rstd, &a->logits, &a->probs,
                       &a->dres, &a->dtmp, &a->dff, &a->dlogits};
    const size_t sizes[] = {(L + 1) * BT * C, L * BT * C, L * BT * C, L * BT, L * BT * C, L * BT * C, L * BT,
                            L * BT * I, L * BT * I, L * BT * I, L * BT * I, BT * C, BT, BT * V, BT * V,
                            BT * C, BT * C, 3 * BT * I, BT * V};
    a->B = B;
    a->T = T;
    return F(attn_stack_init_acts)(&a->attn, fields, sizes, sizeof sizes / sizeof sizes[0], (int)L, &cfg->attn,
                                   false, B, T, sparse, "lm", err);
}

int F(lm_acts_init)(F(lm_acts) *a, const moh_lm_config *cfg, int B, int T, moh_error *err) {
    return F(lm_acts_alloc)(a, cfg, B, T, false, err);
}

void F(lm_acts_free)(F(lm_acts) *a) {
    F(attn_stack_free)(&a->attn); /* the layers, their compute context, the activation block */
    memset(a, 0, sizeof *a);
}

real F(lm_forward)(const moh_lm_config *cfg, const F(lm_params) *p, F(lm_acts) *a,
                   const int *tokens, const int *targets, int B, int T) {
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int V = cfg->vocab_size, BT = B * T;
    const real eps = (real)cfg->rms_norm_eps;
    double *ph = a->phase_s, t = omp_get_wtime();
    a->B = B;
    a->T = T;
    F(be_embedding_forward)(&a->attn.cx, a->resid, tokens, p->embed, BT, C);
    t = lm_lap(ph, LMT_PH_EMBED, t);
    int routing = 0;
    double lb = 0.0;
    for (int l = 0; l < L; l++) {
        const F(lm_block) *b = &p->blocks[l];
        real *x = a->resid + (size_t)l * BT * C, *xo = a->resid + (size_t)(l + 1) * BT * C;
        real *ln1 = a->ln1 + (size_t)l * BT * C, *ao = a->attn_out + (size_t)l * BT * C;
        real *ln2 = a->ln2 + (size_t)l * BT * C;
        real *gate = a->gate + (size_t)l * BT * I, *up = a->up + (size_t)l * BT * I;
        real *act = a->act + (size_t)l * BT * I;
        if (l == 0) { /* later layers: fused into the previous layer's last residual add */
            F(be_rmsnorm_forward)(&a->attn.cx, ln1, a->ln1_rstd, x, b->ln1, BT, C, eps);
            t = lm_lap(ph, LMT_PH_NORM, t);
        }
        F(attn_layer_forward)(&a->attn.layer[l], &cfg->attn, &b->attn, ln1, B, T, ao);
        if (attn_routed_heads(&cfg->attn) > 0 && cfg->attn.top_k > 0) {
            lb += F(attn_layer_router)(&a->attn.layer[l])->lb_loss; /* every layer routes alike: the mean is over all L */
            routing++;
        }
        t = lm_lap(ph, LMT_PH_ATTN, t);
        real *mid = a->mid + (size_t)l * BT * C;
        F(be_add_rmsnorm_forward)(&a->attn.cx, mid, ln2, a->ln2_rstd + (size_t)l * BT, x, ao, b->ln2, BT, C, eps);
        t = lm_lap(ph, LMT_PH_NORM, t);
        F(be_linear_forward)(&a->attn.cx, gate, ln2, b->w_gate, NULL, BT, C, I);
        F(be_linear_forward)(&a->attn.cx, up, ln2, b->w_up, NULL, BT, C, I);
        t = lm_lap(ph, LMT_PH_MLP_IN, t);
        F(be_swiglu_forward_sig)(&a->attn.cx, act, a->sig + (size_t)l * BT * I, gate, up, (long)BT * I);
        t = lm_lap(ph, LMT_PH_SWIGLU, t);
        F(be_linear_forward)(&a->attn.cx, a->dtmp, act, b->w_down, NULL, BT, I, C); /* dtmp: MLP output */
        t = lm_lap(ph, LMT_PH_MLP_DOWN, t);
        /* x_{l+1} = mid + MLP output, and the norm that reads it: next ln1, or the final norm */
        if (l + 1 < L)
            F(be_add_rmsnorm_forward)(&a->attn.cx, xo, a->ln1 + (size_t)(l + 1) * BT * C, a->ln1_rstd + (size_t)(l + 1) * BT, mid,
                                   a->dtmp, p->blocks[l + 1].ln1, BT, C, eps);
        else
            F(be_add_rmsnorm_forward)(&a->attn.cx, xo, a->lnf, a->lnf_rstd, mid, a->dtmp, p->norm, BT, C, eps);
        t = lm_lap(ph, LMT_PH_NORM, t);
    }
    a->lb_loss = routing ? (real)(lb / routing) : 0;
    if (L == 0) F(be_rmsnorm_forward)(&a->attn.cx, a->lnf, a->lnf_rstd, a->resid, p->norm, BT, C, eps);
    F(be_linear_forward)(&a->attn.cx, a->logits, a->lnf, p->lm_head, NULL, BT, C, V);
    t = lm_lap(ph, LMT_PH_HEAD, t);
    if (!targets) {
        a->ce_loss = 0;
        return 0;
    }
    a->ce_loss = F(be_cross_entropy_forward)(&a->attn.cx, a->probs, a->logits, targets, BT, V, 0);
    lm_lap(ph, LMT_PH_LOSS, t);
    return a->ce_loss + (real)cfg->load_balance_coef * a->lb_loss;
}

void F(lm_backward)(const moh_lm_config *cfg, const F(lm_params) *p, const F(lm_params) *g,
                    F(lm_acts) *a, const int *tokens, const int *targets) {
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int V = cfg->vocab_size, B = a->B, T = a->T, BT = B * T;
    const size_t nC = (size_t)BT * C, nI = (size_t)BT * I;
    const bool routed = attn_routed_heads(&cfg->attn) > 0 && cfg->attn.top_k > 0;
    const real lb_scale = routed ? (real)(cfg->load_balance_coef / L) : 0;
    real *dres = a->dres, *dtmp = a->dtmp;
    real *dact = a->dff, *dgate = a->dff + nI, *dup = a->dff + 2 * nI;
    double *ph = a->phase_s, t = omp_get_wtime();
    memset(a->dlogits, 0, sizeof(real) * (size_t)BT * V);
    F(be_cross_entropy_backward)(&a->attn.cx, a->dlogits, a->probs, targets, BT, V, 0, 1);
    t = lm_lap(ph, LMT_PH_B_LOSS, t);
    F(be_linear_backward)(&a->attn.cx, dtmp, 0, g->lm_head, NULL, a->dlogits, a->lnf, p->lm_head, BT, C, V);
    t = lm_lap(ph, LMT_PH_B_HEAD, t);
    memset(dres, 0, sizeof(real) * nC);
    F(be_rmsnorm_backward)(&a->attn.cx, dres, g->norm, dtmp, a->resid + (size_t)L * nC, p->norm, a->lnf_rstd, BT, C);
    t = lm_lap(ph, LMT_PH_B_NORM, t);
    for (int l = L - 1; l >= 0; l--) {
        const F(lm_block) *b = &p->blocks[l];
        const F(lm_block) *gb = &g->blocks[l];
        /* MLP branch of x_{l+1} = x1 + down(swiglu(gate(ln2(x1)), up(ln2(x1)))) */
        F(be_linear_backward)(&a->attn.cx, dact, 0, gb->w_down, NULL, dres, a->act + (size_t)l * nI, b->w_down, BT, I, C);
        t = lm_lap(ph, LMT_PH_B_MLP_DOWN, t);
        F(be_swiglu_backward_set)(&a->attn.cx, dgate, dup, dact, a->gate + (size_t)l * nI, a->sig + (size_t)l * nI,
                               a->up + (size_t)l * nI, (long)nI);
        t = lm_lap(ph, LMT_PH_B_SWIGLU, t);
        F(be_linear_backward)(&a->attn.cx, dtmp, 0, gb->w_gate, NULL, dgate, a->ln2 + (size_t)l * nC, b->w_gate, BT, C, I);
        F(be_linear_backward)(&a->attn.cx, dtmp, 1, gb->w_up, NULL, dup, a->ln2 + (size_t)l * nC, b->w_up, BT, C, I);
        t = lm_lap(ph, LMT_PH_B_MLP_IN, t);
        F(be_rmsnorm_backward)(&a->attn.cx, dres, gb->ln2, dtmp, a->mid + (size_t)l * nC, b->ln2,
                            a->ln2_rstd + (size_t)l * BT, BT, C);
        t = lm_lap(ph, LMT_PH_B_NORM, t);
        /* attention branch of x1 = x_l + attn(ln1(x_l)) */
        memset(dtmp, 0, sizeof(real) * nC);
        F(attn_layer_backward)(&a->attn.layer[l], &cfg->attn, &b->attn, &gb->attn, dres, lb_scale, dtmp);
        t = lm_lap(ph, LMT_PH_B_ATTN, t);
        F(be_rmsnorm_backward)(&a->attn.cx, dres, gb->ln1, dtmp, a->resid + (size_t)l * nC, b->ln1,
                            a->ln1_rstd + (size_t)l * BT, BT, C);
        t = lm_lap(ph, LMT_PH_B_NORM, t);
    }
    F(be_embedding_backward)(&a->attn.cx, g->embed, dres, tokens, BT, C);
    lm_lap(ph, LMT_PH_B_EMBED, t);
}

