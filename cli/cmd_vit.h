/* moh train / moh eval for ViT image classifiers (cmd_vit.c), reached from cmd_train / cmd_eval
 * when the config (or the checkpoint's config.json) has "model_type": "vit". */
#ifndef MOH_CLI_CMD_VIT_H
#define MOH_CLI_CMD_VIT_H
#include <stdbool.h>

/* Train a ViT on an MNIST-style IDX directory; same argc/argv convention as cmd_train. */
int cmd_train_vit(int argc, char **argv);
/* Top-1 accuracy, per-class accuracy and confusion matrix of a ViT checkpoint. */
int cmd_eval_vit(int argc, char **argv);
/* true when these `moh train` (eval = false) or `moh eval` (eval = true) arguments name a ViT:
 * train: the --config file (resolved with cli_resolve_config), or with --resume the --out dir's
 * config.json; eval: the --checkpoint dir's config.json. Unreadable files: false (the LM command
 * then reports the error). */
bool cmd_is_vit(int argc, char **argv, bool eval);
#endif
