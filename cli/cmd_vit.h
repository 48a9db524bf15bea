/* moh train / moh eval for ViT image classifiers (cmd_vit.c), reached from cmd_train / cmd_eval
 * when the config (or the checkpoint's config.json) has "model_type": "vit". */
#ifndef MOH_CLI_CMD_VIT_H
#define MOH_CLI_CMD_VIT_H
#include <stdbool.h>

/* Train a ViT on an MNIST-style IDX directory; same argc/argv convention as cmd_train. */
int cmd_train_vit(int argc, char **argv);
/* Top-1 accuracy, per-class accuracy, confusion matrix and plain cross-entropy of a ViT checkpoint. */
int cmd_eval_vit(int argc, char **argv);
/* true when these `moh train` (eval = false) or `moh eval` (eval = true) arguments name a ViT:
 * train: the --config file (resolved with cli_resolve_config), or with --resume the --out dir's
 * config.json; eval: the --checkpoint dir's config.json. Unreadable files: false (the LM command
 * then reports the error). */
bool cmd_is_vit(int argc, char **argv, bool eval);

/* `moh eval` progress on stderr, LM and ViT (cmd_eval.c): on a terminal a line updated in place and
 * erased at the end; otherwise a line only once the run has taken 2 s, then every 10 s, and a last
 * line. stdout is never written. done/total count `unit`s (e.g. "predictions", "images"). */
typedef struct eval_progress {
    double t0, last;
    bool tty, shown;
    const char *unit;
} eval_progress;
void eval_progress_start(eval_progress *pg, const char *unit);
void eval_progress_update(eval_progress *pg, long done, long total);
/* eval_progress_update as a train_progress callback (pg: an eval_progress). */
void eval_progress_report(void *pg, long done, long total);
void eval_progress_end(eval_progress *pg, long total); /* total < 0: the run failed, no last line */
#endif
