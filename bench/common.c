/* Shared helpers of the benchmarks: statistics, machine description, list parsing. */
#include "bench.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/calib_cache.h"
#include "core/rng.h"
#include "ops/bf16.h"
#include "ops/gemm.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bench_stats bench_summarise(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    bench_stats s = {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t[0], t[n - 1]};
    return s;
}

void bench_cpu_model(char *out, size_t cap) { calib_cpu_model(out, cap); }

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "all (no limit set: the library picks the best the CPU has)";
    }
}

void bench_gemm_line(char *out, size_t cap) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(out, cap, "%s (oneDNN %d.%d.%d, max ISA %s)", gemm_library(), v->major, v->minor, v->patch,
             isa_name(dnnl_get_effective_cpu_isa()));
}

double bench_sgemm_gflops(int M, int N, int K, int reps) {
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)N * K);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    if (!A || !B || !C) {
        free(A);
        free(B);
        free(C);
        return 0.0;
    }
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first call also JIT-compiles the kernel */
        const double t0 = omp_get_wtime();
        gemm_f32(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        const double t = omp_get_wtime() - t0;
        if (r > 0 && t < best) best = t;
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * M * N * K / best * 1e-9;
}

double bench_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void bench_conditions(char *out, size_t cap) {
    double load = -1.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = -1.0;
        fclose(f);
    }
    const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
    const int nt = omp_get_max_threads();
    snprintf(out, cap, "%d thread%s, load average %.2f, OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s", nt, nt == 1 ? "" : "s",
             load, wp ? wp : "(unset)", sc ? sc : "(unset)");
}

int bench_parse_ints(const char *s, int *out, int max) {
    int n = 0;
    while (*s) {
        char *end = NULL;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1 << 24) || n >= max) return -1;
        out[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

int bench_parse_doubles(const char *s, double *out, int max) {
    int n = 0;
    while (*s) {
        char *end = NULL;
        const double v = strtod(s, &end);
        if (end == s || !(v > 0.0) || v > 1.0 || n >= max) return -1;
        out[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

void bench_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

void bench_precisions(const char *cmd, const char *value, bool *fp32, bool *bf16, char *line, size_t cap) {
    *fp32 = strcmp(value, "bf16") != 0;
    *bf16 = strcmp(value, "fp32") != 0;
    char why[160];
    if (cap) line[0] = 0;
    if (*bf16 && precision_resolve(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16) {
        fprintf(stderr, "moh bench %s: --precision %s runs fp32 only: %s\n", cmd, value, why);
        *bf16 = false;
        *fp32 = true;
    }
    if (*bf16) precision_describe(MOH_PRECISION_BF16, line, cap);
}

float bench_rng_sd(uint64_t *s, double sd) {
    const double u = (double)(moh_rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
    return (float)(u * sd * 1.7320508075688772);
}
