/* Byte-level BPE tokenizer of the GPT-2 family (GPT-2, SmolLM2, LLaMA-3, Qwen): added/special
 * tokens matched first (leftmost, then longest), pre-tokenizer regexes (PCRE2, Unicode classes),
 * then our merge loop (lowest merge rank first, leftmost on ties) over the bytes of each piece.
 * Matches Hugging Face `tokenizers` (BPE model + ByteLevel pre-tokenizer/decoder) id for id on
 * valid UTF-8. Invalid UTF-8 bytes (the reference takes only str) never match a regex: each run
 * of them is a piece of its own, encoded byte by byte, so decode(encode(x)) == x for any bytes
 * when all 256 byte tokens exist. A byte without a token is dropped, as the reference does
 * (SmolLM2 has none for 21 bytes: 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF).
 * A bpe_tok is immutable after creation and may be shared by threads. */
#ifndef MOH_BPE_H
#define MOH_BPE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

typedef struct bpe_tok bpe_tok;

/* Pre-tokenizers by llama.cpp's `tokenizer.ggml.pre` name: "gpt-2" (GPT-2 regex; also "gpt2"), "smollm" (every
 * \p{N} isolated, then the GPT-2 regex; also "starcoder", "refact"), "llama-bpe" (LLaMA-3 regex;
 * also "llama3"). BPE_PRE_CUSTOM: the regexes in bpe_spec.pre_regex. */
typedef enum bpe_pre { BPE_PRE_GPT2, BPE_PRE_SMOLLM, BPE_PRE_LLAMA3, BPE_PRE_CUSTOM } bpe_pre;

#define BPE_MAX_REGEX 4

/* The tokenizer as arrays (what GGUF metadata holds):
 *   tokens[n_tokens]: token strings in id order, in the GPT-2 byte-to-unicode form ("Ġthe");
 *                     NULL = no token with that id (never produced; decoding it is an error).
 *   merges[n_merges]: "A B" (both tokens, one space), rank = index; A+B must be a token.
 *   added[n_added]:   ids of tokens matched literally in the text before BPE (their string is the
 *                     content; e.g. <|im_end|>); they decode to that content.
 *   pre / pre_regex[n_regex]: the pre-tokenizer; custom regexes are applied in order, each
 *                     splitting the previous pieces into its matches and the gaps between them.
 *   ignore_merges:    a piece that is itself a token is emitted whole (LLaMA-3). */
typedef struct bpe_spec {
    const char *const *tokens;
    int n_tokens;
    const char *const *merges;
    int n_merges;
    const int *added;
    int n_added;
    bpe_pre pre;
    const char *pre_regex[BPE_MAX_REGEX];
    int n_regex;
    bool ignore_merges;
    const char *source; /* where the tokenizer came from, for messages (a file path), or NULL */
    /* added_normalized[n_added] (NULL: all false): tokens HF marks "normalized": true, matched
     * in the gaps the others leave (tokenizers' second pass). */
    const bool *added_normalized;
    /* ids the post-processor puts around one encoded text (bpe_encode_special): post_prefix
     * before, post_suffix after (HF TemplateProcessing "single"); each a token. */
    const int *post_prefix;
    int n_post_prefix;
    const int *post_suffix;
    int n_post_suffix;
} bpe_spec;

/* Maps a `tokenizer.ggml.pre` name to *pre (ignore_merges: true for LLaMA-3). Unknown names:
 * MOH_E_CONFIG naming the name and the supported ones. */
int bpe_pre_from_name(const char *name, bpe_pre *pre, bool *ignore_merges, moh_error *err);

/* Builds *out from spec (copied; spec may be freed after). Errors (*out NULL): MOH_E_FORMAT for a
 * duplicate token, a malformed merge or one naming an unknown token, an added id out of range,
 * a regex PCRE2 rejects (with its message and offset); MOH_E_ARG for counts < 0; MOH_E_NOMEM. */
int bpe_create(bpe_tok **out, const bpe_spec *spec, moh_error *err);

/* Hugging Face tokenizer.json text[0..len) (label names it in messages), read as `tokenizers`
 * 0.23 reads it (the rules: top comment of bpe.c): model BPE (vocab, merges as "A B" strings or
 * [A, B] pairs, ignore_merges), added_tokens (ids as tokenizers assigns them), normalizer null,
 * pre_tokenizer ByteLevel / Digits / Split(Isolated) / a Sequence of these ending in ByteLevel,
 * post_processor null / ByteLevel / TemplateProcessing (bpe_encode_special applies it), decoder
 * null / ByteLevel. What tokenizers refuses, and what it applies but moh does not (a normalizer,
 * dropout, add_prefix_space, lstrip on an added token, ...), is MOH_E_FORMAT in one line naming
 * the field; JSON syntax errors MOH_E_FORMAT with line and column. */
int bpe_from_tokenizer_json(bpe_tok **out, const char *text, size_t len, const char *label,
                            moh_error *err);
/* Same, from the file at path (MOH_E_IO when unreadable). */
int bpe_load_tokenizer_json(bpe_tok **out, const char *path, moh_error *err);

/* The tokenizer as Hugging Face tokenizer.json text (*json[*len], malloc'd, NUL-terminated):
 * model BPE (vocab in id order, merges "A B" in rank order, ignore_merges), every added token
 * as special (matched before BPE, as bpe_encode does), normalizer null, the pre-tokenizer (gpt2:
 * ByteLevel; smollm: Digits(individual) + ByteLevel; llama-bpe: Split(LLaMA-3 regex, Isolated) +
 * ByteLevel(use_regex false); custom regexes: Digits / Split stages then ByteLevel),
 * post_processor null, ByteLevel decoder. bpe_from_tokenizer_json reads it back to the same ids,
 * and Hugging Face `tokenizers` encodes with it as bpe_encode does (tools/ref/bpe_fixtures.py
 * roundtrip). MOH_E_NOMEM. */
int bpe_to_tokenizer_json(const bpe_tok *t, char **json, size_t *len, moh_error *err);

/* Hugging Face tokenizer_config.json text[0..len) for tokenizer t: *eos_id from "eos_token" (a
 * string or an object with "content"; -1 when absent), *chat_template (malloc'd, or NULL) from
 * "chat_template" (a string, or the entry named "default" of a list of named templates). Other
 * fields are ignored. MOH_E_FORMAT naming label: not a JSON object, an eos_token that is not a
 * token of t. MOH_E_NOMEM. */
int bpe_read_tokenizer_config(const bpe_tok *t, const char *text, size_t len, const char *label, int *eos_id,
                              char **chat_template, moh_error *err);
/* tokenizer_config.json text for t (malloc'd; NULL on OOM): PreTrainedTokenizerFast, eos_token
 * (the string of eos_id, left out when -1), chat_template (left out when NULL). */
char *bpe_tokenizer_config_json(const bpe_tok *t, int eos_id, const char *chat_template);

void bpe_free(bpe_tok *t);

/* Number of token ids (n_tokens of the spec). */
int bpe_n_tokens(const bpe_tok *t);
/* The id of the token with string s (byte-level form), or -1. */
int bpe_token_id(const bpe_tok *t, const char *s);
/* The string of token id as given (byte-level form, "Ġthe"; owned by t), or NULL when id is out
 * of range or has no token. */
const char *bpe_token_str(const bpe_tok *t, int id);
/* The bytes token id decodes to (*bytes, *len; owned by t). MOH_E_ARG when id is out of range
 * or has no token. */
int bpe_token_bytes(const bpe_tok *t, int id, const uint8_t **bytes, size_t *len, moh_error *err);
/* Longest token in bytes (for sizing bpe_stream_push's buffer). */
size_t bpe_max_token_bytes(const bpe_tok *t);

/* GPT-2's spelling of byte b (0..255) in a byte-level vocabulary (bytes_to_unicode of openai/gpt-2
 * encoder.py: printable Latin-1 bytes stand for themselves, the other 68 for U+0100 + k), as a
 * NUL-terminated UTF-8 string in out. */
void bpe_byte_spelling(int b, char out[4]);

/* Length (1..4) of the valid UTF-8 character at s[0..n), or 0 when s starts with an invalid or
 * incomplete one (overlong forms, surrogates and code points past U+10FFFF are invalid). */
int bpe_utf8_len(const uint8_t *s, size_t n);

/* Encodes text[0..len) (any bytes) into *ids[*n_ids] (malloc'd, caller frees; NULL when
 * *n_ids == 0). parse_added: match added tokens (HF's behaviour); false encodes their text as
 * ordinary bytes. MOH_E_NOMEM; MOH_E_ARG for len > INT_MAX; MOH_E_FORMAT when PCRE2 gives up on
 * a (custom) regex, e.g. at its match limit. */
int bpe_encode(const bpe_tok *t, const uint8_t *text, size_t len, bool parse_added, int **ids,
               size_t *n_ids, moh_error *err);

/* bpe_encode with added tokens matched, then the post-processor's ids around the result (what
 * Hugging Face's encode(text) gives with its default add_special_tokens=True; bpe_encode is
 * encode(text, add_special_tokens=False)). Errors as bpe_encode. */
int bpe_encode_special(const bpe_tok *t, const uint8_t *text, size_t len, int **ids, size_t *n_ids,
                       moh_error *err);

/* Concatenated bytes of ids[0..n) into *out[*out_len] (malloc'd + one NUL byte, caller frees).
 * MOH_E_ARG naming the first id out of range; MOH_E_NOMEM. */
int bpe_decode(const bpe_tok *t, const int *ids, size_t n, uint8_t **out, size_t *out_len,
               moh_error *err);

/* Streaming decoder: push ids one at a time, print what comes out. A UTF-8 character is never
 * split across outputs: up to 3 bytes that start a possibly valid character are held back.
 * The concatenation of every output and the final flush equals bpe_decode of all ids. Zero it
 * (bpe_stream s = {0}) to start. */
typedef struct bpe_stream {
    uint8_t held[4];
    int n_held;
} bpe_stream;
/* Writes the printable bytes after id into out (cap >= bpe_max_token_bytes(t) + 3), *n_out.
 * MOH_E_ARG for a bad id or a small cap (s unchanged). */
int bpe_stream_push(const bpe_tok *t, bpe_stream *s, int id, uint8_t *out, size_t cap,
                    size_t *n_out, moh_error *err);
/* The held bytes (an incomplete character at the end of the stream) into out; returns their
 * count (0..3) and empties s. */
size_t bpe_stream_flush(bpe_stream *s, uint8_t out[4]);

/* ---- what writers of other formats read (GGUF export: bpe_gguf.h) ---- */
/* The pre-tokenizer t was created with (a tokenizer.json whose pre_tokenizer equals a named one,
 * as bpe_to_tokenizer_json writes them, gives that name; BPE_PRE_CUSTOM: other regex lists). */
bpe_pre bpe_pre_kind(const bpe_tok *t);
/* bpe_spec.source (the tokenizer.json path when read from one), or NULL. */
const char *bpe_source(const bpe_tok *t);
/* true when id is an added token (matched literally before BPE). */
bool bpe_is_added(const bpe_tok *t, int id);
/* The post-processor's ids (bpe_spec.post_prefix / post_suffix; views into t, NULL when 0). */
void bpe_post_ids(const bpe_tok *t, const int **prefix, int *n_prefix, const int **suffix, int *n_suffix);
/* The merges in rank order as token-id pairs (*left)[i] (*right)[i], i < *n (malloc'd, caller
 * frees both; NULL when *n == 0). A merge given twice appears once, at its first rank.
 * MOH_E_NOMEM. */
int bpe_merge_ids(const bpe_tok *t, int **left, int **right, int *n, moh_error *err);

#endif
