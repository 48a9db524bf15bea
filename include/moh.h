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
} moh_status;

typedef struct moh_error {
    int code;        /* a moh_status */
    char msg[1024];  /* one line, no trailing newline */
} moh_error;

/* Formats err->msg (printf-style), sets err->code = code and returns code. err may be NULL. */
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
    double load_balance_coef; /* beta */
} moh_attn_config;

/* Fills c with defaults (no router, dense, no RoPE). */
void moh_attn_config_default(moh_attn_config *c);
/* Checks every field; the message names the field, its value and what is expected.
 * label: the file name shown in the message. Returns MOH_OK or MOH_E_CONFIG. */
int moh_attn_config_validate(const moh_attn_config *c, const char *label, moh_error *err);
/* Parses a LAYER.json (keys: hidden_size, num_attention_heads, num_key_value_heads, head_dim,
 * shared_heads, top_k, router, causal, qkv_bias, proj_bias, rope_theta, load_balance_coef),
 * then validates. fused_qkv is not a JSON key: it is set from the weights file. */
int moh_attn_config_parse_json(moh_attn_config *c, const char *text, size_t len, const char *label,
                               moh_error *err);

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
    bool tie_word_embeddings;
    int shared_heads;            /* h_s */
    int top_k;                   /* K routed heads per token */
    moh_router router;           /* learned (default) or none (dense MHA twin) */
    double load_balance_coef;    /* beta, default 0.01 */
    moh_attn_config attn;        /* derived: causal, RoPE, split projections, no biases */
} moh_lm_config;

/* Parses and validates config.json (HF LlamaConfig fields plus shared_heads, top_k, router,
 * load_balance_coef), then calls moh_lm_config_finalize, which fills cfg->attn. Defaults:
 * num_key_value_heads = heads, head_dim = hidden / heads (absent or null), rms_norm_eps 1e-6,
 * rope_theta 10000, tie_word_embeddings false, router "learned", shared_heads 0, top_k 0,
 * load_balance_coef 0.01. Standard HF keys moh does not use are accepted: architectures,
 * model_type, torch_dtype, attention_dropout, initializer_range, bos/eos/pad_token_id,
 * pretraining_tp, use_cache, transformers_version, and hidden_act / attention_bias / mlp_bias /
 * rope_scaling when they match moh ("silu", false, false, null); keys starting with "_" or
 * "comment" are annotations. Any other key is an error naming it. Errors name label, field, value,
 * expectation: MOH_E_FORMAT (JSON syntax) / MOH_E_CONFIG; on error cfg is zeroed. */
int moh_lm_config_parse_json(moh_lm_config *cfg, const char *text, size_t len, const char *label,
                             moh_error *err);
/* Checks the fields and derives cfg->attn. MOH_OK or MOH_E_CONFIG. */
int moh_lm_config_finalize(moh_lm_config *cfg, const char *label, moh_error *err);
/* config.json text (malloc'd, caller frees) that transformers' LlamaForCausalLM loads: the HF
 * fields plus architectures, model_type "llama", hidden_act "silu", and the MoH fields. */
char *moh_lm_config_to_json(const moh_lm_config *cfg);

#endif /* MOH_H */
