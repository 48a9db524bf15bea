/* GGUF reader (llama.cpp's model format), read-only, over an mmap of the file.
 *
 * File layout (all little-endian; strings are a u64 byte length then that many bytes, no NUL):
 *   magic "GGUF" | u32 version (2 or 3; both have this layout) | i64 n_tensors | i64 n_kv
 *   n_kv times:      string key | i32 value type | value
 *                    value: the scalar (u8 i8 u16 i16 u32 i32 f32 u64 i64 f64; bool: one byte,
 *                    non-zero is true), a string, or an array: i32 element type, u64 n, n values
 *                    (no arrays of arrays)
 *   n_tensors times: string name | u32 n_dims (<= 4) | n_dims i64 ne[] (ne[0] fastest) |
 *                    i32 ggml type | u64 offset (from the data section start)
 *   padding to general.alignment (u32 key, a power of 2; default 32), only when
 *   n_tensors > 0
 *   data section: tensor i at offset i, each tensor padded to the alignment.
 *
 * Accepted exactly as ggml's gguf.cpp (gguf_init_from_reader, llama.cpp commit 067d44f6) accepts, refused with
 * its reasons: version 0, 1, > 3 or byte-swapped; n_tensors / n_kv negative; strings or arrays over
 * 2^30 bytes / elements or past the end of the file; empty or repeated keys; unknown value types or
 * nested arrays; general.alignment not a u32 power of 2; tensor names of 64 bytes or more (a name
 * is read up to its first NUL byte, as ggml does) or repeated; n_dims > 4; a negative dim; a
 * numel or byte size that overflows; a type outside ggml's list, removed, or whose block size does
 * not divide ne[0]; offsets not the running sum of the padded tensor sizes (so aligned, in file
 * order, no gaps or overlaps); a data section start past the end of the file. Also refused, as
 * llama.cpp's loader does: tensor data past the end of the file. Counts larger than the file can
 * hold are refused before anything is allocated. general.alignment 1, 2 or 4 is accepted as
 * gguf.cpp accepts it (the spec's "multiple of 8" is not checked there; moh reads data byte-wise).
 *
 * Errors: MOH_E_IO (open/mmap), MOH_E_FORMAT (contents), MOH_E_NOMEM, MOH_E_SHAPE (a key or tensor
 * missing or of another type; an unsupported tensor type for dequantisation); the message is one
 * line starting with the file's path (or the parse label) and naming the field and expected value.
 * Block layouts: ggml's ggml-common.h; dequantisation follows ggml-quants.c and is bit-exact
 * against gguf-py 0.19's gguf.quants.dequantize (tests/test_gguf.c, tools/ref/gguf_fixtures.py).
 */
#ifndef MOH_IO_GGUF_H
#define MOH_IO_GGUF_H

#include "moh.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types (the file's i32 codes). */
typedef enum moh_gguf_type {
    MOH_GGUF_U8 = 0, MOH_GGUF_I8 = 1, MOH_GGUF_U16 = 2, MOH_GGUF_I16 = 3, MOH_GGUF_U32 = 4,
    MOH_GGUF_I32 = 5, MOH_GGUF_F32 = 6, MOH_GGUF_BOOL = 7, MOH_GGUF_STRING = 8, MOH_GGUF_ARRAY = 9,
    MOH_GGUF_U64 = 10, MOH_GGUF_I64 = 11, MOH_GGUF_F64 = 12, MOH_GGUF_TYPE_COUNT = 13
} moh_gguf_type;

/* ggml tensor types that moh dequantises (the file's i32 codes; others exist, see type_name). */
enum {
    MOH_GGML_F32 = 0, MOH_GGML_F16 = 1, MOH_GGML_Q4_0 = 2, MOH_GGML_Q4_1 = 3, MOH_GGML_Q5_0 = 6,
    MOH_GGML_Q5_1 = 7, MOH_GGML_Q8_0 = 8, MOH_GGML_Q4_K = 12, MOH_GGML_Q5_K = 13,
    MOH_GGML_Q6_K = 14, MOH_GGML_Q8_K = 15, MOH_GGML_BF16 = 30, MOH_GGML_TYPE_COUNT = 42
};

#define MOH_GGUF_MAX_DIMS 4

typedef struct moh_gguf moh_gguf; /* opaque; owns the mapping and the parsed tables */

typedef struct moh_gguf_tensor {
    const char *name;      /* NUL-terminated, < 64 bytes */
    int type;              /* ggml type code */
    int n_dims;            /* 0..4 */
    int64_t ne[MOH_GGUF_MAX_DIMS]; /* ne[0] fastest (ggml order; numpy shape reversed); 1 past n_dims */
    int64_t numel;
    uint64_t offset;       /* from the data section start */
    uint64_t nbytes;       /* numel / block size * type size */
    const uint8_t *data;   /* inside the mapping; nbytes valid bytes */
} moh_gguf_tensor;

/* mmaps path read-only and parses it; *out is NULL on error. */
int moh_gguf_open(moh_gguf **out, const char *path, moh_error *err);
/* Parses buf[0..len) (kept alive by the caller while *out is used); label names it in messages. */
int moh_gguf_parse(moh_gguf **out, const uint8_t *buf, size_t len, const char *label,
                   moh_error *err);
void moh_gguf_close(moh_gguf *g); /* NULL is a no-op */

uint32_t moh_gguf_version(const moh_gguf *g);
uint32_t moh_gguf_alignment(const moh_gguf *g);
uint64_t moh_gguf_data_offset(const moh_gguf *g); /* file offset of the data section */

/* ---- metadata: index i in [0, n_kv), file order ---- */
int64_t moh_gguf_n_kv(const moh_gguf *g);
int64_t moh_gguf_find_key(const moh_gguf *g, const char *key); /* -1 if absent */
const char *moh_gguf_key(const moh_gguf *g, int64_t i);
moh_gguf_type moh_gguf_kv_type(const moh_gguf *g, int64_t i);  /* MOH_GGUF_ARRAY for arrays */
moh_gguf_type moh_gguf_arr_type(const moh_gguf *g, int64_t i); /* element type of an array */
const char *moh_gguf_type_str(moh_gguf_type t);                /* "u32", "arr", ...; "?" */

/* Typed getters by key: MOH_E_SHAPE naming the key if absent or of another type (exact type,
 * no conversion; the message gives both types). Strings are NUL-terminated (a string holding NUL
 * bytes is cut there; *len, when not NULL, is the full byte length). */
int moh_gguf_get_u16(const moh_gguf *g, const char *key, uint16_t *out, moh_error *err);
int moh_gguf_get_u32(const moh_gguf *g, const char *key, uint32_t *out, moh_error *err);
int moh_gguf_get_i32(const moh_gguf *g, const char *key, int32_t *out, moh_error *err);
int moh_gguf_get_f32(const moh_gguf *g, const char *key, float *out, moh_error *err);
int moh_gguf_get_u64(const moh_gguf *g, const char *key, uint64_t *out, moh_error *err);
int moh_gguf_get_i64(const moh_gguf *g, const char *key, int64_t *out, moh_error *err);
int moh_gguf_get_f64(const moh_gguf *g, const char *key, double *out, moh_error *err);
int moh_gguf_get_bool(const moh_gguf *g, const char *key, bool *out, moh_error *err);
int moh_gguf_get_str(const moh_gguf *g, const char *key, const char **out, size_t *len,
                     moh_error *err);
/* Arrays: length and element type; elements by index (MOH_E_SHAPE if not an array of that type,
 * MOH_E_ARG if idx >= length). */
int moh_gguf_get_arr(const moh_gguf *g, const char *key, moh_gguf_type *elem_type, uint64_t *len,
                     moh_error *err);
int moh_gguf_get_arr_str(const moh_gguf *g, const char *key, uint64_t idx, const char **out,
                         size_t *len, moh_error *err);
int moh_gguf_get_arr_i32(const moh_gguf *g, const char *key, uint64_t idx, int32_t *out,
                         moh_error *err);
int moh_gguf_get_arr_f32(const moh_gguf *g, const char *key, uint64_t idx, float *out,
                         moh_error *err);
/* Raw little-endian elements of a numeric array (n * element size bytes, unaligned), or NULL. */
const uint8_t *moh_gguf_arr_data(const moh_gguf *g, int64_t i);

/* ---- tensors: index i in [0, n_tensors), file order ---- */
int64_t moh_gguf_n_tensors(const moh_gguf *g);
const moh_gguf_tensor *moh_gguf_tensor_at(const moh_gguf *g, int64_t i); /* NULL if out of range */
const moh_gguf_tensor *moh_gguf_find_tensor(const moh_gguf *g, const char *name); /* or NULL */
/* ggml's name of a tensor type ("q4_K", "f32", ...), or "?" for an unknown code. */
const char *moh_gguf_ggml_type_name(int type);
/* Block size (elements) and type size (bytes) of a ggml type; 0 for unknown or removed types. */
int64_t moh_gguf_block_size(int type);
size_t moh_gguf_type_size(int type);
/* 1 if moh_gguf_dequantize handles type. */
int moh_gguf_can_dequantize(int type);

/* Dequantises tensor t of g to out[t->numel] float32 (same element order: ne[0] fastest). An
 * unsupported type is MOH_E_SHAPE naming the tensor and the type. */
int moh_gguf_dequantize(const moh_gguf *g, const moh_gguf_tensor *t, float *out, moh_error *err);
/* Dequantises n elements (a multiple of the block size) of type from src (n / block * type size
 * bytes) to out[n]; for row-wise loading. MOH_E_ARG if the type is unsupported or n is not
 * a whole number of blocks. */
int moh_gguf_dequantize_raw(int type, const uint8_t *src, int64_t n, float *out, moh_error *err);

#endif
