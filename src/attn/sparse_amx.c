/* AMX-BF16 tiles for the head-sparse bf16 products (sparse_kernels.h: sp_mm_bf16 with
 * SP_TILES_AMX), and a C emulation of the same instructions (SP_TILES_AMX_EMU) so that the tiling,
 * padding and layout logic is tested on every CPU, not only on those with AMX.
 *
 * One kernel body serves both: each tile instruction is a macro that either issues it or calls
 * its emulation, chosen by `emu`. The tile registers are configured once per call as 16 rows x 64
 * bytes (palette 1): tmm0..3 hold a 32 x 32 block of C (fp32), tmm4 / tmm5 16 rows of A each (32
 * bf16 = 16 pairs of k), tmm6 / tmm7 the B tiles of two 16-column blocks (16 pairs of k x 16
 * columns, pairs interleaved: the VNNI layout sp_mm_bf16 already takes). Where 16 rows of C are
 * equally spaced, whole accumulator tiles are loaded from and stored to C directly (acc: the
 * products add onto C's values in the tile); other C blocks go through a buffer. Operand blocks
 * that run past R, n or K2 are copied into zero-padded buffers first, so no tile load reads
 * outside the caller's operands.
 * Semantics of TDPBF16PS: Intel SDM vol. 2, "TDPBF16PS" (per element the products of each pair of
 * k, added to the fp32 accumulator in k order; bf16 denormal inputs read as zero, denormal results
 * flushed). The emulation adds the two products of a pair one after the other; hardware may round
 * that pair differently, so tests compare the two within tolerances, never bitwise. */
#include "attn/sparse_kernels.h"

#include <stdalign.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AMX_X86 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#else
#define AMX_X86 0
#define AMX_TARGET
#endif

/* Emulated tile registers: 8 x 16 rows x 64 bytes. */
typedef struct amx_emu {
    alignas(64) unsigned char t[8][16][64];
} amx_emu;

static void emu_zero(amx_emu *E, int t) { memset(E->t[t], 0, sizeof E->t[t]); }
static void emu_load(amx_emu *E, int t, const void *base, long stride) {
    for (int r = 0; r < 16; r++) memcpy(E->t[t][r], (const char *)base + (long)r * stride, 64);
}
static void emu_store(const amx_emu *E, int t, void *base, long stride) {
    for (int r = 0; r < 16; r++) memcpy((char *)base + (long)r * stride, E->t[t][r], 64);
}
/* bf16 -> fp32 with denormals read as zero. */
static float emu_bf16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (h & 0x7F80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float emu_ftz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (!(u & 0x7F800000u)) u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}
/* tmm[c] (16 x 16 fp32) += tmm[a] (16 x 16 pairs) . tmm[b] (16 pairs x 16 columns). */
static void emu_dp(amx_emu *E, int c, int a, int b) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc;
            memcpy(&acc, &E->t[c][m][4 * n], 4);
            for (int k = 0; k < 16; k++) {
                acc = emu_ftz(acc + emu_bf16(&E->t[a][m][4 * k]) * emu_bf16(&E->t[b][k][4 * n]));
                acc = emu_ftz(acc + emu_bf16(&E->t[a][m][4 * k + 2]) * emu_bf16(&E->t[b][k][4 * n + 2]));
            }
            memcpy(&E->t[c][m][4 * n], &acc, 4);
        }
}

/* The tile instructions (tile numbers must be literals). Compiler barriers on both sides of each
 * load and store keep C writes and reads of a buffer on their side of the tile instruction that
 * reads or writes it (the asm of GCC's intrinsics does not say it touches memory). Tile registers
 * stay live across the memset / memcpy calls of the edge copies: glibc's never touch tile state. */
#if AMX_X86
#define T_ZERO(t)                          \
    do {                                   \
        if (emu) emu_zero(E, t);           \
        else _tile_zero(t);                \
    } while (0)
#define T_LOAD(t, p, s)                                   \
    do {                                                  \
        __asm__ volatile("" ::: "memory");                \
        if (emu) emu_load(E, t, p, s);                    \
        else _tile_loadd(t, p, s);                        \
        __asm__ volatile("" ::: "memory");                \
    } while (0)
#define T_STORE(t, p, s)                                  \
    do {                                                  \
        __asm__ volatile("" ::: "memory");                \
        if (emu) emu_store(E, t, p, s);                   \
        else _tile_stored(t, p, s);                       \
        __asm__ volatile("" ::: "memory");                \
    } while (0)
#define T_DP(c, a, b)                      \
    do {                                   \
        if (emu) emu_dp(E, c, a, b);       \
        else _tile_dpbf16ps(c, a, b);      \
    } while (0)
#else
#define T_ZERO(t) emu_zero(E, t)
#define T_LOAD(t, p, s) emu_load(E, t, p, s)
#define T_STORE(t, p, s) emu_store(E, t, p, s)
#define T_DP(c, a, b) emu_dp(E, c, a, b)
#endif

/* The tile configuration (ldtilecfg's 64-byte operand). */
typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

static inline int amin(int a, int b) { return a < b ? a : b; }

/* One B tile: pairs k0 .. k0 + kk of columns jj .. jj + nc into tile t, straight from b when the
 * tile is whole, else through the zero-padded bb. */
#define B_TILE(t, jj)                                                                                    \
    do {                                                                                                 \
        const int nc_ = amin(16, n - (jj));                                                              \
        if (kk == 16 && nc_ == 16) {                                                                     \
            T_LOAD(t, b + (long)k0 * ldb + 2 * (jj), 2 * ldb);                                           \
        } else {                                                                                         \
            memset(bb, 0, sizeof bb);                                                                    \
            for (int k = 0; k < kk; k++) memcpy(bb + 32 * k, b + (long)(k0 + k) * ldb + 2 * (jj), 4 * (size_t)nc_); \
            T_LOAD(t, bb, 64);                                                                           \
        }                                                                                                \
    } while (0)

/* One A tile: rows rb .. rb + m, pairs k0 .. k0 + kk into tile t, straight from a0 when whole, else
 * through the zero-padded ab. */
#define A_TILE(t, rb, m)                                                                                 \
    do {                                                                                                 \
        if (a0 && (m) == 16 && kk == 16) {                                                               \
            T_LOAD(t, a0 + (long)(rb) * lda + 2 * k0, 2 * lda);                                          \
        } else {                                                                                         \
            if ((m) < 16 || kk < 16) memset(ab, 0, sizeof ab); /* whole: every byte written below */     \
            for (int r = 0; r < (m); r++) {                                                              \
                const uint16_t *row = a0 ? a0 + (long)((rb) + r) * lda : ap[(rb) + r];                  \
                memcpy(ab + 32 * r, row + 2 * k0, 4 * (size_t)kk);                                       \
            }                                                                                            \
            T_LOAD(t, ab, 64);                                                                           \
        }                                                                                                \
    } while (0)

/* Accumulator tile t for C rows rb .. rb + 16, columns jj .. jj + 16: loaded from C when `direct`
 * (16 equally spaced rows ld apart, a whole tile) and acc, else zeroed. */
#define C_INIT(t, direct, rb, jj, ld)                                                                    \
    do {                                                                                                 \
        if ((direct) && acc) T_LOAD(t, c[rb] + (jj), 4 * (ld));                                          \
        else T_ZERO(t);                                                                                  \
    } while (0)
/* ... and back: stored into C when direct, else through cb into the m rows and nc columns of C
 * (added when acc). */
#define C_DONE(t, direct, rb, m, jj, ld)                                                                 \
    do {                                                                                                 \
        if (direct) {                                                                                    \
            T_STORE(t, c[rb] + (jj), 4 * (ld));                                                          \
        } else {                                                                                         \
            T_STORE(t, cb, 64);                                                                          \
            c_add(c, rb, m, jj, amin(16, n - (jj)), cb, acc);                                            \
        }                                                                                                \
    } while (0)

/* C rows rb .. rb + m, columns jj .. jj + nc (+)= the 16-wide rows of cb. */
static void c_add(float *const *c, int rb, int m, int jj, int nc, const float *cb, bool acc) {
    for (int r = 0; r < m; r++) {
        float *cr = c[rb + r] + jj;
        const float *s = cb + 16 * r;
        if (acc) {
#pragma omp simd
            for (int j = 0; j < nc; j++) cr[j] += s[j];
        } else {
            memcpy(cr, s, sizeof(float) * (size_t)nc);
        }
    }
}

/* The spacing of C rows rb .. rb + m in floats when there are 16 of them, equally spaced and
 * ascending; else 0. */
static long c_spacing(float *const *c, int rb, int m) {
    if (m != 16) return 0;
    const long ld = c[rb + 1] - c[rb];
    for (int r = 2; r < 16; r++)
        if (c[rb + r] - c[rb] != r * ld) return 0;
    return ld > 0 ? ld : 0;
}

/* Blocks of 32 rows x 32 columns: A tiles tmm4 (rows rb..+16) and tmm5 (the next 16), B tiles tmm6
 * and tmm7 (two 16-column blocks), four accumulators tmm0..3, so each pair of k steps loads four
 * tiles for four products and no tile is rewritten while a product still reads it. */
AMX_TARGET static void amx_mm(bool emu, int R, int n, int K2, const uint16_t *const *ap, const uint16_t *a0,
                              long lda, const uint16_t *b, long ldb, float *const *c, bool acc) {
    amx_emu *E = NULL, emu_regs;
    alignas(64) uint16_t ab[16 * 32], bb[16 * 32];
    alignas(64) float cb[16 * 16];
    if (emu) E = &emu_regs;
#if AMX_X86
    else {
        amx_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
        __asm__ volatile("" ::: "memory");
        _tile_loadconfig(&cfg);
    }
#endif
    for (int r0 = 0; r0 < R; r0 += 32) {
        const int m0 = amin(16, R - r0), m1 = amin(16, R - r0 - 16); /* m1 <= 0: one row block */
        const long ld0 = c_spacing(c, r0, m0), ld1 = m1 > 0 ? c_spacing(c, r0 + 16, m1) : 0;
        for (int j0 = 0; j0 < n; j0 += 32) {
            const bool two_c = n - j0 > 16, two_r = m1 > 0;
            const bool w0 = j0 + 16 <= n, w1 = j0 + 32 <= n; /* whole column tiles */
            const bool d00 = ld0 && w0, d01 = ld0 && w1, d10 = ld1 && w0, d11 = ld1 && w1;
            C_INIT(0, d00, r0, j0, ld0);
            if (two_c) C_INIT(1, d01, r0, j0 + 16, ld0);
            if (two_r) {
                C_INIT(2, d10, r0 + 16, j0, ld1);
                if (two_c) C_INIT(3, d11, r0 + 16, j0 + 16, ld1);
            }
            for (int k0 = 0; k0 < K2; k0 += 16) {
                const int kk = amin(16, K2 - k0);
                A_TILE(4, r0, m0);
                B_TILE(6, j0);
                T_DP(0, 4, 6);
                if (two_c) {
                    B_TILE(7, j0 + 16);
                    T_DP(1, 4, 7);
                }
                if (two_r) {
                    A_TILE(5, r0 + 16, m1);
                    T_DP(2, 5, 6);
                    if (two_c) T_DP(3, 5, 7);
                }
            }
            C_DONE(0, d00, r0, m0, j0, ld0);
            if (two_c) C_DONE(1, d01, r0, m0, j0 + 16, ld0);
            if (two_r) {
                C_DONE(2, d10, r0 + 16, m1, j0, ld1);
                if (two_c) C_DONE(3, d11, r0 + 16, m1, j0 + 16, ld1);
            }
        }
    }
#if AMX_X86
    if (!emu) _tile_release();
#endif
}

void sp_amx_mm_bf16(bool emu, int R, int n, int K2, const uint16_t *const *ap, const uint16_t *a0, long lda,
                    const uint16_t *b, long ldb, float *const *c, bool acc) {
    if (R <= 0 || n <= 0) return;
    if (K2 <= 0) {
        if (!acc)
            for (int r = 0; r < R; r++) memset(c[r], 0, sizeof(float) * (size_t)n);
        return;
    }
    amx_mm(emu || !AMX_X86, R, n, K2, ap, a0, lda, b, ldb, c, acc);
}
