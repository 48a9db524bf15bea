/* Fréchet distance between two sets of feature vectors, each summarised by its mean and
 * covariance (FID: Heusel et al. 2017; the pytorch-fid / TTUR formula):
 *   d^2 = ||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr((S1^1/2 S2 S1^1/2)^1/2)
 * The trace term uses the symmetric form (equal to tr((S1 S2)^1/2) for PSD S1, S2), so only
 * eigendecompositions of symmetric matrices are needed: LAPACK dsyevd, float64. Negative
 * eigenvalues of a PSD matrix (rounding) count as 0. No global state. */
#ifndef MOH_FRECHET_H
#define MOH_FRECHET_H
#include <stdbool.h>
#include <stddef.h>

#include "moh.h"

/* Eigenvalues w [n] (ascending) of the symmetric n x n matrix A (row-major, both triangles
 * set); with vectors, A is overwritten by the eigenvectors as its rows (row i of A holds the
 * vector of w[i]), else A is destroyed. LAPACK dsyevd. MOH_E_ARG (n < 1), MOH_E_NOMEM,
 * MOH_E_FORMAT (LAPACK did not converge or the matrix holds a non-finite value). */
int fd_sym_eig(double *A, int n, double *w, bool vectors, moh_error *err);

/* out [n, n] = the symmetric PSD square root of A [n, n] (symmetric positive semi-definite,
 * row-major): V diag(sqrt(max(lambda, 0))) V^T. out may not alias A. Errors of fd_sym_eig. */
int fd_sqrtm_psd(const double *A, int n, double *out, moh_error *err);

/* Mean [d] and covariance [d, d] (unbiased, divisor n - 1, as numpy.cov) of x [n, d] (float,
 * row-major), accumulated in float64 in two passes (mean, then centred products; OpenMP over
 * rows of the covariance, deterministic). MOH_E_ARG when n < 2 or d < 1. */
int fd_moments(const float *x, long n, int d, double *mean, double *cov, moh_error *err);

/* The squared Fréchet distance d^2 above of (mu1 [d], S1 [d, d]) and (mu2, S2) into *fd (>= 0
 * up to rounding; tiny negative values from rounding are returned as they are). Errors of
 * fd_sym_eig. */
int fd_distance(const double *mu1, const double *S1, const double *mu2, const double *S2, int d, double *fd,
                moh_error *err);
#endif
