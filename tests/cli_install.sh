#!/usr/bin/env bash
# make install's layout, from the build tree of the moh binary given as $1: installs into a temp
# PREFIX, then (1) the installed moh finds its named configs from another folder (--list-configs,
# train --config NAME --help), (2) a C program builds against the installed moh.h + libmoh.a with
# the flags of the installed moh.pc and round-trips a safetensors file through the public API.
set -euo pipefail
moh=$(readlink -f "$1")
build=$(dirname "$moh")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/moh include/moh.h; do [ -f "$tmp/prefix/$f" ] || fail "missing $f"; done
lib=$(find "$tmp/prefix" -name libmoh.a | head -1); [ -n "$lib" ] || fail "missing libmoh.a"
pc=$(find "$tmp/prefix" -name moh.pc | head -1); [ -n "$pc" ] || fail "missing moh.pc"

cd "$tmp"   # no ./configs here: the installed binary must find share/moh/configs
out=$("$tmp/prefix/bin/moh" --list-configs) || fail "--list-configs exited $?"
grep -q '^  moh-75 .*LM 4.89M, hidden 256.*2 shared + top-4 of 6 = 6/8 heads (75.0%)' <<<"$out" || fail "--list-configs: $out"
grep -q '^  vit-mha .*dense: 8/8 heads' <<<"$out" || fail "--list-configs lacks vit-mha: $out"
n=$(grep -c '^  ' <<<"$out"); want=$(ls "$OLDPWD/configs/"*.json 2>/dev/null | wc -l)
[ "$want" -eq 0 ] || [ "$n" -eq "$want" ] || fail "--list-configs lists $n configs, configs/ has $want"
if "$moh" --list-configs-typo >/dev/null 2>&1; then fail "unknown top-level flag accepted"; fi

cat >"$tmp/embed.c" <<'C'
#include <moh.h>
#include <stdio.h>
#include <string.h>
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
    return argc == 2 ? 0 : 1;
}
C
PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --exists moh || fail "pkg-config cannot read moh.pc"
san=  # a sanitizer build's library needs the sanitizer runtimes at link time
grep -q '^MOH_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
cc -std=c11 -Wall -Werror $san "$tmp/embed.c" -o "$tmp/embed" \
   $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --static --cflags --libs moh) || fail "embedding program does not build"
"$tmp/embed" "$tmp/w.safetensors" | grep -q 'round trip ok' || fail "embedding program failed"
echo "cli_install: installed layout, configs and the embedding API work"
