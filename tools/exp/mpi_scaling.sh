#!/usr/bin/env bash
# The MPI scaling table of docs/benchmarks.md: the same global batch (moh-75 on data/kjv, B16 x T256,
# --shards 2) in 1 process x 2 threads and in `mpirun -np 2` x 1 thread, ROUNDS times alternating;
# tokens/s over steps 6-25 (step_s of metrics.jsonl) and the share of the step inside the
# all-reductions (comm_s).   tools/exp/mpi_scaling.sh [ROUNDS]   (needs OpenMPI and data/kjv)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
C=(--config moh-75 --data data/kjv --steps 25 --batch-size 16 --seq-len 256 --shards 2 --eval-every 0 --quiet)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
summary() {
  python3 - "$1" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][5:25]
st = sum(x['step_s'] for x in r); cs = sum(x.get('comm_s', 0) for x in r)
print("%.0f tok/s, communication %.1f %%" % (16 * 256 * len(r) / st, 100 * cs / st))
PY
}
for i in $(seq "$rounds"); do
  rm -rf "$out/a" "$out/b"
  OMP_NUM_THREADS=2 build/moh train "${C[@]}" --out "$out/a"
  echo "round $i, 1 process x 2 threads:   $(summary "$out/a/metrics.jsonl")"
  mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 build/moh train "${C[@]}" --out "$out/b"
  echo "round $i, 2 processes x 1 thread:  $(summary "$out/b/metrics.jsonl")"
done
