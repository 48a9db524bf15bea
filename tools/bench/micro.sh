#!/usr/bin/env bash
# Micro-benchmarks behind figures in docs/benchmarks.md ("Team split measured at run time"): the cost
# of OpenMP regions (omp_region.c) and of one decode GEMV call per head (gemv_calls.c); ("Every type
# of a llama.cpp Q4_K_M file"): one thread's quant_gemv rate per ggml type (quant_gemv.c) and grouped
# vs per-head decode attention per kernel set (decode_group.c). Needs
# build/libmoh.a (make). Usage: tools/bench/micro.sh   (set OMP_WAIT_POLICY as moh does: passive)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build/libmoh.a ] || make -s
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -fopenmp tools/bench/omp_region.c -o "$out/omp_region"
for b in gemv_calls quant_gemv decode_group; do
  cc -std=c11 -O2 -fopenmp -Isrc -Iinclude tools/bench/$b.c build/libmoh.a -ldnnl -lm -o "$out/$b"
done
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$out/omp_region"
"$out/gemv_calls"
OMP_NUM_THREADS=1 "$out/quant_gemv"
"$out/decode_group"
