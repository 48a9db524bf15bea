/* A byte-level BPE tokenizer from GGUF metadata (bpe_gguf.c). Source: llama.cpp src/llama-vocab.cpp
 * (llama_vocab::impl::load: tokenizer.ggml.* keys, token types, pre-tokenizer names). */
#ifndef MOH_BPE_GGUF_H
#define MOH_BPE_GGUF_H
#include "io/gguf.h"
#include "text/bpe.h"

/* tokenizer.ggml.model must be "gpt2"; tokens (strings, id order), merges ("A B", rank order),
 * pre (llama.cpp's name; absent = "default"), token_type (3 control / 4 user-defined: matched
 * before BPE). Errors name path and key: MOH_E_SHAPE (missing), MOH_E_FORMAT, MOH_E_CONFIG. */
int bpe_from_gguf(bpe_tok **out, const moh_gguf *g, const char *path, moh_error *err);
/* true when byte b encodes alone to id b for every byte: the byte vocabulary of moh's models. */
bool bpe_is_bytes(const bpe_tok *t);
#endif
