/* `moh layer` against PyTorch: for every fixture folder in tests/fixtures/layer/ (written by
 * tools/ref/gen_layer_fixtures.py from an independent PyTorch implementation, in float64), run the
 * moh binary (MOH_BIN, set by CTest) and compare y, gates, lb_loss and every gradient: relative
 * error max|a-b| / max|b| <= 1e-5 per tensor. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moh.h"
#include "test_util.h"

#define FIXDIR "tests/fixtures/layer"

static void check_fixture(test_ctx *ctx, const char *moh_bin, const char *name) {
    char dir[512], cmd[4096], outp[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    snprintf(outp, sizeof outp, "%s/moh_test_out_%d_%s.safetensors", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), name);
    snprintf(cmd, sizeof cmd,
             "'%s' layer --config %s/config.json --weights %s/weights.safetensors --input "
             "%s/input.safetensors --grad-output %s/grad_output.safetensors --output '%s'",
             moh_bin, dir, dir, dir, dir, outp);
    int rc = system(cmd);
    CHECK(ctx, rc == 0, "%s: moh layer exited with %d", name, rc);
    if (rc) return;
    moh_safetensors got, want;
    moh_error err;
    char wpath[600];
    snprintf(wpath, sizeof wpath, "%s/expected.safetensors", dir);
    CHECK(ctx, moh_st_open(&want, wpath, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, moh_st_open(&got, outp, &err) == MOH_OK, "%s", err.msg);
    double worst = 0.0;
    const char *worst_name = "";
    CHECK(ctx, got.n_tensors == want.n_tensors, "%s: %d tensors written, %d expected", name, got.n_tensors, want.n_tensors);
    for (int i = 0; i < want.n_tensors; i++) {
        const moh_st_tensor *w = &want.tensors[i];
        const moh_st_tensor *g = moh_st_find(&got, w->name);
        CHECK(ctx, g != NULL, "%s: output lacks '%s'", name, w->name);
        if (!g) continue;
        float *a = malloc(sizeof(float) * (size_t)(w->numel + 1)), *b = malloc(sizeof(float) * (size_t)(w->numel + 1));
        int ok = moh_st_read_f32(&got, w->name, w->ndim, w->shape, a, &err) == MOH_OK &&
                 moh_st_read_f32(&want, w->name, w->ndim, w->shape, b, &err) == MOH_OK;
        CHECK(ctx, ok, "%s: %s", name, err.msg);
        if (ok) {
            const double e = test_rel_err_f32(a, b, w->numel);
            CHECK(ctx, e <= 1e-5, "%s: tensor '%s' rel err %.3g > 1e-5", name, w->name, e);
            if (e > worst) { worst = e; worst_name = w->name; }
        }
        free(a);
        free(b);
    }
    printf("  %-30s %2d tensors, worst rel err %.2e (%s)\n", name, want.n_tensors, worst, worst_name);
    moh_st_close(&got);
    moh_st_close(&want);
    unlink(outp);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    test_ctx ctx = {0};
    const char *moh_bin = getenv("MOH_BIN") ? getenv("MOH_BIN") : "build/moh";
    DIR *d = opendir(FIXDIR);
    CHECK(&ctx, d != NULL, "cannot open %s (run from the repository root)", FIXDIR);
    if (!d) return test_finish("test_layer_fixtures", &ctx);
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof p, FIXDIR "/%s/config.json", e->d_name);
        if (access(p, R_OK) == 0) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof names[0], cmp_str);
    CHECK(&ctx, n >= 10, "only %d fixtures found in %s", n, FIXDIR);
    for (int i = 0; i < n; i++) {
        check_fixture(&ctx, moh_bin, names[i]);
        free(names[i]);
    }
    return test_finish("test_layer_fixtures", &ctx);
}
