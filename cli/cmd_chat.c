/* moh chat: a conversation with a ChatML instruct model (SmolLM2, Qwen: <|im_start|>role\n ...
 * <|im_end|>\n turns), streaming the reply, the KV cache kept across turns (each turn encodes only
 * its new tokens), /reset, and a clear message instead of running past the context. The template
 * is written here for ChatML; the model's chat template (a GGUF's tokenizer.chat_template, a
 * folder's tokenizer_config.json) is rendered (text/chat_template.h) to check that it is ChatML
 * and to take its default system prompt; a template that is not, or that moh cannot render, is
 * refused. Sampling as moh sample (transformers' order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "core/rng.h"
#include "models/lm.h"
#include "models/lm_decode.h"
#include "models/lm_sample.h"
#include "models/model.h"
#include "text/bpe.h"
#include "text/chat_template.h"
#include "train/train_util.h"

#define TURN_USER(u) "<|im_start|>user\n" u "<|im_end|>\n"
#define ASSISTANT "<|im_start|>assistant\n"

/* Renders tmpl for msgs[n] with the generation prompt into *out; a message naming the template. A
 * template that ends a conversation with its last ChatML turn and no generation prompt gets
 * "<|im_start|>assistant\n" added, as this command writes it. */
static int render(const char *tmpl, const chat_msg *msgs, int n, const char *eos, const char *label, char **out,
                  moh_error *err) {
    size_t len = 0;
    int rc = chat_template_render(tmpl, msgs, n, true, NULL, eos, label, out, &len, err);
    static const char end[] = "<|im_end|>\n";
    if (!rc && len >= sizeof end - 1 && !strcmp(*out + len - (sizeof end - 1), end)) {
        char *o = realloc(*out, len + sizeof ASSISTANT);
        if (!o) return moh_fail(err, MOH_E_NOMEM, "out of memory");
        memcpy(o + len, ASSISTANT, sizeof ASSISTANT);
        *out = o;
    }
    return rc;
}

/* The system block that opens a conversation (*block, malloc'd: "<|im_start|>system\nS<|im_end|>\n",
 * or "" for none): with --system (system not NULL) its text, else the chat template's own default.
 * The template (may be NULL: ChatML assumed, no default system prompt) is rendered, never guessed
 * at, and must render conversations as this command writes them: ChatML turns after the system
 * block, for a first turn and a second exchange. MOH_E_FORMAT naming the template otherwise. */
static int system_block(const char *tmpl, const char *system, const char *eos, const char *label, char **block,
                        moh_error *err) {
    static const char open[] = "<|im_start|>system\n", close[] = "<|im_end|>\n";
    *block = NULL;
    if (!tmpl) {
        const size_t n = system ? strlen(system) : 0;
        if (!(*block = malloc(n + sizeof open + sizeof close)))
            return moh_fail(err, MOH_E_NOMEM, "out of memory");
        if (system) snprintf(*block, n + sizeof open + sizeof close, "%s%s%s", open, system, close);
        else (*block)[0] = '\0';
        return MOH_OK;
    }
    static const char first[] = TURN_USER("moh-user-1") ASSISTANT;
    static const char second[] = TURN_USER("moh-user-1") "<|im_start|>assistant\nmoh-assistant-1<|im_end|>\n"
        TURN_USER("moh-user-2") ASSISTANT;
    chat_msg msgs[4];
    int n = 0;
    if (system) msgs[n++] = (chat_msg){"system", system};
    msgs[n++] = (chat_msg){"user", "moh-user-1"};
    char *r = NULL, *r2 = NULL;
    int rc = render(tmpl, msgs, n, eos, label, &r, err);
    const size_t len = r ? strlen(r) : 0, fl = sizeof first - 1;
    /* r = BLOCK + first, BLOCK = "" or open TEXT close (--system: exactly its text) */
    const size_t bl = len >= fl ? len - fl : 0;
    bool ok = !rc && len >= fl && !strcmp(r + bl, first);
    if (ok && bl > 0) {
        ok = bl >= sizeof open + sizeof close - 2 && !strncmp(r, open, sizeof open - 1) &&
             !strncmp(r + bl - (sizeof close - 1), close, sizeof close - 1);
        const char *text = r + sizeof open - 1;
        const size_t tl = ok ? bl - (sizeof open - 1) - (sizeof close - 1) : 0;
        if (ok && system) ok = tl == strlen(system) && !memcmp(text, system, tl);
        for (size_t i = 0; ok && !system && i + 5 <= tl; i++) ok = memcmp(text + i, "<|im_", 5) != 0; /* one block */
    } else if (ok && system) ok = false; /* --system dropped */
    char shown[160];
    if (!rc && !ok)
        rc = moh_fail(err, MOH_E_FORMAT, "%s: renders %s as \"%s\", not as ChatML (an optional <|im_start|>system "
                      "block, then <|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n): moh chat speaks ChatML "
                      "only", label, system ? "a system message and a user turn" : "a user turn",
                      moh_st_quote(shown, sizeof shown, r ? r : ""));
    if (!rc) { /* a second exchange continues the first as ChatML */
        msgs[n++] = (chat_msg){"assistant", "moh-assistant-1"};
        msgs[n++] = (chat_msg){"user", "moh-user-2"};
        rc = render(tmpl, msgs, n, eos, label, &r2, err);
        if (!rc && (strncmp(r2, r, bl) || strcmp(r2 + bl, second)))
            rc = moh_fail(err, MOH_E_FORMAT, "%s: renders a second exchange as \"%s\", not as ChatML turns after the "
                          "first: moh chat speaks ChatML only", label, moh_st_quote(shown, sizeof shown, r2));
    }
    if (!rc) {
        if ((*block = malloc(bl + 1))) {
            memcpy(*block, r, bl);
            (*block)[bl] = '\0';
        } else rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    }
    free(r);
    free(r2);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    const char *path = NULL, *system = NULL, *precision = NULL, *device = NULL;
    int max_tokens = 512, top_k = 0;
    double temp = 0.7, top_p = 1.0;
    uint64_t seed = 1;
    const arg_spec specs[] = {
        {"--model", ARG_STR, &path, "PATH", "a ChatML instruct model with its tokenizer: a .gguf (SmolLM2-Instruct, Qwen) or a folder with tokenizer.json", true, ARG_ANY},
        {"--system", ARG_STR, &system, "TEXT", "system prompt (default: the chat template's, if it has one)", false, ARG_ANY},
        {"--max-tokens", ARG_INT, &max_tokens, "N", "most tokens per reply (default 512)", false, ARG_IN(1, 1 << 20)},
        {"--temperature", ARG_DOUBLE, &temp, "T", "sampling temperature (default 0.7; 0 = greedy)", false, ARG_IN(0, 100)},
        {"--top-k", ARG_INT, &top_k, "K", "keep the K most likely tokens (default 0 = all)", false, ARG_GE(0)},
        {"--top-p", ARG_DOUBLE, &top_p, "P", "nucleus: the smallest set of probability >= P (default 1)", false, ARG_IN_OC(0, 1)},
        {"--seed", ARG_U64, &seed, "S", "sampling seed (default 1)", false, ARG_ANY},
        CLI_DECODE_PRECISION_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
    };
    int rc = args_parse("chat", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]), "--model FILE.gguf|DIR [options]",
                        "Reads one user message per line on stdin and streams each reply to stdout. /reset starts\n"
                        "a new conversation, /exit (or end of input) ends. The conversation stays in the KV cache;\n"
                        "a turn that would pass the context (max_position_embeddings) is refused with a message\n"
                        "(/reset to go on). A reply ends at <|im_end|> or after --max-tokens.\n"
                        "Scripted (stdout not a terminal): one line per message, empty for a refused one, and\n"
                        "exit status 1 at the end when any was refused. Each reply's rate goes to stderr.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    model m;
    /* the default decodes a quantised .gguf from its blocks: no float copy of those matrices */
    if (model_open_ex(&m, path, precision ? 0 : MODEL_OPEN_QUANT_ONLY, &err)) {
        fprintf(stderr, "moh chat: %s\n", err.msg);
        return 1;
    }
    if (model_check_text_vocab(&m, path, &err)) {
        fprintf(stderr, "moh chat: %s\n", err.msg);
        model_free(&m);
        return 1;
    }
    const struct moh_backend *be = NULL;
    if (cli_device("chat", device, m.fam->model_type, &be)) {
        model_free(&m);
        return 1;
    }
    const bpe_tok *tok = m.tokenizer;
    const int im_start = tok ? bpe_token_id(tok, "<|im_start|>") : -1, im_end = tok ? bpe_token_id(tok, "<|im_end|>") : -1;
    if (strcmp(m.fam->task, "text-generation") || im_start < 0 || im_end < 0) {
        fprintf(stderr, "moh chat: %s is not a ChatML chat model (expected a .gguf or folder whose tokenizer has "
                        "<|im_start|> and <|im_end|>, e.g. SmolLM2-Instruct)\n", path);
        model_free(&m);
        return 1;
    }
    const moh_lm_config cfg = *(const moh_lm_config *)m.cfg;
    const lm_params_f32 p = *(const lm_params_f32 *)m.params;
    const int N = cfg.max_position_embeddings, V = cfg.vocab_size;
    char *sys = NULL; /* the system block that opens each conversation */
    char label[4200];
    snprintf(label, sizeof label, "%s (its chat template)", path);
    const char *eos = m.eos_id >= 0 ? bpe_token_str(tok, m.eos_id) : NULL;
    if (system_block(m.chat_template, system, eos, label, &sys, &err)) {
        fprintf(stderr, "moh chat: %s\n", err.msg);
        model_free(&m);
        return 1;
    }
    float *logits = malloc(sizeof(float) * (size_t)V);
    lm_cand *cand = malloc(sizeof(lm_cand) * (size_t)V);
    const size_t cap = bpe_max_token_bytes(tok) + 4;
    uint8_t *piece = malloc(cap);
    char *line = NULL, *turn = NULL; /* a whole stdin line (getline), its ChatML turn */
    size_t line_cap = 0;
    lm_kv_cache kv;
    quant_table own = {0};
    int status = 1;
    bool have_kv = false;
    if (!sys || !logits || !cand || !piece) {
        moh_fail(&err, MOH_E_NOMEM, "out of memory");
        goto fail;
    }
    if (cli_decode_kv("chat", precision, &m, &kv, N, &own, &err)) goto fail;
    have_kv = true;
    const bool tty = isatty(0) && isatty(2), echo = !isatty(0) && isatty(1);
    int refused = 0; /* messages refused for the context */
    if (tty) fprintf(stderr, "moh chat: %s, context %d tokens; /reset, /exit\n", path, N);
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (echo) { /* piped turns, read on a terminal: the transcript shows each, commands included */
            printf("> %s\n", line);
            fflush(stdout);
        }
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            lm_kv_reset(&kv);
            fprintf(stderr, "moh chat: new conversation\n");
            continue;
        }
        /* the turn's text in ChatML: the system block first in a conversation */
        const size_t tcap = strlen(sys) + len + 96;
        free(turn);
        if (!(turn = malloc(tcap))) {
            moh_fail(&err, MOH_E_NOMEM, "out of memory for a turn of %zu bytes", len);
            goto fail;
        }
        int n = 0;
        if (kv.pos == 0) n = snprintf(turn, tcap, "%s", sys);
        snprintf(turn + n, tcap - (size_t)n, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", line);
        int *ids = NULL;
        size_t nids = 0;
        /* a conversation starts with the tokenizer's bos id where it adds one (llama.cpp's first turn) */
        if (kv.pos == 0 ? bpe_encode_special(tok, (const uint8_t *)turn, strlen(turn), &ids, &nids, &err)
                        : bpe_encode(tok, (const uint8_t *)turn, strlen(turn), true, &ids, &nids, &err))
            goto fail;
        if ((size_t)kv.pos + nids + 2 > (size_t)N) { /* never past the trained context */
            fprintf(stderr, "moh chat: this message (%zu tokens with its chat template) would pass the context of %d "
                            "tokens (%d used): /reset to start a new conversation\n", nids, N, kv.pos);
            free(ids);
            refused++;
            if (!isatty(1)) { /* scripted: the replies stay one line per message */
                putchar('\n');
                fflush(stdout);
            }
            continue;
        }
        const double t0 = train_now_s();
        /* the turn in one batched pass (the first: a prefill; later ones extend the cache) */
        rc = lm_feed(&cfg, &p, &kv, ids, (int)nids, logits, &err);
        free(ids);
        if (rc) goto fail;
        const double t1 = train_now_s();
        bpe_stream stream = {0};
        size_t np = 0;
        int gen = 0;
        bool ended = false;
        while (gen < max_tokens && kv.pos < N) {
            for (int v = 0; v < V; v++)
                if (!isfinite(logits[v])) {
                    moh_fail(&err, MOH_E_FORMAT, "%s: logit %d is %g: the model's outputs overflow", path, v, (double)logits[v]);
                    goto fail;
                }
            const int nk = lm_sample_keep(logits, V, temp, top_k, top_p, cand);
            const int t = lm_sample_pick(cand, nk, moh_rng_uniform01(&seed));
            gen++;
            if (lm_decode_step(&cfg, &p, &kv, t, logits, &err)) goto fail; /* the reply stays in the cache */
            if (t == im_end) {
                ended = true;
                break;
            }
            if (bpe_stream_push(tok, &stream, t, piece, cap, &np, &err)) goto fail;
            fwrite(piece, 1, np, stdout);
            fflush(stdout);
        }
        fwrite(piece, 1, bpe_stream_flush(&stream, piece), stdout);
        putchar('\n');
        fflush(stdout);
        const double ps = t1 - t0, gs = train_now_s() - t1; /* prompt, reply seconds */
        bool full = false;
        if (!ended) { /* close the turn so the next one starts clean */
            if (kv.pos + 2 > N) full = true;
            else if (lm_decode_step(&cfg, &p, &kv, im_end, logits, &err)) goto fail;
        }
        if (!full) {
            int *nl = NULL;
            size_t nn = 0;
            if (bpe_encode(tok, (const uint8_t *)"\n", 1, false, &nl, &nn, &err)) goto fail;
            if (nn && (size_t)kv.pos + nn <= (size_t)N) rc = lm_feed(&cfg, &p, &kv, nl, (int)nn, logits, &err);
            free(nl);
            if (rc) goto fail;
        }
        /* the rate, and the context used with the turn closed (what the next turn starts from) */
        fprintf(stderr, "[%d token%s in %.2f s, %.1f tok/s; prompt %zu tokens in %.2f s, %.0f tok/s; context %d of %d]\n",
                gen, gen == 1 ? "" : "s", gs, gs > 0 ? gen / gs : 0.0, nids, ps, ps > 0 ? nids / ps : 0.0, kv.pos, N);
        if (full) fprintf(stderr, "moh chat: the context of %d tokens is full: /reset to start a new conversation\n", N);
        if (echo) { /* a blank line between exchanges */
            putchar('\n');
            fflush(stdout);
        }
    }
    status = refused ? 1 : 0;
    if (refused) fprintf(stderr, "moh chat: %d message%s refused (past the context)\n", refused, refused == 1 ? "" : "s");
    goto done;
fail:
    fprintf(stderr, "moh chat: %s\n", err.msg);
done:
    if (have_kv) lm_kv_free(&kv);
    quant_table_free(&own);
    free(sys);
    free(logits);
    free(cand);
    free(piece);
    free(line);
    free(turn);
    model_free(&m);
    return status;
}
