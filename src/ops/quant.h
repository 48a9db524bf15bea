/* Block-quantised weights on the decode path (issue 29): ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
 * K-quant Q4_K, Q5_K, Q6_K matrices kept in their blocks (a GGUF file's own bytes, or quantised here
 * from float32), multiplied with an activation quantised per 32 values as ggml's Q8_0 / Q8_1 on the
 * CPU's integer units: AVX512-VNNI or AVX-VNNI (vpdpbusd), AVX2 (vpmaddubsw), or portable loops,
 * picked at run time.
 *
 * Layouts (ggml-common.h; rows are whole blocks):
 *   Q8_0  f16 d | i8 qs[32]                          w = d q                  34 bytes / 32
 *   Q4_0  f16 d | u8 qs[16]                          w = d (q - 8)            18 bytes / 32
 *   Q4_1  f16 d | f16 m | u8 qs[16]                  w = d q + m              20 bytes / 32
 *   Q5_0  f16 d | u32 qh | u8 qs[16]                 w = d (q - 16)           22 bytes / 32
 *   Q5_1  f16 d | f16 m | u32 qh | u8 qs[16]         w = d q + m              24 bytes / 32
 *   Q4_K  f16 d | f16 dmin | u8 sc[12] | u8 qs[128]  w = d sc_s q - dmin m_s  144 bytes / 256
 *   Q5_K  as Q4_K with u8 qh[32] before qs           (6-bit sc_s, m_s per 32) 176 bytes / 256
 *   Q6_K  u8 ql[128] | u8 qh[64] | i8 sc[16] | f16 d w = d sc_g (q - 32)     210 bytes / 256
 * (4-bit legacy: the low nibble of qs[j] is weight j, the high nibble weight j + 16, qh bit j the
 * fifth bit of weight j; K-quants: sub-blocks of 32, Q6_K's scales per 16.) The products follow
 * ggml-cpu's vec_dot_*: integer sums per sub-block of 32 (per 16 for Q6_K's scales), scaled in fp32;
 * the activation is quantised per 32 (ggml's K-quant kernels use Q8_K, per 256: finer here), and
 * only the fp32 summation order differs from ggml's. */
#ifndef MOH_OPS_QUANT_H
#define MOH_OPS_QUANT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

#define QUANT_BLOCK 32 /* the activation's block, and every type's (sub-)block of weights */
#define QUANT_TYPE_LIST "q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K or q6_K"

typedef enum quant_isa { QUANT_ISA_SCALAR, QUANT_ISA_AVX2, QUANT_ISA_AVXVNNI, QUANT_ISA_AVX512VNNI } quant_isa;
/* The best kernels this CPU runs (cpuid at run time; MOH_NO_VNNI=1 stops at AVX2, for comparisons). */
quant_isa quant_isa_detect(void);
/* Whether this CPU runs the kernels of isa (whatever MOH_NO_VNNI says). */
bool quant_isa_supported(quant_isa isa);
const char *quant_isa_name(quant_isa isa);

/* 1 for the ggml type codes handled here (QUANT_TYPE_LIST; io/gguf.h), else 0. */
int quant_supported(int type);
/* Bytes of one block of `type` (0 if unsupported). */
size_t quant_block_bytes(int type);
/* Weights per block of `type`: 32, or 256 for the K-quants (0 if unsupported). */
int quant_block_size(int type);
/* Bytes of a row of cols weights (cols a multiple of quant_block_size). */
size_t quant_row_bytes(int type, int64_t cols);
/* The type a matrix of `type` with rows of cols values is written in: type where the rows are whole
 * blocks, else llama-quantize's fallback for a K-quant (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0;
 * llama-quant.cpp, llama_tensor_get_type); -1 (float) where cols is not a multiple of 32. */
int quant_fit(int type, int64_t cols);
/* The LM head's (a tied embedding's) type when the matrices are `type`: Q6_K for a K-quant, else Q8_0
 * (llama-quantize gives the output more bits). */
int quant_head_type(int type);
/* ggml's name: "q8_0" .. "q6_K" (or "?"). */
const char *quant_type_name(int type);
/* Parses a name of QUANT_TYPE_LIST (any case: "Q4_K" as llama-quantize writes it) into a ggml type
 * code: MOH_OK, or MOH_E_ARG naming the value. */
int quant_type_parse(const char *s, int *type, moh_error *err);

/* Quantises x [K] (K a multiple of quant_block_size) into blocks of `type` at out, as ggml-quants.c's
 * quantize_row_*_ref do (Q4_K / Q5_K: make_qkx2_quants; Q6_K: make_qx_quants). */
void quant_row(int type, const float *x, int64_t K, uint8_t *out);
/* IEEE half <-> float (round to nearest even), as ggml's GGML_FP16_TO_FP32 / FP32_TO_FP16. */
float quant_h2f(uint16_t h);
uint16_t quant_f2h(float f);

/* An activation vector quantised per block of 32 as ggml's Q8_1: q [cap] int8, d [cap / 32] the
 * scale, s [cap / 32] = d sum(q) (both rounded to f16), sum [cap / 32] = sum(q). One allocation. */
typedef struct quant_act {
    int8_t *q;
    float *d, *s;
    int32_t *sum;
    size_t cap;
    void *block;
} quant_act;
/* Room for cap values (rounded up to 32). MOH_OK, MOH_E_NOMEM. */
int quant_act_init(quant_act *a, size_t cap, moh_error *err);
void quant_act_free(quant_act *a);
/* Quantises x[off .. off + n) into a (off and n multiples of 32, off + n <= cap). A block holding
 * NaN or inf gets a NaN scale: every product with it is NaN, as in fp32 (never a silent zero). */
void quant_act_set(quant_act *a, const float *x, size_t off, size_t n);

/* out[r] = (b ? b[r] : 0) + sum over the nblk column blocks blk[k] of
 * W[r, blk[k] bw .. blk[k] bw + bw) . x[blk[k] bw ..] for r in 0 .. n: W rows of `type`, row r at
 * w + r row_bytes; bw a multiple of 32 (a K-quant's column blocks may start inside its blocks of
 * 256: each sub-block of 32 has its own scales); x quantised over those columns (quant_act_set). */
void quant_gemv(int type, const uint8_t *w, size_t row_bytes, const float *b, const quant_act *x, const int *blk,
                int nblk, int bw, int n, float *out, quant_isa isa);

/* A model's quantised matrices, each by its place in the model's float32 parameter buffer (base,
 * nbase values): the float rows [off, off + rows cols) are also held as `rows` quantised rows of
 * row_bytes at data (a GGUF mapping, or `owned`). Entries sorted by off, disjoint. */
typedef struct quant_mat {
    size_t off;
    int64_t rows, cols;
    int type;
    const uint8_t *data;
    size_t row_bytes;
} quant_mat;
typedef struct quant_table {
    const float *base;
    size_t nbase;
    quant_mat *m;
    int n, cap;
    uint8_t *owned;       /* blocks this table made or copied (reordered GGUF rows); one allocation */
    size_t owned_bytes, owned_used;
    size_t bytes;         /* quantised bytes over all entries */
    bool borrows;         /* some entries' blocks are the caller's (quant_table_add with data) */
} quant_table;
/* An empty table over base [nbase] with room for `entries` entries and owned_bytes bytes of blocks.
 * MOH_OK, MOH_E_NOMEM. */
int quant_table_init(quant_table *t, const float *base, size_t nbase, int entries, size_t owned_bytes,
                     moh_error *err);
void quant_table_free(quant_table *t);
/* Adds the matrix at float offset off [rows, cols] (cols a multiple of quant_block_size) of `type`, its blocks at
 * data; data NULL: room from `owned` (returned through *room, to fill). MOH_OK, or MOH_E_ARG (an
 * unsupported type, cols not whole blocks, outside base, overlapping or out of order, no room). */
int quant_table_add(quant_table *t, size_t off, int64_t rows, int64_t cols, int type, const uint8_t *data,
                    uint8_t **room, moh_error *err);
/* Quantises the float matrix at offset off [rows, cols] of base into owned blocks of `type`.
 * Errors as quant_table_add, and MOH_E_ARG naming the row and value when a block's scale rounds
 * beyond float16's range (|w| over ~8.3e6 for Q8_0) or a weight is not finite. */
int quant_table_quantize(quant_table *t, size_t off, int64_t rows, int64_t cols, int type, moh_error *err);
/* The entry holding float element w of base, or NULL. */
const quant_mat *quant_table_find(const quant_table *t, const float *w);
/* The row of cols values at w (a row start of an entry of that width) dequantised from its blocks
 * into out; false (out untouched) when the table holds no such row. */
bool quant_table_row(const quant_table *t, const float *w, int64_t cols, float *out);
/* Whether every value of nblocks blocks of `type` at data (nblocks quant_block_bytes) is finite:
 * true iff each block's f16 scales (d, and m / dmin where the type has one; offsets as in
 * ggml-common.h) are, as a non-finite scale makes each value it scales non-finite (NaN times 0 is
 * NaN) and finite ones bound |w| by 65504 * 63 * 63. Reads no weights; false for an unsupported type. */
bool quant_blocks_finite(int type, const uint8_t *data, size_t nblocks);
/* "q4_1 (210 matrices, 93.9 MB)"-style summary of the types held into out[cap]. */
void quant_table_describe(const quant_table *t, char *out, size_t cap);
#endif
