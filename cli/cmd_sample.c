/* moh sample: generate text from a checkpoint (an image-generation checkpoint goes to
 * cmd_sample_image.c) with a KV cache (only the selected heads of each
 * token are computed). The model never runs at a position >= max_position_embeddings: when the
 * cache is full, the last half of the context is re-encoded from position 0 (--context-full slide)
 * or generation stops (--context-full stop). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "models/lm_decode.h"
#include "models/lm_sample.h"
#include "models/model.h"
#include "text/bpe.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Empties the cache and encodes tok[0..n) from position 0; logits are those after tok[n-1]; all
 * (may be NULL) [n, V] gets the logits after every token (token by token; else lm_encode's batched
 * prefill). */
static int encode(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, const int *tok, int n,
                  float *logits, float *all, moh_error *err) {
    if (!all) return lm_encode(cfg, p, kv, tok, n, logits, err);
    lm_kv_reset(kv);
    for (int i = 0; i < n; i++) {
        if (lm_decode_step(cfg, p, kv, tok[i], logits, err)) return err->code;
        if (all) memcpy(all + (size_t)i * cfg->vocab_size, logits, sizeof(float) * (size_t)cfg->vocab_size);
    }
    return MOH_OK;
}

/* --dump-logits: the prompt's ids tok[0..n), the KV-cache logits after each (all [n, V]), the full
 * forward pass's logits on the same ids (head-sparse path, as eval), and the generated ids. */
static int dump_logits(const char *path, const moh_lm_config *cfg, const lm_params_f32 *p, const int *tok, int n,
                       const float *all, const int *gen, int ngen, moh_error *err) {
    const int V = cfg->vocab_size;
    lm_acts_f32 a;
    int rc = lm_acts_init_sparse_f32(&a, cfg, 1, n, err);
    if (rc) return rc;
    lm_forward_f32(cfg, p, &a, tok, NULL, 1, n);
    float *ft = malloc(sizeof(float) * (size_t)(n + ngen + 1));
    if (!ft) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    if (!rc) {
        for (int i = 0; i < n; i++) ft[i] = (float)tok[i];
        for (int i = 0; i < ngen; i++) ft[n + i] = (float)gen[i];
        const moh_st_entry e[4] = {{"tokens", 2, {1, n}, ft}, {"logits", 3, {1, n, V}, all},
                                   {"logits_forward", 3, {1, n, V}, a.logits}, {"generated", 2, {1, ngen}, ft + n}};
        rc = moh_st_write(path, e, 4, err);
    }
    free(ft);
    lm_acts_free_f32(&a);
    return rc;
}

int cmd_sample(int argc, char **argv) {
    { /* an image-generation checkpoint (DiT) takes the image options */
        const char *dir0 = args_value(argc, argv, "--checkpoint");
        if (!dir0) dir0 = args_value(argc, argv, "--model");
        const model_family *f0 = NULL;
        moh_error e0 = {0};
        struct stat s0;
        if (dir0 && stat(dir0, &s0) == 0 && S_ISDIR(s0.st_mode) && model_family_of_dir(dir0, &f0, &e0) == MOH_OK &&
            !strcmp(f0->task, "image-generation"))
            return cmd_sample_image(argc, argv);
    }
    const char *ckpt = NULL, *model_path = NULL, *prompt = "", *full = "slide", *dump = NULL, *precision = NULL, *device = NULL;
    int max_tokens = 256, top_k = 0;
    double temp = 0.8, top_p = 0.95;
    uint64_t seed = 1;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "PATH", "a moh checkpoint / Hugging Face folder or a .gguf (text models; a DiT takes the image options: moh sample --checkpoint DIT --help)", false, ARG_ANY},
        {"--model", ARG_STR, &model_path, "PATH", "the same as --checkpoint", false, ARG_ANY},
        {"--prompt", ARG_STR, &prompt, "TEXT", "text to continue (tokenized with the model's BPE, or bytes; default empty: starts after a newline)", false, ARG_ANY},
        {"--max-tokens", ARG_INT, &max_tokens, "N", "tokens to generate (bytes for a byte model; default 256; a BPE model also stops at its end-of-text token; 0 only with --dump-logits)", false, ARG_IN(0, 1000000000)},
        {"--temperature", ARG_DOUBLE, &temp, "T", "softmax temperature (default 0.8; 0 = greedy)", false, ARG_GE(0)},
        {"--top-k", ARG_INT, &top_k, "K", "keep the K most likely tokens (default 0 = all)", false, ARG_GE(0)},
        {"--top-p", ARG_DOUBLE, &top_p, "P", "nucleus: of those, keep the smallest set with probability >= P (default 0.95)", false, ARG_IN_OC(0, 1)},
        {"--seed", ARG_U64, &seed, "S", "sampling seed (default 1)", false, ARG_ANY},
        {"--context-full", ARG_CHOICE, &full, "slide|stop", "when the context is full: slide (re-encode its last half and go on; default) or stop", false, ARG_ANY},
        CLI_DECODE_PRECISION_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
        {"--dump-logits", ARG_STR, &dump, "FILE", "debug: write the prompt's ids (tokens [1, n]), the logits after each from the KV cache (logits [1, n, V]) and from the full forward pass (logits_forward), and the generated ids (generated [1, g]) as safetensors", false, ARG_ANY},
    };
    int rc = args_parse("sample", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint PATH [--prompt TEXT] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
                        "                  [--seed S] [--context-full slide|stop] [--precision fp32|bf16|q8_0|...|q6_K]\n"
                        "                  [--dump-logits FILE]",
                        "Prints the prompt and its continuation to stdout, and speed and the share of\n"
                        "attention heads computed to stderr.\n"
                        "Sampling order (as transformers' generate()): logits / temperature, softmax;\n"
                        "keep the top-k; renormalise; keep the smallest most-likely prefix of those with\n"
                        "probability >= top-p; renormalise and draw. Temperature 0 = greedy (argmax).\n"
                        "Context: the model never runs at a position >= max_position_embeddings (N).\n"
                        "When the N positions are full, slide keeps the most recent N/2 tokens,\n"
                        "re-encodes them from position 0 and goes on (a note on stderr after the text);\n"
                        "stop ends generation there (a line on stderr; exit 0). A prompt longer than N\n"
                        "bytes: slide encodes its last N bytes (with a note), stop refuses it.\n"
                        "--precision bf16: a bf16 copy of the weights (made once) and a bf16 KV cache; every\n"
                        "product accumulates in fp32 (vdpbf16ps, or widened to fp32 on an AVX-512 CPU without\n"
                        "AVX512-BF16); norms, router, softmax and sampling fp32. A CPU without AVX-512 decodes\n"
                        "in fp32 and says so. q8_0 .. q6_K: the matrix-vector weights in ggml's blocks,\n"
                        "each product's input quantised per 32 values, integer sums (vpdpbusd where the CPU has\n"
                        "VNNI) scaled in fp32, as llama.cpp's CPU backend; a quantised .gguf decodes from its own\n"
                        "blocks unless --precision says otherwise. --dump-logits' full forward pass is fp32.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (!ckpt == !model_path) {
        fprintf(stderr, "moh sample: %s\n", ckpt ? "--checkpoint and --model are the same option: give one"
                                                 : "missing required option --checkpoint (or --model)");
        return 2;
    }
    if (!ckpt) ckpt = model_path;
    if (!cli_output_ok("sample", "--dump-logits", dump, &ckpt, 1)) return 2;
    if (max_tokens == 0 && !dump) {
        fprintf(stderr, "moh sample: --max-tokens 0: expected 1..1000000000 (0 only with --dump-logits, which then "
                        "dumps the prompt's logits alone)\n");
        return 2;
    }
    const bool slide = !strcmp(full, "slide");
    moh_error err = {0};
    const model_family *fam = NULL;
    struct stat sb;
    const bool dir = stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (dir && model_family_of_dir(ckpt, &fam, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        return 1;
    }
    model m;
    /* a folder or a .gguf; the default decodes a quantised .gguf from its blocks, with no float copy of
     * those matrices (--dump-logits' full forward pass needs it) */
    const unsigned open_flags = precision || dump ? 0 : MODEL_OPEN_QUANT_ONLY;
    if (!(dir && strcmp(fam->task, "text-generation")) && model_open_ex(&m, ckpt, open_flags, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        return 1;
    }
    if (!dir) fam = m.fam;
    if (strcmp(fam->task, "text-generation")) { /* (a folder: checked before the rest of its config) */
        fprintf(stderr, "moh sample: %s is a %s (model_type \"%s\"); sample generates text and needs a language "
                        "model checkpoint\n", ckpt, fam->summary, fam->model_type);
        if (!dir) model_free(&m);
        return 1;
    }
    if (model_check_text_vocab(&m, ckpt, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        model_free(&m);
        return 1;
    }
    const struct moh_backend *be = NULL;
    if (cli_device("sample", device, m.fam->model_type, &be)) {
        model_free(&m);
        return 1;
    }
    const moh_lm_config cfg = *(const moh_lm_config *)m.cfg;
    const lm_params_f32 p = *(const lm_params_f32 *)m.params;
    const int N = cfg.max_position_embeddings, plen = (int)strlen(prompt);
    /* hist: the tokens in the cache, in order (hist[i] at position i) */
    lm_kv_cache kv;
    float *logits = malloc(sizeof(float) * cfg.vocab_size);
    lm_cand *c = malloc(sizeof(lm_cand) * cfg.vocab_size);
    int *hist = malloc(sizeof(int) * (size_t)N);
    int status = 1;
    uint8_t *piece = NULL; /* a decoded token (BPE models) */
    float *all = NULL;     /* --dump-logits: the prompt's ids and logits [n, V], the generated ids */
    int *ptok = NULL, *gen_ids = NULL, gen_cap = 0;
    quant_table own = {0};
    if (!logits || !c || !hist || cli_decode_kv("sample", precision, &m, &kv, N, &own, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg[0] ? err.msg : "out of memory");
        free(logits);
        free(c);
        free(hist);
        model_free(&m);
        return 1;
    }
    /* the prompt's tokens: bytes, or the model's BPE ids with its post-processor's (a bos id where
     * the tokenizer adds one, as llama.cpp and HF do); an empty prompt starts from a newline, the
     * corpus' natural separator */
    const bpe_tok *bpe = m.tokenizer;
    int *ids = NULL, n = 0, np = 0;
    size_t nids = 0;
    if (bpe) {
        if (bpe_encode_special(bpe, (const uint8_t *)(plen ? prompt : "\n"), plen ? (size_t)plen : 1, &ids, &nids, &err))
            goto fail;
        np = (int)nids;
    } else np = plen ? plen : 1;
    if (!slide && np > N) {
        moh_fail(&err, MOH_E_ARG, "--prompt is %d tokens, more than the context of %d tokens (max_position_embeddings "
                 "of %s); shorten it or use --context-full slide", np, N, ckpt);
        free(ids);
        goto fail;
    }
    fputs(prompt, stdout); /* once it is accepted: a refusal prints nothing on stdout */
    const int from = np > N ? np - N : 0;
    if (from) {
        fflush(stdout);
        fprintf(stderr, "moh sample: note: --prompt is %d %s, more than the context of %d tokens: encoding its last %d\n",
                np, bpe ? "tokens" : "bytes", N, N);
    }
    for (int i = from; i < np; i++) hist[n++] = bpe ? ids[i] : plen ? (unsigned char)prompt[i] : '\n';
    free(ids);
    bpe_stream stream = {0};
    const size_t cap = bpe ? bpe_max_token_bytes(bpe) + 4 : 4;
    piece = malloc(cap);
    size_t npiece = 0;
    if (!piece) {
        moh_fail(&err, MOH_E_NOMEM, "out of memory");
        goto fail;
    }
    const int nprompt = n;
    if (dump && (!(all = malloc(sizeof(float) * (size_t)n * cfg.vocab_size)) || !(ptok = malloc(sizeof(int) * (size_t)n)))) {
        moh_fail(&err, MOH_E_NOMEM, "out of memory");
        goto fail;
    }
    if (ptok) memcpy(ptok, hist, sizeof(int) * (size_t)n);
    if (encode(&cfg, &p, &kv, hist, n, logits, all, &err)) goto fail;
    const int keep = N / 2 > 0 ? N / 2 : 1;
    int gen = 0, slides = 0, first_slide = 0;
    bool stopped = false;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (; gen < max_tokens; gen++) {
        for (int v = 0; v < cfg.vocab_size; v++)
            if (!isfinite(logits[v])) { /* finite weights can still overflow */
                moh_fail(&err, MOH_E_FORMAT, "%s: logit %d is %g at generated byte %d: the model's outputs "
                         "overflow, nothing to sample from", ckpt, v, (double)logits[v], gen);
                goto fail;
            }
        const int nk = lm_sample_keep(logits, cfg.vocab_size, temp, top_k, top_p, c);
        const int tok = lm_sample_pick(c, nk, (double)(rng_next(&seed) >> 11) / 9007199254740992.0);
        if (dump && gen == gen_cap) {
            gen_cap = gen_cap ? 2 * gen_cap : 256;
            int *g = realloc(gen_ids, sizeof(int) * (size_t)gen_cap);
            if (!g) {
                moh_fail(&err, MOH_E_NOMEM, "out of memory");
                goto fail;
            }
            gen_ids = g;
        }
        if (dump) gen_ids[gen] = tok;
        if (tok == m.eos_id) { /* the model's end of text */
            gen++;
            break;
        }
        if (!bpe) putchar(tok);
        else if (bpe_stream_push(bpe, &stream, tok, piece, cap, &npiece, &err)) goto fail;
        else fwrite(piece, 1, npiece, stdout); /* whole UTF-8 characters only */
        if (gen + 1 == max_tokens) continue; /* the last token's logits are not needed */
        if (n < N) {
            hist[n++] = tok;
            if (lm_decode_step(&cfg, &p, &kv, tok, logits, &err)) goto fail;
            continue;
        }
        if (!slide) {
            stopped = true;
            gen++;
            break;
        }
        if (!slides++) first_slide = gen + 1; /* said after the text, never inside it */
        memmove(hist, hist + (N - keep + 1), sizeof(int) * (size_t)(keep - 1));
        hist[keep - 1] = tok;
        n = keep;
        if (encode(&cfg, &p, &kv, hist, n, logits, NULL, &err)) goto fail;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (bpe) fwrite(piece, 1, bpe_stream_flush(&stream, piece), stdout);
    putchar('\n');
    fflush(stdout);
    if (stopped)
        fprintf(stderr, "moh sample: stopped after %d of %d bytes: the context of %d tokens "
                        "(max_position_embeddings) is full (--context-full slide goes on)\n", gen, max_tokens, N);
    if (slides)
        fprintf(stderr, "moh sample: note: the context of %d tokens filled at generated %s %d: the last %d token%s "
                        "re-encoded from position 0, %d time%s (--context-full stop ends there instead)\n",
                N, bpe ? "token" : "byte", first_slide, keep, keep == 1 ? " was" : "s were", slides, slides == 1 ? "" : "s");
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char re[64] = "";
    if (slides) snprintf(re, sizeof re, "; %d context re-encodes", slides);
    fprintf(stderr, "[%d %s%s in %.2f s, %.1f tok/s; attention heads computed: %.1f%% of %ld%s]\n",
            gen, bpe ? "token" : "byte", gen == 1 ? "" : "s", s, s > 0 ? gen / s : 0.0,
            kv.heads_total ? 100.0 * kv.heads_run / kv.heads_total : 0.0, kv.heads_total, re);
    if (dump && dump_logits(dump, &cfg, &p, ptok, nprompt, all, gen_ids, gen, &err)) goto fail;
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh sample: %s\n", err.msg);
done:
    free(piece);
    free(all);
    free(ptok);
    free(gen_ids);
    lm_kv_free(&kv);
    quant_table_free(&own);
    free(logits);
    free(c);
    free(hist);
    model_free(&m);
    return status;
}
