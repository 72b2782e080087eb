#!/usr/bin/env bash
# Build the git-ignored carry folders that let the GPU machine (Python 3.12, torch 2.11,
# Triton 3.6, no package registry) run tests/integrations and bench_sglang_kit.py.
# Run HERE (with the registry), from the repository root:
#     benchmarks/build_engines_carry.sh            # -> .carry/engines-sglang, .carry/engines-vllm
# Each folder holds one engine's .py files (compiled parts, CUDA sources dropped) and the
# pinned dependencies from tests/integrations/requirements-engines.txt as cp312 wheels'
# contents, zipped. Carry ONE per GPU call (64 MiB per call, repository included):
#     run(carry=[".carry/engines-sglang"], command="benchmarks/run_engines_on_gpu.sh sglang")
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
req=tests/integrations/requirements-engines.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dl() {  # dl DIR SPEC...: cp312 manylinux wheels, no dependencies
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$1" "${@:2}"
}
mkdir -p "$work/wheels" "$work/deps"
grep -vE '^(#|$|sglang==|vllm==)' "$req" > "$work/deps.txt"
while read -r spec; do  # one by one: a pin without a cp312 wheel is reported, not fatal
  dl "$work/wheels" "$spec" 2>/dev/null || echo "note: no cp312 wheel for $spec (not carried)"
done < "$work/deps.txt"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/deps"; done
# Packages the GPU machine has or that only the engines' servers use are left out to fit.
rm -rf "$work"/deps/*.dist-info/RECORD "$work"/deps/bin
for engine in sglang vllm; do
  ver=$(grep -E "^$engine==" "$req" | cut -d= -f3)
  dl "$work/$engine-whl" "$engine==$ver"
  mkdir -p "$work/$engine-src"
  unzip -q -o "$work"/$engine-whl/*.whl -d "$work/$engine-src"
  # .py files and the dist-info (entry points, version); no compiled parts or CUDA sources.
  (cd "$work/$engine-src" && find . -type f ! -name '*.py' ! -path "./$engine-$ver.dist-info/*" -delete)
  out=.carry/engines-$engine
  rm -rf "$out" && mkdir -p "$out"
  (cd "$work/$engine-src" && zip -q -r -9 "$OLDPWD/$out/$engine.zip" .)
  (cd "$work/deps" && zip -q -r -9 "$OLDPWD/$out/deps.zip" .)
  echo "$out: $(du -sh "$out" | cut -f1) ($(ls "$out" | tr '\n' ' '))"
done
