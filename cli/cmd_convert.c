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
#include "ops/quant.h"
#include "train/checkpoint.h"

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *outtype = "f32", *router = "query_norm";
    bool to_moh = false, no_ste = false;
    int shared = -1, top_k = -1;
    double router_std = 1e-3;
    uint64_t seed = 1;
    const arg_spec specs[] = {
        {"--model", ARG_STR, &in, "PATH", "a moh checkpoint / Hugging Face folder, or a .gguf file", true, ARG_ANY},
        {"--out", ARG_STR, &out, "PATH", "FILE.gguf (for llama.cpp), or a folder (config.json + model.safetensors, F32)", true, ARG_ANY},
        {"--outtype", ARG_CHOICE, &outtype, "f32|f16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_K|q5_K|q6_K", "GGUF tensor type of the weight matrices (norms stay F32; default f32). q8_0 .. q6_K: ggml's blocks, as llama-quantize writes them: the embedding and LM head get more bits (Q6_K with a K-quant, else Q8_0), rows not of a K-quant's 256 values llama-quantize's fallback (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0); moh sample / chat decode from them directly", false, ARG_ANY},
        {"--to-moh", ARG_FLAG, &to_moh, NULL, "convert a dense model into MoH (the MoH-LLaMA3 recipe) before writing", false, ARG_ANY},
        {"--router", ARG_CHOICE, &router, "query_norm|learned", "with --to-moh: the router (default query_norm, parameter-free)", false, ARG_ANY},
        {"--shared-heads", ARG_INT, &shared, "S", "with --to-moh: the first S query heads of every layer are shared (default h/2)", false, ARG_GE(0)},
        {"--top-k", ARG_INT, &top_k, "K", "with --to-moh: routed heads per token (default half of the h - S routed heads)", false, ARG_GE(1)},
        {"--router-std", ARG_DOUBLE, &router_std, "X", "with --router learned: std of the initial wg rows (default 1e-3)", false, ARG_IN(0, 1)},
        {"--no-straight-through", ARG_FLAG, &no_ste, NULL, "with --router query_norm: binary gates constant in backward", false, ARG_ANY},
        {"--seed", ARG_U64, &seed, "N", "with --router learned: initialisation seed (default 1)", false, ARG_ANY},
    };
    int rc = args_parse("convert", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--model PATH --out FILE.gguf|DIR [--outtype f32|f16|q8_0|...|q6_K] [--to-moh [--router R] [--shared-heads S] [--top-k K]]",
                        "GGUF input: LLaMA-architecture files (llama.cpp's names and metadata; F32, F16,\n"
                        "BF16 and the Q4/Q5/Q8 and K quant types, dequantised to float32). GGUF output: a\n"
                        "dense model (router \"none\") with its vocabulary: the model's byte-level BPE\n"
                        "(tokens, merges, pre-tokenizer; from a GGUF input also its special token ids and\n"
                        "chat template), or the byte vocabulary; llama.cpp cannot run head routing, so a\n"
                        "MoH checkpoint is refused. A folder output holds the weights only (no optimizer\n"
                        "state): moh eval / sample read it.\n"
                        "--to-moh (docs/continue-tuning.md): the dense model's heads become h_s shared + top-K of\n"
                        "h - h_s routed per token; every weight is kept; the query-norm router has no weights\n"
                        "(it ranks heads by ||q||), the learned one gets wg, wg_0, wg_1 initialised so that the\n"
                        "gates start at ~1. Then train it with `moh train --init DIR`.\n");
    if (rc) return rc == 1 ? 0 : rc;
    const bool moh_opts = args_value(argc, argv, "--router") || shared >= 0 || top_k >= 0 ||
                          args_value(argc, argv, "--router-std") || no_ste || args_value(argc, argv, "--seed");
    const bool learned = !strcmp(router, "learned"), gguf_out = fs_has_suffix(out, ".gguf");
    const char *bad = NULL;
    if (moh_opts && !to_moh)
        bad = "--router, --shared-heads, --top-k, --router-std, --seed and --no-straight-through need --to-moh";
    else if (learned && no_ste)
        bad = "--no-straight-through is for --router query_norm (the learned router has no straight-through estimator)";
    else if (!learned && (args_value(argc, argv, "--router-std") || args_value(argc, argv, "--seed")))
        bad = "--router-std and --seed initialise the learned router's weights: they need --router learned";
    else if (!gguf_out && args_value(argc, argv, "--outtype"))
        bad = "--outtype is the GGUF tensor type: a folder output is always F32 (give --out FILE.gguf)";
    else if (gguf_out && to_moh)
        bad = "--to-moh writes a folder: llama.cpp cannot run head routing (give --out DIR)";
    if (bad) {
        fprintf(stderr, "moh convert: %s\n", bad);
        return 2;
    }
    /* never over an existing model (the input, say): checked before any work */
    struct stat so;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (gguf_out ? stat(out, &so) == 0 : stat(path, &so) == 0) {
        fprintf(stderr, "moh convert: %s already %s: give a new --out\n", out,
                gguf_out ? "exists" : "holds a model (model.safetensors)");
        return 1;
    }
    moh_error err = {0};
    model m;
    if (model_open(&m, in, &err)) {
        fprintf(stderr, "moh convert: %s\n", err.msg);
        return 1;
    }
    char summary[512] = "";
    bool partial = false; /* --to-moh computing fewer heads than the dense model: tuning needed */
    if (to_moh) {
        const moh_attn_config *a = model_attn(&m);
        const int h = a->n_heads, hkv = a->n_kv_heads, S = shared >= 0 ? shared : h / 2;
        model_routing r = {.router = learned ? MOH_ROUTER_LEARNED : MOH_ROUTER_QUERY_NORM,
                           .shared_heads = S, .top_k = top_k >= 0 ? top_k : (h - S + 1) / 2,
                           .straight_through = !no_ste, .router_std = router_std, .seed = seed};
        bool usage = true; /* a bad option (exit 2), else a model that cannot be converted (exit 1) */
        if (r.router == MOH_ROUTER_QUERY_NORM && strcmp(m.fam->model_type, "llama"))
            rc = moh_fail(&err, MOH_E_ARG, "a %s: the query-norm router is the recipe for pretrained language "
                          "models (model_type \"llama\"); use --router learned", m.fam->summary);
        else if (S >= h)
            rc = moh_fail(&err, MOH_E_ARG, "--shared-heads %d: expected 0..%d (the model has %d query heads; at "
                          "least one must be routed)", S, h - 1, h);
        else if (r.top_k > h - S)
            rc = moh_fail(&err, MOH_E_ARG, "--top-k %d: expected 1..%d (%d query heads - %d shared)", r.top_k,
                          h - S, h, S);
        model conv;
        if (!rc) usage = false;
        if (!rc && (rc = model_convert_routing(&m, &r, &conv, &err)) == MOH_OK) {
            model_free(&m);
            m = conv;
        }
        if (rc) {
            fprintf(stderr, "moh convert: %s: %s\n", in, err.msg);
            model_free(&m);
            return usage ? 2 : 1;
        }
        const int n = snprintf(summary, sizeof summary, "MoH: %d shared + top-%d of %d routed heads per token: %d/%d = "
                               "%.1f%% of heads computed; router %s%s", S, r.top_k, h - S, S + r.top_k, h,
                               100.0 * (S + r.top_k) / h, router, r.router == MOH_ROUTER_QUERY_NORM ?
                               (r.straight_through ? " (straight-through)" : " (constant gates)") : "");
        if (hkv < h && n > 0 && (size_t)n < sizeof summary)
            snprintf(summary + n, sizeof summary - (size_t)n, "; %d of %d KV groups serve shared heads only "
                     "(always read)", S / (h / hkv), hkv);
        partial = r.top_k < h - S;
        if (r.top_k == h - S)
            fprintf(stderr, "moh convert: note: --top-k %d selects every routed head: the model computes every head, "
                            "as the dense one\n", r.top_k);
    }
    if (gguf_out) {
        if (!m.fam->to_gguf)
            rc = moh_fail(&err, MOH_E_ARG, "%s is a %s (model_type \"%s\"), which has no GGUF form", in, m.fam->summary,
                          m.fam->model_type);
        else { /* from a GGUF: its tokenizer extras (special ids, chat template) go along */
            moh_gguf *src = NULL;
            if (fs_has_suffix(in, ".gguf")) rc = moh_gguf_open(&src, in, &err);
            int wtype = !strcmp(outtype, "f16") ? MOH_GGML_F16 : MOH_GGML_F32;
            if (!rc && strcmp(outtype, "f16") && strcmp(outtype, "f32")) rc = quant_type_parse(outtype, &wtype, &err);
            if (!rc) rc = m.fam->to_gguf(&m, out, wtype, src, &err);
            moh_gguf_close(src);
        }
    } else {
        rc = checkpoint_save(out, &m, NULL, NULL, NULL, &err);
    }
    if (!rc && summary[0]) printf("%s\n", summary);
    if (!rc) printf("wrote %s (%s, %zu parameters) from %s\n", out, m.fam->model_type, m.n, in);
    if (!rc && partial) {
        printf("note: the converted model is not ready to use: computing fewer heads than it was trained with breaks it "
               "until it is continue-tuned (moh train --init %s --data ...)", out);
        if (!strcmp(m.fam->model_type, "llama")) /* the figures measured on a language model */
            printf(". Measured on SmolLM2-135M with 7 of 9 heads (docs/continue-tuning.md): KJV bits/byte 1.21 dense -> "
                   "2.00 (query_norm) / 1.79 (learned) as converted, 1.29 / 1.21 after 98K tokens of tuning");
        printf("\n");
    }
    model_free(&m);
    if (rc) {
        fprintf(stderr, "moh convert: %s\n", err.msg);
        return 1;
    }
    return 0;
}
