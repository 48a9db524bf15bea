#!/usr/bin/env bash
# make install's layout, from the build tree of the moh binary given as $1: installs into a temp
# PREFIX, then (1) the installed moh finds its named configs from another folder (--list-configs,
# train --config NAME --help), (2) a C program builds against the installed moh.h + libmoh.a with
# the flags of the installed moh.pc, round-trips a safetensors file through the public API, and,
# on a checkpoint the installed moh trains here, loads it (moh_model_load), runs a forward, one
# training step, saves and reloads it bit for bit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
build=$(dirname "$MOH")

cmake --install "$build" --prefix "$T/prefix" >/dev/null
for f in bin/moh include/moh.h; do [ -f "$T/prefix/$f" ] || fail "missing $f"; done
lib=$(find "$T/prefix" -name libmoh.a | head -1); [ -n "$lib" ] || fail "missing libmoh.a"
pc=$(find "$T/prefix" -name moh.pc | head -1); [ -n "$pc" ] || fail "missing moh.pc"

cd "$T"   # no ./configs here: the installed binary must find share/moh/configs
out=$("$T/prefix/bin/moh" --list-configs) || fail "--list-configs exited $?"
grep -q '^  moh-75 .*LM 4.89M, hidden 256.*2 shared + top-4 of 6 = 6/8 heads (75.0%)' <<<"$out" || fail "--list-configs: $out"
grep -q '^  vit-mha .*dense: 8/8 heads' <<<"$out" || fail "--list-configs lacks vit-mha: $out"
n=$(grep -c '^  ' <<<"$out"); want=$(ls "$OLDPWD/configs/"*.json 2>/dev/null | wc -l)
[ "$want" -eq 0 ] || [ "$n" -eq "$want" ] || fail "--list-configs lists $n configs, configs/ has $want"
if "$MOH" --list-configs-typo >/dev/null 2>&1; then fail "unknown top-level flag accepted"; fi

# a tiny LM checkpoint trained by the installed binary
awk 'BEGIN { for (i = 1; i <= 300; i++) printf "line %d: the %s sat by the %s.\n", i, (i % 3 ? "cat" : "dog"), (i % 5 ? "door" : "fire") }' >"$T/corpus.txt"
cat >"$T/tiny.json" <<J
{"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 32,
 "vocab_size": 256, "max_position_embeddings": 16, "router": "learned", "shared_heads": 1, "top_k": 2}
J
"$T/prefix/bin/moh" train --config "$T/tiny.json" --data "$T/corpus.txt" --out "$T/ckpt" --batch-size 2 \
    --seq-len 16 --steps 3 --eval-tokens 256 --quiet >/dev/null || fail "installed moh train exited $?"

cat >"$T/embed.c" <<'C'
#include <math.h>
#include <moh.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* load argv[2], forward, one training step, save to argv[3], reload: same weights and logits */
static int model_round_trip(const char *ckpt, const char *out) {
    moh_error err = {0};
    moh_model *m = NULL, *r = NULL;
    const char *text = "the cat sat by the door.";
    int tok[15], tgt[15];
    for (int i = 0; i < 15; i++) {
        tok[i] = (unsigned char)text[i];
        tgt[i] = (unsigned char)text[i + 1];
    }
    moh_input in = {.B = 1, .T = 15, .tokens = tok, .targets = tgt};
    moh_losses before, step, after;
    moh_optim opt;
    float *la = NULL, *lb = NULL;
    int rc = moh_model_load(&m, ckpt, &err);
    if (!rc) rc = moh_model_forward(m, &in, NULL, &before, &err);
    if (!rc) {
        moh_optim_defaults(m, &opt);
        rc = moh_model_train_step(m, &in, &opt, &step, &err);
    }
    if (!rc) rc = moh_model_save(m, out, &err);
    if (!rc) rc = moh_model_load(&r, out, &err);
    if (rc) {
        fprintf(stderr, "embed: %s\n", err.msg);
        goto done;
    }
    const size_t n = moh_model_num_params(m), nl = moh_model_logits_count(m, &in);
    la = malloc(nl * sizeof(float));
    lb = malloc(nl * sizeof(float));
    rc = !la || !lb || moh_model_forward(m, &in, la, &after, &err) || moh_model_forward(r, &in, lb, NULL, &err);
    if (!rc && (strcmp(moh_model_type(m), "llama") || moh_model_num_params(r) != n ||
                memcmp(moh_model_params(m), moh_model_params(r), n * sizeof(float)) || memcmp(la, lb, nl * sizeof(float)) ||
                !isfinite(before.loss) || step.loss != before.loss || !(after.loss < before.loss) || moh_model_steps(m) != 1)) {
        fprintf(stderr, "embed: model round trip: loss %g -> %g, %zu params\n", before.loss, after.loss, n);
        rc = 1;
    }
    if (!rc) printf("model %s: %zu params, loss %.4f -> %.4f after one step, saved and reloaded\n", moh_model_type(m), n,
                    before.loss, after.loss);
done:
    free(la);
    free(lb);
    moh_model_free(m);
    moh_model_free(r);
    return rc != 0;
}
int main(int argc, char **argv) {
    float w[6] = {0.25f, -1.5f, 3.0f, 0.125f, -7.0f, 2.5f}, back[6];
    int64_t shape[2] = {2, 3};
    moh_st_entry e = {"w", 2, {2, 3}, w};
    moh_error err = {0};
    moh_safetensors st;
    if (moh_st_write(argv[1], &e, 1, &err) || moh_st_open(&st, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rc = moh_st_read_f32(&st, "w", 2, shape, back, &err);
    moh_st_close(&st);
    if (rc || memcmp(w, back, sizeof w)) return 1;
    printf("moh %s round trip ok\n", MOH_VERSION);
    return argc == 4 ? model_round_trip(argv[2], argv[3]) : 1;
}
C
PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --exists moh || fail "pkg-config cannot read moh.pc"
san=  # a sanitizer build's library needs the sanitizer runtimes at link time
grep -q '^MOH_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
cc -std=c11 -Wall -Wextra -Werror $san "$T/embed.c" -o "$T/embed" \
   $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --static --cflags --libs moh) || fail "embedding program does not build"
out=$("$T/embed" "$T/w.safetensors" "$T/ckpt" "$T/saved") || fail "embedding program failed: $out"
grep -q 'round trip ok' <<<"$out" || fail "embedding program: $out"
grep -q '^model llama: .* saved and reloaded' <<<"$out" || fail "embedding program (model API): $out"
[ -f "$T/saved/model.safetensors" ] && [ -f "$T/saved/config.json" ] && [ ! -e "$T/saved/optimizer.safetensors" ] \
    || fail "moh_model_save wrote: $(ls "$T/saved")"
"$T/prefix/bin/moh" eval --checkpoint "$T/saved" --data "$T/corpus.txt" --seq-len 16 >/dev/null || fail "moh eval of the saved model"
! grep -rq 'include "' "$T/prefix/include" || fail "installed headers include private headers"
[ "$(ls "$T/prefix/include" | tr '\n' ' ')" = "moh.h moh_cuda.h " ] ||
    fail "installed include/ holds other than moh.h and moh_cuda.h: $(ls "$T/prefix/include")"
echo "cli_install: installed layout, configs and the embedding API (safetensors, model load/forward/train/save) work"
