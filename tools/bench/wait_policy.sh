#!/usr/bin/env bash
# moh decode and training speed under OpenMP wait settings, on a quiet machine and with busy loops
# on 1 and 2 cores (docs/benchmarks.md, Wait policy). Prints one line per setting and load.
#   tools/bench/wait_policy.sh [path/to/moh]     (run from the repository root: configs/)
set -uo pipefail
MOH=${1:-build/moh}
dec() { env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" "$MOH" bench decode --model small --context 512 --tokens 64 \
  --repeats 2 --json 2>/dev/null | python3 -c "import json,sys; print(round([r for r in json.load(sys.stdin) if 'tokens_per_s' in r][0]['tokens_per_s']))" 2>/dev/null || echo ERR; }
trn() { env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" "$MOH" bench train --configs mha --path sparse --steps 2 \
  --repeats 1 --json 2>/dev/null | python3 -c "import json,sys; print(round([r for r in json.load(sys.stdin) if 'config' in r][0]['tokens_per_s']))" 2>/dev/null || echo ERR; }
settings=("OMP_WAIT_POLICY=passive" "GOMP_SPINCOUNT=3000" "GOMP_SPINCOUNT=10000" "GOMP_SPINCOUNT=30000"
          "GOMP_SPINCOUNT=100000" "OMP_WAIT_POLICY=active" "X_MOH_DEFAULT=1")
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); $(nproc) CPUs; tokens/s (decode: small, 512; train: mha, sparse)"
hogs=()
for busy in 0 1 2; do
  while [ ${#hogs[@]} -lt $busy ]; do (while :; do :; done) & hogs+=($!); done
  for s in "${settings[@]}"; do
    echo "busy cores $busy  ${s/X_MOH_DEFAULT=1/(moh default)}: decode $(dec "$s") $(dec "$s")  train $(trn "$s")"
  done
done
kill "${hogs[@]}" 2>/dev/null
