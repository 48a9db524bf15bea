/* LLaMA-architecture models from and to GGUF (lm_gguf.c). Source: llama.cpp convert_hf_to_gguf.py
 * (LlamaModel: metadata, LlamaModel.permute of attn_q / attn_k) and src/llama-model.cpp
 * (LLM_ARCH_LLAMA hyperparameters and tensors). Weights are float32 in lm_params layout. */
#ifndef MOH_LM_GGUF_H
#define MOH_LM_GGUF_H
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "models/lm.h"
#include "text/bpe.h"

/* The config of a GGUF whose general.architecture is "llama": hidden_size (llama.embedding_length),
 * layers (block_count), heads and KV heads (attention.head_count[_kv]), head_dim
 * (attention.key_length, default C / h), intermediate_size (feed_forward_length), context
 * (context_length), rms_norm_eps, rope_theta (rope.freq_base, default 10000), vocab_size (ne[1] of
 * token_embd.weight), tied when there is no output.weight; router "none" (a dense model).
 * RoPE scaling other than none is refused. Errors name path and key: MOH_E_SHAPE (missing),
 * MOH_E_FORMAT (type), MOH_E_CONFIG (value). */
int lm_gguf_config(const moh_gguf *g, const char *path, moh_lm_config *cfg, moh_error *err);
/* The weights of cfg (lm_gguf_config's) into data (lm_params layout, float32), dequantised, with
 * attn_q / attn_k rows back in the HF rotate-half order. A missing, misshapen, non-finite or
 * unknown tensor, or an unsupported quant type, is an error naming it. */
int lm_gguf_weights(const moh_gguf *g, const char *path, const moh_lm_config *cfg, float *data, moh_error *err);
/* Writes a dense LM (router "none") as a GGUF that llama.cpp runs: the llama.* metadata, the
 * weights under llama.cpp's names (F32, or with f16 the matrices in F16 and the norms F32), attn_q /
 * attn_k rows in ggml's RoPE order, no output.weight when tied, and the vocabulary: tok's BPE
 * (bpe_to_gguf: tokens, types, merges, pre; the special ids and chat template from `from`, the
 * GGUF the model was read from, or when NULL eos_id and chat_template (may be NULL)), or without one (tok NULL or the byte
 * vocabulary) the bytes as a byte-level BPE without merges (token b = byte b in GPT-2's
 * byte-to-unicode spelling; ids >= 256 "<xN>", unused). MOH_E_ARG for a MoH model (llama.cpp has
 * no head routing) or a tokenizer whose size is not vocab_size, MOH_E_IO / NOMEM. */
int lm_gguf_export(const moh_lm_config *cfg, const float *data, const bpe_tok *tok, int eos_id,
                   const char *chat_template, const moh_gguf *from, const char *path, bool f16, moh_error *err);
#endif
