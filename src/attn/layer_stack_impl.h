/* Template of attn_stack_init / attn_stack_free (layer.h), included by layer.c for _f32 and _f64.
 * No include guard on purpose. */

int F(attn_stack_init)(F(attn_stack) *s, int L, const moh_attn_config *cfg, bool per_layer, int B, int N, bool sparse,
                       moh_error *err) {
    memset(s, 0, sizeof *s);
    be_ctx_init(&s->cx, NULL);
    s->cfg = cfg;
    s->per_layer = per_layer;
    if (!(s->layer = calloc((size_t)(L > 0 ? L : 1), sizeof *s->layer)))
        return moh_fail(err, MOH_E_NOMEM, "attention: cannot allocate %d layers", L);
    for (int l = 0; l < L; l++) {
        const int rc = F(attn_layer_init)(&s->layer[l], s->cx.be, &cfg[per_layer ? l : 0], B, N, sparse, err);
        if (rc) return rc;
        s->n = l + 1;
    }
    return MOH_OK;
}

int F(attn_stack_init_acts)(F(attn_stack) *s, real **const *fields, const size_t *sizes, size_t n, int L,
                            const moh_attn_config *cfg, bool per_layer, int B, int N, bool sparse,
                            const char *what, moh_error *err) {
    size_t total = 0;
    real *acts = F(views_alloc)(fields, sizes, n, &total);
    if (!acts) {
        memset(s, 0, sizeof *s);
        return moh_fail(err, MOH_E_NOMEM,
                        "%s: cannot allocate activations for a batch of %d x %d tokens (%zu MiB): lower --batch-size",
                        what, B, N, (total * sizeof(real)) >> 20);
    }
    const int rc = F(attn_stack_init)(s, L, cfg, per_layer, B, N, sparse, err);
    s->acts = acts;
    if (rc) F(attn_stack_free)(s);
    return rc;
}

void F(attn_stack_free)(F(attn_stack) *s) {
    for (int l = 0; l < s->n; l++) F(attn_layer_free)(&s->layer[l]);
    free(s->layer);
    be_ctx_release(&s->cx); /* after the layers that borrow it */
    free(s->acts);
    memset(s, 0, sizeof *s);
}
