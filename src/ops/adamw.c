#include "ops/adamw.h"

#include <math.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

void adamw_step(const adamw_config *c, float *params, const float *grads, float *m, float *v,
                const bool *decay_mask, size_t n, long t, double lr) {
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    const float bc1 = (float)(1.0 - pow(c->beta1, (double)t));
    const float bc2 = (float)(1.0 - pow(c->beta2, (double)t));
    const float flr = (float)lr, wd = (float)c->weight_decay;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const float g = grads[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        const float mh = m[i] / bc1, vh = v[i] / bc2;
        float upd = mh / (sqrtf(vh) + eps);
        if (decay_mask && decay_mask[i]) upd += wd * params[i];
        params[i] -= flr * upd;
    }
}

double lr_schedule(long step, long warmup, long total, double max_lr, double min_lr) {
    if (warmup > 0 && step < warmup) return max_lr * (double)(step + 1) / (double)warmup;
    if (step >= total) return min_lr;
    const double span = (double)(total - warmup);
    const double progress = span > 0 ? (double)(step - warmup) / span : 1.0;
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + cos(M_PI * progress));
}

double clip_grad_norm(float *grads, size_t n, double max_norm) {
    /* blocks of 4096 summed in double in a fixed order */
    double total = 0.0;
    for (size_t b = 0; b < n; b += 4096) {
        const size_t e = b + 4096 < n ? b + 4096 : n;
        double s = 0.0;
        for (size_t i = b; i < e; i++) s += (double)grads[i] * grads[i];
        total += s;
    }
    const double norm = sqrt(total);
    if (max_norm > 0 && norm > max_norm) {
        const float scale = (float)(max_norm / (norm + 1e-6));
        for (size_t i = 0; i < n; i++) grads[i] *= scale;
    }
    return norm;
}

void ema_update(float *ema, const float *w, size_t n, float decay) {
    const float one = 1.0f - decay;
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) ema[i] = decay * ema[i] + one * w[i];
}
