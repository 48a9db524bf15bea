/* moh sample: generate text from a checkpoint with a KV cache (only the selected heads of each
 * token are computed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cli.h"
#include "cmd_vit.h"
#include "models/lm_decode.h"
#include "train/checkpoint.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct cand {
    float p;
    int id;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : x->id - y->id;
}

/* Samples from logits[V] with temperature, top-k (0 = off) and top-p; temperature 0 = argmax. */
static int sample(const float *logits, int V, double temp, int top_k, double top_p, uint64_t *rng, cand *c) {
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
    if (temp <= 0) return best;
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        c[i].id = i;
        c[i].p = (float)exp((logits[i] - logits[best]) / temp);
        sum += c[i].p;
    }
    qsort(c, V, sizeof *c, cmp_cand);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double kept = 0.0;
    for (int i = 0; i < n; i++) {
        kept += c[i].p / sum;
        if (kept >= top_p) {
            n = i + 1;
            break;
        }
    }
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += c[i].p;
    double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * tot;
    for (int i = 0; i < n; i++) {
        u -= c[i].p;
        if (u <= 0) return c[i].id;
    }
    return c[n - 1].id;
}

int cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "";
    int max_tokens = 256, top_k = 0;
    double temp = 0.8, top_p = 0.95;
    uint64_t seed = 1;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "checkpoint dir (config.json + model.safetensors)", true, ARG_ANY},
        {"--prompt", ARG_STR, &prompt, "TEXT", "text to continue (bytes; default empty)", false, ARG_ANY},
        {"--max-tokens", ARG_INT, &max_tokens, "N", "bytes to generate (default 256)", false, ARG_IN(0, 1000000000)},
        {"--temperature", ARG_DOUBLE, &temp, "T", "softmax temperature (default 0.8; 0 = greedy)", false, ARG_GE(0)},
        {"--top-k", ARG_INT, &top_k, "K", "keep the K most likely bytes (default 0 = all)", false, ARG_GE(0)},
        {"--top-p", ARG_DOUBLE, &top_p, "P", "nucleus: keep the smallest set with probability >= P (default 0.95)", false, ARG_IN_OC(0, 1)},
        {"--seed", ARG_U64, &seed, "S", "sampling seed (default 1)", false, ARG_ANY},
    };
    int rc = args_parse("sample", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]",
                        "Prints the prompt and its continuation to stdout, and speed and the share of\n"
                        "attention heads computed to stderr.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (cmd_is_vit(argc, argv, true)) {
        fprintf(stderr, "moh sample: %s/config.json: model_type is \"vit\"; sample generates text and needs a "
                        "language model checkpoint\n", ckpt);
        return 1;
    }
    moh_error err = {0};
    moh_lm_config cfg;
    lm_params_f32 p;
    if (lm_checkpoint_load(ckpt, &cfg, &p, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        return 1;
    }
    const int plen = (int)strlen(prompt);
    lm_kv_cache kv;
    float *logits = malloc(sizeof(float) * cfg.vocab_size);
    cand *c = malloc(sizeof(cand) * cfg.vocab_size);
    int status = 1;
    if (!logits || !c || lm_kv_init(&kv, &cfg, plen + max_tokens + 1, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg[0] ? err.msg : "out of memory");
        free(logits);
        free(c);
        lm_params_free_f32(&p);
        return 1;
    }
    fputs(prompt, stdout);
    /* an empty prompt starts from a newline byte, the corpus' natural separator */
    const int first = plen ? (unsigned char)prompt[0] : '\n';
    if (lm_decode_step(&cfg, &p, &kv, first, logits, &err)) goto fail;
    for (int i = 1; i < plen; i++)
        if (lm_decode_step(&cfg, &p, &kv, (unsigned char)prompt[i], logits, &err)) goto fail;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < max_tokens; i++) {
        int tok = sample(logits, cfg.vocab_size, temp, top_k, top_p, &seed, c);
        putchar(tok);
        if (i + 1 < max_tokens && lm_decode_step(&cfg, &p, &kv, tok, logits, &err)) goto fail;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    putchar('\n');
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "[%d bytes in %.2f s, %.1f tok/s; attention heads computed: %.1f%% of %ld]\n",
            max_tokens, s, s > 0 ? max_tokens / s : 0.0,
            kv.heads_total ? 100.0 * kv.heads_run / kv.heads_total : 0.0, kv.heads_total);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh sample: %s\n", err.msg);
done:
    lm_kv_free(&kv);
    free(logits);
    free(c);
    lm_params_free_f32(&p);
    return status;
}
