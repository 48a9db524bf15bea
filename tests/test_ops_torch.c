/* Core ops' _f32 forwards against PyTorch float32 outputs in tests/fixtures/ops.safetensors
 * (written by tools/ref/gen_op_fixtures.py; the constants below must match that script).
 * Every check: test_rel_err (max |diff| / max |ref|) <= 1e-5. */
#include "moh.h"
#include "ops/ops.h"
#include "test_util.h"

#include <string.h>

#define TOL 1e-5
enum { M = 33, C = 48, V = 50, NEL = 500, RN = 300, RH = 2, RD = 16 };
static const float LN_EPS = 1e-5f, RMS_EPS = 1e-6f, SMOOTH = 0.1f;
static const double ROPE_THETA = 10000.0;
#define FIXTURE "tests/fixtures/ops.safetensors"

static test_ctx T;
static moh_safetensors ST;

/* Reads tensor name of the given shape into a new buffer (NULL, and a failed check, if absent). */
static float *get(const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    float *buf = calloc((size_t)n, sizeof(float));
    moh_error err = {0};
    int rc = buf ? moh_st_read_f32(&ST, name, ndim, shape, buf, &err) : MOH_E_NOMEM;
    CHECK(&T, rc == MOH_OK, "read %s: %s", name, err.msg);
    if (rc != MOH_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void report(const char *op, double err) {
    printf("  %-24s f32 vs torch %9.2e  (<= %.0e)\n", op, err, TOL);
    CHECK(&T, err <= TOL, "%s: error %.3e > %.0e", op, err, TOL);
}

static void test_layernorm(void) {
    float *x = get("layernorm.x", 2, M, C, 0), *w = get("layernorm.w", 1, C, 0, 0),
          *b = get("layernorm.b", 1, C, 0, 0), *ref = get("layernorm.out", 2, M, C, 0);
    float *out = calloc((size_t)M * C, sizeof(float)), *mean = calloc(M, sizeof(float)),
          *rstd = calloc(M, sizeof(float));
    if (x && w && b && ref && out && mean && rstd) {
        layernorm_forward_f32(out, mean, rstd, x, w, b, M, C, LN_EPS);
        report("layernorm", test_rel_err_f32(out, ref, (long)M * C));
    }
    free(x), free(w), free(b), free(ref), free(out), free(mean), free(rstd);
}

static void test_rmsnorm(void) {
    float *x = get("rmsnorm.x", 2, M, C, 0), *w = get("rmsnorm.w", 1, C, 0, 0),
          *ref = get("rmsnorm.out", 2, M, C, 0);
    float *out = calloc((size_t)M * C, sizeof(float)), *rstd = calloc(M, sizeof(float));
    if (x && w && ref && out && rstd) {
        rmsnorm_forward_f32(out, rstd, x, w, M, C, RMS_EPS);
        report("rmsnorm (HF)", test_rel_err_f32(out, ref, (long)M * C));
    }
    free(x), free(w), free(ref), free(out), free(rstd);
}

static void test_unary(const char *op, const char *xname, const char *oname,
                       void (*fwd)(float *, const float *, long)) {
    float *x = get(xname, 1, NEL, 0, 0), *ref = get(oname, 1, NEL, 0, 0);
    float *out = calloc(NEL, sizeof(float));
    if (x && ref && out) {
        fwd(out, x, NEL);
        report(op, test_rel_err_f32(out, ref, NEL));
    }
    free(x), free(ref), free(out);
}

static void test_softmax(void) {
    float *x = get("softmax.x", 2, M, V, 0), *ref = get("softmax.out", 2, M, V, 0);
    float *out = calloc((size_t)M * V, sizeof(float));
    if (x && ref && out) {
        softmax_forward_f32(out, x, M, V);
        report("softmax", test_rel_err_f32(out, ref, (long)M * V));
    }
    free(x), free(ref), free(out);
}

static void test_cross_entropy(void) {
    float *lg = get("cross_entropy.logits", 2, M, V, 0), *tgf = get("cross_entropy.targets", 1, M, 0, 0),
          *ref = get("cross_entropy.loss", 1, 1, 0, 0);
    float *probs = calloc((size_t)M * V, sizeof(float));
    int tg[M], ignored = 0;
    if (lg && tgf && ref && probs) {
        for (int m = 0; m < M; m++) {
            tg[m] = (int)tgf[m]; /* -100 = ignored (any negative target is) */
            ignored += tg[m] < 0;
        }
        CHECK(&T, ignored > 0, "fixture has no ignored rows");
        float loss = cross_entropy_forward_f32(probs, lg, tg, M, V, SMOOTH);
        report("cross_entropy ls=0.1", test_rel_err_f32(&loss, ref, 1));
    }
    free(lg), free(tgf), free(ref), free(probs);
}

static void test_rope(void) {
    float *x = get("rope.x", 3, RN, RH, RD), *ref = get("rope.out", 3, RN, RH, RD);
    int *pos = calloc(RN, sizeof(int));
    if (x && ref && pos) {
        for (int t = 0; t < RN; t++) pos[t] = t;
        moh_attn_config a;
        moh_attn_config_default(&a);
        a.head_dim = RD;
        a.rope_theta = ROPE_THETA;
        rope_forward_f32(x, RN, RH * RD, RH, pos, &a);
        report("rope (HF, pos 0..299)", test_rel_err_f32(x, ref, (long)RN * RH * RD));
    }
    free(x), free(ref), free(pos);
}

int main(void) {
    moh_error err = {0};
    int rc = moh_st_open(&ST, FIXTURE, &err);
    CHECK(&T, rc == MOH_OK, "open %s: %s (regenerate: python3 tools/ref/gen_op_fixtures.py)", FIXTURE,
          err.msg);
    if (rc != MOH_OK) return test_finish("test_ops_torch", &T);
    test_layernorm();
    test_rmsnorm();
    test_unary("gelu_erf", "gelu_erf.x", "gelu_erf.out", gelu_erf_forward_f32);
    test_unary("gelu_tanh", "gelu_tanh.x", "gelu_tanh.out", gelu_tanh_forward_f32);
    test_unary("silu", "silu.x", "silu.out", silu_forward_f32);
    test_softmax();
    test_cross_entropy();
    test_rope();
    moh_st_close(&ST);
    return test_finish("test_ops_torch", &T);
}
