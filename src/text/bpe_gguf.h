/* A byte-level BPE tokenizer from GGUF metadata (bpe_gguf.c). Source: llama.cpp src/llama-vocab.cpp
 * (llama_vocab::impl::load: tokenizer.ggml.* keys, token types, pre-tokenizer names). */
#ifndef MOH_BPE_GGUF_H
#define MOH_BPE_GGUF_H
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "text/bpe.h"

/* tokenizer.ggml.model must be "gpt2"; tokens (strings, id order), merges ("A B", rank order),
 * pre (llama.cpp's name; absent = "default"), token_type (3 control / 4 user-defined: matched
 * before BPE; other values, in llama.cpp's enum or not, are ordinary tokens, as llama.cpp makes an
 * unknown type UNDEFINED). As llama.cpp refuses: a special-token id key (bos / eos / ... _token_id)
 * that is not u32, a flag (add_bos_token, ...) that is not bool, pre not a string (MOH_E_FORMAT
 * naming the key and the type expected). An id >= n_tokens is left to the reader (llama.cpp
 * ignores it), tokenizer.chat_template is not read here. Errors name path and key: MOH_E_SHAPE
 * (missing), MOH_E_FORMAT, MOH_E_CONFIG. */
int bpe_from_gguf(bpe_tok **out, const moh_gguf *g, const char *path, moh_error *err);
/* Writes t into w as llama.cpp's tokenizer metadata, what bpe_from_gguf and llama-vocab.cpp
 * read back to the same ids: tokenizer.ggml.model "gpt2"; pre (src's name when src has one, else
 * gpt-2 / smollm / llama-bpe from t's pre-tokenizer); tokens in id order (an id without a token:
 * "[UNUSED_id]", type 5 unused); token_type 1 normal, 3 control for added tokens (4 where src types
 * the token user-defined); merges "A B" in rank order. From src (the GGUF t came from; may be
 * NULL): the bos / eos / unknown / seperator / padding ids, add_bos_token, add_eos_token,
 * add_space_prefix and tokenizer.chat_template (when a string); without src (a folder's tokenizer.json +
 * tokenizer_config.json), eos_token_id = eos_id (when a token id), add_bos_token false (HF's
 * post_processor null adds none) and tokenizer.chat_template = chat_template (when not NULL).
 * MOH_E_ARG naming bpe_source(t): a tokenizer.json's own regexes that equal no named
 * pre-tokenizer, which llama.cpp cannot take (it knows them by name); MOH_E_NOMEM. */
int bpe_to_gguf(const bpe_tok *t, int eos_id, const char *chat_template, const moh_gguf *src, moh_gguf_writer *w,
                moh_error *err);
/* true when byte b encodes alone to id b for every byte: the byte vocabulary of moh's models. */
bool bpe_is_bytes(const bpe_tok *t);
#endif
