/* Kernels of the head-sparse attention (sparse.c): plain functions over the slice a caller hands
 * them; no threads, no timers. The fp32 ones run the instruction set `vec` names (sp_vec: AVX-512,
 * AVX2 + FMA or portable C; the caller checks the CPU), with the same results up to rounding. */
#ifndef MOH_ATTN_SPARSE_KERNELS_H
#define MOH_ATTN_SPARSE_KERNELS_H
#include <stdbool.h>
#include <stdint.h>

#include "attn/sparse.h"

#define SP_MR 6  /* rows of a register tile */
#define SP_NR 64 /* columns of a register tile (4 vectors of 16) */

/* C[M x n] (+)= A[M x K] B[K x n] (acc: add to C, else overwrite), through register tiles of
 * SP_MR rows x SP_NR columns (column block outer: a B block is reused by every row group; on
 * AVX2, vec = SP_VEC_AVX2, each in blocks of 16 columns).
 * Rows by pointer arrays, so gathers and scatters cost nothing: A(r, k) = a[r][aoff + k]
 * (amode 0) or a[k][aoff + r] (amode 1: A stored transposed); B(k, j) = b[k][boff + j];
 * C(r, j) = c[r][coff + j]. Each C element is one chain of fused multiply-adds over k in
 * increasing order. */
void sp_mm(int vec, int amode, int M, int n, int K, const float *const *a, long aoff,
           const float *const *b, long boff, float *const *c, long coff, bool acc);

/* How the bf16 tile products run (picked once per cache, sparse_cache_set_bf16): portable C,
 * AVX512-BF16 register tiles (vdpbf16ps), AMX-BF16 tile registers (tdpbf16ps, where the CPU has
 * them and the OS granted the tile state), or AMX's C emulation (tests: the AMX blocking on any CPU). */
typedef enum sp_tiles { SP_TILES_PORTABLE = 0, SP_TILES_DP = 1, SP_TILES_AMX = 2, SP_TILES_AMX_EMU = 3 } sp_tiles;
/* The best this CPU and OS allow: SP_TILES_AMX where bf16_amx_tiles (AMX-BF16 permitted, MOH_NO_AMX
 * unset or "0"), else SP_TILES_DP with AVX512-BF16, else SP_TILES_PORTABLE. */
sp_tiles sp_tiles_detect(void);
/* "portable", "AVX512-BF16 vdpbf16ps", "AMX-BF16 tdpbf16ps", "AMX-BF16 (C emulation)". */
const char *sp_tiles_name(sp_tiles isa);

/* bf16 tiles: C[R x n] (acc: +=, else =) A B with bf16 inputs and fp32 accumulation. A row r:
 * a + r lda, K2 pairs of bf16 (a[2k], a[2k+1]); B in pair-interleaved ("VNNI") layout:
 * B(2k + u, j) = b[k ldb + 2 j + u], u = 0, 1; C(r, j) = c[r][j]. Odd K are zero-padded to a pair
 * by the caller. isa: SP_TILES_DP and the AMX kinds need the CPU features (the caller checks); the
 * kinds give the same products, summed in other orders. */
void sp_mm_bf16(sp_tiles isa, int R, int n, int K2, const uint16_t *a, long lda, const uint16_t *b, long ldb,
                float *const *c, bool acc);
/* The same with A rows by pointer: A row r at a[r] (gathered rows cost nothing). */
void sp_mm_bf16_rows(sp_tiles isa, int R, int n, int K2, const uint16_t *const *a, const uint16_t *b, long ldb,
                     float *const *c, bool acc);
/* The AMX kernel behind both (sparse_amx.c): A rows at a0 + r lda when a0 != NULL (whole 16-row
 * blocks are loaded from there), else at ap[r]; emu: the C emulation of the tile instructions. */
void sp_amx_mm_bf16(bool emu, int R, int n, int K2, const uint16_t *const *ap, const uint16_t *a0, long lda,
                    const uint16_t *b, long ldb, float *const *c, bool acc);

/* Rows rows[0..R) of n floats rounded to bf16 and interleaved in pairs of rows (the B layout of
 * sp_mm_bf16 over rows): dst[(r / 2) ldd + 2 j + r % 2] = bf16(rows[r][j]); a zero row pads odd R. */
void sp_bf16_row_pairs(bool avx512bf16, int R, int n, const float *const *rows, uint16_t *dst, long ldd);

/* The same for rows already in bf16: dst[(r / 2) ldd + 2 j + r % 2] = rows[r][j]. */
void sp_bf16_row_pairs16(bool avx512bf16, int R, int n, const uint16_t *const *rows, uint16_t *dst, long ldd);

/* R rows of n floats (src row r at src + r lds) rounded to bf16 and transposed:
 * dst[j ldd + r] = bf16(src[r lds + j]) (the A operand of sp_mm_bf16 over rows: a product summed
 * over the R rows, pairs of rows adjacent). */
void sp_bf16_transpose(bool avx512bf16, int R, int n, const float *src, long lds, uint16_t *dst, long ldd);

/* Online-softmax update of R <= SP_MR rows of raw scores s[r][0..nk), nk <= SPARSE_BK, of which
 * the first nv[r] are valid (causal prefix): running max m[r] (raw units), 16 partial sums
 * l[16 r ..], accumulator rows o[r][0..d) rescaled when the max moves; s[r] becomes the
 * unnormalised probabilities 2^((s - m) cl2), cl2 = log2(e) / sqrt(d) (0 past nv[r]). */
void sp_fwd_softmax(int vec, int R, int nk, float *const *s, const int *nv, float cl2, float *m,
                    float *l, float *const *o, int d);

/* Backward tile of R rows: s[r][j] raw scores -> P = 2^((s - smax[r]) cl2 - lse[r]);
 * dp[r][j] = dO.v -> dS = P (dp - D[r]) scale (both 0 past nv[r]). */
void sp_bwd_ds(int vec, int R, int nk, float *const *s, float *const *dp, const int *nv,
               float cl2, float scale, const float *smax, const float *lse, const float *D);

/* The AVX2 + FMA decode kernels behind sparse_decode_attend_f32 (d <= 64, n >= 1) and
 * sparse_decode_gemv_f32 on CPUs without AVX-512, callable directly so that tests run them on
 * AVX-512 CPUs too; false (nothing written) when the CPU lacks AVX2 / FMA or the shape is out of
 * their range. */
bool sp_decode_attend_avx2(const float *q, const float *K, const float *V, long ld, int n, int d, float gate,
                           float *scores, float *out);
bool sp_decode_gemv_avx2(const float *w, long ldw, const float *b, const float *x, const int *blk, int nblk, int d,
                         int r0, int r1, float *out);

#endif
