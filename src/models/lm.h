/* Decoder LM (spec: issue "main job"): token embedding [V, C] -> L x [RMSNorm -> MoH attention
 * (causal, RoPE, split q/k/v/o, optional GQA, learned router or none) -> residual -> RMSNorm ->
 * SwiGLU MLP -> residual] -> RMSNorm -> LM head [V, C] (optionally tied to the embedding).
 * Loss = mean cross-entropy + beta * mean over layers of the load-balance loss (spec §2).
 * Parameters live in one contiguous buffer, in checkpoint order (lm_tensors). */
#ifndef MOH_LM_H
#define MOH_LM_H
#include "attn/attn.h"
#include "attn/layer.h"
#include "backend/backend.h"
#include "models/model.h"
#include "moh.h"

/* Phases of an LM forward + backward timed into lm_acts.phase_s (wall seconds, accumulated over
 * calls; zero them to restart). norm: RMSNorms with the residual adds fused into them (the final
 * norm included); mlp_in: gate and up GEMMs; head: LM head GEMM; loss: softmax cross-entropy.
 * The attention phases include the attention path's own phases (attn_layer_phases_f32). */
enum {
    LMT_PH_EMBED, LMT_PH_NORM, LMT_PH_ATTN, LMT_PH_MLP_IN, LMT_PH_SWIGLU, LMT_PH_MLP_DOWN,
    LMT_PH_HEAD, LMT_PH_LOSS,
    LMT_PH_B_LOSS, LMT_PH_B_HEAD, LMT_PH_B_MLP_DOWN, LMT_PH_B_SWIGLU, LMT_PH_B_MLP_IN, LMT_PH_B_NORM,
    LMT_PH_B_ATTN, LMT_PH_B_EMBED,
    LMT_NPHASE
};
/* Short name of phase i ("embed", "norm", "attn", ..., "bwd_embed"), "?" out of range. */
const char *lm_train_phase_name(int i);

#define real float
#define F(x) x##_f32
#include "lm_decl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "lm_decl.h"
#undef real
#undef F

/* As lm_acts_init_f32, with attention through the head-sparse path (src/attn/sparse.h): only
 * the (token, head) pairs the router selects are computed, memory is linear in T. Same results
 * as the reference path to ~1e-6. MOH_OK or MOH_E_NOMEM. */
int lm_acts_init_sparse_f32(lm_acts_f32 *a, const moh_lm_config *cfg, int B, int T, moh_error *err);


/* One named checkpoint tensor (HF LlamaForCausalLM names), a view into a buffer laid out like
 * lm_params: the model interface's tensor type. */
typedef model_tensor lm_tensor;

/* The model's tensors in buffer order; *n gets the count. Caller frees the array. NULL on OOM. */
lm_tensor *lm_tensors(const moh_lm_config *cfg, int *n);
/* The same registry under another naming scheme (model.h: checkpoint or GGUF names). */
lm_tensor *lm_tensors_named(const moh_lm_config *cfg, model_naming scheme, int *n);
/* HF LLaMA initialisation: every matrix N(0, std^2) (std = initializer_range, 0.02), every
 * RMSNorm weight 1. Deterministic in seed. */
void lm_params_init_random(const moh_lm_config *cfg, lm_params_f32 *p, uint64_t seed, double std);
#endif
