/* GGUF writer (gguf_write.c): metadata of the common value types and F32 / F16 / Q8_0 / Q4_0 /
 * Q4_1 tensors, version 3, alignment 32, as gguf-py's GGUFWriter lays files out; read back by io/gguf.h and llama.cpp.
 * Source: the layout in io/gguf.h (ggml's gguf.h / gguf.cpp); gguf-py gguf_writer.py. */
#ifndef MOH_IO_GGUF_WRITE_H
#define MOH_IO_GGUF_WRITE_H
#include "io/gguf.h"

typedef struct moh_gguf_writer moh_gguf_writer;

int moh_gguf_writer_new(moh_gguf_writer **out, moh_error *err);
void moh_gguf_writer_free(moh_gguf_writer *w);
/* Metadata, in the order added (an allocation failure is reported by moh_gguf_write). */
void moh_gguf_add_u32(moh_gguf_writer *w, const char *key, uint32_t v);
void moh_gguf_add_i32(moh_gguf_writer *w, const char *key, int32_t v);
void moh_gguf_add_f32(moh_gguf_writer *w, const char *key, float v);
void moh_gguf_add_bool(moh_gguf_writer *w, const char *key, bool v);
void moh_gguf_add_str(moh_gguf_writer *w, const char *key, const char *s);
void moh_gguf_add_arr_str(moh_gguf_writer *w, const char *key, const char *const *s, uint64_t n);
void moh_gguf_add_arr_i32(moh_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void moh_gguf_add_arr_f32(moh_gguf_writer *w, const char *key, const float *v, uint64_t n);
/* A tensor of ggml shape ne[0..n_dims) (ne[0] fastest: the PyTorch shape reversed) stored as type
 * MOH_GGML_F32, MOH_GGML_F16 (rounded to nearest even) or MOH_GGML_Q8_0 / _Q4_0 / _Q4_1 (quantised
 * at write time as ggml's quantize_row_*_ref, ops/quant.h; ne[0] a multiple of 32); data (numel
 * floats) is borrowed until moh_gguf_write. MOH_E_ARG for another type, > 4 dims, a name of 64
 * bytes or more, rows not of whole blocks, or an F16 / quantised tensor with a value that float16
 * cannot hold (|x| that rounds to infinity, or not finite), naming it. */
int moh_gguf_add_tensor(moh_gguf_writer *w, const char *name, int n_dims, const int64_t *ne, int type,
                        const float *data, moh_error *err);
/* Writes the file: a temporary file, fsynced, renamed over path. MOH_E_IO / MOH_E_NOMEM. */
int moh_gguf_write(const moh_gguf_writer *w, const char *path, moh_error *err);
#endif
