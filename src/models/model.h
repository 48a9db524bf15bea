/* The model interface: what every model family (decoder LM, ViT, ...) provides to the one trainer
 * (train/trainer.h), the one checkpoint module (train/checkpoint.h), evaluation and the CLI.
 * A family is a const model_family table in src/models/<family>_family.c plus one line in the
 * registry (model.c: FAMILIES). docs/architecture.md has the recipe for adding one.
 *
 * Objects:
 *   model         one instance: family, parsed config, parameters (one float32 buffer [n] in
 *                 tensor-registry order, with the family's typed views over it)
 *   model_tensor  one checkpoint tensor: name, shape, offset into the buffer, weight decay or not
 *   moh_batch     one batch of any family (the family reads the fields it uses)
 *   model_shards  a batch split into data-parallel shards, each with its own activations (and
 *                 gradient), forward/backward in parallel with per-shard load-balance statistics
 *   batch_source  training batches (knowing the shard/rank) and evaluation batches of a data set
 */
#ifndef MOH_MODEL_H
#define MOH_MODEL_H
#include <stdio.h>

#include "attn/attn.h"
#include "attn/layer.h"
#include "core/progress.h"
#include "moh.h"
#include "ops/bf16.h"

#define MODEL_MAX_DIMS 4
#define MODEL_MAX_SHARDS 256

/* One named checkpoint tensor, a view into a buffer laid out like the model's parameters. */
typedef struct model_tensor {
    char name[96];   /* checkpoint name (HF LLaMA / timm / official DiT) */
    int ndim;
    int64_t shape[MODEL_MAX_DIMS];
    size_t offset;   /* in floats from the start of the parameter buffer */
    size_t numel;
    bool decay;      /* AdamW weight decay applies */
    bool hidden;     /* a hidden weight matrix (attention / MLP projection): --optimizer muon
                      * updates it; embeddings, heads, routers, norms, biases stay on AdamW */
} model_tensor;

/* A tensor registry under construction (the families' builders): tensors in buffer order, each with
 * a family-defined initialisation kind. */
typedef struct model_tensor_list {
    model_tensor *t;       /* [cap] */
    unsigned char *init;   /* [cap] the family's initialisation kind of each tensor */
    int n, cap;
    size_t off;            /* floats so far */
} model_tensor_list;
/* An empty list of room cap. MOH_OK or MOH_E_NOMEM (nothing allocated). */
int model_tensor_list_init(model_tensor_list *L, int cap);
/* Appends the tensor named fmt (with %d = layer) of shape[ndim] at the current offset; decay: 0
 * none, 1 weight decay, 2 decay and a hidden matrix (Muon). Past cap: ignored, *L->n stays cap
 * (the families size cap to their configs). */
void model_tensor_push(model_tensor_list *L, int decay, int init, int ndim, const int64_t *shape, const char *fmt,
                       int layer);
/* Appends layer's attention tensors in attn_params_bind order under timm's Attention names plus
 * MoH's router (blocks.<layer>.attn.{qkv,proj}.{weight,bias}, .wg, .wg_0, .wg_1 as a has them;
 * d_model D): the weights of kind init, the biases of kind zero. The ViT and DiT layout. */
void model_tensor_push_timm_attn(model_tensor_list *L, const moh_attn_config *a, int64_t D, int init, int zero,
                                  int layer);
/* Appends layer's timm Mlp (blocks.<layer>.mlp.fc1 [Hm, D], fc2 [D, Hm], weights of kind init, biases
 * of kind zero). */
void model_tensor_push_timm_mlp(model_tensor_list *L, int64_t D, int64_t Hm, int init, int zero, int layer);
/* Hands over the table (*n its count) and, when init_out is not NULL, the kinds; frees the rest. */
model_tensor *model_tensor_list_done(model_tensor_list *L, int *n, unsigned char **init_out);

/* How a kind of tensor is initialised (model_init_random): zero, one, uniform in [-scale, scale),
 * xavier_uniform_ (bound sqrt(6 / (fan_in + fan_out)), fan_out = dim 0, fan_in the rest), normal with
 * std scale, normal with std scale redrawn outside [-2, 2] (timm's trunc_normal_), or filled by the
 * family (skipped). */
typedef enum model_init_law {
    MODEL_INIT_ZERO, MODEL_INIT_ONE, MODEL_INIT_UNIFORM, MODEL_INIT_XAVIER, MODEL_INIT_NORMAL,
    MODEL_INIT_TRUNC_NORMAL, MODEL_INIT_FAMILY
} model_init_law;
typedef struct model_init {
    model_init_law law;
    double scale;
} model_init;
/* Initialises data by the registry ts [nt] and kinds (model_tensor_list_done): tensor i by
 * laws[kind[i]], element by element in order, from one splitmix64 stream seeded with seed. */
void model_init_random(const model_tensor *ts, const unsigned char *kind, int nt, const model_init *laws,
                       float *data, uint64_t seed);

/* Naming schemes of the tensor registry. */
typedef enum model_naming {
    MODEL_NAMES_CHECKPOINT = 0, /* the family's PyTorch state_dict names (model.safetensors) */
    MODEL_NAMES_GGUF = 1,       /* llama.cpp's GGUF names (blk.N.attn_q.weight); LM only */
} model_naming;

/* One batch. Text: tokens/targets [B, T] (row-major, targets -1 = ignored). Images: images
 * [B, C, H, W] (NCHW, normalised), labels [B]. Diffusion (DiT): images are the noised x_t,
 * labels the class (num_classes = the null class), timesteps [B] and noise [B, C, H, W] the
 * target epsilon. Pointers are borrowed from the batch source. */
typedef struct moh_batch {
    int B;           /* examples (sequences or images) */
    int T;           /* tokens per sequence (text); 0 for images */
    const int *tokens, *targets;
    const int *target_bytes; /* text evaluation: [B, T] UTF-8 bytes each target token decodes to
                              * (BPE); NULL = 1 byte each (byte vocabulary) */
    const float *images;
    int C, H, W;     /* image shape */
    const int *labels;
    const int *timesteps;  /* diffusion: t of each example (NULL otherwise) */
    const float *noise;    /* diffusion: the eps that made images from the clean data [B, C, H, W] */
} moh_batch;

/* Evaluation result of any family (model_evaluate). */
typedef struct model_eval {
    long n;             /* evaluated items: predictions (LM) or images (ViT) */
    double loss;        /* mean plain cross-entropy over the items (nats) */
    double metric;      /* the family's headline: bits per byte (LM), top-1 accuracy (ViT) */
    long correct;       /* classifiers: top-1 hits */
    long *confusion;    /* classifiers: [K, K] row = true class, column = predicted (malloc'd) */
    double *head_share; /* [L, h]: share of tokens whose gate for head i is non-zero (malloc'd) */
    double lb_loss;     /* mean over batches of the load-balance loss (monitoring, not added) */
    double ce_sum;      /* sum of per-item cross-entropies (nats) */
    double tokens;      /* attention tokens seen (head_share denominator) */
    double bytes;       /* text: UTF-8 bytes of the predicted tokens (bits-per-byte denominator) */
    long batches;
} model_eval;
void model_eval_free(model_eval *r);

/* The hyperparameters that shape a run: filled with the family's defaults (train_defaults), then
 * the command line's, saved in optimizer.safetensors (checkpoint.c TRAIN_KEYS) and restored on
 * resume. Data fields a family does not use are ignored by it. */
typedef struct train_hparams {
    double lr, min_lr_ratio, weight_decay, beta1, beta2, grad_clip;
    long warmup;        /* -1 = auto */
    int batch_size;     /* examples per micro-batch (all shards together) */
    int seq_len;        /* text: tokens per sequence (0 = the config's context) */
    int grad_accum;     /* micro-batches per optimizer step */
    int shards;         /* data-parallel shards per micro-batch (0 = the family's default) */
    uint64_t seed;      /* init, data order, augmentation */
    double val_fraction;/* text: held-out tail of a single file */
    long train_limit;   /* images: use the first N training images (0 = all) */
    int crop_pad;       /* images: random-crop padding */
    int hflip;          /* images: random horizontal flip (0/1) */
    double epochs;      /* schedule length in passes over the training data (0 = not given) */
    long eval_every;    /* steps between validations (0 = per epoch when the source has epochs,
                         * else only at the end) */
    long eval_limit;    /* items per periodic validation (0 = the whole split) */
    long log_every;
    int attention;      /* attention path: 1 head-sparse, 2 reference (0 = the family's default) */
    int optimizer;      /* 0 AdamW everywhere; 1 Muon on the hidden matrices (ops/muon.h), AdamW
                         * on the rest */
    double muon_lr;     /* Muon's peak lr (the schedule of lr scaled by muon_lr / lr); 0 = lr */
    double ema_decay;   /* EMA of the weights (0 = none): after every applied step
                         * ema = d ema + (1 - d) w with d = min(ema_decay, (1 + step) / (10 + step));
                         * model.safetensors then holds the EMA weights (diffusion families) */
    long save_every;    /* extra checkpoints every N steps (0 = at validations and the end) */
    int precision;      /* compute precision of the steps (moh_precision: 0 fp32, 1 bf16); saved as
                         * it ran (bf16 asked on a CPU without it runs, and is saved as, fp32) */
} train_hparams;

typedef struct model_family model_family;
struct image_gen_request; /* below */

/* One model: family, config, parameters. */
struct bpe_tok;
typedef struct model {
    const model_family *fam;
    struct bpe_tok *tokenizer; /* text models with a BPE vocabulary (from a GGUF or a folder's
                                * tokenizer.json), else NULL */
    int eos_id;                /* end-of-text token of that tokenizer, or -1 */
    char *chat_template;       /* the tokenizer's chat template (Jinja text, owned), or NULL */
    void *cfg;       /* the family's config struct (moh_lm_config, moh_vit_config), owned */
    void *params;    /* the family's parameter views (lm_params_f32, ...), owned */
    float *data;     /* parameter buffer [n] in tensor-registry order (== params' data) */
    size_t n;
    struct quant_table *quant; /* a GGUF file's quantised matrices over data (ops/quant.h; owned),
                                * kept for decoding from its blocks; NULL when it has none */
    struct moh_gguf *gguf;     /* the mapping quant borrows its blocks from (io/gguf.h; owned), or NULL */
    bool quant_only;           /* MODEL_OPEN_QUANT_ONLY: quant's matrices are not in data (their float
                                * rows stay zero, never written: no memory); only decoding from
                                * quant (lm_kv_init_quant) may run this model */
} model;

/* Training batches and evaluation batches of one data set, opened by a family (open_data). */
typedef struct batch_source {
    void *self;
    const char *unit;      /* what a training example is counted in for rates: "tok", "img" */
    const char *seen_key;  /* metrics.jsonl key of the running count: "tokens", "images" */
    const char *eval_unit; /* progress unit of evaluation items: "predictions", "images" */
    const char *what;      /* what n_train / n_eval count: "bytes", "images" */
    const char *label;     /* the evaluation data in messages (a path; owned by self) */
    long examples_per_step;/* training items per micro-batch (B T tokens, B images) */
    long steps_per_epoch;  /* optimizer steps per pass over the training split (0 = no epochs) */
    long warmup_cap;       /* automatic warmup: min(warmup_cap, total steps / 10) */
    uint64_t rng_start;    /* data position of a fresh run (sources drawing at random) */
    size_t n_train, n_eval;/* size of the splits, in `what` */
    int seq_len;           /* text: tokens per sequence T (activations are sized for it); 0 images */
    uint32_t data_crc;     /* zlib CRC-32 of the training then the validation data as read (text
                            * bytes; images then labels), which ties a resume to its data */
    /* Micro-batch `micro` of optimizer step `step`, rank `rank` of `nranks` (each rank gets
     * examples [rank B / nranks, (rank + 1) B / nranks) of the global micro-batch); *data_rng is
     * the data position of sources that draw batches at random (advanced by every rank alike). */
    int (*next)(void *self, long step, int micro, int rank, int nranks, uint64_t *data_rng,
                moh_batch *out, moh_error *err);
    /* Items of an evaluation over the first `limit` items (0 = all), as model_evaluate counts. */
    long (*eval_items)(void *self, long limit);
    /* The evaluation batch at *cursor (0 at start; advanced); capacity: examples. Returns the
     * batch's items (0 at the end). */
    long (*eval_next)(void *self, long *cursor, long limit, int capacity, moh_batch *out);
    void (*free)(void *self);
} batch_source;
void batch_source_free(batch_source *s);

/* Where the family's data comes from: a path plus the data hyperparameters. */
typedef struct data_request {
    const char *path;
    const train_hparams *hp;
    int eval_batch;        /* capacity of evaluation batches (examples) */
    bool train;            /* open the training split too (else evaluation only) */
    const char *split;     /* evaluation only, images: file prefix of the split ("t10k", "train") */
    const char *model_label; /* the model in messages: "the checkpoint DIR", "the config FILE" */
    bool quiet;
} data_request;

/* What `moh eval` reports besides the result (eval_report). */
typedef struct eval_context {
    bool json;
    const char *checkpoint;
    const char *data_path;   /* --data as given */
    const batch_source *src; /* the evaluation source (label, n_eval, what) */
    int seq_len;             /* text: T */
    const char *split;       /* images: split prefix */
} eval_context;

/* What `moh analyze` asks of a family (open_analysis): labelled data for one model and an
 * optional dense twin of the same family and layer count. */
typedef struct analysis_request {
    const char *data;        /* --data as given */
    const char *categories;  /* --categories, or NULL (the family's default: every category) */
    long max_tokens;         /* --max-tokens: tokens per category */
    int seq_len;             /* --seq-len, or -1 when not given */
    int batch;               /* --batch-size, or -1 (the family's default) */
    model *m, *twin;         /* the model, and its twin (--compare) or NULL */
    const char *model_label, *twin_label; /* their checkpoint dirs, for messages */
    /* The index of the name in names[0..n) nearest to key, or -1 (the CLI's matcher, for "did you
     * mean" hints); may be NULL. */
    int (*nearest)(const char *key, const char *const *names, int n);
} analysis_request;

/* Labelled analysis data (open_analysis): C categories whose examples come in batches. Run on
 * activations from acts_new(cfg, batch, T, sparse = false): on that reference path router(acts, l)
 * is the layer's whole attention cache (gates, router probabilities, every head's attention rows
 * [B, h, N, N] and outputs [B N, h d]), which the statistics of src/analysis need. */
typedef struct analysis_data {
    void *self;
    const char *type;        /* analysis.json "type": "lm", "vit" */
    int C;                   /* categories (1..256) */
    char **names;            /* [C] category names (owned by self) */
    const char *note;        /* how the tokens were drawn, for analysis.json (owned by self) */
    const char *unit;        /* progress unit of the items next returns: "tokens", "images" */
    double items;            /* items of one pass over the data (progress total) */
    int batch;               /* examples per batch, at most */
    int T;                   /* text: longest sequence (acts_new's T); 0 for images */
    /* The batch at *cursor (0 at the start; advanced) as model m (req->m or req->twin) takes
     * it: *out, and cat[0..out->B) the category of each example. Returns the batch's items (tokens
     * or images); 0 at the end. */
    long (*next)(void *self, const model *m, long *cursor, moh_batch *out, int *cat);
    void (*free)(void *self);
} analysis_data;

struct model_family {
    const char *model_type;  /* config.json "model_type" */
    const char *task;        /* what the commands may do with it: "text-generation" (train, eval,
                              * sample, analyze), "image-classification" (train, eval, analyze),
                              * "image-generation" (train, eval, sample images) */
    const char *summary;     /* one line: "decoder language model (LLaMA layout)" */
    const char *data_help;   /* what --data takes */
    size_t config_size;
    /* One line describing a config with n parameters ("LM 3.41M, hidden 256, 6 layers, ..."). */
    void (*describe)(const void *cfg, size_t n, char *buf, size_t cap);
    /* Parses and validates config.json text (label names the file in errors). */
    int (*config_parse)(void *cfg, const char *text, size_t len, const char *label, moh_error *err);
    char *(*config_to_json)(const void *cfg); /* malloc'd; NULL on OOM */
    int (*num_layers)(const void *cfg);
    /* The attention config (with per-layer head counts: a representative layer's; n_heads, router
     * and layout are the same in every layer). */
    const moh_attn_config *(*attn)(const void *cfg);
    /* Optional: layer l's attention config when layers differ in shared_heads / top_k (DiT);
     * NULL: attn() holds for every layer. */
    const moh_attn_config *(*attn_layer)(const void *cfg, int l);
    /* The tensor registry in buffer order under a naming scheme (NULL: OOM or scheme not
     * supported by the family); *n gets the count. Caller frees. */
    model_tensor *(*tensors)(const void *cfg, model_naming scheme, int *n);
    /* Optional: for a tensor a checkpoint may hold beyond the registry, the registry tensor it
     * duplicates (it must hold the same values: the LM's lm_head.weight when config.json ties it to
     * model.embed_tokens.weight), else NULL. */
    const char *(*tied_tensor)(const void *cfg, const char *name);
    /* Parameters: a family struct of params_size bytes (zeroed by the caller) that params_init
     * points over a new zeroed buffer *data [*n] (model_params_new); params_release frees the
     * buffer, not the struct. */
    size_t params_size;
    int (*params_init)(void *params, const void *cfg, float **data, size_t *n, moh_error *err);
    void (*params_release)(void *params);
    void (*init_random)(const void *cfg, void *params, uint64_t seed);
    /* Activations: a family struct of acts_size bytes that acts_init fills for up to Bmax examples
     * of T tokens (text; ignored by images), attention on the head-sparse path when sparse
     * (attn/layer.h) (model_acts_new); acts_release frees what it holds, not the struct. The
     * struct begins with an attn_stack_f32 (attn/layer.h): its layers give every family's gates
     * and load balance (model_router), its compute context the precision (model_shards). */
    size_t acts_size;
    int (*acts_init)(void *acts, const void *cfg, int Bmax, int T, bool sparse, moh_error *err);
    void (*acts_release)(void *acts);
    /* Forward of examples [first, first + count) of b: returns the training loss (ce + beta lb);
     * *ce, *lb get its parts. train = false: the plain loss of evaluation (no label smoothing). */
    double (*forward)(const void *cfg, const void *params, void *acts, const moh_batch *b, int first,
                      int count, bool train, double *ce, double *lb);
    /* Backward after forward(train = true): ACCUMULATES into grads (a params_new struct). */
    void (*backward)(const void *cfg, const void *params, void *grads, void *acts, const moh_batch *b,
                     int first, int count);
    /* Attention tokens per example of b (T for text, num_tokens for images). */
    int (*tokens_per_example)(const void *cfg, const moh_batch *b);
    /* Family defaults of the run's hyperparameters. */
    void (*train_defaults)(train_hparams *hp);
    /* Training-state keys (train/checkpoint.c TRAIN_KEYS) of data the family does not have,
     * space-separated: their flags are refused ("crop_pad hflip train_limit" for text). */
    const char *unused_keys;
    /* Opens the data: training source (req->train) and evaluation source. May fill data-derived
     * config fields (ViT: input mean/std) before training starts. */
    int (*open_data)(model *m, const data_request *req, batch_source *train, batch_source *eval,
                     moh_error *err);
    /* Evaluation: adds the items of a shard's last forward(train = false) of b's examples
     * [first, first + count) to r (n, ce_sum, correct, confusion). */
    void (*eval_add)(const void *cfg, const void *acts, const moh_batch *b, int first, int count,
                     model_eval *r);
    void (*eval_finish)(const void *cfg, model_eval *r); /* sets r->loss, r->metric */
    /* metrics.jsonl fields of an evaluation (", \"val_loss\": ..."), and a short progress text. */
    void (*eval_json)(const model_eval *r, char *buf, size_t cap);
    void (*eval_brief)(const model_eval *r, char *buf, size_t cap);
    const char *metric_name; /* "val bits/byte", "test accuracy" */
    /* Optional: extra metrics.jsonl fields of a training batch (ViT: batch accuracy); NULL = none. */
    void (*train_json)(const void *cfg, void *const *acts, const int *count, int nshards,
                       const moh_batch *b, char *buf, size_t cap);
    /* The `moh eval` report (text or JSON) on stdout. */
    void (*eval_report)(const model *m, const model_eval *r, const eval_context *ctx);
    /* Optional debug (`moh eval --dump-logits FILE`, model_dump_logits): runs the forward of batch b
     * on acts (made for b on the family's default path) and fills e[0 .. n) (n returned, <= 4) with
     * the inputs and logits, views of b, acts and scratch [3 (B + T)] floats. dump_examples: the
     * examples of the first evaluation batch it dumps (0: the whole batch). */
    int (*dump_entries)(const model *m, const moh_batch *b, void *acts, float *scratch, moh_st_entry *e);
    long dump_examples;
    /* Longest sequence the config supports (text; NULL for images). */
    int (*max_seq_len)(const void *cfg);
    /* Image input shape (images; NULL for text) and the input normalisation of channel c (0 / 1
     * when the config has none). */
    void (*image_shape)(const void *cfg, int *C, int *H, int *W);
    void (*image_norm)(const void *cfg, int c, double *mean, double *std);
    /* Outputs per prediction (vocab size, classes), and the logits of the last forward in acts:
     * [count T, V] (text) or [count, K] (images). */
    int (*num_outputs)(const void *cfg);
    const float *(*logits)(const void *acts);
    /* Optional (classifiers; NULL: none): the penultimate features of the last forward in acts,
     * [count, *dim] row-major (ViT: the pooled token after its final norm, the head's input). The
     * feature space of the sample-quality metric of `moh eval --classifier`. */
    const float *(*features)(const void *cfg, const void *acts, int *dim);
    bool default_sparse;     /* attention on the head-sparse path unless asked otherwise */
    /* Optional: a model from a GGUF file (llama.cpp's format) whose general.architecture is
     * gguf_arch: config from its metadata, weights dequantised (g: an io/gguf.h moh_gguf; flags:
     * model_open_ex's). */
    const char *gguf_arch;
    int (*from_gguf)(model *m, const void *g, const char *path, unsigned flags, moh_error *err);
    /* Optional: writes m as a GGUF file llama.cpp runs (wtype: the matrices' ggml type, MOH_GGML_F32,
     * _F16, _Q8_0, _Q4_0 or _Q4_1), with its tokenizer;
     * src: the GGUF m was read from (an io/gguf.h moh_gguf; its special token ids and chat template
     * are carried), or NULL. */
    int (*to_gguf)(const model *m, const char *path, int wtype, const void *src, moh_error *err);
    /* optimizer.safetensors "format" of moh 0.1 for this family (still loaded), or NULL */
    const char *legacy_optimizer_format;
    const char *short_name;  /* the family in messages: "LM", "ViT" */
    /* Optional (`moh analyze`; NULL: the command says the family does not support it): opens the
     * labelled data of req for req->m and its twin (analysis_data below). May fill
     * data-derived config fields of both (ViT: input mean/std) and print notes on stderr. */
    int (*open_analysis)(const analysis_request *req, analysis_data *out, moh_error *err);
    /* Optional (`moh bench train`; NULL: not supported): a batch of B examples (text: T tokens
     * each) with random content from seed (tokens and targets, or images and labels), as
     * forward/backward take it; its arrays live in *buf (malloc'd; the caller frees it). */
    int (*synthetic_batch)(const void *cfg, int B, int T, uint64_t seed, moh_batch *out, void **buf,
                           moh_error *err);
    /* Optional (`moh bench train --phases`; NULL: not supported): the wall seconds per phase that
     * forward and backward on acts accumulated since the last reset, as up to cap entries of
     * names[i] (static strings), seconds[i] and sub[i] (true: a breakdown of earlier entries, not
     * part of their sum: the attention path's own phases); returns the count. reset: zero the
     * timers after reading. */
    int (*phase_times)(void *acts, const char **names, double *seconds, bool *sub, int cap, bool reset);
    /* Optional ("image-generation": `moh sample` on images): req->n images [n, C, H, W] with
     * pixels in [-1, 1] into out (the family's sampler, image_gen_request below). MOH_E_ARG names
     * a bad request field. */
    int (*generate)(const model *m, const struct image_gen_request *req, float *out, moh_error *err);
};

/* What `moh sample` asks of an image-generation family (generate). */
typedef struct image_gen_request {
    const int *labels;       /* [n] class of each image (num_classes: unconditional) */
    int n;
    int steps;               /* sampling steps (respaced from the training schedule) */
    double cfg_scale;        /* classifier-free guidance w >= 0: eps = uncond + w (cond - uncond) */
    int sampler;             /* 0 DDPM ancestral, 1 DDIM (eta 0) */
    int variance;            /* DDPM: 0 fixed large (beta), 1 fixed small (posterior variance) */
    uint64_t seed;           /* image i draws from (seed, i) only: any batch size, same images */
    int batch;               /* images per forward batch */
    bool sparse;             /* head-sparse attention path */
    moh_precision precision; /* bf16: the model's GEMMs and attention tiles in bf16 (fp32 where
                              * precision_resolve says the CPU cannot; the caller reports that) */
    void (*progress)(void *ctx, long done, long total); /* may be NULL */
    void *ctx;
} image_gen_request;

/* The members every family implements under the same static names in its <name>_family.c
 * (describe, cfg_parse, cfg_json, num_layers, attn, tensors, params_init, params_release,
 * init_random, acts_init, acts_release, forward, backward,
 * tokens_per_example, train_defaults, open_data, eval_add, eval_finish, eval_json, eval_brief,
 * eval_report): its table starts with MODEL_FAMILY_CORE(its params struct, its acts struct), then
 * gives its names, values and optional members. */
#define MODEL_FAMILY_CORE(config_t, params_t, acts_t)                                                              \
    .config_size = sizeof(config_t), .synthetic_batch = synthetic_batch,                                           \
    .describe = describe, .config_parse = cfg_parse, .config_to_json = cfg_json, .num_layers = num_layers,         \
    .attn = attn, .tensors = tensors, .params_size = sizeof(params_t), .params_init = params_init,                 \
    .params_release = params_release, .init_random = init_random, .acts_size = sizeof(acts_t),                     \
    .acts_init = acts_init, .acts_release = acts_release, .forward = forward, .backward = backward,                \
    .tokens_per_example = tokens_per_example,                                                                      \
    .train_defaults = train_defaults, .open_data = open_data, .eval_add = eval_add, .eval_finish = eval_finish,    \
    .eval_json = eval_json, .eval_brief = eval_brief, .eval_report = eval_report

/* The params_init, params_release, init_random, acts_init and acts_release a family's table names,
 * over its pfx_params_init_f32 (views of one zeroed buffer), pfx_params_free_f32 and
 * pfx_acts_free_f32, for a params struct pfx_params_f32 with data and n. ACTS is the family's call
 * that makes activations, an expression in (a, cfg, Bmax, T, sparse, err); INIT fills the
 * parameters, an expression in (cfg, p, seed). */
#define MODEL_ADAPTER(pfx, ACTS, INIT)                                                                              \
    static int params_init(void *p, const void *cfg, float **data, size_t *n, moh_error *err) {                    \
        const int rc = pfx##_params_init_f32(p, cfg, err);                                                          \
        *data = ((const pfx##_params_f32 *)p)->data;                                                                \
        *n = ((const pfx##_params_f32 *)p)->n;                                                                      \
        return rc;                                                                                                  \
    }                                                                                                               \
    static void params_release(void *p) { pfx##_params_free_f32(p); }                                              \
    static void init_random(const void *cfg, void *p, uint64_t seed) { INIT; }                                      \
    static int acts_init(void *a, const void *cfg, int Bmax, int T, bool sparse, moh_error *err) {                  \
        (void)T;                                                                                                    \
        (void)sparse;                                                                                               \
        return ACTS;                                                                                                \
    }                                                                                                               \
    static void acts_release(void *a) { pfx##_acts_free_f32(a); }

/* Checkpoint tensors must hold finite values: MOH_E_FORMAT naming the file, the tensor and the
 * first non-finite value's index when x[0..n) has a NaN or infinity (a diverged or damaged
 * checkpoint, refused before it can print nan or sample garbage). */
int model_check_finite(const char *path, const char *name, const float *x, size_t n, moh_error *err);
/* A family's synthetic_batch of images: B random images [B, C, H, W] uniform in [-2, 2) (about the
 * range of normalised pixels) and labels [B] in 0..n_labels-1; with steps > 0 also timesteps [B]
 * in 0..steps-1 and noise [B, C, H, W] ~ N(0, 1) (diffusion). splitmix64 at seed; *buf owns it all.
 * MOH_OK or MOH_E_NOMEM. */
int model_synthetic_images(int B, int C, int H, int W, int n_labels, int steps, uint64_t seed, moh_batch *out,
                           void **buf, moh_error *err);
/* `moh eval --dump-logits`: the family's dump_entries of the first evaluation batch of src
 * written to path as safetensors (temp file and rename). MOH_E_FORMAT (no batch), MOH_E_NOMEM, MOH_E_IO;
 * MOH_E_ARG when the family has no dump. */
int model_dump_logits(const model *m, batch_source *src, const char *path, moh_error *err);

/* Router activations (gates [tokens, h], mask, p, lb_loss) of layer l after a forward on acts (any
 * family's: its attn_stack_f32), whichever attention path ran. */
static inline const attn_cache_f32 *model_router(const void *acts, int l) {
    return attn_stack_router_f32((const attn_stack_f32 *)acts, l);
}

/* The one adapter of every family's parameters and activations (params_size / params_init,
 * acts_size / acts_init above): a new struct *params with views over *data [*n] (zeroed), or *acts.
 * MOH_OK, MOH_E_NOMEM, or the family's error; nothing allocated on error. The frees take NULL. */
int model_params_new(const model_family *f, const void *cfg, void **params, float **data, size_t *n,
                     moh_error *err);
void model_params_free(const model_family *f, void *params);
int model_acts_new(const model_family *f, const void *cfg, int Bmax, int T, bool sparse, void **acts,
                   moh_error *err);
void model_acts_free(const model_family *f, void *acts);

/* ---- registry ---------------------------------------------------------------------------- */
/* The family called model_type, or NULL. */
const model_family *model_family_find(const char *model_type);
/* Families in registry order (*n gets the count). */
const model_family *const *model_families(int *n);
/* "model_type" of config.json text: the string value, "llama" when absent (moh's LM configs and
 * HF LLaMA configs); MOH_E_FORMAT (not JSON) / MOH_E_CONFIG (unknown type, naming the known ones)
 * with label. */
int model_family_of_json(const char *text, size_t len, const char *label, const model_family **fam,
                         moh_error *err);

/* The family of checkpoint dir's config.json (only its model_type is read). */
int model_family_of_dir(const char *dir, const model_family **fam, moh_error *err);

/* ---- one model --------------------------------------------------------------------------- */
/* ---- loading (model_io.c) ---------------------------------------------------------------- */
/* Reads every registry tensor ts[0..nt), named prefix + name, from st into buf at its offset:
 * shape as the registry's, values finite. MOH_E_SHAPE / MOH_E_FORMAT naming st's file and tensor. */
int model_read_tensors(const moh_safetensors *st, const model_tensor *ts, int nt, const char *prefix, float *buf,
                       moh_error *err);
/* m's weights from an opened model.safetensors: every registry tensor, finite, nothing else (but a
 * tied duplicate of one, which must hold its twin's values). Errors as model_read_tensors. */
int model_weights_from(model *m, const moh_safetensors *st, moh_error *err);
/* Reads dir/config.json (family from its model_type) and dir/model.safetensors into a new model
 * (or, without model.safetensors, the shards a Hugging Face model.safetensors.index.json lists;
 * F32, BF16 or F16 tensors, converted to float32), and the tokenizer (model_load_tokenizer).
 * First manifest_check: a committed save is finished and, where the folder has checkpoint.json,
 * every file read must match it (MOH_E_FORMAT naming the file otherwise). A missing, misshapen or
 * non-finite tensor, or one the config does not have (a tied duplicate of one must hold its
 * values), is MOH_E_SHAPE / MOH_E_FORMAT naming the file and tensor. */
int model_load(model *m, const char *dir, moh_error *err);
/* A model from path: a checkpoint directory (model_load) or a GGUF file (llama.cpp's format) of an
 * architecture a family reads (model_family.from_gguf: "llama"), weights dequantised to float32.
 * Errors name the path, the key or tensor. */
int model_open(model *m, const char *path, moh_error *err);
/* model_open with flags: MODEL_OPEN_QUANT_ONLY keeps a GGUF's quantised matrices as blocks only
 * (model.quant_only; the float copy of a SmolLM2 Q4_1 is 538 MB, its blocks 96 MB); no effect on
 * other files. */
#define MODEL_OPEN_QUANT_ONLY 1u
int model_open_ex(model *m, const char *path, unsigned flags, moh_error *err);
/* Reads a model.safetensors file at path into m (same checks). */
int model_load_weights(model *m, const char *path, moh_error *err);
/* Attaches dir/tokenizer.json (when present; else m is left as it is: a byte model) to m, with
 * eos_id and chat_template from dir/tokenizer_config.json when present. The tokenizer may have
 * fewer tokens than the model's vocab_size (padded embeddings), not more (MOH_E_SHAPE; not checked
 * for a zeroed m, which gets the tokenizer alone). Reader
 * errors name the file (MOH_E_FORMAT, MOH_E_IO). */
int model_load_tokenizer(model *m, const char *dir, moh_error *err);

/* Parses config.json text (family from its model_type) into a new model with zeroed params. */
int model_from_config_text(model *m, const char *text, size_t len, const char *label, moh_error *err);
/* Reads and parses a config.json file into a new model with zeroed params. */
int model_from_config_file(model *m, const char *path, moh_error *err);
void model_free(model *m);
/* Whether m reads and writes text as bytes or BPE ids is decided by m->tokenizer alone; without one
 * a text model (task "text-generation") must have the 256 byte tokens. MOH_E_CONFIG for a text
 * model with no tokenizer and vocab_size != 256: "label: vocab_size V needs a tokenizer
 * (tokenizer.json; a byte model has 256 tokens)" (a BPE folder that lost its tokenizer.json; for a
 * label ending in .gguf: tokenizer.ggml.* metadata).
 * MOH_OK for other families and models with a tokenizer. */
int model_check_text_vocab(const model *m, const char *label, moh_error *err);
/* The registry of m's tensors (MODEL_NAMES_CHECKPOINT); NULL on OOM. Caller frees. */
model_tensor *model_tensors(const model *m, int *n);
int model_num_layers(const model *m);
const moh_attn_config *model_attn(const model *m);
/* Layer l's attention config (attn_layer, else model_attn). */
const moh_attn_config *model_attn_layer(const model *m, int l);
/* Heads active per token, mean over the layers (h for the "none" router). */
double model_active_heads(const model *m);
/* Prints r->head_share [L, h] on stdout: a table (each layer's mean at the end of its line), or
 * (json) the fields `"head_share": [[...], ...], "layer_head_share": [...]`, the latter the share
 * of each layer's heads computed per token (mean of its row). */
void model_print_head_share(const model *m, const model_eval *r, bool json);

/* ---- MHA -> MoH conversion (issue 11, spec §3 and §10) ---------------------------------- */
typedef struct model_routing {
    moh_router router;      /* MOH_ROUTER_QUERY_NORM or MOH_ROUTER_LEARNED */
    int shared_heads;       /* h_s: the first h_s query heads of every layer */
    int top_k;              /* K of the h - h_s routed heads */
    bool straight_through;  /* query_norm: train through the STE */
    double router_std;      /* learned: std of the initial wg rows (wg_0, wg_1 start at 0) */
    uint64_t seed;
} model_routing;
/* dst = the dense model src (router "none") with the routing r: the same config otherwise, every
 * tensor of src copied by name, new router tensors initialised (learned: wg ~ N(0, router_std^2),
 * wg_0 = wg_1 = 0, so shared gates are exactly 1 and a selected routed head's gate is
 * K p_j / sum_sel p = 1 + O(router_std)). src's tokenizer and chat template move to dst. With top_k = h - h_s
 * (and query_norm, or learned with router_std 0) dst computes exactly what src does.
 * MOH_E_ARG (src already routed), MOH_E_CONFIG (the family's check of the new config, naming the
 * field), MOH_E_NOMEM. On error dst is empty and src unchanged. */
int model_convert_routing(model *src, const model_routing *r, model *dst, moh_error *err);

/* ---- data-parallel shards ---------------------------------------------------------------- */
/* A micro-batch split into n shards that run forward and backward in parallel, one OpenMP thread
 * per shard (single-threaded ops inside) when n > 1. Shard s holds examples
 * [s B / n, (s + 1) B / n). Like n data-parallel GPUs (DDP), each shard computes its own
 * load-balance statistics over its tokens (spec §2: per GPU, not all-reduced); the loss and
 * gradient are the shard-size-weighted means, so the cross-entropy part equals the whole-batch
 * mean exactly. Results depend on n, not on the thread count. */
typedef struct model_shards {
    int n;                  /* number of shards */
    int Bmax;               /* capacity of each shard (examples) */
    void **acts;            /* [n] family activations */
    void **grads;           /* [n] per-shard gradients (NULL: evaluation only, or n == 1) */
    float **gdata;          /* [n] their buffers */
    int first[MODEL_MAX_SHARDS + 1], count[MODEL_MAX_SHARDS]; /* split of the last batch */
    moh_precision precision; /* what the shards compute in (model_shards_set_precision) */
    bf16_mirror wbf16;       /* bf16: the weights' bf16 copy, shared by the shards, converted at
                              * the start of every model_shards_step */
} model_shards;

/* `--precision auto`: what a run computes in, chosen by measurement (README, Precision). */
typedef struct precision_choice {
    moh_precision run; /* fp32 or bf16 */
    double ms[2];      /* [fp32, bf16] milliseconds per step, the mean over processes (0, 0: not measured) */
    bool cached;       /* ms came from the cache (calib_cache "precision") */
    char note[224];    /* the start line's words: "bf16 (measured: fp32 512 ms, bf16 390 ms per ...)" */
} precision_choice;
/* Sums x[0..n) over the processes of a run (MPI ranks; NULL: one process). */
typedef void (*model_sum_fn)(void *ctx, double *x, size_t n);
/* n shards (1..256, <= batch) for micro-batches of up to `batch` examples of T tokens (text);
 * with_grads for training. MOH_OK, MOH_E_ARG or MOH_E_NOMEM. */
int model_shards_init(model_shards *w, const model *m, int batch, int T, int n, bool with_grads,
                      bool sparse, moh_error *err);
void model_shards_free(model_shards *w, const model *m);
/* Compute in precision p (default fp32). bf16 runs only where the backend has a bf16 path
 * (precision_resolve; every family: its attn_stack takes the weights' bf16 copy); otherwise fp32,
 * and note[cap] says why (else "").
 * w->precision gets what runs. MOH_OK or MOH_E_NOMEM. */
int model_shards_set_precision(model_shards *w, const model *m, moh_precision p, char *note, size_t cap,
                               moh_error *err);
/* --precision auto on the run's shards: fp32 where the CPU has no bf16 path (precision_resolve);
 * else the faster of fp32 and bf16 on the family's synthetic_batch of B examples of T tokens (T
 * ignored by image families): model_shards_step (with train: forward and backward into g/gdata,
 * which the caller's step clears anyway) timed twice in each after a warm-up, alternated, the
 * minimum of each, in milliseconds; or the times cached for this CPU, bf16 kernels and model config
 * (calib_cache "precision": a model's first measurement decides for its later runs). sum (NULL:
 * one process) adds the processes' times so that every rank chooses alike. Leaves w in the chosen
 * precision; out->note is the start line's words. MOH_OK, or synthetic_batch's and
 * model_shards_set_precision's errors (MOH_E_NOMEM). README, "--precision auto". */
int model_shards_auto_precision(model_shards *w, const model *m, int B, int T, bool train, void *g, float *gdata,
                                model_sum_fn sum, void *sum_ctx, precision_choice *out, moh_error *err);
/* Forward of b (b->B <= n Bmax); with g (a params_new struct of m, data gdata), also backward:
 * ACCUMULATES sum_s (B_s / B) grad_s into g (n == 1: the backward accumulates into g directly).
 * Returns the weighted training loss; *ce, *lb its parts. */
double model_shards_step(const model *m, model_shards *w, const moh_batch *b, bool train, void *g,
                         float *gdata, double *ce, double *lb);
/* Min and max over layers and routed heads of the share of the last batch's tokens selecting the
 * head (1, 1 without routed heads). */
void model_shards_routed_share(const model *m, const model_shards *w, const moh_batch *b, double *mn,
                               double *mx);
/* Default shard count: omp_get_max_threads(), at most batch and 256. */
int model_default_shards(int batch);

/* Evaluates the first `limit` items (0 = all) of src's evaluation split with w (forward only, plain
 * loss): the family's metric, head shares, load-balance loss. progress may be NULL. */
int model_evaluate(const model *m, model_shards *w, batch_source *src, long limit,
                   const moh_progress *progress, model_eval *r, moh_error *err);
/* Evaluation split across processes: rank `rank` of `nranks` runs batches k with k % nranks ==
 * rank, and sum(ctx, x, n) adds x [n] over the ranks in place (an all-reduce). */
typedef struct eval_split {
    int rank, nranks;
    void (*sum)(void *ctx, double *x, size_t n);
    void *ctx;
} eval_split;
/* model_evaluate over this rank's batches, its counts summed over the ranks (split may be NULL:
 * one process); every rank gets the whole result. */
int model_evaluate_split(const model *m, model_shards *w, batch_source *src, long limit,
                         const moh_progress *progress, const eval_split *split, model_eval *r, moh_error *err);
#endif
