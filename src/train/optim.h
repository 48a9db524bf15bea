/* The optimizer over a model's parameter buffer, shared by the trainer and `moh bench train`:
 * AdamW on every tensor (ops/adamw.h), or Muon (train/muon.h) on the tensors the family's
 * registry marks hidden (attention and MLP matrices) and AdamW on the rest. */
#ifndef MOH_OPTIM_H
#define MOH_OPTIM_H
#include "models/model.h"
#include "ops/adamw.h"
#include "train/muon.h"

enum { OPTIM_ADAMW = 0, OPTIM_MUON = 1 }; /* train_hparams.optimizer */

typedef struct optim {
    int kind;          /* OPTIM_ADAMW or OPTIM_MUON */
    model_tensor *ts;  /* the model's tensor registry [nt] */
    int nt;
    size_t n;          /* parameters */
    bool *decay;       /* [n]: AdamW weight decay applies */
    int nctx;          /* Muon: threads that update matrices side by side */
    size_t work_floats;/* Muon scratch per thread (the largest hidden matrix's) */
    float *work;       /* [nctx * work_floats] */
    bf16_ctx **bc;     /* [nctx]: Newton-Schulz products in bf16, or NULLs (fp32) */
    const struct moh_backend *be; /* runs the AdamW updates (backend.h; the CPU unless set after init) */
} optim;

/* For model m: kind, and bf16 (Newton-Schulz in bf16; the caller has resolved that the CPU has
 * it). MOH_E_NOMEM; MOH_E_ARG for Muon on a family that marks no hidden matrix. */
int optim_init(optim *o, const model *m, int kind, bool bf16, moh_error *err);
void optim_free(optim *o);

/* One update of w [n] from g [n] at 1-based step t: AdamW at lr (moments m1, m2 [n]); with Muon
 * the hidden matrices at muon_lr (momentum in m1 there; m2 untouched), whole matrices per thread. */
void optim_step(const optim *o, const adamw_config *ac, const muon_config *mc, float *w, const float *g,
                float *m1, float *m2, long t, double lr, double muon_lr);
#endif
