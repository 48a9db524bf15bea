/* moh eval: the family's metric of a checkpoint on data (bits per byte of a text file for a
 * language model, top-1 accuracy and the confusion matrix of an IDX split for a ViT, the
 * noise-prediction MSE of a DiT), with per-layer head-activation shares (model.h: model_evaluate,
 * eval_report). The sample-quality options (--classifier, ...) go to cmd_eval_image.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "models/model.h"

/* true when argv holds an option of `moh eval --classifier` (sample quality of a DiT) */
static bool sample_quality_args(int argc, char **argv) {
    static const char *const opts[] = {"--classifier", "--samples", "--real", "--cfg", "--sampler", "--steps", "--seed"};
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
            const size_t len = strlen(opts[k]);
            if (!strncmp(argv[i], opts[k], len) && (argv[i][len] == '\0' || argv[i][len] == '=')) return true;
        }
    return false;
}

int cmd_eval(int argc, char **argv) {
    if (sample_quality_args(argc, argv)) return cmd_eval_image(argc, argv);
    const char *ckpt = NULL, *data = NULL, *dump = NULL, *split = NULL, *precision = NULL, *device = NULL;
    double val_fraction = NAN;
    int T = 0, B = 0;
    long limit = 0;
    bool json = false, sparse = false, reference = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "PATH", "checkpoint dir (config.json + model.safetensors, tokenizer.json for BPE models), Hugging Face folder or .gguf; its model_type picks the family", true, ARG_ANY},
        {"--data", ARG_STR, &data, "PATH", "llama: a text file (a prepared dir: its val.txt); vit: an IDX dir", true, ARG_ANY},
        {"--seq-len", ARG_INT, &T, "T", "text: context per chunk, at most the config's max_position_embeddings (default: that, at most 1024)", false, ARG_GE(1)},
        {"--split", ARG_STR, &split, "NAME", "text: all (the whole file, default) or val (its held-out tail as training splits it, by --val-fraction); images: file prefix t10k (test, default) or train", false, ARG_ANY},
        {"--val-fraction", ARG_DOUBLE, &val_fraction, "F", "text, --split val: the held-out tail of the file (default 0.1, as moh train)", false, ARG_IN_OO(0, 1)},
        {"--limit", ARG_LONG, &limit, "N", "evaluate about the first N items (predictions, images) only, in whole batches (text: whole chunks of T, so up to B T - 1 more; default all)", false, ARG_GE(0)},
        {"--batch-size", ARG_INT, &B, "B", "examples per forward pass (default: llama 8 or fewer, at most 2048 tokens, vit 256; does not change the result, only memory)", false, ARG_IN(1, 65536)},
        {"--sparse-attn", ARG_FLAG, &sparse, NULL, "attention on the head-sparse path (the default for llama; same results to ~1e-5)", false, ARG_ANY},
        {"--reference-attention", ARG_FLAG, &reference, NULL, "every head computed then gated (the default for vit)", false, ARG_ANY},
        CLI_PRECISION_AUTO_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
        {"--json", ARG_FLAG, &json, NULL, "print one JSON object (llama: val_loss, bits_per_byte, tokens, bytes, vocab, split, head_share, layer_head_share; vit: accuracy, per_class, confusion, ce_loss, head_share, layer_head_share)", false, ARG_ANY},
        {"--dump-logits", ARG_STR, &dump, "FILE", "debug: write the inputs and logits (fp32) of the first evaluation batch, one sequence for an LM (safetensors; not a DiT)", false, ARG_ANY},
    };
    int rc = args_parse("eval", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint PATH --data PATH [options] [--json]",
                        "llama: the text's tokens (bytes; or, for a model with a BPE tokenizer, the ids of\n"
                        "the whole text tokenized once) are cut into consecutive chunks of T + 1 tokens (a\n"
                        "last chunk shorter than 2 is dropped); each chunk predicts its tokens 1..len-1 from\n"
                        "the tokens before them in the chunk, so the first of each chunk is context only;\n"
                        "val_loss is the mean cross-entropy in nats over all predicted tokens (no\n"
                        "load-balance term); bits_per_byte = their summed cross-entropy in bits / the UTF-8\n"
                        "bytes the predicted tokens decode to (bytes: val_loss / ln 2).\n"
                        "vit: top-1 accuracy over the split (no augmentation; inputs normalised with the\n"
                        "mean/std in config.json), per-class accuracy (recall), the confusion matrix (rows:\n"
                        "true class, columns: predicted), the plain mean cross-entropy in nats (ce_loss,\n"
                        "without the training label smoothing).\n"
                        "dit: noise-prediction MSE at one fixed (timestep, noise) per test image; sample\n"
                        "quality (class accuracy, FID under a moh ViT): moh eval --classifier CLF --help.\n"
                        "All: each head's activation share per layer. Long runs print progress (rate, ETA)\n"
                        "to stderr; stdout holds only the result.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (sparse && reference) {
        fprintf(stderr, "moh eval: --sparse-attn and --reference-attention exclude each other\n");
        return 2;
    }
    const char *inputs[] = {ckpt, data};
    if (!cli_output_ok("eval", "--dump-logits", dump, inputs, 2)) return 2;
    moh_error err = {0};
    model m = {0};
    batch_source src = {0};
    model_shards w = {0};
    model_eval r = {0};
    int status = 1;
    char label[PATH_MAX + 32];
    if (model_open(&m, ckpt, &err)) goto fail;
    if (dump && !m.fam->dump_entries) { /* before any work, as the other argument errors */
        fprintf(stderr, "moh eval: --dump-logits: a %s has no logits to dump (expected a checkpoint with logits: "
                "llama or vit)\n", m.fam->short_name);
        status = 2;
        goto done;
    }
    const struct moh_backend *be = NULL;
    if (cli_device("eval", device, m.fam->model_type, &be)) goto done;
    train_hparams hp;
    m.fam->train_defaults(&hp);
    hp.seq_len = T;
    if (!isnan(val_fraction)) hp.val_fraction = val_fraction;
    const bool text = m.fam->max_seq_len != NULL;
    if (!split) split = text ? "all" : "t10k";
    if (!isnan(val_fraction) && (!text || strcmp(split, "val"))) {
        moh_fail(&err, MOH_E_ARG, "--val-fraction applies to text with --split val only");
        goto fail;
    }
    if (text && T <= 0) { /* the config's context, at most 1024 (a pretrained model's 8192 rarely fits) */
        const int ctx_T = m.fam->max_seq_len(m.cfg);
        hp.seq_len = T = ctx_T < 1024 ? ctx_T : 1024;
    }
    if (B <= 0) B = text ? (2048 / T > 8 ? 8 : 2048 / T > 1 ? 2048 / T : 1) : 256;
    hp.batch_size = B;
    snprintf(label, sizeof label, "the checkpoint %s", ckpt);
    const data_request req = {.path = data, .hp = &hp, .eval_batch = B, .train = false, .split = split,
                              .model_label = label};
    if (m.fam->open_data(&m, &req, NULL, &src, &err)) goto fail;
    const long items = src.eval_items(src.self, limit);
    if (B > items && items > 0) B = (int)items; /* no larger than the data: the result does not change */
    const bool sp = sparse || (!reference && m.fam->default_sparse);
    if (model_shards_init(&w, &m, B, src.seq_len, model_default_shards(B), false, sp, &err)) goto fail;
    char why[192] = "", line[256], chose[256] = "";
    const moh_precision prec = cli_precision_parse(precision);
    if (prec == MOH_PRECISION_AUTO) { /* measured on a synthetic batch of the evaluation's shape */
        precision_choice pc;
        if (model_shards_auto_precision(&w, &m, B, src.seq_len, false, NULL, NULL, NULL, NULL, &pc, &err)) goto fail;
        snprintf(chose, sizeof chose, "; --precision auto chose %s", pc.note);
    } else if (model_shards_set_precision(&w, &m, prec, why, sizeof why, &err)) goto fail;
    precision_describe(w.precision, line, sizeof line);
    if (*why) fprintf(stderr, "moh eval: --precision bf16 runs fp32: %s\n", why);
    else if (w.precision == MOH_PRECISION_BF16 || *chose) fprintf(stderr, "moh eval: compute %s%s\n", line, chose);
    if (dump && model_dump_logits(&m, &src, dump, &err)) goto fail;
    eval_progress pg;
    eval_progress_start(&pg, src.eval_unit);
    const moh_progress report = {eval_progress_report, &pg};
    rc = model_evaluate(&m, &w, &src, limit, &report, &r, &err);
    eval_progress_end(&pg, rc ? -1 : r.n);
    if (rc) goto fail;
    if (!isfinite(r.loss)) { /* finite weights can still overflow: never print nan as a result */
        moh_fail(&err, MOH_E_FORMAT, "%s: val_loss is %g on %s: the model's outputs overflow", ckpt, r.loss, src.label);
        goto fail;
    }
    const eval_context ctx = {.json = json, .checkpoint = ckpt, .data_path = data, .src = &src, .seq_len = src.seq_len,
                              .split = split};
    m.fam->eval_report(&m, &r, &ctx);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh eval: %s\n", err.msg);
done:
    model_eval_free(&r);
    if (m.fam) model_shards_free(&w, &m);
    batch_source_free(&src);
    model_free(&m);
    return status;
}
