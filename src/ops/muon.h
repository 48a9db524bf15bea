/* Muon: momentum orthogonalised by a Newton-Schulz iteration, for the hidden weight matrices of a
 * model (K. Jordan et al. 2024, github.com/KellerJordan/Muon `Muon` / `zeropower_via_newtonschulz5`;
 * the update scale 0.2 sqrt(max(rows, cols)) that matches AdamW's update RMS, so AdamW's lr and
 * weight decay carry over: J. Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv
 * 2502.16982, eq. 4). Embeddings, output heads, routers, norms and biases stay on AdamW. */
#ifndef MOH_MUON_H
#define MOH_MUON_H
#include <stddef.h>

#include "ops/bf16.h"

typedef struct muon_config {
    double momentum;     /* mu of the momentum buffer (0.95) */
    double weight_decay; /* decoupled, times lr, as AdamW's */
    int ns_steps;        /* Newton-Schulz iterations (5) */
} muon_config;

/* Scratch floats muon_step needs for a [rows, cols] matrix (2 rows cols + 2 min(rows, cols)^2). */
size_t muon_work_floats(int rows, int cols);

/* Orthogonalises x [rows, cols] (row-major) in place: x <- NS^k(x / (|x|_F + 1e-7)), the
 * quintic iteration x <- a x + (b A + c A^2) x with A = x x^T (rows <= cols; x^T x on the right
 * otherwise), (a, b, c) = (3.4445, -4.7750, 2.0315): singular values move into about [0.7, 1.2],
 * singular vectors stay. Products in bf16 with fp32 accumulation when bc (a bf16 GEMM context with
 * no weight mirror), else fp32. work: rows cols + 2 min(rows, cols)^2 floats. */
void muon_orthogonalise(bf16_ctx *bc, float *x, int rows, int cols, int steps, float *work);

/* One Muon update of the matrix w [rows, cols] (row-major) from its gradient g at learning rate
 * lr: buf = mu buf + g; u = g + mu buf (Nesterov); w -= lr (0.2 sqrt(max(rows, cols))
 * muon_orthogonalise(bc, u) + wd w). buf [rows, cols] is the momentum (zero at the start); work:
 * muon_work_floats(rows, cols) floats. */
void muon_step(const muon_config *c, bf16_ctx *bc, float *w, const float *g, float *buf, int rows, int cols,
               double lr, float *work);
#endif
