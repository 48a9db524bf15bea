/* Template of the op prototypes: included twice by ops.h, with real = float / F(x) = x##_f32 and
 * real = double / F(x) = x##_f64. No include guard on purpose.
 *
 * Conventions: row-major; M = number of rows (tokens); backward functions ACCUMULATE (+=) into
 * every gradient they write (dinp, dweight, dbias); any gradient pointer may be NULL to skip it. */

/* One allocation with views (llm.c's habit): a block of sum(sizes[0..n)) values (*total gets it),
 * *fields[i] pointed at its i-th part in order. Returns the block (the caller frees it), or NULL
 * when malloc fails (fields untouched). */
real *F(views_alloc)(real **const *fields, const size_t *sizes, size_t n, size_t *total);

/* out[M,O] = inp[M,I] @ w[O,I]^T + b[O] (b may be NULL). PyTorch nn.Linear. */
void F(linear_forward)(real *out, const real *inp, const real *w, const real *b, int M, int I, int O);
void F(linear_backward)(real *dinp, real *dw, real *db, const real *dout, const real *inp,
                        const real *w, int M, int I, int O);

/* LayerNorm over the last dim C: out = (x - mean) * rstd * w + b; mean[M], rstd[M] saved. w and b
 * both NULL: no affine (nn.LayerNorm(elementwise_affine=False), the DiT's); backward then takes
 * dw = db = NULL. */
void F(layernorm_forward)(real *out, real *mean, real *rstd, const real *inp, const real *w,
                          const real *b, int M, int C, real eps);
void F(layernorm_backward)(real *dinp, real *dw, real *db, const real *dout, const real *inp,
                           const real *w, const real *mean, const real *rstd, int M, int C);

/* adaLN modulate (DiT models.py modulate): out[b, n, :] = x[b, n, :] (1 + scale[b, :]) + shift[b, :];
 * x, out [B, N, D]; shift and scale rows of stride ld (chunks of the adaLN output [B, k D]). */
void F(modulate_forward)(real *out, const real *x, const real *shift, const real *scale, int ld, int B, int N,
                         int D);
/* Its backward: ACCUMULATES dx (may be NULL) and dshift, dscale (rows of stride ld). */
void F(modulate_backward)(real *dx, real *dshift, real *dscale, const real *dout, const real *x, const real *scale,
                          int ld, int B, int N, int D);
/* The adaLN gated residual: x[b, n, :] += gate[b, :] * y[b, n, :] (gate rows of stride ld). */
void F(gated_add_forward)(real *x, const real *gate, const real *y, int ld, int B, int N, int D);
/* Its backward for d x = g: dgate[b, :] += sum_n g y (ACCUMULATES); dy = g gate (written). */
void F(gated_add_backward)(real *dy, real *dgate, const real *g, const real *gate, const real *y, int ld, int B,
                           int N, int D);

/* RMSNorm (HF LlamaRMSNorm): out = x * rsqrt(mean(x^2) + eps) * w; rstd[M] saved. */
void F(rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *w, int M, int C, real eps);
/* Residual add fused with the RMSNorm that follows it: sum = a + b, then out = rmsnorm(sum) as
 * rmsnorm_forward (same arithmetic, one pass). All [M, C] row-major; rstd [M]. */
void F(add_rmsnorm_forward)(real *sum, real *out, real *rstd, const real *a, const real *b, const real *w,
                            int M, int C, real eps);
void F(rmsnorm_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                         const real *rstd, int M, int C);

/* GELU, exact erf form (timm ViT, nn.GELU()) and tanh form (DiT, nn.GELU(approximate="tanh")). */
void F(gelu_erf_forward)(real *out, const real *inp, long n);
void F(gelu_erf_backward)(real *dinp, const real *dout, const real *inp, long n);
void F(gelu_tanh_forward)(real *out, const real *inp, long n);
void F(gelu_tanh_backward)(real *dinp, const real *dout, const real *inp, long n);

/* SiLU x*sigmoid(x), and SwiGLU out = silu(gate) * up (HF LlamaMLP), all [n]. */
void F(silu_forward)(real *out, const real *inp, long n);
void F(silu_backward)(real *dinp, const real *dout, const real *inp, long n);
void F(swiglu_forward)(real *out, const real *gate, const real *up, long n);
void F(swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up, long n);
/* swiglu_forward that also saves sig[n] = sigmoid(gate) (the exp a backward would recompute). */
void F(swiglu_forward_sig)(real *out, real *sig, const real *gate, const real *up, long n);
/* As swiglu_backward with sig from swiglu_forward_sig (same results, no exp), but WRITES dgate and
 * dup (both non-NULL) instead of accumulating. */
void F(swiglu_backward_set)(real *dgate, real *dup, const real *dout, const real *gate, const real *sig,
                            const real *up, long n);

/* Row softmax over the last dim: out[M,N]. Backward uses the saved output. */
void F(softmax_forward)(real *out, const real *inp, int M, int N);
void F(softmax_backward)(real *dinp, const real *dout, const real *out, int M, int N);

/* Cross-entropy over logits[M,V] with integer targets[M] (rows with target < 0 are ignored),
 * optional label smoothing eps (PyTorch F.cross_entropy(label_smoothing=eps)). Writes the
 * softmax probs[M,V] for backward; returns the mean loss in nats over non-ignored rows
 * (0 if none). backward: dlogits += dloss * d(mean loss)/d(logits). */
real F(cross_entropy_forward)(real *probs, const real *logits, const int *targets, int M, int V,
                              real label_smoothing);
void F(cross_entropy_backward)(real *dlogits, const real *probs, const int *targets, int M, int V,
                               real label_smoothing, real dloss);

/* Embedding lookup: out[M,C] = table[ids[m], :]; backward scatters into dtable[V,C]. */
void F(embedding_forward)(real *out, const int *ids, const real *table, int M, int C);
void F(embedding_backward)(real *dtable, const real *dout, const int *ids, int M, int C);

/* RoPE, rotate-half (HF LLaMA): in place on x viewed as T rows of n_heads * a->head_dim values
 * starting every row_stride elements; row t has position pos[t]. Pairs (j, j + head_dim/2),
 * angle = pos * rope_inv_freq(a, j), computed in `real` precision like HF's float32 path.
 * a->head_dim must be even and a->rope_theta > 0. backward applies the inverse rotation in place. */
void F(rope_forward)(real *x, int T, int row_stride, int n_heads, const int *pos,
                     const moh_attn_config *a);
void F(rope_backward)(real *dx, int T, int row_stride, int n_heads, const int *pos,
                      const moh_attn_config *a);
/* Inverse frequency of pair j (0 <= j < head_dim / 2) of a's RoPE: 1 / theta^(2j/head_dim),
 * rescaled by a->rope_scaling (moh.h; transformers' _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_llama3_parameters). Every RoPE path (reference,
 * head-sparse tables, KV-cache decode) takes its frequencies from here. */
real F(rope_inv_freq)(const moh_attn_config *a, int j);
