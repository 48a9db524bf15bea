#!/usr/bin/env bash
# On the lent GPU machine, in the repository root (device tool; carry build-gpu/carry.tar.xz made
# by tools/gpu/pack.sh): the CUDA tests against the CPU engine, then `moh bench attention --device
# cuda` alternated with the PyTorch peers (tools/bench/cuda_peers.py) for ROUNDS rounds, and the
# summary table last (tools/gpu/summary.py); the Python module's test and benchmark on the GPU
# (tests/py_torch_module.py, tools/bench/torch_module.py). Logs and JSON under $OUT (at most 9 files).
#   ROUNDS=2 REPEATS=20 COMPILE=0 PHASES= tools/gpu/run.sh   (PHASES=1: per-phase layer times in bench.err)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/moh-gpu-out}
mkdir -p "$OUT"
W=/tmp/moh-gpu
rm -rf "$W" && mkdir -p "$W" && tar -C "$W" -xJf build-gpu/carry.tar.xz || { echo "no build-gpu/carry.tar.xz: run tools/gpu/pack.sh and carry it"; exit 1; }
CUB=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cu13", "cublas")]' 2>/dev/null); do
    if [ -e "$d/libcublasLt.so.13" ]; then CUB=$d; break; fi
done
export LD_LIBRARY_PATH="$W/lib${CUB:+:$CUB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv
    echo "cuBLASLt from: ${CUB:-not found}"
    python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())'
    lscpu | grep -m1 "Model name"
} 2>&1 | tee "$OUT/machine.txt"
for o in "$W"/obj/*.o; do # registers, spills, shared memory per kernel; which MMA instructions the SASS holds
    echo "== $(basename "$o")"
    cuobjdump --dump-resource-usage "$o" 2>&1 | grep -E "Function|REG|STACK|SHARED|LOCAL"
    echo "sm_90a SASS: $(cuobjdump --dump-sass --gpu-architecture sm_90a "$o" 2>/dev/null | grep -oE "\b(HGMMA|HMMA|LDSM|LDGSTS|UTMALDG)[.A-Z0-9]*" | sort | uniq -c | tr '\n' ' ')"
done >"$OUT/resource-usage.txt" 2>&1
echo "== tests"
timeout "${TEST_TIMEOUT:-240}" "$W/test_cuda_attn" 2>&1 | tee "$OUT/test.log"
test_rc=${PIPESTATUS[0]}
echo "test_cuda_attn exit $test_rc"
echo "== moh layer --device cuda against the CPU"
python3 tools/gpu/layer_cli_check.py "$W/moh" /tmp/moh-layer-check 2>&1 | tee -a "$OUT/test.log" || test_rc=1
echo "== moh.torch.MoHAttention (python/) on the GPU against its CPU run and the official module"
MOH_LIB="$W/libmoh.so" PYTHONPATH=python timeout "${PY_TIMEOUT:-300}" python3 tests/py_torch_module.py 2>&1 | tee -a "$OUT/test.log"
[ "${PIPESTATUS[0]}" = 0 ] || test_rc=1
echo "== the module swapped into ViT-B: official vs moh, bf16 (tools/bench/torch_module.py)"
MOH_LIB="$W/libmoh.so" PYTHONPATH=python timeout "${PY_TIMEOUT:-300}" python3 tools/bench/torch_module.py --device cuda \
    --n 4096 --what module,block --rounds 2 --repeats 10 2>>"$OUT/bench.err" | tee "$OUT/torch_module.txt"
MOH_LIB="$W/libmoh.so" PYTHONPATH=python timeout "${PY_TIMEOUT:-300}" python3 tools/bench/torch_module.py --device cuda \
    --n 197 --batch 256 --what vit --rounds 2 --repeats 10 2>>"$OUT/bench.err" | tee -a "$OUT/torch_module.txt"
echo "== benchmark: moh and the PyTorch peers alternated, ${ROUNDS:=2} rounds (and moh's wgmma forwards once)"
: >"$OUT/torch.jsonl"
: >"$OUT/moh.jsonl"
tolines() { python3 -c 'import json,sys; [print(json.dumps(dict(r, round=int(sys.argv[1]), engine=sys.argv[2]))) for r in json.load(open(sys.argv[3]))]' "$@"; }
for r in $(seq 1 "$ROUNDS"); do
    timeout "${BENCH_TIMEOUT:-150}" "$W/moh" bench attention --device cuda --json --repeats "${REPEATS:=20}" \
        ${PHASES:+--phases} >"$W/moh.json" 2>>"$OUT/bench.err" && tolines "$r" moh "$W/moh.json" >>"$OUT/moh.jsonl" ||
        echo "moh bench round $r failed: $(tail -2 "$OUT/bench.err")"
    if [ "$r" = 1 ]; then # the other forward kernels, once (head_dim 64 and 128 shapes)
        for k in wgmma wgmma1; do
            MOH_CUDA_FWD=$k timeout "${BENCH_TIMEOUT:-150}" "$W/moh" bench attention --device cuda --json --repeats "$REPEATS" \
                --shapes vit-b-4096,vit-b-197,llama-4096 >"$W/moh.json" 2>>"$OUT/bench.err" &&
                tolines "$r" "moh-$k" "$W/moh.json" >>"$OUT/moh.jsonl" || echo "moh bench ($k) failed: $(tail -2 "$OUT/bench.err")"
        done
    fi
    cflag=; [ "${COMPILE:-0}" = 1 ] && [ "$r" = "$ROUNDS" ] && cflag=--compile
    timeout "${PEER_TIMEOUT:-200}" python3 tools/bench/cuda_peers.py --repeats "$REPEATS" --round "$r" $cflag \
        --json "$OUT/torch.jsonl" 2>>"$OUT/bench.err" || echo "peers round $r failed (rc $?): $(tail -2 "$OUT/bench.err")"
done
python3 tools/gpu/summary.py "$OUT/moh.jsonl" "$OUT/torch.jsonl" 2>&1 | tee "$OUT/summary.txt"
echo "test_cuda_attn exit $test_rc"
exit "$test_rc"
