/* Progress reports of long loops (evaluations, analyses), shared by every layer. */
#ifndef MOH_PROGRESS_H
#define MOH_PROGRESS_H

/* Progress of a long loop: fn(ctx, done, total) after each batch, in the loop's units (predictions,
 * images). A NULL moh_progress or fn reports nothing. */
typedef struct moh_progress {
    void (*fn)(void *ctx, long done, long total);
    void *ctx;
} moh_progress;
#endif
