/* moh train: train a MoH (or dense) decoder language model on a text corpus. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cli.h"
#include "cmd_vit.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv) {
    if (cmd_is_vit(argc, argv, false)) return cmd_train_vit(argc, argv); /* "model_type": "vit" */
    lm_train_options o;
    lm_train_defaults(&o);
    const char *config = NULL;
    const arg_spec specs[] = {
        {"--config", ARG_STR, &config, "NAME|FILE", "model config: a JSON file, or a name from configs/ (moh-75, mha, moh-50, moh-90, ...)", false, ARG_ANY},
        {"--data", ARG_STR, &o.data_path, "FILE|DIR", "UTF-8 text file (its last --val-fraction, cut at a line start, is validation) or a dir with train.txt + val.txt", true, ARG_ANY},
        {"--out", ARG_STR, &o.out_dir, "DIR", "checkpoint dir: config.json, model.safetensors, optimizer.safetensors, metrics.jsonl", true, ARG_ANY},
        {"--steps", ARG_LONG, &o.steps, "N", "optimizer steps (default: fit the schedule into --max-minutes)", false, ARG_GE(1)},
        {"--max-minutes", ARG_DOUBLE, &o.max_minutes, "M", "end the run within M minutes, final validation included (checkpoint saved)", false, ARG_IN_OC(0, 5256000)},
        {"--seed", ARG_U64, &o.seed, "S", "seed for init and data order (default 1)", false, ARG_ANY},
        {"--batch-size", ARG_INT, &o.batch_size, "B", "sequences per micro-batch (default 16)", false, ARG_IN(1, 65536)},
        {"--seq-len", ARG_INT, &o.seq_len, "T", "tokens per sequence, at most the config's max_position_embeddings (the default)", false, ARG_GE(1)},
        {"--grad-accum", ARG_INT, &o.grad_accum, "N", "micro-batches per optimizer step (default 1)", false, ARG_IN(1, 65536)},
        {"--lr", ARG_DOUBLE, &o.lr, "LR", "peak learning rate (default 2e-3)", false, ARG_IN_OC(0, 1000)},
        {"--min-lr-ratio", ARG_DOUBLE, &o.min_lr_ratio, "R", "final lr = R * peak after cosine decay (default 0.1)", false, ARG_IN(0, 1)},
        {"--warmup", ARG_LONG, &o.warmup, "N", "linear warmup steps (default min(100, steps/10))", false, ARG_GE(0)},
        {"--weight-decay", ARG_DOUBLE, &o.weight_decay, "WD", "AdamW decoupled weight decay on matrices (default 0.1)", false, ARG_GE(0)},
        {"--grad-clip", ARG_DOUBLE, &o.grad_clip, "C", "clip the global gradient norm to C (default 1.0; 0 = off)", false, ARG_GE(0)},
        {"--eval-every", ARG_LONG, &o.eval_every, "N", "validate and checkpoint every N steps (default 200; 0 = at the end)", false, ARG_GE(0)},
        {"--eval-tokens", ARG_LONG, &o.eval_tokens, "N", "predictions per periodic validation (default 131072; 0 = the whole split, as the final one)", false, ARG_GE(0)},
        {"--save-every", ARG_LONG, &o.save_every, "N", "extra checkpoints every N steps (default: at validations)", false, ARG_GE(0)},
        {"--log-every", ARG_LONG, &o.log_every, "N", "progress line every N steps (default 10)", false, ARG_GE(1)},
        {"--val-fraction", ARG_DOUBLE, &o.val_fraction, "F", "held-out tail of a single text file (default 0.1)", false, ARG_IN_OO(0, 1)},
        {"--stop-at-step", ARG_LONG, &o.stop_at_step, "N", "save and stop after step N (continue later with --resume)", false, ARG_GE(1)},
        {"--resume", ARG_FLAG, &o.resume, NULL, "continue from --out (same batches and losses as an uninterrupted run)", false, ARG_ANY},
        {"--reference-attention", ARG_FLAG, &o.reference_attention, NULL, "compute every head then gate (the definition) instead of only the selected heads; same results, slower", false, ARG_ANY},
        {"--quiet", ARG_FLAG, &o.quiet, NULL, "no progress output", false, ARG_ANY},
        {"--dump-grads", ARG_STR, &o.dump_grads, "FILE", "debug: write the first step's batch, initial weights (init.*) and gradient (grad.*)", false, ARG_ANY},
    };
    int rc = args_parse("train", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--config NAME|FILE --data FILE --out DIR [options]",
                        "Loss = mean cross-entropy + load_balance_coef * mean over layers of the\n"
                        "load-balance loss. AdamW (beta 0.9/0.95), linear warmup + cosine decay.\n"
                        "Ctrl-C saves a checkpoint and exits; --resume continues it.\n"
                        "These are the LM options. With a ViT config (model_type \"vit\") the\n"
                        "options differ: moh train --config vit-moh-75 --help lists them.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (args_check_less("train", argc, argv, "--warmup", o.warmup, "--steps", o.steps)) return 2;
    char path[PATH_MAX + 64];
    if (!o.resume) {
        if (!config) {
            fprintf(stderr, "moh train: missing required option --config (or --resume)\n");
            return 2;
        }
        if (!cli_resolve_config(config, path, sizeof path)) {
            cli_config_not_found("train", config);
            return 2;
        }
        o.config_path = path;
    } else if (config) {
        fprintf(stderr, "moh train: note: --resume uses %s/config.json; --config ignored\n", o.out_dir);
    }
    moh_error err = {0};
    rc = lm_train(&o, &err);
    if (rc < 0) {
        fprintf(stderr, "moh train: %s\n", err.msg);
        return 1;
    }
    return rc;
}
