/* Fréchet distance of feature statistics through LAPACK (frechet.h). */
#include "analysis/frechet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* LAPACK (Fortran, column-major; a symmetric matrix reads the same in either order). The
 * trailing size_t arguments are the hidden lengths of the character arguments (gfortran ABI). */
void dsyevd_(const char *jobz, const char *uplo, const int *n, double *a, const int *lda, double *w, double *work,
             const int *lwork, int *iwork, const int *liwork, int *info, size_t jobz_len, size_t uplo_len);

int fd_sym_eig(double *A, int n, double *w, bool vectors, moh_error *err) {
    if (n < 1) return moh_fail(err, MOH_E_ARG, "eigendecomposition: n is %d, expected >= 1", n);
    for (size_t i = 0; i < (size_t)n * n; i++)
        if (!isfinite(A[i])) return moh_fail(err, MOH_E_FORMAT, "eigendecomposition: the %dx%d matrix holds %g", n, n, A[i]);
    const char jobz = vectors ? 'V' : 'N', uplo = 'L';
    int lwork = -1, liwork = -1, info = 0, iq = 0;
    double wq = 0;
    dsyevd_(&jobz, &uplo, &n, A, &n, w, &wq, &lwork, &iq, &liwork, &info, 1, 1); /* workspace query */
    lwork = (int)wq + 1;
    liwork = iq > 0 ? iq : 1;
    double *work = malloc(sizeof(double) * (size_t)lwork);
    int *iwork = malloc(sizeof(int) * (size_t)liwork);
    if (!work || !iwork) {
        free(work);
        free(iwork);
        return moh_fail(err, MOH_E_NOMEM, "eigendecomposition of %dx%d: out of memory", n, n);
    }
    if (info == 0) dsyevd_(&jobz, &uplo, &n, A, &n, w, work, &lwork, iwork, &liwork, &info, 1, 1);
    free(work);
    free(iwork);
    if (info != 0)
        return moh_fail(err, MOH_E_FORMAT, "eigendecomposition of %dx%d: LAPACK dsyevd info %d (did not converge)", n,
                        n, info);
    return MOH_OK;
}

int fd_sqrtm_psd(const double *A, int n, double *out, moh_error *err) {
    if (n < 1) return moh_fail(err, MOH_E_ARG, "matrix square root: n is %d, expected >= 1", n);
    double *V = malloc(sizeof(double) * ((size_t)n * n + (size_t)n));
    if (!V) return moh_fail(err, MOH_E_NOMEM, "matrix square root of %dx%d: out of memory", n, n);
    double *w = V + (size_t)n * n;
    memcpy(V, A, sizeof(double) * (size_t)n * n);
    int rc = fd_sym_eig(V, n, w, true, err);
    if (!rc) {
        for (int k = 0; k < n; k++) w[k] = sqrt(w[k] > 0 ? w[k] : 0.0);
        /* out = sum_k sqrt(lambda_k) v_k v_k^T, v_k = row k of V */
#pragma omp parallel for schedule(static) if (n >= 64)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int k = 0; k < n; k++) s += w[k] * V[(size_t)k * n + i] * V[(size_t)k * n + j];
                out[(size_t)i * n + j] = s;
            }
    }
    free(V);
    return rc;
}

int fd_moments(const float *x, long n, int d, double *mean, double *cov, moh_error *err) {
    if (n < 2 || d < 1)
        return moh_fail(err, MOH_E_ARG, "feature statistics: %ld vectors of dimension %d, expected at least 2 of >= 1", n,
                        d);
    for (int j = 0; j < d; j++) mean[j] = 0;
    for (long r = 0; r < n; r++)
        for (int j = 0; j < d; j++) mean[j] += x[(size_t)r * d + j];
    for (int j = 0; j < d; j++) mean[j] /= (double)n;
#pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < d; i++) {
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (long r = 0; r < n; r++)
                s += ((double)x[(size_t)r * d + i] - mean[i]) * ((double)x[(size_t)r * d + j] - mean[j]);
            cov[(size_t)i * d + j] = cov[(size_t)j * d + i] = s / (double)(n - 1);
        }
    }
    return MOH_OK;
}

/* c [n, n] = a b (row-major) */
static void matmul(const double *a, const double *b, double *c, int n) {
#pragma omp parallel for schedule(static) if (n >= 64)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += a[(size_t)i * n + k] * b[(size_t)k * n + j];
            c[(size_t)i * n + j] = s;
        }
}

int fd_distance(const double *mu1, const double *S1, const double *mu2, const double *S2, int d, double *fd,
                moh_error *err) {
    if (d < 1) return moh_fail(err, MOH_E_ARG, "Fréchet distance: dimension %d, expected >= 1", d);
    const size_t dd = (size_t)d * d;
    double *R = malloc(sizeof(double) * (3 * dd + (size_t)d));
    if (!R) return moh_fail(err, MOH_E_NOMEM, "Fréchet distance in %d dimensions: out of memory", d);
    double *T = R + dd, *M = T + dd, *w = M + dd;
    int rc = fd_sqrtm_psd(S1, d, R, err);
    if (!rc) {
        /* M = R S2 R, then symmetrised (rounding) */
        matmul(R, S2, T, d);
        matmul(T, R, M, d);
        for (int i = 0; i < d; i++)
            for (int j = 0; j < i; j++) {
                const double s = 0.5 * (M[(size_t)i * d + j] + M[(size_t)j * d + i]);
                M[(size_t)i * d + j] = M[(size_t)j * d + i] = s;
            }
        rc = fd_sym_eig(M, d, w, false, err);
    }
    if (!rc) {
        double dist = 0, tr = 0, trs = 0;
        for (int i = 0; i < d; i++) {
            dist += (mu1[i] - mu2[i]) * (mu1[i] - mu2[i]);
            tr += S1[(size_t)i * d + i] + S2[(size_t)i * d + i];
            trs += sqrt(w[i] > 0 ? w[i] : 0.0);
        }
        *fd = dist + tr - 2.0 * trs;
    }
    free(R);
    return rc;
}
