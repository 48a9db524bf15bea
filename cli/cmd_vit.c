/* moh train / moh eval for ViT image classifiers (MoH-ViT and its dense MHA twin) on IDX data. */
#include "cmd_vit.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "train/vit_checkpoint.h"
#include "train/vit_trainer.h"

static bool has_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

static bool file_is_vit(const char *path) {
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, NULL);
    /* a ViT config that does not parse still goes to the ViT parser, which names the problem */
    const bool yes = text && (moh_config_is_vit(text, len) ||
                              (strstr(text, "\"model_type\"") && strstr(text, "\"vit\"")));
    free(text);
    return yes;
}

bool cmd_is_vit(int argc, char **argv, bool eval) {
    char path[PATH_MAX + 64];
    if (eval) {
        const char *ck = args_value(argc, argv, "--checkpoint");
        if (!ck) return false;
        snprintf(path, sizeof path, "%s/config.json", ck);
        return file_is_vit(path);
    }
    const char *cfg = args_value(argc, argv, "--config"), *out = args_value(argc, argv, "--out");
    if (out && has_flag(argc, argv, "--resume")) { /* a resume follows the checkpoint's config */
        snprintf(path, sizeof path, "%s/config.json", out);
        return file_is_vit(path);
    }
    if (cfg && cli_resolve_config(cfg, path, sizeof path)) return file_is_vit(path);
    return false;
}

int cmd_train_vit(int argc, char **argv) {
    vit_train_options o;
    vit_train_defaults(&o);
    const char *config = NULL;
    bool no_flip = false, no_augment = false;
    const arg_spec specs[] = {
        {"--config", ARG_STR, &config, "NAME|FILE", "ViT config: a JSON file or a name from configs/ (vit-moh-75, vit-mha, vit-moh-50, vit-moh-90, vit-moh-75-p4, ...)", false, ARG_ANY},
        {"--data", ARG_STR, &o.data_dir, "DIR", "IDX dir: train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-* (test set, evaluated every epoch)", true, ARG_ANY},
        {"--out", ARG_STR, &o.out_dir, "DIR", "checkpoint dir: config.json, model.safetensors (timm names), optimizer.safetensors, metrics.jsonl", true, ARG_ANY},
        {"--epochs", ARG_DOUBLE, &o.epochs, "E", "passes over the training images (default 25; fractions allowed)", false, ARG_IN_OC(0, 1e6)},
        {"--steps", ARG_LONG, &o.steps, "N", "optimizer steps (overrides --epochs)", false, ARG_GE(1)},
        {"--stop-at-step", ARG_LONG, &o.stop_at_step, "N", "save and stop after step N (continue later with --resume)", false, ARG_GE(1)},
        {"--max-minutes", ARG_DOUBLE, &o.max_minutes, "M", "stop after M minutes of training, checkpoint saved (--resume continues)", false, ARG_IN_OC(0, 5256000)},
        {"--seed", ARG_U64, &o.seed, "S", "seed for init, data order and augmentation (default 1)", false, ARG_ANY},
        {"--batch-size", ARG_INT, &o.batch_size, "B", "images per step (default 128)", false, ARG_IN(1, 65536)},
        {"--shards", ARG_INT, &o.shards, "S", "split each batch into S data-parallel shards, one thread each, with per-shard load-balance statistics like S GPUs (default: OpenMP threads; kept on --resume)", false, ARG_IN(1, 256)},
        {"--lr", ARG_DOUBLE, &o.lr, "LR", "peak learning rate (default 2e-3)", false, ARG_IN_OC(0, 1000)},
        {"--min-lr-ratio", ARG_DOUBLE, &o.min_lr_ratio, "R", "final lr = R * peak after cosine decay (default 0.01)", false, ARG_IN(0, 1)},
        {"--warmup", ARG_LONG, &o.warmup, "N", "linear warmup steps (default one epoch, at most 10% of the steps)", false, ARG_GE(0)},
        {"--weight-decay", ARG_DOUBLE, &o.weight_decay, "WD", "AdamW weight decay on weight matrices and routers, not biases/norms/pos_embed/cls_token (default 0.05)", false, ARG_GE(0)},
        {"--grad-clip", ARG_DOUBLE, &o.grad_clip, "C", "clip the global gradient norm to C (default 1.0; 0 = off)", false, ARG_GE(0)},
        {"--eval-every", ARG_LONG, &o.eval_every, "N", "evaluate on the test split and checkpoint every N steps (default: every epoch)", false, ARG_GE(0)},
        {"--eval-limit", ARG_LONG, &o.eval_limit, "N", "test images per periodic evaluation (default all; the final one uses all)", false, ARG_GE(0)},
        {"--log-every", ARG_LONG, &o.log_every, "N", "progress line every N steps (default 50)", false, ARG_GE(1)},
        {"--train-limit", ARG_LONG, &o.train_limit, "N", "train on the first N training images only (smoke tests)", false, ARG_GE(1)},
        {"--crop-pad", ARG_INT, &o.crop_pad, "P", "random crop with zero padding P, i.e. shifts of up to P pixels (default 1; 0 = off)", false, ARG_IN(0, 64)},
        {"--no-flip", ARG_FLAG, &no_flip, NULL, "no random horizontal flip", false, ARG_ANY},
        {"--no-augment", ARG_FLAG, &no_augment, NULL, "no crop and no flip", false, ARG_ANY},
        {"--sparse-attn", ARG_FLAG, &o.sparse_attn, NULL, "attention on the head-sparse path (only routed heads, flash-style; same results to ~1e-5)", false, ARG_ANY},
        {"--resume", ARG_FLAG, &o.resume, NULL, "continue the run in --out (same batches, schedule, hyper-parameters, shards and seed)", false, ARG_ANY},
        {"--quiet", ARG_FLAG, &o.quiet, NULL, "no progress output", false, ARG_ANY},
        {"--dump-grads", ARG_STR, &o.dump_grads, "FILE", "debug: write the first step's images, labels, initial weights (init.*) and gradient (grad.*)", false, ARG_ANY},
    };
    int rc = args_parse("train", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--config vit-NAME|FILE --data DIR --out DIR [options]   (ViT configs)",
                        "ViT (config model_type \"vit\"): loss = label-smoothed cross-entropy +\n"
                        "load_balance_coef * mean over layers of the load-balance loss (spec §2).\n"
                        "AdamW (beta 0.9/0.999), linear warmup + cosine decay, inputs normalised by\n"
                        "the training set's mean/std (saved in config.json). Ctrl-C saves a\n"
                        "checkpoint and exits; --resume continues it.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (args_check_less("train", argc, argv, "--warmup", o.warmup, "--steps", o.steps)) return 2;
    if (no_flip || no_augment) o.hflip = false;
    if (no_augment) o.crop_pad = 0;
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
    rc = vit_train(&o, &err);
    if (rc < 0) {
        fprintf(stderr, "moh train: %s\n", err.msg);
        return 1;
    }
    return rc;
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

/* Writes images [n, 1, H, W] (normalised, the model input), labels [n] and logits [n, K] of the
 * first n test images. */
static int dump_logits(const char *path, const moh_vit_config *cfg, const vit_params_f32 *p,
                       vit_shards *w, const idx_split *s, moh_error *err) {
    const int n = s->n < w->n * w->Bmax ? s->n : w->n * w->Bmax, H = cfg->img_size, K = cfg->num_classes;
    float *img = malloc(sizeof(float) * (size_t)n * H * H), *lab = malloc(sizeof(float) * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * K);
    int *idx = malloc(sizeof(int) * (size_t)n);
    int rc = MOH_OK;
    if (!img || !lab || !idx || !logits) rc = moh_fail(err, MOH_E_NOMEM, "dump-logits: out of memory");
    if (!rc) {
        for (int j = 0; j < n; j++) {
            idx[j] = j;
            lab[j] = (float)s->labels[j];
        }
        vit_make_batch(cfg, s, idx, n, NULL, 0, 0, img);
        vit_shards_step(cfg, p, w, img, NULL, n, NULL, NULL, NULL);
        for (int j = 0; j < n; j++) memcpy(logits + (size_t)j * K, vit_shards_logits(cfg, w, j), sizeof(float) * K);
        moh_st_entry e[3] = {{"images", 4, {n, 1, H, H}, img}, {"labels", 1, {n}, lab},
                             {"logits", 2, {n, K}, logits}};
        rc = moh_st_write(path, e, 3, err);
    }
    free(img);
    free(lab);
    free(logits);
    free(idx);
    return rc;
}

/* true when dir holds a file named name */
static bool has_file(const char *dir, const char *name) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

int cmd_eval_vit(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *dump = NULL, *split = "t10k";
    int B = 256;
    long limit = 0;
    bool json = false, sparse = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "ViT checkpoint dir (config.json + model.safetensors)", true, ARG_ANY},
        {"--data", ARG_STR, &data, "DIR", "IDX dir (as for moh train)", true, ARG_ANY},
        {"--split", ARG_STR, &split, "NAME", "file prefix of the split: t10k (test, default) or train", false, ARG_ANY},
        {"--limit", ARG_LONG, &limit, "N", "evaluate the first N images only (default all)", false, ARG_GE(0)},
        {"--batch-size", ARG_INT, &B, "B", "images per forward pass (default 256; does not change the result)", false, ARG_IN(1, 65536)},
        {"--sparse-attn", ARG_FLAG, &sparse, NULL, "attention on the head-sparse path (same results to ~1e-5)", false, ARG_ANY},
        {"--json", ARG_FLAG, &json, NULL, "print one JSON object: accuracy, per_class, confusion, ce_loss, head_share, ...", false, ARG_ANY},
        {"--dump-logits", ARG_STR, &dump, "FILE", "debug: write images, labels and logits of the first --batch-size images (safetensors)", false, ARG_ANY},
    };
    int rc = args_parse("eval", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --data DIR [--json]   (ViT checkpoints)",
                        "ViT: top-1 accuracy over the split (no augmentation; inputs normalised with\n"
                        "the mean/std in config.json), per-class accuracy (recall), the confusion\n"
                        "matrix (rows: true class, columns: predicted), the mean cross-entropy in nats\n"
                        "(ce_loss: plain, without the config's label smoothing, which only training\n"
                        "uses) and each head's activation share per layer. Long runs print progress\n"
                        "(rate, ETA) to stderr; stdout holds only the result.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    moh_vit_config cfg;
    vit_params_f32 p;
    vit_shards w;
    idx_split s;
    vit_eval_result r;
    memset(&p, 0, sizeof p);
    memset(&w, 0, sizeof w);
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    int status = 1;
    struct stat st;
    if (stat(data, &st) == 0 && !S_ISDIR(st.st_mode)) {
        moh_fail(&err, MOH_E_ARG, "--data %s is a file, but %s is a ViT (image) checkpoint: it needs a directory "
                 "of IDX files (t10k-images-idx3-ubyte[.gz], ...)", data, ckpt);
        goto fail;
    }
    if (stat(data, &st) == 0 && (has_file(data, "val.txt") || has_file(data, "train.txt")) &&
        !has_file(data, "t10k-images-idx3-ubyte") && !has_file(data, "t10k-images-idx3-ubyte.gz")) {
        moh_fail(&err, MOH_E_ARG, "--data %s holds text (val.txt / train.txt), but %s is a ViT (image) checkpoint: "
                 "it needs a directory of IDX files (t10k-images-idx3-ubyte[.gz], ...)", data, ckpt);
        goto fail;
    }
    if (vit_checkpoint_load(ckpt, &cfg, &p, &err)) goto fail;
    if (cfg.n_norm == 0) {
        if (idx_train_mean_std(data, cfg.num_classes, &cfg.mean[0], &cfg.std[0], &err)) goto fail;
        cfg.n_norm = 1;
        fprintf(stderr, "moh eval: note: %s/config.json has no mean/std; using the training split's "
                "(%.4f, %.4f)\n", ckpt, cfg.mean[0], cfg.std[0]);
    }
    if (idx_split_load(&s, data, split, cfg.num_classes, &err)) goto fail;
    if (vit_check_split(&cfg, &s, data, &err)) goto fail;
    if (B > s.n) B = s.n; /* no larger than the split: the batch size does not change the result */
    if (vit_shards_init(&w, &cfg, B, vit_default_shards(B), false, sparse, &err)) goto fail;
    if (dump && dump_logits(dump, &cfg, &p, &w, &s, &err)) goto fail;
    eval_progress pg;
    eval_progress_start(&pg, "images");
    const train_progress report = {eval_progress_report, &pg};
    rc = vit_evaluate(&cfg, &p, &w, &s, limit, &report, &r, &err);
    eval_progress_end(&pg, rc ? -1 : r.n);
    if (rc) goto fail;
    if (!isfinite(r.loss)) { /* finite weights can still overflow: never print nan as a result */
        moh_fail(&err, MOH_E_FORMAT, "%s: ce_loss is %g: the model's outputs overflow", ckpt, r.loss);
        goto fail;
    }
    const int K = cfg.num_classes, L = cfg.depth, h = cfg.num_heads;
    const char *const *names = idx_fashion_names(data, K);
    char cname[32];
    if (json) {
        printf("{\"accuracy\": %.6f, \"correct\": %ld, \"n\": %ld, \"ce_loss\": %.6f, \"lb_loss\": %.6f, "
               "\"split\": ", r.accuracy, r.correct, r.n, r.loss, r.lb_loss);
        json_string(split);
        printf(", \"classes\": [");
        for (int k = 0; k < K; k++) {
            snprintf(cname, sizeof cname, "%d", k);
            printf("%s", k ? ", " : "");
            json_string(names ? names[k] : cname);
        }
        printf("], \"per_class\": [");
        for (int k = 0; k < K; k++) {
            long row = 0;
            for (int j = 0; j < K; j++) row += r.confusion[(size_t)k * K + j];
            printf("%s%.6f", k ? ", " : "", row ? (double)r.confusion[(size_t)k * K + k] / row : 0.0);
        }
        printf("], \"confusion\": [");
        for (int k = 0; k < K; k++) {
            printf("%s[", k ? ", " : "");
            for (int j = 0; j < K; j++) printf("%s%ld", j ? ", " : "", r.confusion[(size_t)k * K + j]);
            printf("]");
        }
        printf("], \"head_share\": [");
        for (int l = 0; l < L; l++) {
            printf("%s[", l ? ", " : "");
            for (int i = 0; i < h; i++) printf("%s%.6f", i ? ", " : "", r.head_share[(size_t)l * h + i]);
            printf("]");
        }
        printf("]}\n");
    } else {
        printf("checkpoint %s on %s/%s (%ld images)\n", ckpt, data, split, r.n);
        printf("top-1 accuracy %.4f (%ld / %ld) | cross-entropy %.4f nats (no label smoothing) | lb %.3f "
               "(monitoring, not added)\n",
               r.accuracy, r.correct, r.n, r.loss, r.lb_loss);
        printf("per-class accuracy:\n");
        for (int k = 0; k < K; k++) {
            long row = 0;
            for (int j = 0; j < K; j++) row += r.confusion[(size_t)k * K + j];
            snprintf(cname, sizeof cname, "class %d", k);
            printf("  %2d %-12s %.4f (%ld)\n", k, names ? names[k] : cname,
                   row ? (double)r.confusion[(size_t)k * K + k] / row : 0.0, row);
        }
        printf("confusion matrix (rows: true class, columns: predicted):\n     ");
        for (int j = 0; j < K; j++) printf(" %5d", j);
        printf("\n");
        for (int k = 0; k < K; k++) {
            printf("  %2d:", k);
            for (int j = 0; j < K; j++) printf(" %5ld", r.confusion[(size_t)k * K + j]);
            printf("\n");
        }
        printf("head-activation share per layer (heads 0..%d; shared heads first):\n", h - 1);
        for (int l = 0; l < L; l++) {
            printf("  layer %2d:", l);
            for (int i = 0; i < h; i++) printf(" %.2f", r.head_share[(size_t)l * h + i]);
            printf("\n");
        }
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh eval: %s\n", err.msg);
done:
    vit_eval_result_free(&r);
    idx_split_free(&s);
    vit_shards_free(&w);
    vit_params_free_f32(&p);
    return status;
}
