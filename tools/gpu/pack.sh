#!/usr/bin/env bash
# Builds, on this machine, what the lent GPU machine runs (it has CUDA and PyTorch but no Debian
# -dev packages): moh, the CUDA tests and libmoh.so (the Python package's library) for any x86-64 CPU (MOH_NATIVE=OFF), with the shared
# libraries they need beyond glibc and libstdc++ (oneDNN, cJSON, PCRE2, libpng, LAPACK, OpenMP...),
# packed into build-gpu/carry.tar.xz (ignored by git; the device call carries it). glibc here
# (Debian 12, 2.36) is older than there, so the binaries run there.
#   tools/gpu/pack.sh            then, on the GPU machine: tools/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-gpu
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DMOH_CUDA=ON -DMOH_MPI=OFF -DMOH_CAIRO=OFF -DMOH_NATIVE=OFF >/dev/null
cmake --build "$B" -j "$(nproc)" --target moh test_cuda_attn moh_shared >"$B/pack.log" 2>&1 || { tail -40 "$B/pack.log"; exit 1; }
rm -rf "$B/carry" && mkdir -p "$B/carry/lib"
cp "$B/moh" "$B/test_cuda_attn" "$B/libmoh.so" "$B/carry/"
for f in "$B/moh" "$B/test_cuda_attn" "$B/libmoh.so"; do ldd "$f" | awk '/=> \//{print $3}'; done | sort -u | while read -r so; do
    case "$(basename "$so")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
    *) cp -L "$so" "$B/carry/lib/" ;;
    esac
done
# the kernels' object files: run.sh reads their resource usage and SASS with cuobjdump (there)
mkdir -p "$B/carry/obj" && cp "$B"/CMakeFiles/mohlib.dir/src/cuda/*.cu.o "$B"/CMakeFiles/mohlib.dir/src/cuda/sm90/*.cu.o "$B/carry/obj/"
tar -C "$B/carry" -cJf "$B/carry.tar.xz" .
ls -la "$B/carry.tar.xz"
echo "packed: $(ls "$B/carry/lib" | tr '\n' ' ')"
