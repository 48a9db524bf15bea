/* moh convert: a model between moh checkpoints (= Hugging Face folders: config.json +
 * model.safetensors) and GGUF files (llama.cpp's format), in either direction. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "models/model.h"
#include "io/gguf.h"
#include "train/checkpoint.h"

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *outtype = "f32";
    const arg_spec specs[] = {
        {"--model", ARG_STR, &in, "PATH", "a moh checkpoint / Hugging Face folder, or a .gguf file", true, ARG_ANY},
        {"--out", ARG_STR, &out, "PATH", "FILE.gguf (for llama.cpp), or a folder (config.json + model.safetensors, F32)", true, ARG_ANY},
        {"--outtype", ARG_CHOICE, &outtype, "f32|f16", "GGUF tensor type of the weight matrices (norms stay F32; default f32)", false, ARG_ANY},
    };
    int rc = args_parse("convert", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--model PATH --out FILE.gguf|DIR [--outtype f32|f16]",
                        "GGUF input: LLaMA-architecture files (llama.cpp's names and metadata; F32, F16,\n"
                        "BF16 and the Q4/Q5/Q8 and K quant types, dequantised to float32). GGUF output: a\n"
                        "dense model (router \"none\") with its vocabulary: the model's byte-level BPE\n"
                        "(tokens, merges, pre-tokenizer; from a GGUF input also its special token ids and\n"
                        "chat template), or the byte vocabulary; llama.cpp cannot run head routing, so a\n"
                        "MoH checkpoint is refused. A folder output holds the weights only (no optimizer\n"
                        "state): moh eval / sample read it.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    model m;
    if (model_open(&m, in, &err)) {
        fprintf(stderr, "moh convert: %s\n", err.msg);
        return 1;
    }
    struct stat so;
    if (ends_with(out, ".gguf")) {
        if (stat(out, &so) == 0) /* never over an existing file (the input, say) */
            rc = moh_fail(&err, MOH_E_ARG, "%s already exists: give a new --out", out);
        else if (!m.fam->to_gguf)
            rc = moh_fail(&err, MOH_E_ARG, "%s is a %s (model_type \"%s\"), which has no GGUF form", in, m.fam->summary,
                          m.fam->model_type);
        else { /* from a GGUF: its tokenizer extras (special ids, chat template) go along */
            moh_gguf *src = NULL;
            if (ends_with(in, ".gguf")) rc = moh_gguf_open(&src, in, &err);
            if (!rc) rc = m.fam->to_gguf(&m, out, !strcmp(outtype, "f16"), src, &err);
            moh_gguf_close(src);
        }
    } else {
        struct stat sb;
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (stat(path, &sb) == 0)
            rc = moh_fail(&err, MOH_E_ARG, "%s already holds a model (model.safetensors): give a new --out", out);
        else rc = checkpoint_save(out, &m, NULL, NULL, NULL, &err);
    }
    if (!rc) printf("wrote %s (%s, %zu parameters) from %s\n", out, m.fam->model_type, m.n, in);
    model_free(&m);
    if (rc) {
        fprintf(stderr, "moh convert: %s\n", err.msg);
        return 1;
    }
    return 0;
}
