/* moh train: train any model family (the config's "model_type": a decoder LM on text, a ViT on IDX
 * images, ...) with the one trainer (src/train/trainer.h). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "models/model.h"
#include "train/trainer.h"

/* The "Family defaults" part of --help, from each registered family's train_defaults. */
static void family_defaults(char *buf, size_t cap) {
    int nf = 0;
    const model_family *const *fams = model_families(&nf);
    size_t used = (size_t)snprintf(buf, cap, "Defaults per model_type (a resume keeps the checkpoint's values):\n");
    for (int i = 0; i < nf && used < cap; i++) {
        train_hparams h;
        fams[i]->train_defaults(&h);
        char shards[32], ev[48], ep[32] = "";
        snprintf(shards, sizeof shards, h.shards > 0 ? "%d" : "threads", h.shards);
        snprintf(ev, sizeof ev, h.eval_every > 0 ? "%ld" : "epoch", h.eval_every);
        if (h.epochs > 0) snprintf(ep, sizeof ep, ", epochs %g", h.epochs);
        if (h.ema_decay > 0) snprintf(ep + strlen(ep), sizeof ep - strlen(ep), ", ema %g", h.ema_decay);
        used += (size_t)snprintf(buf + used, cap - used,
                                 "  %-6s batch %d, lr %g, min-lr-ratio %g, weight-decay %g, betas %g/%g, shards %s,\n"
                                 "         eval-every %s, eval-limit %ld, log-every %ld%s; data: %s\n",
                                 fams[i]->model_type, h.batch_size, h.lr, h.min_lr_ratio, h.weight_decay, h.beta1,
                                 h.beta2, shards, ev, h.eval_limit, h.log_every, ep, fams[i]->data_help);
    }
}

int cmd_train(int argc, char **argv) {
    train_options o;
    train_options_defaults(&o);
    train_hparams *f = &o.flags;
    const char *config = NULL, *init = NULL, *precision = NULL, *device = NULL;
    bool no_flip = false, no_augment = false, sparse = false, reference = false;
    const char *optimizer = NULL;
    long eval_tokens = LONG_MIN;
    const arg_spec specs[] = {
        {"--config", ARG_STR, &config, "NAME|FILE", "model config: a JSON file or a name from configs/ (moh-75, mha, vit-moh-75, vit-mha, dit-moh-75, ...; moh --list-configs); its model_type picks the family", false, ARG_ANY},
        {"--init", ARG_STR, &init, "PATH", "start from pretrained weights instead of --config: a moh checkpoint, a Hugging Face folder or a .gguf, with its config and tokenizer (BPE text is tokenized with it); fresh optimizer and schedule from step 0", false, ARG_ANY},
        {"--data", ARG_STR, &o.data_path, "PATH", "training data of the family: a text file or dir with train.txt + val.txt (llama); an IDX dir (vit, dit); --resume: the run's own (recorded in the checkpoint, checked by its CRC-32)", false, ARG_ANY},
        {"--out", ARG_STR, &o.out_dir, "DIR", "checkpoint dir: config.json, model.safetensors, optimizer.safetensors, metrics.jsonl", true, ARG_ANY},
        {"--steps", ARG_LONG, &o.steps, "N", "optimizer steps (default: --epochs, else fit the schedule into --max-minutes)", false, ARG_GE(1)},
        {"--epochs", ARG_DOUBLE, &f->epochs, "E", "passes over the training data (data read in epochs: images; fractions allowed)", false, ARG_IN_OC(0, 1e6)},
        {"--max-minutes", ARG_DOUBLE, &o.max_minutes, "M", "end the session within M minutes, final validation included (checkpoint saved)", false, ARG_IN_OC(0, 5256000)},
        {"--seed", ARG_U64, &f->seed, "S", "seed for init, data order and augmentation (default 1)", false, ARG_ANY},
        {"--batch-size", ARG_INT, &f->batch_size, "B", "examples (sequences, images) per micro-batch (--init: default 4)", false, ARG_IN(1, 65536)},
        {"--seq-len", ARG_INT, &f->seq_len, "T", "text: tokens per sequence, at most the config's max_position_embeddings (the default; --init: at most 512)", false, ARG_GE(1)},
        {"--grad-accum", ARG_INT, &f->grad_accum, "N", "micro-batches per optimizer step (default 1)", false, ARG_IN(1, 65536)},
        {"--shards", ARG_INT, &f->shards, "S", "split each micro-batch into S data-parallel shards, one thread each, with per-shard load-balance statistics like S GPUs", false, ARG_IN(1, 256)},
        {"--lr", ARG_DOUBLE, &f->lr, "LR", "peak learning rate (--init: default 5e-5, a fine-tuning rate)", false, ARG_IN_OC(0, 1000)},
        {"--min-lr-ratio", ARG_DOUBLE, &f->min_lr_ratio, "R", "final lr = R * peak after cosine decay", false, ARG_IN(0, 1)},
        {"--warmup", ARG_LONG, &f->warmup, "N", "linear warmup steps (default min(100 or an epoch, steps/10))", false, ARG_GE(0)},
        {"--weight-decay", ARG_DOUBLE, &f->weight_decay, "WD", "decoupled weight decay on weight matrices, times the lr (AdamW's, and Muon's with --optimizer muon)", false, ARG_GE(0)},
        {"--beta1", ARG_DOUBLE, &f->beta1, "B1", "AdamW beta1", false, ARG_IN(0, 0.999999)},
        {"--beta2", ARG_DOUBLE, &f->beta2, "B2", "AdamW beta2", false, ARG_IN(0, 0.999999)},
        {"--optimizer", ARG_CHOICE, &optimizer, "adamw|muon", "adamw (default), or muon: Muon (momentum 0.95, Nesterov, 5 Newton-Schulz steps, update scaled to AdamW's RMS) on the attention and MLP weight matrices at --muon-lr, AdamW at --lr on embeddings, heads, routers, norms and biases", false, ARG_ANY},
        {"--muon-lr", ARG_DOUBLE, &f->muon_lr, "LR", "--optimizer muon: peak lr of the Muon-updated matrices, same warmup and decay as --lr; weight decay on them is times this lr (default: --lr, Muon's update being scaled to AdamW's RMS)", false, ARG_IN_OC(0, 1000)},
        {"--grad-clip", ARG_DOUBLE, &f->grad_clip, "C", "clip the global gradient norm to C (default 1.0; 0 = off)", false, ARG_GE(0)},
        {"--ema-decay", ARG_DOUBLE, &f->ema_decay, "D", "dit: EMA of the weights with decay min(D, (1+n)/(10+n)) after update n; model.safetensors holds the EMA (default 0.999; 0 = off)", false, ARG_IN(0, 0.999999999)},
        {"--eval-every", ARG_LONG, &f->eval_every, "N", "validate and checkpoint every N steps (0 = every epoch, or only at the end)", false, ARG_GE(0)},
        {"--eval-limit", ARG_LONG, &f->eval_limit, "N", "items (predictions, images) per periodic validation (0 = the whole split, as the final one)", false, ARG_GE(0)},
        {"--eval-tokens", ARG_LONG, &eval_tokens, "N", "text: the same as --eval-limit", false, ARG_GE(0)},
        {"--save-every", ARG_LONG, &f->save_every, "N", "extra checkpoints every N steps (default: at validations)", false, ARG_GE(0)},
        {"--log-every", ARG_LONG, &f->log_every, "N", "progress line every N steps", false, ARG_GE(1)},
        {"--val-fraction", ARG_DOUBLE, &f->val_fraction, "F", "text: held-out tail of a single text file (default 0.1)", false, ARG_IN_OO(0, 1)},
        {"--train-limit", ARG_LONG, &f->train_limit, "N", "images: train on the first N training images only (smoke tests)", false, ARG_GE(1)},
        {"--crop-pad", ARG_INT, &f->crop_pad, "P", "images: random crop with zero padding P, i.e. shifts of up to P pixels (default 1; 0 = off)", false, ARG_IN(0, 64)},
        {"--no-flip", ARG_FLAG, &no_flip, NULL, "images: no random horizontal flip", false, ARG_ANY},
        {"--no-augment", ARG_FLAG, &no_augment, NULL, "images: no crop and no flip", false, ARG_ANY},
        {"--stop-at-step", ARG_LONG, &o.stop_at_step, "N", "save and stop after step N (continue later with --resume)", false, ARG_GE(1)},
        {"--comm-timeout", ARG_DOUBLE, &o.comm_timeout, "S", "under mpirun: end the whole job when no step finishes for S seconds on a rank (a rank died or hangs; default 300)", false, ARG_IN_OC(0, 1e6)},
        {"--max-bad-steps", ARG_INT, &o.max_bad_steps, "N", "stop after N steps in a row with a non-finite loss or gradient (each is skipped; default 3)", false, ARG_IN(1, 1000000)},
        {"--resume", ARG_FLAG, &o.resume, NULL, "continue the run in --out with its saved hyperparameters, schedule, data position and seed (same batches and losses as an uninterrupted run)", false, ARG_ANY},
        {"--sparse-attn", ARG_FLAG, &sparse, NULL, "attention on the head-sparse path (only the selected heads; the default for llama)", false, ARG_ANY},
        {"--reference-attention", ARG_FLAG, &reference, NULL, "every head computed then gated (the definition; the default for vit); same results, slower", false, ARG_ANY},
        CLI_PRECISION_AUTO_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
        {"--quiet", ARG_FLAG, &o.quiet, NULL, "no progress output", false, ARG_ANY},
        {"--dump-grads", ARG_STR, &o.dump_grads, "FILE", "debug: write the first step's batch, initial weights (init.*) and gradient (grad.*)", false, ARG_ANY},
        {"--debug-nan-grad", ARG_LONG, &o.nan_step, "STEP", "test hook: put a NaN into one gradient element at step STEP (see --debug-nan-count)", false, ARG_GE(1)},
        {"--debug-nan-count", ARG_INT, &o.nan_count, "N", "test hook: ... and the N-1 steps after it (default 1)", false, ARG_IN(1, 1000000)},
    };
    char epilog[4096];
    int used = snprintf(epilog, sizeof epilog,
                        "Loss = the family's loss (cross-entropy; label-smoothed for vit) + load_balance_coef *\n"
                        "mean over layers of the load-balance loss (spec §2). AdamW (--optimizer muon: Muon\n"
                        "on the attention and MLP matrices), linear warmup + cosine decay, global-norm\n"
                        "clipping. A step whose loss or gradient norm is not finite is\n"
                        "skipped (warning, \"skipped\" in metrics.jsonl), never applied or saved. Ctrl-C saves\n"
                        "a checkpoint and exits (130); --resume continues it. On --resume a flag that changes\n"
                        "an optimisation value (--lr, --min-lr-ratio, --weight-decay, --beta1/2, --grad-clip,\n"
                        "--ema-decay, --muon-lr, --save-every, --precision,\n"
                        "--warmup, --steps, --eval-*) is applied from the next step with a printed note; one\n"
                        "that changes the batches or the optimizer (--batch-size, --seq-len, --grad-accum,\n"
                        "--shards, --seed, --optimizer,\n"
                        "--val-fraction, --train-limit, --crop-pad, --no-flip, --no-augment) is refused, and\n"
                        "so is other data (--resume without --data takes the run's own, checked by CRC-32).\n"
                        "A save commits every file at once (checkpoint.json: each file's size and CRC-32);\n"
                        "a file changed or copied in from another checkpoint is refused.\n"
                        "--init PATH continue-tunes a pretrained model (moh / HF folder, .gguf): its config\n"
                        "and weights, its tokenizer for the text (a BPE model trains on its tokens; bits per\n"
                        "byte are over the bytes the predicted tokens decode to); the checkpoint in --out\n"
                        "holds the tokenizer (tokenizer.json), so --resume, eval, sample and chat use it.\n"
                        "Several processes (MPI, when moh is built with libopenmpi-dev):\n"
                        "  mpirun -np R [--hostfile H] moh train ... --shards S --batch-size B\n"
                        "runs R ranks of one model, each taking S/R shards (B/R examples) of every\n"
                        "micro-batch; gradients and losses are summed with MPI_Allreduce, so -np R equals\n"
                        "one process with --shards S (S a multiple of R, B of S). Rank 0 alone writes the\n"
                        "checkpoint, metrics.jsonl and the progress line; validation is split across the\n"
                        "ranks. Resume works with any R that divides S. Each rank needs the data and --out\n"
                        "at the same path (a shared folder across hosts). Ctrl-C on mpirun kills the job\n"
                        "(the last checkpoint stays); `kill -USR1 <mpirun pid>` saves and stops (exit 130),\n"
                        "as Ctrl-C does for one process. A rank that dies ends the job; one that hangs\n"
                        "ends it after --comm-timeout seconds.\n");
    family_defaults(epilog + used, sizeof epilog - (size_t)used);
    int rc = args_parse("train", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "(--config NAME|FILE | --init PATH) --data PATH --out DIR [options]", epilog);
    if (rc) return rc == 1 ? 0 : rc;
    if (args_check_less("train", argc, argv, "--warmup", f->warmup, "--steps", o.steps)) return 2;
    if (eval_tokens != LONG_MIN) {
        if (f->eval_limit != LONG_MIN && f->eval_limit != eval_tokens) {
            fprintf(stderr, "moh train: --eval-tokens %ld and --eval-limit %ld disagree (they are one option)\n",
                    eval_tokens, f->eval_limit);
            return 2;
        }
        f->eval_limit = eval_tokens;
    }
    if (optimizer) f->optimizer = !strcmp(optimizer, "muon");
    if (sparse && reference) {
        fprintf(stderr, "moh train: --sparse-attn and --reference-attention exclude each other\n");
        return 2;
    }
    if (sparse || reference) f->attention = sparse ? 1 : 2; /* else the family's default, or the checkpoint's */
    o.seed_given = args_value(argc, argv, "--seed") != NULL;
    moh_error derr = {0};
    if (backend_parse_device(device, &o.device, &derr)) {
        fprintf(stderr, "moh train: %s\n", derr.msg);
        return 2;
    }
    if (precision) f->precision = (int)cli_precision_parse(precision);
    if (no_flip || no_augment) f->hflip = 0;
    if (no_augment) f->crop_pad = 0;
    o.no_augment = no_augment;
    if (o.nan_step > 0 && o.nan_count == 0) o.nan_count = 1;
    char path[PATH_MAX + 64];
    if (init && (o.resume || config)) {
        fprintf(stderr, "moh train: --init starts a new run from %s with its own config: it excludes %s\n", init,
                o.resume ? "--resume (which continues the run in --out)" : "--config");
        return 2;
    }
    o.init_path = init;
    const char *inputs[] = {o.data_path, init, config, o.out_dir};
    if (!cli_output_ok("train", "--dump-grads", o.dump_grads, inputs, 4)) return 2;
    if (!o.resume && !o.data_path) {
        fprintf(stderr, "moh train: missing required option --data\n");
        return 2;
    }
    if (!o.resume && !init) {
        if (!config) {
            fprintf(stderr, "moh train: missing required option --config (or --init, or --resume)\n");
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
    rc = train_run(&o, &err);
    if (rc < 0) {
        if (err.msg[0]) fprintf(stderr, "moh train: %s\n", err.msg); /* (another MPI rank may report it) */
        return 1;
    }
    return rc;
}
