#!/usr/bin/env bash
# Builds the libFuzzer targets (clang) and runs each for FUZZ_SECONDS (default 30) from its seed
# corpus in tests/fuzz/corpus/<name>. Exits non-zero if any target finds a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-30}
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOH_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" >/dev/null
status=0
for f in build-fuzz/fuzz_*; do
  name=${f##*/fuzz_}
  work=build-fuzz/corpus-$name
  mkdir -p "$work"
  seeds=tests/fuzz/corpus/$name
  [ -d "$seeds" ] || seeds=
  if "$f" -max_total_time="$secs" -print_final_stats=1 "$work" $seeds >build-fuzz/$name.log 2>&1; then
    echo "fuzz $name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' build-fuzz/$name.log | grep -o '[0-9]*$') runs in ${secs}s, no crash"
  else
    echo "fuzz $name: FAILED"; tail -n 40 build-fuzz/$name.log; status=1
  fi
done
exit $status
