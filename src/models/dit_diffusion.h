/* Gaussian diffusion of the DiT family (official DiT diffusion/gaussian_diffusion.py and
 * respace.py, epsilon prediction, learn_sigma false):
 *   betas = linspace(beta_start, beta_end, T) (float64, DiT's "linear" schedule), alphas_cumprod
 *   acp_t = prod_{s <= t} (1 - beta_s); q(x_t | x_0): x_t = sqrt(acp_t) x_0 + sqrt(1 - acp_t) eps.
 * Sampling respaces the T steps to S (space_timesteps(T, [S]): round(i (T - 1) / (S - 1)), round
 * half to even as Python) with the betas recomputed from acp at those steps, and runs
 *   DDPM ancestral (p_sample: x_0 = sqrt(1/acp) x - sqrt(1/acp - 1) eps, clipped to [-1, 1]
 *   (pixel space: clip_denoised), posterior mean, variance fixed large (beta, DiT's default
 *   without learned sigma) or fixed small (posterior variance)), or DDIM with eta 0.
 * Classifier-free guidance: eps = eps(x, null) + w (eps(x, y) - eps(x, null)) on every channel. */
#ifndef MOH_DIT_DIFFUSION_H
#define MOH_DIT_DIFFUSION_H
#include "models/dit.h"
#include "models/model.h"

/* The training schedule: T betas and alphas_cumprod (float64). */
typedef struct dit_schedule {
    int T;
    double *betas, *acp;     /* [T] each (one allocation) */
} dit_schedule;

/* Builds cfg's linear schedule. MOH_OK or MOH_E_NOMEM. */
int dit_schedule_init(dit_schedule *s, const moh_dit_config *cfg, moh_error *err);
void dit_schedule_free(dit_schedule *s);

/* The S timesteps of space_timesteps(T, [S]) in increasing order into use[S]. MOH_E_ARG when S is
 * not in 1..T. */
int dit_respace(int T, int S, int *use, moh_error *err);

/* Noise of example `key` under seed: t uniform in 0..T-1, eps [n] standard normal, and whether
 * the label is dropped (probability drop): a pure function of (seed, key). */
void dit_draw(uint64_t seed, uint64_t key, int T, double drop, int n, int *t, float *eps, bool *dropped);

/* q_sample in place: x [n] (x_0 in, x_t out) = sqrt(acp_t) x + sqrt(1 - acp_t) eps. */
void dit_q_sample(const dit_schedule *s, int t, const float *eps, float *x, int n);

/* Samples req->n images of the model p (cfg) into out [n, C, H, W] (pixels in [-1, 1], clipped).
 * req->precision bf16 (where precision_resolve allows it, else silently fp32: the caller reports):
 * one bf16 copy of the weights and a bf16 GEMM context per thread (attn_stack_set_weights_f32).
 * Errors: MOH_E_ARG (steps not in 1..T, cfg_scale < 0 or not finite, a label outside
 * 0..num_classes, batch < 1), MOH_E_NOMEM. */
int dit_sample(const moh_dit_config *cfg, const dit_params_f32 *p, const image_gen_request *req, float *out,
               moh_error *err);
/* The noise predictor of a sampler: eps [m, C, H, W] for x [m, C, H, W] at timesteps t [m] with
 * labels y [m] (num_classes = null); the result stays valid until the next call. */
typedef const float *(*dit_eps_fn)(void *ctx, const float *x, const int *t, const int *y, int m);
/* dit_sample with any noise predictor (batches of up to 2 req->batch rows with guidance). */
int dit_sample_with(const moh_dit_config *cfg, dit_eps_fn eps_fn, void *ctx, const image_gen_request *req, float *out,
                    moh_error *err);
#endif
