/* moh: Mixture-of-Head attention engine. Public API.
 *
 * Conventions (all functions):
 *  - Tensors are dense row-major float32 arrays; shapes are written [dim0, dim1, ...] with the last
 *    index fastest. B = batch, N = sequence length, C = hidden_size (d_model), h = n_heads,
 *    h_kv = n_kv_heads, d = head_dim, E = h - shared_heads (routed heads), T = B*N tokens.
 *  - Fallible calls return 0 (MOH_OK) or a negative moh_status and fill a caller-owned moh_error
 *    with a one-line message naming the file, field and expected value. Nothing aborts.
 *  - Section numbers (spec §N) refer to docs/spec.md, the project's statement of MoH semantics.
 */
#ifndef MOH_H
#define MOH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOH_VERSION "0.1.0"

typedef enum moh_status {
    MOH_OK = 0,
    MOH_E_IO = -1,     /* file missing, unreadable, unwritable */
    MOH_E_FORMAT = -2, /* malformed file contents (safetensors, JSON, IDX, text) */
    MOH_E_CONFIG = -3, /* inconsistent or out-of-range configuration */
    MOH_E_SHAPE = -4,  /* tensor missing or of the wrong shape/dtype */
    MOH_E_NOMEM = -5,  /* allocation failed */
    MOH_E_ARG = -6,    /* bad argument from the caller */
    MOH_E_NONFINITE = -7, /* a loss or gradient norm is NaN or infinite (a training step not applied) */
    MOH_E_DEVICE = -8, /* GPU missing, built without CUDA, or a CUDA / cuBLASLt call failed */
} moh_status;

typedef struct moh_error {
    int code;        /* a moh_status */
    char msg[1024];  /* one line, no trailing newline */
} moh_error;

/* Formats err->msg (printf-style; a newline or carriage return, from a quoted input say, becomes a space:
 * the message is one line), sets err->code = code and returns code. err may be NULL. */
int moh_fail(moh_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ------------------------------------------------------------------------------------------------
 * safetensors (https://huggingface.co/docs/safetensors): 8-byte little-endian header length n,
 * n bytes of UTF-8 JSON {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}},
 * then the data buffer. Read: F32, F64, BF16, F16 (converted to float32). Write: F32.
 * ---------------------------------------------------------------------------------------------- */
#define MOH_ST_MAX_DIMS 8

typedef enum moh_dtype { MOH_DT_F32, MOH_DT_F64, MOH_DT_BF16, MOH_DT_F16, MOH_DT_OTHER } moh_dtype;

typedef struct moh_st_tensor {
    char *name;
    moh_dtype dtype;
    char dtype_name[16];           /* as written in the file, e.g. "F32", "I64" */
    int ndim;
    int64_t shape[MOH_ST_MAX_DIMS];
    int64_t numel;
    size_t begin, end;             /* byte offsets into the data buffer */
} moh_st_tensor;

typedef struct moh_safetensors {
    char *path;                    /* label used in error messages ("<memory>" when parsed) */
    uint8_t *file;                 /* owned copy of the file (NULL when parsing borrowed memory) */
    const uint8_t *data;           /* start of the data buffer */
    size_t data_size;
    int n_tensors;
    moh_st_tensor *tensors;
    int n_meta;                    /* __metadata__ pairs, in file order: */
    char **meta;                   /* meta[2i] -> meta[2i+1] (keys unique; use moh_st_meta) */
} moh_safetensors;

/* Reads and validates a whole file as the reference safetensors reader does: header length, JSON,
 * dtypes, shapes vs offsets, tensors tiling the data buffer to the end of the file (rules: top of
 * src/io/safetensors.c). Returns MOH_OK, MOH_E_IO or MOH_E_FORMAT; on error st is left empty. */
int moh_st_open(moh_safetensors *st, const char *path, moh_error *err);
/* Same validation on a buffer the caller keeps alive while st is used (fuzzing, tests). */
int moh_st_parse(moh_safetensors *st, const uint8_t *buf, size_t len, const char *label,
                 moh_error *err);
void moh_st_close(moh_safetensors *st);
/* The tensor called name, or NULL. */
const moh_st_tensor *moh_st_find(const moh_safetensors *st, const char *name);
/* Copies tensor name into out (numel float32 values), converting from F32/F64/BF16/F16.
 * shape/ndim: the expected shape; a mismatch or absent tensor is MOH_E_SHAPE naming both. */
int moh_st_read_f32(const moh_safetensors *st, const char *name, int ndim, const int64_t *shape,
                    float *out, moh_error *err);

typedef struct moh_st_entry {
    const char *name;
    int ndim;
    int64_t shape[MOH_ST_MAX_DIMS];
    const float *data;             /* numel float32 values */
} moh_st_entry;

/* Value of __metadata__[key] of an opened file, or NULL (no such key, no __metadata__). */
const char *moh_st_meta(const moh_safetensors *st, const char *key);
/* s (a tensor name, say) made safe to quote in a one-line message, into buf (cap >= 8): control
 * bytes, quote and backslash escaped, long names cut with "...". Returns buf. */
const char *moh_st_quote(char *buf, size_t cap, const char *s);
/* __metadata__[key] parsed as a finite number in [lo, hi] (an integer when `integer`) into *out.
 * MOH_E_FORMAT naming the file, the key and the expected range when it is missing, not a number,
 * not finite, fractional where an integer is expected, or out of range. */
int moh_st_meta_number(const moh_safetensors *st, const char *key, double lo, double hi, bool integer,
                       double *out, moh_error *err);

/* Writes entries as an F32 safetensors file, with a __metadata__ object of n_meta string pairs
 * meta[2i] -> meta[2i+1] (none when n_meta is 0). Names, keys and values must be valid UTF-8;
 * a repeated tensor name or metadata key is MOH_E_ARG. Atomic: PATH.tmp.PID is written and
 * fsync'ed, renamed over path, then the directory is fsync'ed. Returns MOH_OK or
 * MOH_E_IO/MOH_E_ARG/MOH_E_NOMEM.
 * Any error before the rename leaves an existing file at path untouched (and no temporary file).
 * Once the rename is done the new, fully synced file is in place: if only the final directory
 * fsync then fails, EINVAL/ENOTSUP (a filesystem that cannot sync directories) still return
 * MOH_OK; any other failure returns MOH_E_IO with a message saying that the new file is in place
 * but its rename may not survive a crash. */
int moh_st_write_meta(const char *path, const moh_st_entry *entries, int n,
                      const char *const *meta, int n_meta, moh_error *err);
/* moh_st_write_meta without metadata. */
int moh_st_write(const char *path, const moh_st_entry *entries, int n, moh_error *err);

/* ------------------------------------------------------------------------------------------------
 * One MoH attention layer (spec §1-3, §10).
 * ---------------------------------------------------------------------------------------------- */
typedef enum moh_router {
    MOH_ROUTER_NONE = 0,       /* dense multi-head attention: every head on, every gate 1 */
    MOH_ROUTER_LEARNED = 1,    /* two-stage learned router: wg, wg_0, wg_1 (spec §1) */
    MOH_ROUTER_QUERY_NORM = 2, /* parameter-free, ||q_i|| / std, softmax, top-k, binary (spec §3) */
} moh_router;

/* Hugging Face `rope_scaling` of LLaMA-family configs (transformers modeling_rope_utils.py):
 * the per-pair inverse frequency inv_j = 1 / theta^(2j/d) is rescaled, positions are unchanged.
 * DEFAULT: inv_j. LINEAR: inv_j / factor (positions divided by factor). LLAMA3
 * (_compute_llama3_parameters): wavelength w_j = 2 pi / inv_j; w_j < original / high_freq_factor
 * keeps inv_j, w_j > original / low_freq_factor gives inv_j / factor, between them a linear blend
 * with s = (original / w_j - low_freq_factor) / (high_freq_factor - low_freq_factor):
 * (1 - s) inv_j / factor + s inv_j. All zero: no scaling. */
typedef enum moh_rope_type {
    MOH_ROPE_DEFAULT = 0, /* "default", null or absent */
    MOH_ROPE_LINEAR = 1,  /* "linear": factor */
    MOH_ROPE_LLAMA3 = 2,  /* "llama3": factor, low/high_freq_factor, original_max_position_embeddings */
} moh_rope_type;

typedef struct moh_rope_scaling {
    moh_rope_type type;
    double factor;                        /* LINEAR, LLAMA3: > 0 */
    double low_freq_factor;               /* LLAMA3: > 0 */
    double high_freq_factor;              /* LLAMA3: > low_freq_factor */
    int original_max_position_embeddings; /* LLAMA3: > 0, the pre-extension context */
} moh_rope_scaling;

typedef struct moh_attn_config {
    int hidden_size;       /* C */
    int n_heads;           /* h, query heads */
    int n_kv_heads;        /* h_kv, divides h (GQA); query head i uses KV head i / (h / h_kv) */
    int head_dim;          /* d */
    int shared_heads;      /* h_s: heads 0..h_s-1 always on */
    int top_k;             /* K of the E = h - h_s routed heads chosen per token */
    moh_router router;
    bool causal;
    bool qkv_bias;
    bool proj_bias;
    bool fused_qkv;        /* weight names: qkv/proj (ViT, DiT) or q_proj/k_proj/v_proj/o_proj */
    double rope_theta;     /* <= 0: no RoPE; else rotate-half RoPE with this base (spec §10) */
    moh_rope_scaling rope_scaling; /* with rope_theta > 0: the inverse frequencies' rescaling */
    double load_balance_coef; /* beta */
    bool straight_through; /* query_norm only: backward passes dL/dg of each selected routed head
                            * to its softmax score (spec §10); false: binary gates are constants */
} moh_attn_config;

/* Fills c with defaults (no router, dense, no RoPE). */
void moh_attn_config_default(moh_attn_config *c);
/* Checks every field; the message names the field, its value and what is expected.
 * label: the file name shown in the message. Returns MOH_OK or MOH_E_CONFIG. */
int moh_attn_config_validate(const moh_attn_config *c, const char *label, moh_error *err);
/* Parses a LAYER.json (keys: hidden_size, num_attention_heads, num_key_value_heads, head_dim,
 * shared_heads, top_k, router, causal, qkv_bias, proj_bias, rope_theta, load_balance_coef,
 * straight_through),
 * then validates. fused_qkv is not a JSON key: it is set from the weights file. */
int moh_attn_config_parse_json(moh_attn_config *c, const char *text, size_t len, const char *label,
                               moh_error *err);

/* One layer on caller buffers (CPU; include/moh_cuda.h has its GPU twin): what bindings such as
 * python/moh/torch.py call. float32 host arrays, row-major; weights under the official module's
 * names (spec §10): qkv.weight = w_qkv [(h + 2 h_kv) d, C] (q rows, then k, then v), qkv.bias =
 * b_qkv [(h + 2 h_kv) d], proj.weight = w_o [C, h d], proj.bias = b_o [C], wg [E, C], wg_0 [2, C],
 * wg_1 [h_s, C]; a field is NULL exactly when the config has no such tensor (moh_attn_layer_has).
 * Runs the head-sparse path (only the selected (token, head) pairs; spec §10) with OpenMP threads;
 * the reference path where the head-sparse one cannot run the config (odd head_dim with RoPE). */
typedef struct moh_attn_weights {
    const float *w_qkv, *b_qkv, *w_o, *b_o, *wg, *wg_0, *wg_1;
} moh_attn_weights;
/* Gradients, same shapes; ACCUMULATED into (+=); NULL fields skipped. */
typedef struct moh_attn_grads {
    float *w_qkv, *b_qkv, *w_o, *b_o, *wg, *wg_0, *wg_1;
} moh_attn_grads;

typedef struct moh_attn_layer moh_attn_layer;

/* Which of the tensors above cfg has, in the order w_qkv, b_qkv, w_o, b_o, wg, wg_0, wg_1:
 * has[7]. */
void moh_attn_layer_has(const moh_attn_config *cfg, bool has[7]);
/* A layer for batches of up to max_B x max_N tokens (cfg copied). MOH_E_CONFIG (cfg invalid, the
 * field named), MOH_E_ARG (max_B, max_N < 1), MOH_E_NOMEM. Source: attn/layer.h. */
int moh_attn_layer_new(moh_attn_layer **out, const moh_attn_config *cfg, int max_B, int max_N, moh_error *err);
/* Frees the layer and everything it owns; NULL is a no-op. */
void moh_attn_layer_free(moh_attn_layer *l);
/* Forward (spec §1): x [B, N, C] -> y [B, N, C] (written), lb (may be NULL) gets the load-balance
 * loss of spec §2 (E sum_i P_i f_i, the official l_aux; 0 without a learned router). x is borrowed
 * until backward. MOH_E_ARG: NULL x / y / a tensor the config needs, B or N out of capacity. */
int moh_attn_layer_forward(moh_attn_layer *l, const moh_attn_weights *w, const float *x, int B, int N, float *y,
                           float *lb, moh_error *err);
/* Backward of L = sum(y * dy) + lb_scale * lb after forward (same w, x still valid): dy [B, N, C];
 * dx [B, N, C] (may be NULL) and g are ACCUMULATED into. MOH_E_ARG without a forward before it. */
int moh_attn_layer_backward(moh_attn_layer *l, const moh_attn_weights *w, const moh_attn_grads *g,
                            const float *dy, float lb_scale, float *dx, moh_error *err);
/* Compute precision of the next forwards and backwards: bf16 (true) runs the projections as bf16
 * GEMMs and the attention tiles in bf16 where the CPU has AVX512-BF16 or AMX-BF16, accumulating in
 * float32 (operands rounded to bf16 on the fly; buffers stay float32); false: float32 (the
 * default). MOH_OK, MOH_E_ARG (NULL l), MOH_E_NOMEM. Source: attn/layer.h attn_layer_set_compute. */
int moh_attn_layer_set_bf16(moh_attn_layer *l, bool bf16, moh_error *err);
/* Gates [B N, h] (row-major, the router's weight of each head, 0 for a head not selected) of the
 * last forward, valid until the next forward; NULL before any or for a NULL l. */
const float *moh_attn_layer_gates(const moh_attn_layer *l);

/* ------------------------------------------------------------------------------------------------
 * Decoder language model (LLaMA-style, MoH attention). config.json uses HF LlamaConfig names.
 * ---------------------------------------------------------------------------------------------- */
typedef struct moh_lm_config {
    int hidden_size;             /* C */
    int num_hidden_layers;       /* L */
    int num_attention_heads;     /* h */
    int num_key_value_heads;     /* h_kv (GQA), default h */
    int head_dim;                /* default C / h */
    int intermediate_size;       /* I, SwiGLU width */
    int vocab_size;              /* V (256: bytes) */
    int max_position_embeddings; /* default training/eval context T */
    double rms_norm_eps;
    double rope_theta;
    moh_rope_scaling rope_scaling; /* HF rope_scaling (default: none) */
    bool tie_word_embeddings;
    int shared_heads;            /* h_s */
    int top_k;                   /* K routed heads per token */
    moh_router router;           /* learned, none (dense MHA twin) or query_norm; default none
                                  * for a config without MoH keys (plain HF LLaMA), else learned
                                  * (converted pretrained models, spec §3) */
    double load_balance_coef;    /* beta, default 0.01 */
    bool straight_through;       /* query_norm: train through the STE (default true, spec §10) */
    moh_attn_config attn;        /* derived: causal, RoPE, split projections, no biases */
} moh_lm_config;

/* Parses and validates config.json (HF LlamaConfig fields plus shared_heads, top_k, router,
 * load_balance_coef), then calls moh_lm_config_finalize, which fills cfg->attn. Defaults:
 * num_key_value_heads = heads, head_dim = hidden / heads (absent or null), rms_norm_eps 1e-6,
 * rope_theta 10000, tie_word_embeddings false, router "none" when no MoH key is given (a plain HF LLaMA config) else "learned", shared_heads 0, top_k 0,
 * load_balance_coef 0.01. Standard HF keys moh does not use are accepted: architectures,
 * model_type, torch_dtype, attention_dropout, initializer_range, bos/eos/pad_token_id,
 * pretraining_tp, use_cache, transformers_version, dtype, is_llama_config, transformers.js_config
 * (SmolLM2), rope_interleaved when false, and hidden_act / attention_bias / mlp_bias
 * when they match moh ("silu", false, false). rope_scaling: null, or an object with "rope_type"
 * (or the older "type") "default", "linear" (factor) or "llama3" (factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings); other types and keys are errors.
 * transformers 5's rope_parameters (the same object plus rope_theta) is read the same way. Keys
 * starting with "_" or "comment" are annotations. Any other key is an error naming it. Errors name label, field, value,
 * expectation: MOH_E_FORMAT (JSON syntax) / MOH_E_CONFIG; on error cfg is zeroed. */
int moh_lm_config_parse_json(moh_lm_config *cfg, const char *text, size_t len, const char *label,
                             moh_error *err);
/* Checks the fields and derives cfg->attn. MOH_OK or MOH_E_CONFIG. */
int moh_lm_config_finalize(moh_lm_config *cfg, const char *label, moh_error *err);
/* config.json text (malloc'd, caller frees) that transformers' LlamaForCausalLM loads: the HF
 * fields plus architectures, model_type "llama", hidden_act "silu", and the MoH fields. */
char *moh_lm_config_to_json(const moh_lm_config *cfg);

/* ------------------------------------------------------------------------------------------------
 * Models of every family: "llama" (decoder LM over bytes, HF LlamaForCausalLM layout) and "vit"
 * (image classifier, timm VisionTransformer layout), behind one opaque handle (src/api.c over the
 * model interface src/models/model.h). Load a checkpoint directory (config.json +
 * model.safetensors, as `moh train` writes) or build from a config.json, run forward passes and
 * AdamW training steps, save. A handle is used by one thread at a time (the ops inside run in
 * parallel with OpenMP). Pointers a getter returns stay valid until the handle is freed; gates
 * (moh_model_router_gates) only until the next forward or training step. A NULL handle is an
 * error (MOH_E_ARG) where a call returns a status, and gives 0 / NULL / -1 from a getter.
 * ---------------------------------------------------------------------------------------------- */
typedef struct moh_model moh_model;

#define MOH_MODEL_MAX_DIMS 4

/* Loads checkpoint_dir/config.json (family from its "model_type"; absent = "llama") and
 * checkpoint_dir/model.safetensors into a new handle *out (NULL on error). Every tensor must be
 * present, of the config's shape and finite; optimizer.safetensors is not read (AdamW moments
 * start at zero). Returns MOH_OK, or MOH_E_ARG (NULL argument), MOH_E_IO (missing file),
 * MOH_E_FORMAT / MOH_E_CONFIG (bad JSON or config), MOH_E_SHAPE (tensor missing, extra or
 * misshapen), MOH_E_NOMEM; the message names the file and tensor or field. checkpoint_dir may
 * also be a Hugging Face folder with sharded weights, or a LLaMA-architecture .gguf file (weights
 * dequantised to float32). Source: train/checkpoint.h model_open. */
int moh_model_load(moh_model **out, const char *checkpoint_dir, moh_error *err);
/* A new handle from a config.json file, parameters drawn by the family's initialisation (LM: HF
 * LLaMA, N(0, 0.02^2) matrices, RMSNorm weights 1; ViT: timm's init_weights), deterministic in
 * seed. Errors as moh_model_load. Source: models/model.h model_from_config_file, init_random. */
int moh_model_new(moh_model **out, const char *config_json_path, uint64_t seed, moh_error *err);
/* Frees the handle and everything it owns; NULL is a no-op. */
void moh_model_free(moh_model *m);

/* config.json "model_type" of the family: "llama" or "vit". */
const char *moh_model_type(const moh_model *m);
/* Number of float32 parameters n (the length of moh_model_params). */
size_t moh_model_num_params(const moh_model *m);
/* Transformer layers L (LM num_hidden_layers, ViT depth). */
int moh_model_num_layers(const moh_model *m);
/* Query heads h per layer (shared + routed). */
int moh_model_num_heads(const moh_model *m);
/* The attention configuration every layer shares (heads, shared_heads, top_k, router, ...). */
const moh_attn_config *moh_model_attn(const moh_model *m);
/* Outputs per prediction: vocabulary size V (LM) or classes K (ViT). */
int moh_model_num_outputs(const moh_model *m);
/* Text models: the longest sequence T a forward accepts (max_position_embeddings); 0 for images. */
int moh_model_max_seq_len(const moh_model *m);
/* Image models: the input shape [C, H, W] a forward expects (in_chans, img_size, img_size); all 0
 * for text models. Any pointer may be NULL. */
void moh_model_image_shape(const moh_model *m, int *C, int *H, int *W);
/* Image models: the normalisation of channel c the model was trained with: pixels given to
 * moh_model_forward are (value / 255 - mean) / std. mean 0, std 1 when the config has none.
 * MOH_E_ARG for a text model or c outside [0, C). */
int moh_model_image_norm(const moh_model *m, int c, double *mean, double *std, moh_error *err);
/* The parameter buffer [n] (n = moh_model_num_params), float32, in the order of the tensor
 * registry below (the checkpoint's tensor order). Writable: changes take effect in the next forward. */
float *moh_model_params(moh_model *m);
/* config.json text of the model (malloc'd, the caller frees; NULL on out of memory). */
char *moh_model_config_json(const moh_model *m);

/* One checkpoint tensor: a view of moh_model_params(m) + offset, numel floats, row-major shape. */
typedef struct moh_tensor_info {
    const char *name;              /* PyTorch state_dict name (HF LLaMA / timm); owned by the handle */
    int ndim;
    int64_t shape[MOH_MODEL_MAX_DIMS];
    size_t offset;                 /* in floats from the start of the parameter buffer */
    size_t numel;
    bool decay;                    /* AdamW weight decay applies (matrices) */
} moh_tensor_info;
/* Number of checkpoint tensors. */
int moh_model_num_tensors(const moh_model *m);
/* Tensor i (0 <= i < moh_model_num_tensors) into *out. MOH_OK or MOH_E_ARG (i out of range). */
int moh_model_tensor(const moh_model *m, int i, moh_tensor_info *out, moh_error *err);
/* Index of the tensor called name, or -1. */
int moh_model_find_tensor(const moh_model *m, const char *name);

/* One batch of inputs. A text model reads B, T, tokens, targets; an image model reads B, C, H, W,
 * images, labels. Arrays are row-major and borrowed for the call. */
typedef struct moh_input {
    int B;                 /* examples (sequences or images), >= 1 */
    int T;                 /* text: tokens per sequence, 1..moh_model_max_seq_len */
    const int *tokens;     /* text: [B, T] token ids in [0, V) */
    const int *targets;    /* text: [B, T] next-token targets in [0, V), -1 = no prediction; NULL:
                            * no loss */
    int C, H, W;           /* images: must equal moh_model_image_shape */
    const float *images;   /* images: [B, C, H, W] (NCHW), normalised (moh_model_image_norm) */
    const int *labels;     /* images: [B] classes in [0, K), -1 = not counted; NULL: no loss */
} moh_input;

/* Losses of one forward (all in nats). */
typedef struct moh_losses {
    double loss;      /* the training objective: cross-entropy (ViT: with the config's label
                       * smoothing) + load_balance_coef * lb, what moh_model_train_step minimises;
                       * NaN without targets/labels */
    double ce;        /* plain mean cross-entropy over the counted predictions, no label smoothing,
                       * from the logits in float64 (what `moh eval` reports); NaN without any */
    double lb;        /* mean over the routing layers of the load-balance loss (spec §2); 0 without
                       * a learned router */
    long n;           /* counted predictions (targets / labels other than -1) */
    double grad_norm; /* moh_model_train_step: global L2 norm of the gradient before clipping;
                       * NaN after moh_model_forward */
} moh_losses;

/* Floats of the logits of a forward of in: B T V (text) or B K (images); 0 when in is NULL. */
size_t moh_model_logits_count(const moh_model *m, const moh_input *in);
/* Forward of in. logits (may be NULL): [B, T, V] (text: logits of the token after each position)
 * or [B, K] (images), moh_model_logits_count floats. losses (may be NULL) as moh_losses.
 * Returns MOH_OK, MOH_E_ARG (B < 1, T out of range, a NULL array the family needs, an image shape
 * other than the model's, a token / target / label out of range: the message names the field,
 * the index and the accepted range) or MOH_E_NOMEM. The activations are kept for
 * moh_model_router_gates / moh_model_head_share. Source: model.h model_shards_step (one shard,
 * the family's default attention path). */
int moh_model_forward(moh_model *m, const moh_input *in, float *logits, moh_losses *losses, moh_error *err);
/* Router gates of layer l of the last forward (or training step): *gates [tokens, h] (row-major;
 * gate of head i for each attention token, 0 when the head is off; every gate 1 for a dense model),
 * *tokens = B T (text) or B (num_patches + class token) (images). Valid until the next forward.
 * MOH_E_ARG: no forward yet, or l outside [0, L). */
int moh_model_router_gates(const moh_model *m, int l, const float **gates, long *tokens, moh_error *err);
/* share[h]: for each head of layer l, the fraction of the last forward's attention tokens whose
 * gate is non-zero (1 for shared heads). MOH_E_ARG as moh_model_router_gates. */
int moh_model_head_share(const moh_model *m, int l, double *share, moh_error *err);

/* AdamW hyperparameters of a training step (moh_optim_defaults gives the family's). */
typedef struct moh_optim {
    double lr;            /* learning rate, > 0 (no schedule: the caller varies it per step) */
    double beta1, beta2;  /* moment decay rates, in [0, 1) */
    double eps;           /* > 0, added to sqrt(v_hat) */
    double weight_decay;  /* >= 0, decoupled, on the tensors with decay (matrices) */
    double grad_clip;     /* global L2 norm clipping threshold; 0 = none */
} moh_optim;
/* The family's `moh train` defaults (LM: lr 2e-3, betas 0.9/0.95, wd 0.1; ViT: lr 2e-3, betas
 * 0.9/0.999, wd 0.05; both eps 1e-8, clip 1.0). */
void moh_optim_defaults(const moh_model *m, moh_optim *opt);
/* One training step on in: forward (training objective), backward, global-norm clipping, AdamW
 * (t = moh_model_steps + 1, no learning-rate schedule), as `moh train` does for one micro-batch.
 * The AdamW moments (2 n floats) are owned by the handle, allocated on the first step.
 * losses (may be NULL) gets the losses of the forward before the update and the gradient norm.
 * Non-finite guard: a NaN / infinite loss or gradient norm is not applied (weights, moments and
 * step count unchanged) and returns MOH_E_NONFINITE. Other returns: MOH_OK, MOH_E_ARG (inputs as
 * moh_model_forward, targets / labels NULL or all -1, bad opt field named), MOH_E_NOMEM.
 * Source: train/trainer.c (the step), train/adamw.h. */
int moh_model_train_step(moh_model *m, const moh_input *in, const moh_optim *opt, moh_losses *losses,
                         moh_error *err);
/* Training steps applied so far (0 after load / new). */
long moh_model_steps(const moh_model *m);
/* Writes dir/config.json and dir/model.safetensors (F32, the checkpoint names), creating dir;
 * no optimizer state. Each file is written atomically. MOH_E_ARG when dir holds an
 * optimizer.safetensors (a `moh train` run whose --resume would restore those weights instead);
 * MOH_E_IO / MOH_E_NOMEM naming the file. Source: train/checkpoint.h checkpoint_save. */
int moh_model_save(const moh_model *m, const char *dir, moh_error *err);

#endif /* MOH_H */
