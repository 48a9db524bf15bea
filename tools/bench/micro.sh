#!/usr/bin/env bash
# Micro-benchmarks behind figures in docs/benchmarks.md ("Team split measured at run time"): the cost
# of OpenMP regions (omp_region.c) and of one decode GEMV call per head (gemv_calls.c). Needs
# build/libmoh.a (make). Usage: tools/bench/micro.sh   (set OMP_WAIT_POLICY as moh does: passive)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build/libmoh.a ] || make -s
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -fopenmp tools/bench/omp_region.c -o "$out/omp_region"
cc -std=c11 -O2 -fopenmp -Isrc -Iinclude tools/bench/gemv_calls.c build/libmoh.a -ldnnl -lm -o "$out/gemv_calls"
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$out/omp_region"
"$out/gemv_calls"
