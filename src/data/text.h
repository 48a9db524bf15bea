/* Byte-level text data for the language-model trainer: loading and splitting a corpus, random
 * training batches, the evaluation chunks that define `moh eval`'s metric, and order-0 entropy.
 * Tokens are bytes (vocab 256): any byte sequence is valid input, invalid UTF-8 included. */
#ifndef MOH_DATA_TEXT_H
#define MOH_DATA_TEXT_H
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

/* Largest text file (or split file) accepted: 4 GiB. */
#define TEXT_MAX_BYTES ((uint64_t)4 << 30)
/* A NUL byte within this many leading bytes marks a file as binary (rejected). */
#define TEXT_BINARY_SCAN 65536

/* train and val share one allocation owned by train (val points into it, possibly at its end);
 * release with text_data_free. An empty split has n == 0 and a non-NULL pointer. */
typedef struct text_data {
    uint8_t *train;
    size_t n_train;
    uint8_t *val;
    size_t n_val;
} text_data;

/* path: a UTF-8 text file (validation = its last val_fraction of bytes, rounded up to whole bytes
 * and moved back to the start of a line so no line is split; train = everything before), or a
 * directory holding train.txt and val.txt (a prepared split, e.g. data/kjv; val_fraction is then
 * unused but must still be in (0, 1)). Errors: bad arguments, val_fraction outside (0, 1)
 * (MOH_E_ARG); missing/unreadable file, not a regular file or directory, larger than 4 GiB
 * (MOH_E_IO); empty file, a NUL byte in the first 64 KiB ("looks binary"), or a split shorter than
 * min_bytes (MOH_E_FORMAT, the message says how many bytes are needed). On error d is empty. */
int text_data_load(text_data *d, const char *path, double val_fraction, size_t min_bytes,
                   moh_error *err);
/* Same split logic on a caller's buffer (copied); label names it in messages ("<memory>" if
 * NULL). */
int text_data_from_buffer(text_data *d, const uint8_t *buf, size_t len, double val_fraction,
                          size_t min_bytes, const char *label, moh_error *err);
/* Frees and zeroes d; NULL and already-freed (zeroed) d are fine. */
void text_data_free(text_data *d);
/* zlib CRC-32 of d's training bytes, then its validation bytes. */
uint32_t text_data_crc(const text_data *d);

/* Order-0 entropy in bits per byte of bytes[0..n) (0 for n == 0). */
double text_entropy_bits(const uint8_t *bytes, size_t n);

/* Random training batch: B windows of T+1 consecutive bytes at offsets drawn uniformly (rejection
 * sampling, no modulo bias) from [0, n-T-1] of bytes[0..n), one offset per window in order b =
 * 0..B-1; tokens[b*T+t] = w[t], targets[b*T+t] = w[t+1] (t < T), values 0..255. Uses only
 * moh_rng_next(rng) (core/rng.h), so a saved *rng reproduces the same batches. tokens and targets hold B*T
 * ints. MOH_E_ARG (nothing written, *rng unchanged) on NULL pointers, B < 1, T < 1 or n < T+1. */
int text_batch(const uint8_t *bytes, size_t n, int B, int T, uint64_t *rng, int *tokens,
               int *targets, moh_error *err);

/* text_batch over token ids[0..n) (a tokenized text) instead of bytes: the same offsets for the
 * same n and *rng, tokens[b*T+t] = ids[o+t], targets[b*T+t] = ids[o+t+1]. Same errors. */
int text_batch_ids(const int *ids, size_t n, int B, int T, uint64_t *rng, int *tokens, int *targets,
                   moh_error *err);

/* Evaluation chunks, exactly as `moh eval` defines its metric: bytes[0..n) are cut into
 * consecutive chunks of T+1 bytes, chunk c starting at c*(T+1); a last chunk shorter than 2 bytes
 * is dropped. Chunk c (length len) predicts its bytes 1..len-1 from the bytes before them in the
 * same chunk: every byte except the first of each chunk (and a dropped 1-byte tail) is predicted
 * exactly once, n - num_chunks - (n % (T+1) == 1) predictions in all.
 * text_eval_num_chunks: the number of chunks (0 if T < 1).
 * text_eval_chunk: fills tokens[0..len-1) = chunk[0..len-1) and targets[0..len-1) = chunk[1..len)
 * (each array holds at least T ints) and returns len-1 (1..T); returns 0 for c outside
 * [0, num_chunks), T < 1 or NULL pointers. */
long text_eval_num_chunks(size_t n, int T);
/* The number of predictions of that metric over bytes[0..n) (0 if T < 1). */
long text_eval_num_preds(size_t n, int T);
int text_eval_chunk(const uint8_t *bytes, size_t n, int T, long c, int *tokens, int *targets);
/* text_eval_chunk over token ids[0..n) (the chunks of a BPE model's evaluation: T+1 tokens each,
 * the first of each chunk context only). */
int text_eval_chunk_ids(const int *ids, size_t n, int T, long c, int *tokens, int *targets);
#endif
