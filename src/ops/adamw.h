/* AdamW (Loshchilov & Hutter) with decoupled weight decay, the warmup + cosine learning-rate
 * schedule, and global-norm gradient clipping. float32, one contiguous parameter buffer. */
#ifndef MOH_ADAMW_H
#define MOH_ADAMW_H
#include <stdbool.h>
#include <stddef.h>

typedef struct adamw_config {
    double beta1, beta2, eps;
    double weight_decay; /* applied only where decay_mask is true (matrices) */
} adamw_config;

/* One AdamW update of params[n] from grads[n] at 1-based step t with learning rate lr:
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p [decay]).
 * decay_mask[n] may be NULL (no decay). */
void adamw_step(const adamw_config *c, float *params, const float *grads, float *m, float *v,
                const bool *decay_mask, size_t n, long t, double lr);

/* Linear warmup from 0 over `warmup` steps to max_lr, then cosine decay to min_lr at `total`
 * steps; step is 0-based (the lr used for update number step + 1). */
double lr_schedule(long step, long warmup, long total, double max_lr, double min_lr);

/* Global L2 norm of grads[n]; when max_norm > 0 and the norm exceeds it, scales grads in place
 * to max_norm. Returns the norm before clipping. Fixed summation order (deterministic). */
double clip_grad_norm(float *grads, size_t n, double max_norm);

/* Exponential moving average of the weights: ema[i] = decay ema[i] + (1 - decay) w[i], i < n. */
void ema_update(float *ema, const float *w, size_t n, float decay);
#endif
