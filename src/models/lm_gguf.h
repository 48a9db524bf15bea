/* LLaMA-architecture models from and to GGUF (lm_gguf.c). Source: llama.cpp convert_hf_to_gguf.py
 * (LlamaModel: metadata, LlamaModel.permute of attn_q / attn_k) and src/llama-model.cpp
 * (LLM_ARCH_LLAMA hyperparameters and tensors). Weights are float32 in lm_params layout. */
#ifndef MOH_LM_GGUF_H
#define MOH_LM_GGUF_H
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "ops/quant.h"
#include "models/lm.h"
#include "text/bpe.h"

/* The config of a GGUF whose general.architecture is "llama", the keys read as llama.cpp's
 * llama_model::load_hparams reads them for LLM_ARCH_LLAMA (the reason in brackets; refused in one
 * line naming the file and key: MOH_E_SHAPE missing, MOH_E_FORMAT type, MOH_E_CONFIG value):
 * - every key of exactly its type (GKV::get_kv "wrong type"): u32 block_count, embedding_length,
 *   context_length, feed_forward_length, attention.head_count[_kv], attention.key_length /
 *   value_length, rope.dimension_count, vocab_size, expert_[used_|group_|group_used_]count,
 *   rope.scaling.original_context_length; f32 attention.layer_norm_rms_epsilon, rope.freq_base,
 *   rope.scaling.factor / attn_factor, rope.scale_linear; string rope.scaling.type; bool
 *   rope.scaling.finetuned; u16 split.count;
 * - block_count 1..512 (LLAMA_MAX_LAYERS, get_key_or_arr); layer_norm_rms_epsilon required;
 * - feed_forward_length, head_count, head_count_kv: a u32 or n_layer i32 / u32 / bool values
 *   (get_key_or_arr; another length refused); moh has one width for all layers, so differing
 *   values are refused;
 * - head_dim = key_length (default C / heads); rope.dimension_count != key_length refused
 *   ("invalid n_rot"), value_length != key_length refused (the llama graph asserts it);
 * - RoPE: freq_base (default 10000); rope.scaling.type (default "linear") none or linear, yarn /
 *   longrope / unknown names refused; rope.scaling.factor (else the older rope.scale_linear; 0 or
 *   absent: none) honoured as HF "linear" (llama.cpp freq_scale = 1 / factor), ignored for type
 *   none (llama_context), negative refused; rope.scaling.attn_factor other than 1 refused;
 * - expert counts other than 0 refused (a mixture-of-experts FFN); split.count > 1 refused (the
 *   other files of a split model);
 * - llama.vocab_size other than the rows of token_embd.weight refused (older llama.cpp sized
 *   token_embd by it; current llama.cpp uses the token count, which model_open checks);
 * vocab_size is the rows of token_embd.weight, tied when there is no output.weight; router
 * "none" (a dense model). */
int lm_gguf_config(const moh_gguf *g, const char *path, moh_lm_config *cfg, moh_error *err);
/* The weights of cfg (lm_gguf_config's) into data (lm_params layout, float32), dequantised, with
 * attn_q / attn_k rows back in the HF rotate-half order; the matrices `held` holds (may be NULL;
 * lm_gguf_quant_table's over data) are left unwritten, their blocks checked finite. A missing,
 * misshapen (all 4 ne compared, trailing 1s allowed, as check_tensor_dims), non-finite or unknown
 * tensor (biases, rope_freqs), or an unsupported quant type, is an error naming it. */
int lm_gguf_weights(const moh_gguf *g, const char *path, const moh_lm_config *cfg, float *data,
                    const quant_table *held, moh_error *err);
/* The file's quantised matrices (Q8_0, Q4_0, Q4_1 tensors of 2 dims and cfg's shape; attn_q /
 * attn_k rows put back in Hugging Face order as lm_gguf_weights does, into qt's own memory; the
 * others' blocks borrowed from g's mapping, which must outlive qt; attn_output only when head_dim
 * is a multiple of 32, as decode reads it per head) into qt (quant_table_free), keyed by their
 * place in data [n] (lm_gguf_weights' buffer). An empty table when the file has none. Tensors of
 * another shape are left to lm_gguf_weights' errors. MOH_OK, MOH_E_NOMEM. */
int lm_gguf_quant_table(const moh_gguf *g, const char *path, const moh_lm_config *cfg, const float *data, size_t n,
                        quant_table *qt, moh_error *err);
/* Writes a dense LM (router "none") as a GGUF that llama.cpp runs: the llama.* metadata, the
 * weights under llama.cpp's names (wtype MOH_GGML_F32; or the matrices in F16, Q8_0, Q4_0 or Q4_1
 * (4-bit: the embedding and LM head Q8_0; rows not of whole blocks F16) and the norms F32), attn_q /
 * attn_k rows in ggml's RoPE order, no output.weight when tied, linear RoPE scaling as
 * llama.rope.scaling.type / factor (llama3 scaling is refused), and the vocabulary: tok's BPE
 * (bpe_to_gguf: tokens, types, merges, pre; the special ids and chat template from `from`, the
 * GGUF the model was read from, or when NULL eos_id and chat_template (may be NULL)), or without one (tok NULL or the byte
 * vocabulary) the bytes as a byte-level BPE without merges (token b = byte b in GPT-2's
 * byte-to-unicode spelling; ids >= 256 "<xN>", unused). MOH_E_ARG for a MoH model (llama.cpp has
 * no head routing) or a tokenizer whose size is not vocab_size, MOH_E_IO / NOMEM. */
int lm_gguf_export(const moh_lm_config *cfg, const float *data, const bpe_tok *tok, int eos_id,
                   const char *chat_template, const moh_gguf *from, const char *path, int wtype, moh_error *err);
#endif
