#!/usr/bin/env bash
# Option errors of every command (no model needed: all are caught while parsing): an out-of-range
# value names only its option, its value and the range; nan/inf and integer overflow are
# rejected; unknown options get the nearest known one suggested when close, nothing when far;
# cross-option checks name both options; --help exits 0 and shows the ranges.
set -uo pipefail
. "$(dirname "$0")/lib.sh"

# usage error: exit 2, one line on stderr, containing every `+pattern`, none of the `!pattern`s
expect() { # name, patterns (+has / !lacks) ..., --, command...
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then bad "$name: exit $rc, want 2 ($out)"; return; fi
  if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then bad "$name: not one line: $out"; return; fi
  for p in "${pats[@]}"; do
    case $p in
      +*) printf '%s' "$out" | grep -qF -- "${p#+}" || { bad "$name: '$out' lacks '${p#+}'"; return; } ;;
      !*) printf '%s' "$out" | grep -qF -- "${p#!}" && { bad "$name: '$out' has '${p#!}'"; return; } ;;
    esac
  done
  ok
}

# 0. numbers are written as users write them: no leading blank (strtol would skip it), decimal
# floats only (strtod would take hex), and --max-minutes at most 10 years
expect int-leading-blank "+option --seq-len expects an integer, got ' 4'" \
  -- "$MOH" eval --checkpoint "$T/none" --data "$T/none.txt" --seq-len " 4"
expect float-hex "+option --temperature expects a decimal number, got '0x10'" \
  -- "$MOH" sample --checkpoint "$T/none" --temperature 0x10
expect max-minutes-cap "+--max-minutes 1e308 is out of range: expected 0 < M <= 5256000" \
  -- "$MOH" train --config moh-75 --data "$T/none.txt" --out "$T/o" --max-minutes 1e308

# 0b. mistyped command and config names get the nearest one suggested, far-off ones nothing
expect cmd-typo "+unknown command 'sampel'; did you mean 'sample'?" -- "$MOH" sampel
expect cmd-far "+unknown command 'frobnicate'" "!did you mean" -- "$MOH" frobnicate
expect bench-typo "+unknown benchmark 'decod'; did you mean 'decode'?" -- "$MOH" bench decod
expect bench-far "+unknown benchmark 'xyzzy' (attention, decode or train)" "!did you mean" -- "$MOH" bench xyzzy
expect config-typo "+--config 'moh75': no such file" "+did you mean 'moh-75'?" \
  -- "$MOH" train --config moh75 --data "$T/none.txt" --out "$T/o" --steps 1
expect config-far "+--config 'zzzzzzzz': no such file" "!did you mean" \
  -- "$MOH" train --config zzzzzzzz --data "$T/none.txt" --out "$T/o" --steps 1

# 1. an out-of-range value names that option only, with its value and the expected range
expect sample-top-p "+--top-p 1.5 is out of range: expected 0 < P <= 1" "!--temperature" "!--top-k" "!--max-tokens" \
  -- "$MOH" sample --checkpoint "$T/none" --top-p 1.5
expect sample-top-k "+--top-k -3 is out of range: expected K >= 0" "!--top-p" \
  -- "$MOH" sample --checkpoint "$T/none" --top-k -3
expect train-batch "+--batch-size 0 is out of range: expected 1 <= B <= 65536" \
  -- "$MOH" train --config moh-75 --data "$T/none.txt" --out "$T/o" --steps 5 --batch-size 0
expect train-min-lr "+--min-lr-ratio 1.5 is out of range: expected 0 <= R <= 1" \
  -- "$MOH" train --config moh-75 --data "$T/none.txt" --out "$T/o" --steps 5 --min-lr-ratio 1.5
expect vit-crop "+--crop-pad 65 is out of range: expected 0 <= P <= 64" \
  -- "$MOH" train --config vit-moh-75 --data "$T/none" --out "$T/o" --crop-pad 65
expect eval-batch "+--batch-size 70000 is out of range: expected 1 <= B <= 65536" "!config.json" \
  -- "$MOH" eval --checkpoint "$T/none" --data "$T/none.txt" --batch-size 70000
expect analyze-batch "+--batch-size 0 is out of range" "!--seq-len" \
  -- "$MOH" analyze --checkpoint "$T/none" --data "$T/none.txt:x" --out "$T/an" --batch-size 0 --seq-len 5
expect bench-repeats "+--repeats 0 is out of range: expected 1 <= R <= 64" "!--context" "!--tokens" \
  -- "$MOH" bench decode --repeats 0
expect bench-synthetic-twice "+--model small is a synthetic model: give it once, or give only paths" \
  -- "$MOH" bench decode --model small --model "$T/a.gguf"
expect bench-text-synthetic "+--text applies to --model PATH (a loaded model) only" \
  -- "$MOH" bench decode --model llm --text "$T/t.txt"
expect bench-config-model "+--config and --model $T/a.gguf: give one" \
  -- "$MOH" bench decode --model "$T/a.gguf" --config moh-75
expect layer-path "+--path 'refrence' is not one of sparse|reference; did you mean 'reference'?" \
  -- "$MOH" layer --config a --weights b --input c --output d --path refrence

# 2. non-finite doubles and integer overflow
expect sample-nan "+--top-p nan is not a finite number" -- "$MOH" sample --checkpoint "$T/none" --top-p nan
expect sample-temp-inf "+--temperature inf is not a finite number" -- "$MOH" sample --checkpoint "$T/none" --temperature inf
expect train-lr-neg-inf "+--lr -inf is not a finite number" -- "$MOH" train --config moh-75 --data x --out "$T/o" --lr -inf
expect train-wd-huge "+--weight-decay 1e999 is not a finite number" -- "$MOH" train --config moh-75 --data x --out "$T/o" --weight-decay 1e999
expect steps-overflow "+--steps 99999999999999999999 is out of range: expected 1 <= N <= 9223372036854775807" \
  -- "$MOH" train --config moh-75 --data x --out "$T/o" --steps 99999999999999999999
expect int-overflow "+--max-tokens 3000000000 is out of range: expected 0 <= N <= 1000000000" \
  -- "$MOH" sample --checkpoint "$T/none" --max-tokens 3000000000
expect seed-negative "+--seed -1 is out of range" -- "$MOH" sample --checkpoint "$T/none" --seed -1

# 3. a typo gets the nearest option; a far-off name gets none
expect typo-lr "+unknown option '--lerning-rate'; did you mean '--lr'?" -- "$MOH" train --lerning-rate 1e-3
expect typo-prefix "+unknown option '--max-token'; did you mean '--max-tokens'?" -- "$MOH" sample --max-token 5
expect typo-swap "+unknown option '--temprature'; did you mean '--temperature'?" -- "$MOH" sample --temprature 0
expect typo-transpose "+did you mean '--batch-size'?" -- "$MOH" eval --bacth-size 3
expect typo-analyze "+did you mean '--layers'?" -- "$MOH" analyze --layer last
expect typo-vit "+did you mean '--no-flip'?" -- "$MOH" train --config vit-moh-75 --no-flips
expect typo-bench "+did you mean '--repeats'?" -- "$MOH" bench attention --repeat 2
expect typo-equals "+did you mean '--lr 1e-3'?" -- "$MOH" train --lr=1e-3
expect typo-temp-prefix "+did you mean '--temperature'?" -- "$MOH" sample --temp 0
expect far-off "+unknown option '--bogus' (see moh train --help)" "!did you mean" -- "$MOH" train --bogus 1
expect far-off-sample "+unknown option '--xyzzy'" "!did you mean" -- "$MOH" sample --xyzzy 1

# 4. cross-option checks name both options; a forgotten value names the option that took its place
expect warmup-steps "+--warmup 50 must be less than --steps 10" \
  -- "$MOH" train --config moh-75 --data "$T/none.txt" --out "$T/o" --steps 10 --warmup 50
expect no-value "+option --out needs a value (DIR) before --steps" -- "$MOH" train --config moh-75 --data x --out --steps 4
[ ! -e "$T/o" ] && ok || bad "a rejected train created its --out folder"

# 5. --help still exits 0, and shows the ranges
for cmd in "train" "train --config vit-moh-75" "eval" "sample" "analyze" "layer" "bench attention" "bench decode" "bench train"; do
  # shellcheck disable=SC2086
  "$MOH" $cmd --help >"$T/help" 2>&1 && ok || bad "moh $cmd --help exited $?"
done
# (the help is read from a file: `moh ... | grep -q` fails under pipefail when grep exits first and
# moh's next write gets SIGPIPE)
"$MOH" sample --help >"$T/help" 2>&1; grep -qF -- "[0 < P <= 1]" "$T/help" && ok || bad "sample --help lacks the --top-p range"
"$MOH" train --help >"$T/help" 2>&1; grep -qF -- "[0 < LR <= 1000]" "$T/help" && ok || bad "train --help lacks the --lr range"

# 6. OpenMP waits: moh's short spin unless the user chose a policy or a spin count (kept as given)
wait_line() { env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" "$MOH" bench decode --model small --context 8 --tokens 1 \
  --repeats 1 2>/dev/null | grep -o 'OMP_WAIT_POLICY=[^;]*'; }
[ "$(wait_line)" = "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=10000" ] && ok || bad "default waits: '$(wait_line)'"
[ "$(wait_line OMP_WAIT_POLICY=passive)" = "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=(unset)" ] && ok \
  || bad "OMP_WAIT_POLICY=passive not kept: '$(wait_line OMP_WAIT_POLICY=passive)'"
[ "$(wait_line GOMP_SPINCOUNT=5)" = "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=5" ] && ok \
  || bad "GOMP_SPINCOUNT=5 not kept: '$(wait_line GOMP_SPINCOUNT=5)'"

finish
