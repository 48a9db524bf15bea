/* The optimizer over a model's parameter buffer, shared by the trainer and `moh bench train`:
 * AdamW on every tensor (ops/adamw.h), or Muon (ops/muon.h) on the tensors the family's
 * registry marks hidden (attention and MLP matrices) and AdamW on the rest. */
#ifndef MOH_OPTIM_H
#define MOH_OPTIM_H
#include "backend/backend.h"
#include "models/model.h"
#include "ops/adamw.h"
#include "ops/muon.h"

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
    be_ctx *cx;        /* [nctx]: the Newton-Schulz products' contexts (bf16 or fp32) */
    const moh_backend *be; /* runs the updates (AdamW, Muon) */
} optim;

/* For model m on backend be (NULL: the CPU): kind, and bf16 (Newton-Schulz in bf16; the caller has
 * resolved that the backend has it). MOH_E_NOMEM; MOH_E_ARG for Muon on a family that marks no
 * hidden matrix. */
int optim_init(optim *o, const model *m, int kind, bool bf16, const moh_backend *be, moh_error *err);
void optim_free(optim *o);

/* One update of w [n] from g [n] at 1-based step t: AdamW at lr (moments m1, m2 [n]); with Muon
 * the hidden matrices at muon_lr (momentum in m1 there; m2 untouched), whole matrices per thread. */
void optim_step(const optim *o, const adamw_config *ac, const muon_config *mc, float *w, const float *g,
                float *m1, float *m2, long t, double lr, double muon_lr);
#endif
