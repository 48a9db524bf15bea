/* A byte-level BPE tokenizer from GGUF metadata (bpe_gguf.c). Source: llama.cpp src/llama-vocab.cpp
 * (llama_vocab::impl::load: tokenizer.ggml.* keys, token types, pre-tokenizer names). */
#ifndef MOH_BPE_GGUF_H
#define MOH_BPE_GGUF_H
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "text/bpe.h"

/* The tokenizer as llama-vocab.cpp's llama_vocab::impl::load reads tokenizer.ggml.* (reason in
 * brackets; refused in one line naming the file and key):
 * - model must be "gpt2" (byte-level BPE; llama.cpp's others, llama / bert / t5 ..., are not
 *   supported); tokens an array of strings (id order; an empty one is named "[EMPTY_<id>]", as
 *   llama.cpp does); merges an array of strings ("A B", rank order; moh refuses a malformed one or
 *   one naming a non-token, which llama.cpp keeps as a merge that never or oddly applies);
 * - pre: absent or "default" is llama.cpp's default regex list (llm_tokenizer_bpe), gpt-2,
 *   smollm / starcoder / refact, llama-bpe / llama3 as llama.cpp; other names refused ("unknown
 *   pre-tokenizer type"; "gpt2" is not one of llama.cpp's);
 * - token_type: i32, at least one per token ("Index out of array bounds for toktypes"); types 2
 *   unknown, 3 control, 4 user-defined are matched before BPE (llama.cpp's special-token cache);
 *   other values, in llama.cpp's enum or not, are ordinary tokens;
 * - scores (unused by BPE): f32 or i32, at least one per token, as llama.cpp requires;
 * - special-token ids and token_type_count u32, flags bool, pre a string (get_key "wrong type");
 *   an id >= n_tokens is left to the reader (llama.cpp ignores it);
 * - add_bos_token (default true for llama-bpe / llama3) and add_eos_token become the tokenizer's
 *   post-processor ids (bos before, eos after the text: bpe_encode_special, what llama_tokenize
 *   with add_special gives); bos / eos ids default to 11 (llama.cpp's gpt2 vocab), and a flag on
 *   with no such token is refused; add_sep_token and add_space_prefix true are refused (llama.cpp
 *   adds a separator / strips a space prefix on detokenising, moh does not).
 * tokenizer.chat_template is not read here. Errors: MOH_E_SHAPE (missing), MOH_E_FORMAT,
 * MOH_E_CONFIG. */
int bpe_from_gguf(bpe_tok **out, const moh_gguf *g, const char *path, moh_error *err);
/* Writes t into w as llama.cpp's tokenizer metadata, what bpe_from_gguf and llama-vocab.cpp
 * read back to the same ids: tokenizer.ggml.model "gpt2"; pre (src's name when src has one,
 * "default" when src has none, else gpt-2 / smollm / llama-bpe from t's pre-tokenizer); tokens in id order (an id without a token:
 * "[UNUSED_id]", type 5 unused); token_type 1 normal, 3 control for added tokens (4 where src types
 * the token user-defined); merges "A B" in rank order. From src (the GGUF t came from; may be
 * NULL): the bos / eos / unknown / seperator / padding ids, add_bos_token, add_eos_token,
 * add_space_prefix and tokenizer.chat_template (when a string); without src (a folder's tokenizer.json +
 * tokenizer_config.json), eos_token_id = eos_id (when a token id), add_bos_token / add_eos_token
 * and bos_token_id from the post-processor's ids (TemplateProcessing "single": at most one before,
 * one after, which must be eos_id when that is set) and tokenizer.chat_template = chat_template
 * (when not NULL). MOH_E_ARG naming bpe_source(t): a tokenizer.json's own regexes that equal no
 * named pre-tokenizer, which llama.cpp cannot take (it knows them by name), or a post-processor
 * GGUF cannot say; MOH_E_NOMEM. */
int bpe_to_gguf(const bpe_tok *t, int eos_id, const char *chat_template, const moh_gguf *src, moh_gguf_writer *w,
                moh_error *err);
/* true when byte b encodes alone to id b for every byte: the byte vocabulary of moh's models. */
bool bpe_is_bytes(const bpe_tok *t);
#endif
