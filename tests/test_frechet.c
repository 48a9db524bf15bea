/* Fréchet distance (src/analysis/frechet.c) and the classifier pass of sample quality
 * (src/models/image_quality.c): the LAPACK square root of random SPD matrices squares back to the
 * matrix; the distance against closed forms (1-D, diagonal, jointly rotated commuting
 * covariances), its symmetry and rotation invariance for non-commuting ones, zero for a set
 * against itself; moments against a hand-computed case; classifier features independent of the
 * batch size, and the FID of images against perturbed copies growing with the perturbation. */
#include <string.h>

#include "analysis/frechet.h"
#include "models/image_quality.h"
#include "models/model.h"
#include "test_util.h"

/* A = B B^T + eps I for B [n, n] uniform in [-1, 1] (symmetric positive definite) */
static void random_spd(test_rng *r, int n, double eps, double *A) {
    double *B = malloc(sizeof(double) * (size_t)n * n);
    for (int i = 0; i < n * n; i++) B[i] = test_rng_uniform(r);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = i == j ? eps : 0.0;
            for (int k = 0; k < n; k++) s += B[i * n + k] * B[j * n + k];
            A[i * n + j] = s;
        }
    free(B);
}

static void matmul(const double *a, const double *b, double *c, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

/* a random rotation Q [n, n]: the eigenvectors of a random SPD matrix (rows orthonormal) */
static void random_rotation(test_rng *r, int n, double *Q) {
    double *w = malloc(sizeof(double) * (size_t)n);
    moh_error err = {0};
    random_spd(r, n, 0.5, Q);
    fd_sym_eig(Q, n, w, true, &err);
    free(w);
}

/* Q^T diag(d) Q */
static void rotated_diag(const double *Q, const double *d, int n, double *out) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += Q[k * n + i] * d[k] * Q[k * n + j];
            out[i * n + j] = s;
        }
}

static void test_sqrtm(test_ctx *t) {
    test_rng r = {0x51ED5EEDULL};
    const int sizes[3] = {1, 7, 48};
    for (int s = 0; s < 3; s++) {
        const int n = sizes[s];
        double *A = malloc(sizeof(double) * (size_t)n * n), *R = malloc(sizeof(double) * (size_t)n * n),
               *RR = malloc(sizeof(double) * (size_t)n * n);
        random_spd(&r, n, 0.1, A);
        moh_error err = {0};
        CHECK(t, fd_sqrtm_psd(A, n, R, &err) == MOH_OK, "%s", err.msg);
        matmul(R, R, RR, n);
        CHECK(t, test_rel_err_f64(RR, A, (long)n * n) < 1e-11, "n %d: sqrtm(A)^2 vs A rel err %.3g", n,
              test_rel_err_f64(RR, A, (long)n * n));
        double asym = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) asym = fmax(asym, fabs(R[i * n + j] - R[j * n + i]));
        CHECK(t, asym < 1e-12, "n %d: sqrtm not symmetric (%.3g)", n, asym);
        free(A);
        free(R);
        free(RR);
    }
    /* a known case: sqrt of [[5, 4], [4, 5]] = [[2, 1], [1, 2]] */
    const double A2[4] = {5, 4, 4, 5}, want[4] = {2, 1, 1, 2};
    double R2[4];
    moh_error err = {0};
    CHECK(t, fd_sqrtm_psd(A2, 2, R2, &err) == MOH_OK && test_rel_err_f64(R2, want, 4) < 1e-14,
          "sqrtm [[5,4],[4,5]] = [[%g, %g], [%g, %g]]", R2[0], R2[1], R2[2], R2[3]);
    double bad[4] = {1, NAN, NAN, 1}, w[2];
    CHECK(t, fd_sym_eig(bad, 2, w, false, &err) == MOH_E_FORMAT, "NaN matrix accepted");
}

static void test_distance(test_ctx *t) {
    moh_error err = {0};
    double fd = -1;
    /* 1-D: (m1 - m2)^2 + (s1 - s2)^2 */
    const double m1 = 0.3, m2 = -1.2, v1 = 2.25, v2 = 0.49;
    CHECK(t, fd_distance(&m1, &v1, &m2, &v2, 1, &fd, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, fabs(fd - (1.5 * 1.5 + (1.5 - 0.7) * (1.5 - 0.7))) < 1e-12, "1-D: %.15g", fd);

    /* commuting covariances Q^T D Q: sum (m1 - m2)^2 + sum (sqrt d1 - sqrt d2)^2 */
    enum { N = 12 };
    test_rng r = {0xF1DF1DULL};
    double Q[N * N], d1[N], d2[N], S1[N * N], S2[N * N], mu1[N], mu2[N], want = 0;
    random_rotation(&r, N, Q);
    for (int i = 0; i < N; i++) {
        d1[i] = 0.2 + 1.5 * (test_rng_uniform(&r) + 1);
        d2[i] = 0.1 + 2.0 * (test_rng_uniform(&r) + 1);
        mu1[i] = test_rng_uniform(&r);
        mu2[i] = test_rng_uniform(&r);
        want += (mu1[i] - mu2[i]) * (mu1[i] - mu2[i]) + (sqrt(d1[i]) - sqrt(d2[i])) * (sqrt(d1[i]) - sqrt(d2[i]));
    }
    rotated_diag(Q, d1, N, S1);
    rotated_diag(Q, d2, N, S2);
    CHECK(t, fd_distance(mu1, S1, mu2, S2, N, &fd, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, fabs(fd - want) < 1e-10 * want, "commuting: %.15g vs %.15g", fd, want);
    CHECK(t, fd_distance(mu1, S1, mu1, S1, N, &fd, &err) == MOH_OK && fabs(fd) < 1e-10, "self: %.3g", fd);

    /* non-commuting: symmetric in its arguments, invariant under a joint rotation */
    double A[N * N], B[N * N], fab = 0, fba = 0, frot = 0;
    random_spd(&r, N, 0.05, A);
    random_spd(&r, N, 0.05, B);
    fd_distance(mu1, A, mu2, B, N, &fab, &err);
    fd_distance(mu2, B, mu1, A, N, &fba, &err);
    CHECK(t, fab > 0 && fabs(fab - fba) < 1e-9 * fab, "FD(A, B) %.15g vs FD(B, A) %.15g", fab, fba);
    double QA[N * N], RA[N * N], QB[N * N], RB[N * N], Qt[N * N], rm1[N], rm2[N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) Qt[i * N + j] = Q[j * N + i];
    matmul(Q, A, QA, N);
    matmul(QA, Qt, RA, N);
    matmul(Q, B, QB, N);
    matmul(QB, Qt, RB, N);
    for (int i = 0; i < N; i++) {
        rm1[i] = rm2[i] = 0;
        for (int k = 0; k < N; k++) {
            rm1[i] += Q[i * N + k] * mu1[k];
            rm2[i] += Q[i * N + k] * mu2[k];
        }
    }
    fd_distance(rm1, RA, rm2, RB, N, &frot, &err);
    CHECK(t, fabs(frot - fab) < 1e-9 * fab, "rotated %.15g vs %.15g", frot, fab);
}

static void test_moments(test_ctx *t) {
    /* x = [[1, 2], [3, 5], [4, 4]]: mean (8/3, 11/3); cov (n - 1 = 2) [[7/3, 11/6], [11/6, 7/3]] */
    const float x[6] = {1, 2, 3, 5, 4, 4};
    double mean[2], cov[4];
    moh_error err = {0};
    CHECK(t, fd_moments(x, 3, 2, mean, cov, &err) == MOH_OK, "%s", err.msg);
    const double wm[2] = {8.0 / 3, 11.0 / 3}, wc[4] = {7.0 / 3, 11.0 / 6, 11.0 / 6, 7.0 / 3};
    CHECK(t, test_rel_err_f64(mean, wm, 2) < 1e-15 && test_rel_err_f64(cov, wc, 4) < 1e-15,
          "mean (%g, %g) cov [[%g, %g], [%g, %g]]", mean[0], mean[1], cov[0], cov[1], cov[2], cov[3]);
    CHECK(t, fd_moments(x, 1, 2, mean, cov, &err) == MOH_E_ARG, "one vector accepted");
}

/* Random smooth 12x12 images (a blob per image), a random tiny ViT: features and predictions are
 * batch-independent; FID(images, perturbed images) is 0 unperturbed and grows with the noise. */
static void test_classifier(test_ctx *t) {
    static const char cfg[] = "{\"model_type\": \"vit\", \"img_size\": 12, \"patch_size\": 3, \"num_classes\": 3, "
                              "\"embed_dim\": 24, \"depth\": 2, \"num_heads\": 4, \"router\": \"learned\", "
                              "\"shared_heads\": 1, \"top_k\": 2}";
    model m = {0};
    moh_error err = {0};
    CHECK(t, model_from_config_text(&m, cfg, strlen(cfg), "test", &err) == MOH_OK, "%s", err.msg);
    if (!m.fam) return;
    m.fam->init_random(m.cfg, m.params, 7);
    CHECK(t, iq_check_classifier(&m, 1, 12, 12, 3, "clf", "gen", &err) == MOH_OK, "%s", err.msg);
    CHECK(t, iq_check_classifier(&m, 1, 8, 8, 3, "clf", "gen", &err) == MOH_E_CONFIG && strstr(err.msg, "12x12x1"),
          "size mismatch: %s", err.msg);
    CHECK(t, iq_check_classifier(&m, 1, 12, 12, 10, "clf", "gen", &err) == MOH_E_CONFIG && strstr(err.msg, "3 classes"),
          "class mismatch: %s", err.msg);
    enum { NI = 200, HW = 144 };
    uint8_t *px = malloc((size_t)NI * HW), *pp = malloc((size_t)NI * HW);
    test_rng r = {0xB10BULL};
    for (int i = 0; i < NI; i++) {
        const double cx = 6 + 4 * test_rng_uniform(&r), cy = 6 + 4 * test_rng_uniform(&r), s = 2 + test_rng_uniform(&r);
        for (int y = 0; y < 12; y++)
            for (int x = 0; x < 12; x++) {
                const double v = 230 * exp(-((x - cx) * (x - cx) + (y - cy) * (y - cy)) / (2 * s * s)) +
                                 20 * (test_rng_uniform(&r) + 1);
                px[i * HW + y * 12 + x] = (uint8_t)(v > 255 ? 255 : v);
            }
    }
    float *f1 = NULL, *f2 = NULL;
    int d1 = 0, d2 = 0, p1[NI], p2[NI];
    CHECK(t, iq_classify(&m, px, NI, 64, &f1, &d1, p1, NULL, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, iq_classify(&m, px, NI, 7, &f2, &d2, p2, NULL, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, d1 == 24 && d2 == 24, "feature dim %d %d", d1, d2);
    if (f1 && f2) {
        CHECK(t, test_rel_err_f32(f2, f1, (long)NI * d1) < 1e-5, "batch 7 vs 64 features rel err %.3g",
              test_rel_err_f32(f2, f1, (long)NI * d1));
        CHECK(t, !memcmp(p1, p2, sizeof p1), "predictions depend on the batch");
    }
    free(f2);
    f2 = NULL;
    double mu1[24], S1[24 * 24], mu2[24], S2[24 * 24], prev = -1;
    if (f1) fd_moments(f1, NI, 24, mu1, S1, &err);
    const double sigma[4] = {0, 8, 30, 90};
    for (int k = 0; k < 4 && f1; k++) {
        test_rng q = {0x9E57ULL + (uint64_t)k};
        for (int i = 0; i < NI * HW; i++) {
            const double v = px[i] + sigma[k] * test_rng_uniform(&q) * 1.7320508;
            pp[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        double fd = NAN;
        CHECK(t, iq_classify(&m, pp, NI, 64, &f2, &d2, p2, NULL, &err) == MOH_OK, "%s", err.msg);
        if (!f2) break;
        fd_moments(f2, NI, 24, mu2, S2, &err);
        CHECK(t, fd_distance(mu1, S1, mu2, S2, 24, &fd, &err) == MOH_OK, "%s", err.msg);
        if (k == 0) CHECK(t, fabs(fd) < 1e-9, "unperturbed FID %.3g", fd);
        else CHECK(t, fd > 1.5 * prev && fd > 1e-6, "noise %g: FID %.6g not above %.6g", sigma[k], fd, prev);
        prev = fd;
        free(f2);
        f2 = NULL;
    }
    CHECK(t, iq_classify(&m, px, 0, 64, &f2, &d2, p2, NULL, &err) == MOH_E_ARG && !f2, "0 images accepted");
    free(f1);
    free(px);
    free(pp);
    model_free(&m);
}

int main(void) {
    test_ctx t = {0};
    test_sqrtm(&t);
    test_distance(&t);
    test_moments(&t);
    test_classifier(&t);
    return test_finish("test_frechet", &t);
}
