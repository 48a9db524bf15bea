#!/usr/bin/env bash
# Builds the libFuzzer targets (clang; the library itself is instrumented with coverage, ASan and
# UBSan, see MOH_FUZZ in CMakeLists.txt) and runs each for FUZZ_SECONDS (default 30) from its seed
# corpus in tests/fuzz/corpus/<name>. Prints one summary line per target and exits non-zero if any
# target finds a crash, leak, sanitizer report or hang (crash inputs are kept in the build dir).
# Optional: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_TIMEOUT (seconds per input, default 25).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-30}
build=${FUZZ_BUILD_DIR:-build-fuzz}
unit_timeout=${FUZZ_TIMEOUT:-25}
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOH_FUZZ=ON -DMOH_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
status=0
found=0
for f in "$build"/fuzz_*; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  found=1
  name=${f##*/fuzz_}
  work=$build/corpus-$name
  mkdir -p "$work" "$build/artifacts-$name"
  seeds=tests/fuzz/corpus/$name
  [ -d "$seeds" ] || seeds=
  log=$build/$name.log
  if "$f" -max_total_time="$secs" -timeout="$unit_timeout" -print_final_stats=1 \
      -artifact_prefix="$build/artifacts-$name/" "$work" $seeds >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    echo "fuzz $name: ${runs:-?} runs in ${secs}s, no crash"
  else
    echo "fuzz $name: FAILED (log $log, inputs in $build/artifacts-$name/)"
    tail -n 40 "$log"
    status=1
  fi
done
if [ "$found" = 0 ]; then
  echo "fuzz: no fuzz_* executables in $build" >&2
  exit 1
fi
exit $status
