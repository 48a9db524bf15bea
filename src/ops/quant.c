/* Block-quantised matrix-vector products (quant.h). Sources: ggml/src/ggml-quants.c
 * (quantize_row_*_ref), ggml/src/ggml-cpu/arch/x86/quants.c (quantize_row_q8_0 / q8_1, the
 * vec_dot kernels' integer sums and scales). */
#include "ops/quant.h"

#include "io/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <cpuid.h>
#define QUANT_X86 1
#endif

static int q4_bytes(int type) { return type == MOH_GGML_Q4_1 ? 20 : 18; }

int quant_supported(int type) { return type == MOH_GGML_Q8_0 || type == MOH_GGML_Q4_0 || type == MOH_GGML_Q4_1; }

size_t quant_block_bytes(int type) {
    return type == MOH_GGML_Q8_0 ? 34 : type == MOH_GGML_Q4_0 ? 18 : type == MOH_GGML_Q4_1 ? 20 : 0;
}

const char *quant_type_name(int type) {
    return type == MOH_GGML_Q8_0 ? "q8_0" : type == MOH_GGML_Q4_0 ? "q4_0" : type == MOH_GGML_Q4_1 ? "q4_1" : "?";
}

int quant_type_parse(const char *s, int *type, moh_error *err) {
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1};
    for (size_t i = 0; s && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(s, quant_type_name(types[i]))) {
            *type = types[i];
            return MOH_OK;
        }
    return moh_fail(err, MOH_E_ARG, "quantisation '%s', expected q8_0, q4_0 or q4_1", s ? s : "(none)");
}

bool quant_isa_supported(quant_isa isa) {
#ifdef QUANT_X86
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    switch (isa) {
    case QUANT_ISA_SCALAR: return true;
    case QUANT_ISA_AVX2: return avx2;
    /* AVX-VNNI: cpuid leaf 7 subleaf 1, eax bit 4 (clang 14 has no "avxvnni" feature string) */
    case QUANT_ISA_AVXVNNI: return avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
    case QUANT_ISA_AVX512VNNI:
        return avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw");
    }
    return false;
#else
    return isa == QUANT_ISA_SCALAR;
#endif
}

quant_isa quant_isa_detect(void) {
    const char *no = getenv("MOH_NO_VNNI");
    const bool vnni_off = no && *no && strcmp(no, "0");
    if (!vnni_off && quant_isa_supported(QUANT_ISA_AVX512VNNI)) return QUANT_ISA_AVX512VNNI;
    if (!vnni_off && quant_isa_supported(QUANT_ISA_AVXVNNI)) return QUANT_ISA_AVXVNNI;
    return quant_isa_supported(QUANT_ISA_AVX2) ? QUANT_ISA_AVX2 : QUANT_ISA_SCALAR;
}

const char *quant_isa_name(quant_isa isa) {
    static const char *const n[] = {"portable", "AVX2 vpmaddubsw", "AVX-VNNI vpdpbusd", "AVX512-VNNI vpdpbusd"};
    return isa >= QUANT_ISA_SCALAR && isa <= QUANT_ISA_AVX512VNNI ? n[isa] : "?";
}

/* ---- f16 ------------------------------------------------------------------------------------ */

float quant_h2f(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, f;
    if (e == 0) {
        if (m == 0) f = s;
        else {
            e = 113;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            f = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) f = s | 0x7f800000u | (m << 13);
    else f = s | ((e + 112) << 23) | (m << 13);
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

uint16_t quant_f2h(float x) {
    uint32_t f;
    memcpy(&f, &x, sizeof f);
    const uint32_t s = (f >> 16) & 0x8000, a = f & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00); /* rounds to >= 65536: inf */
    if (a < 0x38800000u) { /* below the smallest normal half: a subnormal, rounded to nearest even */
        if (a < 0x33000000u) return (uint16_t)s;
        const uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, sh = 126 - e; /* 14..24 */
        uint32_t h = m >> sh;
        const uint32_t rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(s | h);
    }
    uint32_t h = ((a - 0x38000000u) >> 13);
    const uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(s | h);
}

static float ld_h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_h2f(h);
}

static void st_h(uint8_t *p, float x) {
    const uint16_t h = quant_f2h(x);
    memcpy(p, &h, 2);
}

/* ---- quantisation --------------------------------------------------------------------------- */

void quant_row(int type, const float *x, int64_t K, uint8_t *out) {
    const size_t bb = quant_block_bytes(type);
    for (int64_t b = 0; b < K / QUANT_BLOCK; b++) {
        const float *v = x + b * QUANT_BLOCK;
        uint8_t *y = out + (size_t)b * bb;
        if (type == MOH_GGML_Q8_0) {
            float amax = 0;
            for (int j = 0; j < QUANT_BLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            st_h(y, d);
            for (int j = 0; j < QUANT_BLOCK; j++) y[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
        } else if (type == MOH_GGML_Q4_0) {
            float amax = 0, max = 0;
            for (int j = 0; j < QUANT_BLOCK; j++)
                if (amax < fabsf(v[j])) {
                    amax = fabsf(v[j]);
                    max = v[j];
                }
            const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            st_h(y, d);
            for (int j = 0; j < 16; j++) {
                const int a = (int8_t)(v[j] * id + 8.5f), c = (int8_t)(v[16 + j] * id + 8.5f);
                y[2 + j] = (uint8_t)((a < 15 ? a : 15) | (c < 15 ? c : 15) << 4);
            }
        } else { /* Q4_1 */
            float mn = v[0], mx = v[0];
            for (int j = 1; j < QUANT_BLOCK; j++) {
                mn = fminf(mn, v[j]);
                mx = fmaxf(mx, v[j]);
            }
            const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            st_h(y, d);
            st_h(y + 2, mn);
            for (int j = 0; j < 16; j++) {
                const int a = (int8_t)((v[j] - mn) * id + 0.5f), c = (int8_t)((v[16 + j] - mn) * id + 0.5f);
                y[4 + j] = (uint8_t)((a < 15 ? a : 15) | (c < 15 ? c : 15) << 4);
            }
        }
    }
}

int quant_act_init(quant_act *a, size_t cap, moh_error *err) {
    memset(a, 0, sizeof *a);
    cap = (cap + QUANT_BLOCK - 1) / QUANT_BLOCK * QUANT_BLOCK;
    const size_t nb = cap / QUANT_BLOCK;
    a->block = malloc(cap + nb * (2 * sizeof(float) + sizeof(int32_t)) + 64);
    if (!a->block) return moh_fail(err, MOH_E_NOMEM, "quantised activations: cannot allocate %zu values", cap);
    a->d = a->block;
    a->s = a->d + nb;
    a->sum = (int32_t *)(a->s + nb);
    a->q = (int8_t *)(a->sum + nb);
    a->cap = cap;
    return MOH_OK;
}

void quant_act_free(quant_act *a) {
    free(a->block);
    memset(a, 0, sizeof *a);
}

/* ggml's quantize_row_q8_1 (x86): d = amax / 127, q = round-half-even(x 127 / amax), s = d sum(q). */
void quant_act_set(quant_act *a, const float *x, size_t off, size_t n) {
    for (size_t b = off / QUANT_BLOCK, e = (off + n) / QUANT_BLOCK; b < e; b++) {
        const float *v = x + b * QUANT_BLOCK;
        int8_t *q = a->q + b * QUANT_BLOCK;
        float amax = 0;
        for (int j = 0; j < QUANT_BLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < QUANT_BLOCK; j++) {
            q[j] = (int8_t)nearbyintf(v[j] * id);
            sum += q[j];
        }
        a->d[b] = quant_h2f(quant_f2h(d));
        a->s[b] = quant_h2f(quant_f2h(d * (float)sum));
        a->sum[b] = sum;
    }
}

/* ---- products ------------------------------------------------------------------------------- */

/* Portable: the integer sum of each block, then the scales, as ggml's generic vec_dot. Not
 * auto-vectorised: GCC 12 at -O2 -march=native turns the signed x signed Q8_0 sum into vpdpbusd,
 * which reads one side as unsigned (wrong sums; tests/test_quant.c caught it). */
#if defined(__GNUC__) && !defined(__clang__)
#define QUANT_NO_AUTOVEC __attribute__((optimize("no-tree-vectorize")))
#else
#define QUANT_NO_AUTOVEC
#endif
QUANT_NO_AUTOVEC static void gemv_scalar(int type, const uint8_t *w, size_t rb, const float *bias, const quant_act *x, const int *blk,
                        int nblk, int bw, int n, float *out) {
    const int nb = bw / QUANT_BLOCK;
    const size_t bb = quant_block_bytes(type);
    for (int r = 0; r < n; r++) {
        float acc = 0;
        for (int k = 0; k < nblk; k++)
            for (int j = blk[k] * nb, e = j + nb; j < e; j++) {
                const uint8_t *p = w + (size_t)r * rb + (size_t)j * bb;
                const int8_t *xq = x->q + (size_t)j * QUANT_BLOCK;
                int32_t s = 0;
                if (type == MOH_GGML_Q8_0) {
                    for (int i = 0; i < QUANT_BLOCK; i++) s += (int8_t)p[2 + i] * xq[i];
                    acc += ld_h(p) * x->d[j] * (float)s;
                } else {
                    const uint8_t *qs = p + (type == MOH_GGML_Q4_1 ? 4 : 2);
                    for (int i = 0; i < 16; i++) s += (qs[i] & 15) * xq[i] + (qs[i] >> 4) * xq[16 + i];
                    if (type == MOH_GGML_Q4_0) acc += ld_h(p) * x->d[j] * (float)(s - 8 * x->sum[j]);
                    else acc += ld_h(p) * x->d[j] * (float)s + ld_h(p + 2) * x->s[j];
                }
            }
        out[r] = acc + (bias ? bias[r] : 0.0f);
    }
}

#ifdef QUANT_X86
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVXVNNI __attribute__((target("avxvnni,avx2,fma,f16c")))
#define T_VNNI512 __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma,f16c")))
#define DOT_AVX2(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define DOT_AVXVNNI(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
#define DOT_VNNI512(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)

/* One kernel per (type, ISA): NR rows at a time share each activation block; per block and row
 * an integer dot of 32 products (DOT: u8 x s8 -> 8 int32) scaled in fp32. Q8_0 multiplies |w| by
 * x with w's sign (vpsignb), as ggml's mul_sum_i8_pairs. */
#define QUANT_KERNELS(SUF, TARGET, DOT)                                                                                \
    TARGET static inline float hsum_##SUF(__m256 v) {                                                                 \
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));                                \
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                                                        \
        s = _mm_add_ss(s, _mm_movehdup_ps(s));                                                                         \
        return _mm_cvtss_f32(s);                                                                                       \
    }                                                                                                                  \
    TARGET static inline float h_##SUF(const uint8_t *p) {                                                            \
        uint16_t h;                                                                                                    \
        memcpy(&h, p, 2);                                                                                              \
        return _cvtsh_ss(h);                                                                                           \
    }                                                                                                                  \
    TARGET __attribute__((always_inline)) static inline void rows_##SUF(int type, const uint8_t *w, size_t rb,        \
                                                                        const quant_act *x, const int *blk, int nblk, \
                                                                        int nb, int NR, float *res) {                 \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};         \
        float lin[4] = {0, 0, 0, 0};                                                                                   \
        const __m256i m4 = _mm256_set1_epi8(0x0F);                                                                     \
        const size_t bb = type == MOH_GGML_Q8_0 ? 34 : (size_t)q4_bytes(type), qo = type == MOH_GGML_Q4_1 ? 4 : 2;     \
        for (int k = 0; k < nblk; k++)                                                                                 \
            for (int j = blk[k] * nb, e = j + nb; j < e; j++) {                                                        \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)j * QUANT_BLOCK));              \
                const float dx = x->d[j];                                                                              \
                for (int i = 0; i < NR; i++) {                                                                         \
                    const uint8_t *p = w + (size_t)i * rb + (size_t)j * bb;                                            \
                    __m256i s;                                                                                         \
                    if (type == MOH_GGML_Q8_0) {                                                                       \
                        const __m256i wv = _mm256_loadu_si256((const __m256i *)(p + 2));                               \
                        s = DOT(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));                                   \
                    } else {                                                                                           \
                        const __m128i q = _mm_loadu_si128((const __m128i *)(p + qo));                                  \
                        s = DOT(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4), xv);                  \
                    }                                                                                                  \
                    const float dd = h_##SUF(p) * dx;                                                                  \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dd), acc[i]);                       \
                    if (type == MOH_GGML_Q4_0) lin[i] -= dd * (float)(8 * x->sum[j]);                                  \
                    else if (type == MOH_GGML_Q4_1) lin[i] += h_##SUF(p + 2) * x->s[j];                                \
                }                                                                                                      \
            }                                                                                                          \
        for (int i = 0; i < NR; i++) res[i] = hsum_##SUF(acc[i]) + lin[i];                                             \
    }                                                                                                                  \
    TARGET __attribute__((always_inline)) static inline void gemv_t_##SUF(int type, const uint8_t *w, size_t rb,      \
                                                                          const float *bias, const quant_act *x,      \
                                                                          const int *blk, int nblk, int bw, int n,    \
                                                                          float *out) {                               \
        const int nb = bw / QUANT_BLOCK;                                                                               \
        float res[4];                                                                                                  \
        int r = 0;                                                                                                     \
        for (; r + 4 <= n; r += 4) {                                                                                   \
            /* the next group, line by line: decode streams each row once from memory (SmolLM2 Q4_1: +60 % \
             * tokens/s over none; the group after next: +38 %) */                                                   \
            if (r + 8 <= n && nblk == 1 && nb * QUANT_BLOCK == bw)                                                    \
                for (size_t o = 0; o < 4 * rb; o += 64) _mm_prefetch((const char *)w + (size_t)(r + 4) * rb + o,     \
                                                                     _MM_HINT_T0);                                    \
            rows_##SUF(type, w + (size_t)r * rb, rb, x, blk, nblk, nb, 4, res);                                        \
            for (int i = 0; i < 4; i++) out[r + i] = res[i] + (bias ? bias[r + i] : 0.0f);                             \
        }                                                                                                              \
        for (; r < n; r++) {                                                                                           \
            rows_##SUF(type, w + (size_t)r * rb, rb, x, blk, nblk, nb, 1, res);                                        \
            out[r] = res[0] + (bias ? bias[r] : 0.0f);                                                                 \
        }                                                                                                              \
    }                                                                                                                  \
    /* the type a constant in each instance */                                                                        \
    TARGET static void gemv_##SUF(int type, const uint8_t *w, size_t rb, const float *bias, const quant_act *x,       \
                                  const int *blk, int nblk, int bw, int n, float *out) {                              \
        if (type == MOH_GGML_Q8_0) gemv_t_##SUF(MOH_GGML_Q8_0, w, rb, bias, x, blk, nblk, bw, n, out);                 \
        else if (type == MOH_GGML_Q4_0) gemv_t_##SUF(MOH_GGML_Q4_0, w, rb, bias, x, blk, nblk, bw, n, out);            \
        else gemv_t_##SUF(MOH_GGML_Q4_1, w, rb, bias, x, blk, nblk, bw, n, out);                                       \
    }

QUANT_KERNELS(avx2, T_AVX2, DOT_AVX2)
QUANT_KERNELS(avxvnni, T_AVXVNNI, DOT_AVXVNNI)
QUANT_KERNELS(vnni512, T_VNNI512, DOT_VNNI512)
#endif

void quant_gemv(int type, const uint8_t *w, size_t row_bytes, const float *b, const quant_act *x, const int *blk,
                int nblk, int bw, int n, float *out, quant_isa isa) {
#ifdef QUANT_X86
    switch (isa) {
    case QUANT_ISA_AVX512VNNI: gemv_vnni512(type, w, row_bytes, b, x, blk, nblk, bw, n, out); return;
    case QUANT_ISA_AVXVNNI: gemv_avxvnni(type, w, row_bytes, b, x, blk, nblk, bw, n, out); return;
    case QUANT_ISA_AVX2: gemv_avx2(type, w, row_bytes, b, x, blk, nblk, bw, n, out); return;
    default: break;
    }
#endif
    (void)isa;
    gemv_scalar(type, w, row_bytes, b, x, blk, nblk, bw, n, out);
}

/* ---- table ---------------------------------------------------------------------------------- */

int quant_table_init(quant_table *t, const float *base, size_t nbase, int entries, size_t owned_bytes,
                     moh_error *err) {
    memset(t, 0, sizeof *t);
    t->m = malloc(sizeof(quant_mat) * (size_t)(entries > 0 ? entries : 1));
    t->owned = owned_bytes ? malloc(owned_bytes) : NULL;
    if (!t->m || (owned_bytes && !t->owned)) {
        quant_table_free(t);
        return moh_fail(err, MOH_E_NOMEM, "quantised weights: cannot allocate %zu MiB", owned_bytes >> 20);
    }
    t->base = base;
    t->nbase = nbase;
    t->cap = entries;
    t->owned_bytes = owned_bytes;
    return MOH_OK;
}

void quant_table_free(quant_table *t) {
    free(t->m);
    free(t->owned);
    memset(t, 0, sizeof *t);
}

int quant_table_add(quant_table *t, size_t off, int64_t rows, int64_t cols, int type, const uint8_t *data,
                    uint8_t **room, moh_error *err) {
    if (!quant_supported(type))
        return moh_fail(err, MOH_E_ARG, "quantised weights: type %d, expected q8_0, q4_0 or q4_1", type);
    if (rows < 1 || cols < QUANT_BLOCK || cols % QUANT_BLOCK)
        return moh_fail(err, MOH_E_ARG, "quantised weights: a [%lld, %lld] matrix, expected columns a multiple of %d",
                        (long long)rows, (long long)cols, QUANT_BLOCK);
    if (off > t->nbase || (size_t)(rows * cols) > t->nbase - off)
        return moh_fail(err, MOH_E_ARG, "quantised weights: matrix at %zu past the %zu parameters", off, t->nbase);
    if (t->n && off < t->m[t->n - 1].off + (size_t)(t->m[t->n - 1].rows * t->m[t->n - 1].cols))
        return moh_fail(err, MOH_E_ARG, "quantised weights: matrix at %zu overlaps or precedes the last one", off);
    if (t->n >= t->cap) return moh_fail(err, MOH_E_ARG, "quantised weights: more than %d matrices", t->cap);
    const size_t rb = (size_t)(cols / QUANT_BLOCK) * quant_block_bytes(type);
    t->borrows = t->borrows || data;
    if (!data) {
        if ((size_t)rows * rb > t->owned_bytes - t->owned_used)
            return moh_fail(err, MOH_E_ARG, "quantised weights: no room for a [%lld, %lld] matrix", (long long)rows,
                            (long long)cols);
        data = t->owned + t->owned_used;
        t->owned_used += (size_t)rows * rb;
        if (room) *room = (uint8_t *)data;
    }
    t->m[t->n++] = (quant_mat){off, rows, cols, type, data, rb};
    t->bytes += (size_t)rows * rb;
    return MOH_OK;
}

int quant_table_quantize(quant_table *t, size_t off, int64_t rows, int64_t cols, int type, moh_error *err) {
    uint8_t *room = NULL;
    if (quant_table_add(t, off, rows, cols, type, NULL, &room, err)) return err->code;
    const size_t rb = t->m[t->n - 1].row_bytes;
    for (int64_t r = 0; r < rows; r++) quant_row(type, t->base + off + (size_t)(r * cols), cols, room + (size_t)r * rb);
    return MOH_OK;
}

const quant_mat *quant_table_find(const quant_table *t, const float *w) {
    if (!t || !t->n || w < t->base || w >= t->base + t->nbase) return NULL;
    const size_t at = (size_t)(w - t->base);
    int lo = 0, hi = t->n - 1;
    while (lo < hi) { /* the last entry with off <= at */
        const int mid = (lo + hi + 1) / 2;
        if (t->m[mid].off <= at) lo = mid;
        else hi = mid - 1;
    }
    const quant_mat *m = &t->m[lo];
    return at >= m->off && at < m->off + (size_t)(m->rows * m->cols) ? m : NULL;
}

bool quant_table_row(const quant_table *t, const float *w, int64_t cols, float *out) {
    const quant_mat *e = quant_table_find(t, w);
    if (!e || e->cols != cols) return false;
    const size_t at = (size_t)(w - t->base) - e->off;
    if (at % (size_t)cols) return false;
    moh_error ignore = {0}; /* a supported type and whole blocks: cannot fail */
    return moh_gguf_dequantize_raw(e->type, e->data + at / (size_t)cols * e->row_bytes, cols, out, &ignore) == MOH_OK;
}

void quant_table_describe(const quant_table *t, char *out, size_t cap) {
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1};
    size_t used = 0;
    if (cap) out[0] = 0;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        int n = 0;
        for (int i = 0; i < t->n; i++) n += t->m[i].type == types[k];
        if (n && used < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%d %s", used ? ", " : "", n, quant_type_name(types[k]));
    }
    if (used < cap)
        snprintf(out + used, cap - used, " (%.1f %s)", (double)t->bytes / (t->bytes < 100000 ? 1e3 : 1e6),
                 t->bytes < 100000 ? "kB" : "MB");
}
