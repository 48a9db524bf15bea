/* Block-quantised matrix-vector products (quant.h). Sources: ggml/src/ggml-quants.c
 * (quantize_row_*_ref), ggml/src/ggml-cpu/arch/x86/quants.c (quantize_row_q8_0 / q8_1, the
 * vec_dot kernels' integer sums and scales). */
#include "ops/quant.h"

#include "io/gguf.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <cpuid.h>
#define QUANT_X86 1
#endif

/* The types on the hot path: elements per block (32, or a K-quant's 256 in sub-blocks of 32) and
 * bytes per block (ggml-common.h). */
static const struct {
    int type, qk, bytes;
    const char *name;
} QTYPES[] = {
    {MOH_GGML_Q8_0, 32, 34, "q8_0"},   {MOH_GGML_Q4_0, 32, 18, "q4_0"},   {MOH_GGML_Q4_1, 32, 20, "q4_1"},
    {MOH_GGML_Q5_0, 32, 22, "q5_0"},   {MOH_GGML_Q5_1, 32, 24, "q5_1"},   {MOH_GGML_Q4_K, 256, 144, "q4_K"},
    {MOH_GGML_Q5_K, 256, 176, "q5_K"}, {MOH_GGML_Q6_K, 256, 210, "q6_K"},
};
#define NQTYPES (int)(sizeof QTYPES / sizeof QTYPES[0])

static int qtype_index(int type) {
    for (int i = 0; i < NQTYPES; i++)
        if (QTYPES[i].type == type) return i;
    return -1;
}

static bool is_k(int type) { return type == MOH_GGML_Q4_K || type == MOH_GGML_Q5_K || type == MOH_GGML_Q6_K; }

int quant_supported(int type) { return qtype_index(type) >= 0; }

size_t quant_block_bytes(int type) {
    const int i = qtype_index(type);
    return i < 0 ? 0 : (size_t)QTYPES[i].bytes;
}

int quant_block_size(int type) {
    const int i = qtype_index(type);
    return i < 0 ? 0 : QTYPES[i].qk;
}

size_t quant_row_bytes(int type, int64_t cols) {
    const int qk = quant_block_size(type);
    return qk ? (size_t)(cols / qk) * quant_block_bytes(type) : 0;
}

int quant_fit(int type, int64_t cols) {
    if (!quant_supported(type) || cols < 1 || cols % QUANT_BLOCK) return -1;
    if (cols % quant_block_size(type) == 0) return type;
    return type == MOH_GGML_Q4_K ? MOH_GGML_Q5_0 : type == MOH_GGML_Q5_K ? MOH_GGML_Q5_1 : MOH_GGML_Q8_0;
}

int quant_head_type(int type) { return is_k(type) ? MOH_GGML_Q6_K : MOH_GGML_Q8_0; }

const char *quant_type_name(int type) {
    const int i = qtype_index(type);
    return i < 0 ? "?" : QTYPES[i].name;
}

/* a equal to b but for the case of ASCII letters (llama-quantize's names are "Q4_K", ggml's "q4_K") */
static bool same_name(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return false;
    return *a == *b;
}

int quant_type_parse(const char *s, int *type, moh_error *err) {
    for (int i = 0; s && i < NQTYPES; i++)
        if (same_name(s, QTYPES[i].name)) {
            *type = QTYPES[i].type;
            return MOH_OK;
        }
    return moh_fail(err, MOH_E_ARG, "quantisation '%s', expected " QUANT_TYPE_LIST, s ? s : "(none)");
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

/* ggml's nearest_int: round half to even */
static int nearest(float x) { return (int)lrintf(x); }

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* 32 values of a legacy block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) into y, as quantize_row_*_ref. */
static void quant_block32(int type, const float *v, uint8_t *y) {
    if (type == MOH_GGML_Q8_0) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        st_h(y, d);
        for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
    } else if (type == MOH_GGML_Q4_0 || type == MOH_GGML_Q5_0) { /* symmetric: the extreme value -> -8 / -16 */
        const bool five = type == MOH_GGML_Q5_0;
        const int half = five ? 16 : 8, top = five ? 31 : 15;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(v[j])) {
                amax = fabsf(v[j]);
                max = v[j];
            }
        const float d = max / (float)-half, id = d != 0.0f ? 1.0f / d : 0.0f;
        st_h(y, d);
        uint8_t *qs = y + (five ? 6 : 2);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = (int8_t)(v[j] * id + (float)half + 0.5f), c = (int8_t)(v[16 + j] * id + (float)half + 0.5f);
            a = a < top ? a : top;
            c = c < top ? c : top;
            qs[j] = (uint8_t)((a & 15) | (c & 15) << 4);
            qh |= (uint32_t)(a >> 4 & 1) << j | (uint32_t)(c >> 4 & 1) << (j + 16);
        }
        if (five) memcpy(y + 2, &qh, 4); /* little-endian, as ggml's memcpy */
    } else { /* Q4_1, Q5_1: d q + min */
        const bool five = type == MOH_GGML_Q5_1;
        float mn = v[0], mx = v[0];
        for (int j = 1; j < 32; j++) {
            mn = fminf(mn, v[j]);
            mx = fmaxf(mx, v[j]);
        }
        const float d = (mx - mn) / (five ? 31.0f : 15.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
        st_h(y, d);
        st_h(y + 2, mn);
        uint8_t *qs = y + (five ? 8 : 4);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = (int8_t)((v[j] - mn) * id + 0.5f), c = (int8_t)((v[16 + j] - mn) * id + 0.5f);
            if (!five) {
                a = a < 15 ? a : 15;
                c = c < 15 ? c : 15;
            }
            qs[j] = (uint8_t)((a & 15) | (c & 15) << 4);
            qh |= (uint32_t)(a >> 4 & 1) << j | (uint32_t)(c >> 4 & 1) << (j + 16);
        }
        if (five) memcpy(y + 4, &qh, 4);
    }
}

/* ggml's make_qkx2_quants: levels L[n] in 0..nmax for x ~ scale L - min, the scale and min (>= 0)
 * by weighted least squares over nstep + 1 trial scales around nmax / (max - min). */
static float qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min, uint8_t *Laux,
                  float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        min = fminf(min, x[i]);
        max = fmaxf(max, x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
        const float diff = scale * L[i] + min - x[i];
        best += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur = 0;
            for (int i = 0; i < n; i++) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                cur += w[i] * diff * diff;
            }
            if (cur < best) {
                memcpy(L, Laux, (size_t)n);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Q4_K / Q5_K 6-bit scale j and min j of the 12 packed bytes q (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One Q4_K / Q5_K super-block of 256 (quantize_row_q4_K_ref / q5_K_ref): per sub-block of 32 a scale
 * and a min by qkx2, both quantised to 6 bits against the block's largest, then the levels again. */
static void quant_block_k45(bool five, const float *x, uint8_t *y) {
    const int nmax = five ? 31 : 15;
    uint8_t L[256], Laux[32], *sc = y + 4;
    float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = qkx2(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, five ? -0.5f : -1.0f, 0.1f,
                         five ? 15 : 20);
        max_scale = fmaxf(max_scale, scales[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        const int ls = clampi(nearest(inv_scale * scales[j]), 0, 63), lm = clampi(nearest(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            sc[j] = (uint8_t)ls;
            sc[j + 4] = (uint8_t)lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    st_h(y, max_scale / 63.0f);
    st_h(y + 2, max_min / 63.0f);
    const float d = ld_h(y), dmin = ld_h(y + 2);
    for (int j = 0; j < 8; j++) {
        int is, im;
        scale_min_k4(j, sc, &is, &im);
        const float ds = d * (float)is;
        if (ds == 0.0f) continue;
        const float dm = dmin * (float)im;
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(nearest((x[32 * j + l] + dm) / ds), 0, nmax);
    }
    uint8_t *qh = y + 16, *qs = y + (five ? 48 : 16);
    if (five) memset(qh, 0, 32);
    for (int c = 0; c < 4; c++) /* sub-blocks 2c and 2c + 1 share 32 bytes: low and high nibbles */
        for (int l = 0; l < 32; l++) {
            const int a = L[64 * c + l], b = L[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((a & 15) | (b & 15) << 4);
            if (five) qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
        }
}

/* ggml's make_qx_quants (rmse_type 1): signed levels in -nmax .. nmax - 1 (stored + nmax) and the
 * scale, by x^2-weighted least squares over 19 trial scales. */
static float qx(int n, int nmax, const float *x, uint8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (uint8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (!is) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (uint8_t)(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* One Q6_K super-block of 256 (quantize_row_q6_K_ref): a signed 8-bit scale per 16 values against the
 * block's f16 d, 6-bit levels. */
static void quant_block_q6k(const float *x, uint8_t *y) {
    uint8_t L[256], *ql = y, *qh = y + 128;
    int8_t *sc = (int8_t *)(y + 192);
    float scales[16], max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = qx(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs) {
            max_abs = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    if (max_abs < 1e-15f) {
        memset(y, 0, 210);
        return;
    }
    const float iscale = -128.0f / max_scale;
    st_h(y + 208, 1 / iscale);
    for (int ib = 0; ib < 16; ib++) sc[ib] = (int8_t)(nearest(iscale * scales[ib]) < 127 ? nearest(iscale * scales[ib]) : 127);
    const float d = ld_h(y + 208);
    for (int j = 0; j < 16; j++) {
        const float ds = d * (float)sc[j];
        if (ds == 0.0f) continue;
        for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)(clampi(nearest(x[16 * j + i] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = L + 128 * h + l;
            ql[l] = (uint8_t)((v[0] & 15) | (v[64] & 15) << 4);
            ql[l + 32] = (uint8_t)((v[32] & 15) | (v[96] & 15) << 4);
            qh[l] = (uint8_t)((v[0] >> 4) | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
        }
}

void quant_row(int type, const float *x, int64_t K, uint8_t *out) {
    const int qk = quant_block_size(type);
    const size_t bb = quant_block_bytes(type);
    for (int64_t b = 0; b < K / qk; b++) {
        const float *v = x + b * qk;
        uint8_t *y = out + (size_t)b * bb;
        if (type == MOH_GGML_Q6_K) quant_block_q6k(v, y);
        else if (type == MOH_GGML_Q4_K || type == MOH_GGML_Q5_K) quant_block_k45(type == MOH_GGML_Q5_K, v, y);
        else quant_block32(type, v, y);
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
        bool finite = true;
        for (int j = 0; j < QUANT_BLOCK; j++) {
            amax = fmaxf(amax, fabsf(v[j]));
            finite = finite && fabsf(v[j]) <= FLT_MAX;
        }
        if (!finite) { /* NaN or inf in: a NaN scale, so every product with the block is NaN, as in fp32 */
            memset(q, 0, QUANT_BLOCK);
            a->d[b] = a->s[b] = NAN;
            a->sum[b] = 0;
            continue;
        }
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
/* Where sub-block j (32 columns from 32 j) of a row lives: its block, and its index in a K-quant's 8. */
static inline const uint8_t *sub_block(int type, const uint8_t *row, int j, size_t bb, int *s) {
    if (is_k(type)) {
        *s = j & 7;
        return row + (size_t)(j >> 3) * bb;
    }
    *s = 0;
    return row + (size_t)j * bb;
}

/* Sub-block s of block p as unsigned levels u[32] and w = dlo/dhi (u - off) + mn for the first and
 * last 16 values (ggml-common.h layouts; dequant_row_* in ggml-quants.c). */
static void unpack_sub(int type, const uint8_t *p, int s, int *u, float *dlo, float *dhi, int *off, float *mn) {
    *off = 0;
    *mn = 0;
    switch (type) {
    case MOH_GGML_Q8_0:
        for (int i = 0; i < 32; i++) u[i] = (int8_t)p[2 + i];
        *dlo = ld_h(p);
        break;
    case MOH_GGML_Q4_0: case MOH_GGML_Q4_1: case MOH_GGML_Q5_0: case MOH_GGML_Q5_1: {
        const bool one = type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1, five = type == MOH_GGML_Q5_0 || type == MOH_GGML_Q5_1;
        const uint8_t *qs = p + 2 + (one ? 2 : 0) + (five ? 4 : 0);
        uint32_t qh = 0;
        if (five) memcpy(&qh, p + (one ? 4 : 2), 4);
        for (int i = 0; i < 16; i++) {
            u[i] = (qs[i] & 15) | (int)((qh >> i & 1) << 4);
            u[16 + i] = (qs[i] >> 4) | (int)((qh >> (16 + i) & 1) << 4);
        }
        *dlo = ld_h(p);
        if (one) *mn = ld_h(p + 2);
        else *off = five ? 16 : 8;
        break;
    }
    case MOH_GGML_Q4_K: case MOH_GGML_Q5_K: {
        const bool five = type == MOH_GGML_Q5_K;
        const uint8_t *qs = p + (five ? 48 : 16) + 32 * (s >> 1);
        int sc, m;
        scale_min_k4(s, p + 4, &sc, &m);
        for (int i = 0; i < 32; i++) u[i] = (qs[i] >> (4 * (s & 1)) & 15) | (five ? (p[16 + i] >> s & 1) << 4 : 0);
        *dlo = ld_h(p) * (float)sc;
        *mn = -(ld_h(p + 2) * (float)m);
        break;
    }
    default: { /* Q6_K */
        const int h = s >> 2, t = s & 3;
        const uint8_t *ql = p + 64 * h + 32 * (t & 1), *qh = p + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * h + 2 * t;
        for (int i = 0; i < 32; i++) u[i] = (ql[i] >> (4 * (t >> 1)) & 15) | (qh[i] >> (2 * t) & 3) << 4;
        const float d = ld_h(p + 208);
        *dlo = d * (float)sc[0];
        *dhi = d * (float)sc[1];
        *off = 32;
        return;
    }
    }
    *dhi = *dlo;
}

/* Portable: the integer sums of each sub-block (per 16 where the scales differ), then the scales, as
 * ggml's generic vec_dot. Not auto-vectorised: GCC 12 at -O2 -march=native turns the signed x
 * signed Q8_0 sum into vpdpbusd, which reads one side as unsigned (wrong sums; tests/test_quant.c
 * caught it). The min term: Q4_1 / Q5_1 m s (s as Q8_1 stores it), the K-quants' min dx sum(q). */
#if defined(__GNUC__) && !defined(__clang__)
#define QUANT_NO_AUTOVEC __attribute__((optimize("no-tree-vectorize")))
#else
#define QUANT_NO_AUTOVEC
#endif
QUANT_NO_AUTOVEC static void gemv_scalar(int type, const uint8_t *w, size_t rb, const float *bias, const quant_act *x,
                                         const int *blk, int nblk, int bw, int n, float *out) {
    const int nb = bw / QUANT_BLOCK;
    const size_t bb = quant_block_bytes(type);
    int u[32];
    for (int r = 0; r < n; r++) {
        float acc = 0;
        for (int k = 0; k < nblk; k++)
            for (int j = blk[k] * nb, e = j + nb; j < e; j++) {
                int s, off;
                float dlo, dhi, mn;
                const uint8_t *p = sub_block(type, w + (size_t)r * rb, j, bb, &s);
                unpack_sub(type, p, s, u, &dlo, &dhi, &off, &mn);
                const int8_t *xq = x->q + (size_t)j * QUANT_BLOCK;
                int32_t lo = 0, hi = 0;
                for (int i = 0; i < 16; i++) lo += (u[i] - off) * xq[i];
                for (int i = 16; i < 32; i++) hi += (u[i] - off) * xq[i];
                acc += x->d[j] * (dlo * (float)lo + dhi * (float)hi);
                if (type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1) acc += mn * x->s[j];
                else if (mn != 0.0f) acc += mn * x->d[j] * (float)x->sum[j];
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

/* One kernel per (type, ISA): NR rows at a time share each activation sub-block of 32; per sub-block
 * and row an integer dot of 32 products (DOT: u8 x s8 -> 8 int32, lane i the products 4i .. 4i + 3)
 * scaled in fp32. Q8_0 multiplies |w| by x with w's sign (vpsignb), as ggml's mul_sum_i8_pairs; the
 * 5-bit types' fifth bits come from qh (one bit per value: spread to bytes; Q5_K: bit s of byte i);
 * Q6_K's levels are 0..63 less 32 (32 sum(x) per lane, one DOT with ones per sub-block) with one
 * scale per 16 values (lanes 0-3, 4-7). */
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
    /* 0x10 in byte i where bit i of qh is set */                                                                     \
    TARGET static inline __m256i bit4_##SUF(const uint8_t *p) {                                                       \
        uint32_t qh;                                                                                                   \
        memcpy(&qh, p, 4);                                                                                             \
        const __m256i idx = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);   \
        const __m256i bm = _mm256_set1_epi64x((long long)0x8040201008040201ULL);                                      \
        const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), idx);                                        \
        return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bm), bm), _mm256_set1_epi8(0x10));               \
    }                                                                                                                  \
    TARGET static inline __m256i shr_##SUF(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }    \
    /* K-quant columns in whole blocks of 256 (sub-blocks j0 .. j0 + 8 nblocks): each row's scales and   \
     * mins decoded once per block (Q4_K / Q5_K: into vectors, scaled by the 8 activation scales at    \
     * once, the mins' term one vector per block), each 32-byte load of levels feeding its two         \
     * sub-blocks; Q6_K's 32 sum(x) once per block for all rows. */                                    \
    TARGET __attribute__((always_inline)) static inline void kblocks_##SUF(int type, const uint8_t *w, size_t rb,     \
                                                                           const quant_act *x, int j0, int nblocks,   \
                                                                           int NR, __m256 *acc) {                     \
        const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);                 \
        const size_t bb = quant_block_bytes(type);                                                                     \
        for (int b = 0; b < nblocks; b++) {                                                                            \
            const int jb = j0 + 8 * b;                                                                                 \
            const int8_t *xq = x->q + (size_t)jb * QUANT_BLOCK;                                                        \
            __m256i xs[8]; /* Q6_K: 32 sum(x) per lane of each sub-block, for all the rows */                         \
            for (int t = 0; t < 8 && type == MOH_GGML_Q6_K; t++)                                                       \
                xs[t] = _mm256_slli_epi32(DOT(m1, _mm256_loadu_si256((const __m256i *)(xq + t * QUANT_BLOCK))), 5);    \
            const __m256 dxv = _mm256_loadu_ps(x->d + jb); /* the 8 sub-blocks' activation scales and sums */        \
            const __m256 sumv = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(x->sum + jb)));              \
            for (int i = 0; i < NR; i++) {                                                                             \
                const uint8_t *p = w + (size_t)i * rb + (size_t)(jb >> 3) * bb;                                        \
                if (type == MOH_GGML_Q6_K) {                                                                           \
                    const float d = h_##SUF(p + 208);                                                                  \
                    const int8_t *sc = (const int8_t *)(p + 192);                                                      \
                    for (int h = 0; h < 2; h++) {                                                                      \
                        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));                    \
                        const __m256i q0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));                          \
                        const __m256i q1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));                     \
                        const __m256i u[4] = {                                                                         \
                            _mm256_or_si256(_mm256_and_si256(q0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),  \
                            _mm256_or_si256(_mm256_and_si256(q1, m4),                                                  \
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),     \
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),                            \
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),     \
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),                            \
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4))};    \
                        for (int t = 0; t < 4; t++) {                                                                  \
                            const int j = jb + 4 * h + t;                                                              \
                            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (4 * h + t) * QUANT_BLOCK));  \
                            const __m256i d6 = _mm256_sub_epi32(DOT(u[t], xv), xs[4 * h + t]);                         \
                            const int8_t *st = sc + 8 * h + 2 * t;                                                     \
                            const float dd = d * x->d[j];                                                              \
                            const __m256 dv = _mm256_set_m128(_mm_set1_ps(dd * (float)st[1]), _mm_set1_ps(dd * (float)st[0])); \
                            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d6), dv, acc[i]);                              \
                        }                                                                                              \
                    }                                                                                                  \
                    continue;                                                                                          \
                }                                                                                                      \
                const bool five = type == MOH_GGML_Q5_K;                                                               \
                /* the 8 scales and 8 mins from their 12 bytes at once (ggml's kmask trick), as floats */              \
                uint32_t ut[4];                                                                                        \
                memcpy(ut, p + 4, 12);                                                                                 \
                ut[3] = ((ut[2] >> 4) & 0x0F0F0F0Fu) | (((ut[1] >> 6) & 0x03030303u) << 4);                            \
                const uint32_t mlo = ut[1] & 0x3F3F3F3Fu;                                                              \
                ut[1] = (ut[2] & 0x0F0F0F0Fu) | (((ut[0] >> 6) & 0x03030303u) << 4);                                   \
                ut[0] &= 0x3F3F3F3Fu;                                                                                  \
                const __m256 scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(ut[0] | (uint64_t)ut[1] << 32))));\
                const __m256 mnv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(mlo | (uint64_t)ut[3] << 32))));\
                /* scale of sub-block s: (d sc_s) dx_s; the mins' term dmin m_s dx_s sum_s, all 8 in one vector */     \
                const __m256 dsx = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(h_##SUF(p)), scv), dxv);                 \
                acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(h_##SUF(p + 2)), mnv), dxv), sumv, acc[i]);\
                const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();      \
                for (int t = 0; t < 4; t++) {                                                                          \
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + (five ? 48 : 16) + 32 * t));            \
                    __m256i u0 = _mm256_and_si256(q, m4), u1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);          \
                    if (five) {                                                                                        \
                        const __m256i h2 = shr_##SUF(qh, 2 * t);                                                       \
                        u0 = _mm256_or_si256(u0, _mm256_slli_epi16(_mm256_and_si256(h2, m1), 4));                      \
                        u1 = _mm256_or_si256(u1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h2, 1), m1), 4));\
                    }                                                                                                  \
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + 2 * t * QUANT_BLOCK));                \
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + (2 * t + 1) * QUANT_BLOCK));          \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u0, x0)),                                          \
                                             _mm256_permutevar8x32_ps(dsx, _mm256_set1_epi32(2 * t)), acc[i]);         \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u1, x1)),                                          \
                                             _mm256_permutevar8x32_ps(dsx, _mm256_set1_epi32(2 * t + 1)), acc[i]);     \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    TARGET __attribute__((always_inline)) static inline void rows_##SUF(int type, const uint8_t *w, size_t rb,        \
                                                                        const quant_act *x, const int *blk, int nblk, \
                                                                        int nb, int NR, float *res) {                 \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};         \
        float lin[4] = {0, 0, 0, 0};                                                                                   \
        const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);                 \
        const size_t bb = quant_block_bytes(type);                                                                     \
        const bool one = type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1;                                               \
        for (int k = 0; k < nblk; k++) {                                                                               \
            if (is_k(type) && blk[k] * nb % 8 == 0 && nb % 8 == 0) { /* whole blocks of 256 */                        \
                kblocks_##SUF(type, w, rb, x, blk[k] * nb, nb / 8, NR, acc);                                           \
                continue;                                                                                              \
            }                                                                                                          \
            for (int j = blk[k] * nb, e = j + nb; j < e; j++) {                                                        \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)j * QUANT_BLOCK));              \
                const float dx = x->d[j];                                                                              \
                const __m256i xs = type == MOH_GGML_Q6_K ? DOT(m1, xv) : _mm256_setzero_si256();                       \
                for (int i = 0; i < NR; i++) {                                                                         \
                    int s;                                                                                             \
                    const uint8_t *p = sub_block(type, w + (size_t)i * rb, j, bb, &s);                                 \
                    if (type == MOH_GGML_Q8_0) {                                                                       \
                        const __m256i wv = _mm256_loadu_si256((const __m256i *)(p + 2));                               \
                        const __m256i d8 = DOT(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));                    \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d8), _mm256_set1_ps(h_##SUF(p) * dx), acc[i]);     \
                    } else if (!is_k(type)) { /* Q4_0, Q4_1, Q5_0, Q5_1 */                                             \
                        const bool five = type == MOH_GGML_Q5_0 || type == MOH_GGML_Q5_1;                              \
                        const __m128i q = _mm_loadu_si128((const __m128i *)(p + 2 + (one ? 2 : 0) + (five ? 4 : 0)));   \
                        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);                   \
                        if (five) u = _mm256_or_si256(u, bit4_##SUF(p + (one ? 4 : 2)));                               \
                        const float dd = h_##SUF(p) * dx;                                                              \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u, xv)), _mm256_set1_ps(dd), acc[i]);          \
                        if (one) lin[i] += h_##SUF(p + 2) * x->s[j];                                                   \
                        else lin[i] -= dd * (float)((five ? 16 : 8) * x->sum[j]);                                      \
                    } else if (type == MOH_GGML_Q6_K) {                                                                \
                        const int h = s >> 2, t = s & 3;                                                               \
                        const __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (t & 1)));           \
                        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));                    \
                        const __m256i u = _mm256_or_si256(_mm256_and_si256(shr_##SUF(ql, 4 * (t >> 1)), m4),           \
                                                          _mm256_slli_epi16(_mm256_and_si256(shr_##SUF(qh, 2 * t), m3), 4)); \
                        const __m256i d6 = _mm256_sub_epi32(DOT(u, xv), _mm256_slli_epi32(xs, 5));                     \
                        const int8_t *sc = (const int8_t *)(p + 192) + 8 * h + 2 * t;                                  \
                        const float d = h_##SUF(p + 208) * dx;                                                         \
                        const __m256 dv = _mm256_set_m128(_mm_set1_ps(d * (float)sc[1]), _mm_set1_ps(d * (float)sc[0])); \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d6), dv, acc[i]);                                  \
                    } else { /* Q4_K, Q5_K */                                                                          \
                        const bool five = type == MOH_GGML_Q5_K;                                                       \
                        int sc, m;                                                                                     \
                        scale_min_k4(s, p + 4, &sc, &m);                                                               \
                        const __m256i q = _mm256_loadu_si256((const __m256i *)(p + (five ? 48 : 16) + 32 * (s >> 1))); \
                        __m256i u = _mm256_and_si256(shr_##SUF(q, 4 * (s & 1)), m4);                                   \
                        if (five) {                                                                                    \
                            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));                          \
                            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(shr_##SUF(qh, s), m1), 4));      \
                        }                                                                                              \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u, xv)),                                       \
                                                 _mm256_set1_ps(h_##SUF(p) * (float)sc * dx), acc[i]);                 \
                        lin[i] -= h_##SUF(p + 2) * (float)m * dx * (float)x->sum[j];                                   \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
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
        switch (type) {                                                                                                \
        case MOH_GGML_Q8_0: gemv_t_##SUF(MOH_GGML_Q8_0, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q4_0: gemv_t_##SUF(MOH_GGML_Q4_0, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q4_1: gemv_t_##SUF(MOH_GGML_Q4_1, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q5_0: gemv_t_##SUF(MOH_GGML_Q5_0, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q5_1: gemv_t_##SUF(MOH_GGML_Q5_1, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q4_K: gemv_t_##SUF(MOH_GGML_Q4_K, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        case MOH_GGML_Q5_K: gemv_t_##SUF(MOH_GGML_Q5_K, w, rb, bias, x, blk, nblk, bw, n, out); break;                 \
        default: gemv_t_##SUF(MOH_GGML_Q6_K, w, rb, bias, x, blk, nblk, bw, n, out); break;                            \
        }                                                                                                              \
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
        return moh_fail(err, MOH_E_ARG, "quantised weights: type %d, expected " QUANT_TYPE_LIST, type);
    const int qk = quant_block_size(type);
    if (rows < 1 || cols < qk || cols % qk)
        return moh_fail(err, MOH_E_ARG, "quantised weights: a [%lld, %lld] %s matrix, expected columns a multiple of %d",
                        (long long)rows, (long long)cols, quant_type_name(type), qk);
    if (off > t->nbase || (size_t)(rows * cols) > t->nbase - off)
        return moh_fail(err, MOH_E_ARG, "quantised weights: matrix at %zu past the %zu parameters", off, t->nbase);
    if (t->n && off < t->m[t->n - 1].off + (size_t)(t->m[t->n - 1].rows * t->m[t->n - 1].cols))
        return moh_fail(err, MOH_E_ARG, "quantised weights: matrix at %zu overlaps or precedes the last one", off);
    if (t->n >= t->cap) return moh_fail(err, MOH_E_ARG, "quantised weights: more than %d matrices", t->cap);
    const size_t rb = quant_row_bytes(type, cols);
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
    const size_t rb = t->m[t->n - 1].row_bytes, nb = (size_t)(cols / quant_block_size(type));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = t->base + off + (size_t)(r * cols);
        quant_row(type, x, cols, room + (size_t)r * rb);
        if (quant_blocks_finite(type, room + (size_t)r * rb, nb)) continue;
        float amax = 0; /* a scale rounded to f16 infinity (or a non-finite weight): refused, as moh convert does */
        for (int64_t j = 0; j < cols; j++) amax = fabsf(x[j]) > amax || x[j] != x[j] ? fabsf(x[j]) : amax;
        return moh_fail(err, MOH_E_ARG, "quantise to %s: row %lld of the matrix at float offset %zu holds %g, whose "
                        "block scale is beyond float16's range (65504): this model cannot be quantised so",
                        quant_type_name(type), (long long)r, off, (double)amax);
    }
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

bool quant_blocks_finite(int type, const uint8_t *data, size_t nblocks) {
    const int i = qtype_index(type);
    if (i < 0) return false;
    /* byte offsets of the f16 scales in a block (ggml-common.h): d first, m / dmin next; Q6_K's d last */
    const bool two = type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1 || type == MOH_GGML_Q4_K || type == MOH_GGML_Q5_K;
    const size_t at = type == MOH_GGML_Q6_K ? 208 : 0, bytes = (size_t)QTYPES[i].bytes;
    unsigned bad = 0;
    for (size_t b = 0; b < nblocks; b++) {
        const uint8_t *p = data + b * bytes + at;
        uint16_t d, m = 0;
        memcpy(&d, p, 2);
        if (two) memcpy(&m, p + 2, 2);
        bad |= (d & 0x7C00u) == 0x7C00u || (m & 0x7C00u) == 0x7C00u; /* exponent all ones: inf or NaN */
    }
    return !bad;
}

void quant_table_describe(const quant_table *t, char *out, size_t cap) {
    size_t used = 0;
    if (cap) out[0] = 0;
    for (int k = 0; k < NQTYPES; k++) {
        int n = 0;
        for (int i = 0; i < t->n; i++) n += t->m[i].type == QTYPES[k].type;
        if (n && used < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%d %s", used ? ", " : "", n, QTYPES[k].name);
    }
    if (used < cap)
        snprintf(out + used, cap - used, " (%.1f %s)", (double)t->bytes / (t->bytes < 100000 ? 1e3 : 1e6),
                 t->bytes < 100000 ? "kB" : "MB");
}
