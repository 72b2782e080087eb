#!/usr/bin/env bash
# Build the git-ignored carry folder that lets the GPU machine (Python 3.12, torch 2.11,
# Triton 3.6, no package registry, 64 MiB per call with the working tree) run
# tests/integrations and the engine benchmarks against the pinned engines, both engines in one
# call. Run HERE (with the registry), from anywhere in the repository:
#     benchmarks/build_engines_carry.sh        # -> .carry/engines
# The folder holds, per engine, <engine>.zip (the engine's .py files, pruned below),
# deps-<engine>.zip (its pinned packages that the GPU machine lacks, where the other engine
# pins another version or does not need them) and requirements-<engine>.txt (its pins, for the
# tests' version check), and deps-common.zip (the packages both engines pin at the same
# version, carried once). SGLang's pins come from tests/integrations/requirements-engines.txt,
# vLLM's from VLLM_REQUIREMENTS (default: requirements-engines-vllm-0.34.txt, the newest
# release the tests cover; requirements-engines.txt gives vLLM 0.33.0). The folder and the
# working tree must fit the 64 MiB a call carries (checked at the end, measured with du -sb):
#     run(carry=[".carry/engines"], command="benchmarks/run_engines_on_gpu.sh")
# Knobs (defaults build the GPU carry):
#     CARRY_PYTHON=3.12   the Python whose compiled wheels are taken (3.11: a carry for a CPU
#                         simulation here, where the only local torch wheel is for 3.11)
#     CARRY_DIR=.carry    where engines/ goes
#     VLLM_REQUIREMENTS   the requirements file vLLM's pins come from (see above)
# Versions are all pinned (the requirements files); the pruning rules are below, each with why.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
pyver=${CARRY_PYTHON:-3.12}
abi=cp${pyver/./}
dest=${CARRY_DIR:-.carry}
case $dest in /*) ;; *) dest=$root/$dest ;; esac
limit=$((64 * 1024 * 1024))
sglang_req=tests/integrations/requirements-engines.txt
vllm_req=${VLLM_REQUIREMENTS:-tests/integrations/requirements-engines-vllm-0.34.txt}

# --- Pruning rule 1: packages the GPU machine already has are not carried. ---
# Its image holds these (device docs, KINDS.md "Python packages already there", read
# 2026-11-17), together with torch, triton, numpy and torch's own dependencies (sympy, mpmath,
# networkx, jinja2, markupsafe, filelock, fsspec, typing-extensions), none of which is in the
# requirements files anyway. tests/integrations/conftest.py APPENDS the carry to sys.path, after
# site-packages, so a carried copy of one of these would never be imported there: it would
# only cost bytes. (Where the image's version differs from our pin -- transformers 5.17.0 vs
# 5.19.0, huggingface-hub 1.33.0 vs 2.4.0 -- the image's is the one that runs either way;
# run_engines_on_gpu.sh records the versions it used. vLLM 0.34 declares huggingface-hub>=2.0,
# but the modules the tests import use no 2.x API.)
ON_GPU_IMAGE="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi click
  cloudpickle einops frozenlist h11 httpx huggingface-hub idna multidict pillow
  prometheus-client propcache psutil py-cpuinfo pyyaml regex requests safetensors sentencepiece
  tokenizers tqdm transformers urllib3 uvloop yarl"

# --- Pruning rule 2: per engine, pinned packages its attention tests never import. ---
# Checked with a module trace of tests/integrations/test_<engine>_*.py run from the carry (CPU
# simulation, docs/engines.md) and by grep of the engine's imports. vLLM runs its CPU platform
# on the GPU machine too (conftest sets VLLM_TARGET_DEVICE=cpu), so its import chain is the
# same there; SGLang's CUDA-only module-level imports are its compiled kernels (sgl_kernel, a
# test stand-in), not these packages.
#   llguidance: SGLang's llguidance grammar backend (loaded only when chosen), vLLM's
#     structured output. cbor2, cachetools: vLLM only. openai-harmony: in SGLang only its
#     OpenAI-compatible server (sglang/srt/entrypoints), which the tests never start.
SGLANG_SKIP_DEPS="llguidance cbor2 cachetools openai-harmony"
#   ipython, traitlets, loguru, dill: SGLang only. compressed-tensors, gguf: imported by
#   vLLM's quantization schemes and GGUF loader, which load only for such checkpoints.
VLLM_SKIP_DEPS="ipython traitlets compressed-tensors gguf loguru dill"

# --- Pruning rule 3: engine files the tests cannot import. ---
# Only .py files and the engine's dist-info (version, entry points) are kept. Compiled parts
# go: vLLM's extensions (_C, FlashAttention, MoE, DeepGEMM, vllm-rs; 0.8 GB, built against
# torch 2.14) cannot load against the machine's torch 2.11; SGLang's Rust extensions (its
# HTTP/gRPC server, multimodal, radix-tree core; 46 MB) serve its server and are imported
# optionally (the tests pass without them). CUDA/C++ sources, configs and tuning tables (JSON)
# are not read on the attention path (one exception, kept below).
# One whole subpackage goes, one that nothing on the tests' import chain imports (grep: no
# import of it from outside itself; the tests pass from the carry, on the CPU and with CUDA
# faked for the import chain): sglang/multimodal_gen, SGLang's diffusion-model server with
# its own runtime (19 MB of .py, 5.1 MB zipped). Smaller candidates stay, as their savings
# are not worth the risk (each under 0.5 MB zipped): sglang/benchmark (which sglang/test/
# test_utils.py imports), vLLM's third_party kernels, vllm_flash_attn and benchmarks.
SGLANG_PRUNE="sglang/multimodal_gen"
VLLM_PRUNE=""
# Non-.py files kept all the same: SGLang's JIT kernel sources (C++/CUDA headers and sources,
# 4.4 MB before zipping). sglang.kernels.jit checks at import time that include/ and csrc/
# exist (RuntimeError "Cannot find sglang.kernels.jit path" from the kit's import chain
# otherwise), and on CUDA SGLang JIT-compiles some of its ops from them with the machine's nvcc.
SGLANG_KEEP_DATA="sglang/kernels/jit/include sglang/kernels/jit/csrc"
VLLM_KEEP_DATA=""

norm() { tr 'A-Z_.' 'a-z--'; }
in_list() { case " $(echo $2) " in *" $1 "*) return 0 ;; esac; return 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dl() {  # dl DIR SPEC: the pinned wheel for this CPython on x86-64 Linux, no dependencies
  local plats=() n
  for n in 39 35 34 31 28 27 26 24 17 12 5; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
    "${plats[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "$1" "$2"
}
zipdir() {  # zipdir SRC ZIP: deterministic order, no extra attributes
  (cd "$1" && find . -type f | LC_ALL=C sort | zip -q -X -9 "$2" -@)
}

echo "build_engines_carry: CPython $pyver wheels into $dest/engines"
# carried_deps ENGINE REQ: "name==version" lines of REQ that ENGINE's tests need and the GPU
# image lacks (rules 1 and 2)
carried_deps() {
  local skip spec name
  case $1 in sglang) skip=$SGLANG_SKIP_DEPS ;; vllm) skip=$VLLM_SKIP_DEPS ;; esac
  grep -vE '^(#|$|sglang==|vllm==)' "$2" | while read -r spec; do
    name=$(echo "${spec%%==*}" | norm)
    in_list "$name" "$ON_GPU_IMAGE" && continue
    in_list "$name" "$skip" && continue
    echo "$name==${spec#*==}"
  done | sort -u
}
carried_deps sglang "$sglang_req" > "$work/sglang.deps"
carried_deps vllm "$vllm_req" > "$work/vllm.deps"
comm -12 "$work/sglang.deps" "$work/vllm.deps" > "$work/common.deps"
comm -23 "$work/sglang.deps" "$work/vllm.deps" > "$work/sglang-only.deps"
comm -13 "$work/sglang.deps" "$work/vllm.deps" > "$work/vllm-only.deps"
# unpack_deps LIST DIR: the wheels of LIST, unpacked into DIR
unpack_deps() {
  local spec
  rm -rf "$2" && mkdir -p "$2"
  while read -r spec; do
    rm -rf "$work/whl" && mkdir -p "$work/whl"
    dl "$work/whl" "$spec" >"$work/dl.log" 2>&1 || {
      echo "build_engines_carry: no $abi wheel for $spec:" >&2; tail -3 "$work/dl.log" >&2; exit 1; }
    unzip -q -o "$work"/whl/*.whl -d "$2"
  done < "$1"
  # RECORD lists files by hash (not needed to import); bin/ holds console scripts
  rm -rf "$2"/*.dist-info/RECORD "$2/bin"
}

out=$dest/engines
rm -rf "$out" && mkdir -p "$out"
unpack_deps "$work/common.deps" "$work/deps-common"
zipdir "$work/deps-common" "$out/deps-common.zip"
for engine in sglang vllm; do
  case $engine in
    sglang) req=$sglang_req prune=$SGLANG_PRUNE keep=$SGLANG_KEEP_DATA ;;
    vllm) req=$vllm_req prune=$VLLM_PRUNE keep=$VLLM_KEEP_DATA ;;
  esac
  ver=$(grep -E "^$engine==" "$req" | cut -d= -f3)
  unpack_deps "$work/$engine-only.deps" "$work/deps-$engine"
  zipdir "$work/deps-$engine" "$out/deps-$engine.zip"
  # the engine itself
  dl "$work/$engine-whl" "$engine==$ver" >"$work/dl.log" 2>&1 || {
    echo "build_engines_carry: no $abi wheel for $engine==$ver:" >&2; tail -3 "$work/dl.log" >&2; exit 1; }
  rm -rf "$work/$engine-src" && mkdir -p "$work/$engine-src"
  unzip -q -o "$work"/$engine-whl/*.whl -d "$work/$engine-src"
  (
    cd "$work/$engine-src"
    keep_args=(! -path "./$engine-$ver.dist-info/*")
    for k in $keep; do
      [ -d "$k" ] || { echo "build_engines_carry: keep rule $k matches nothing" >&2; exit 1; }
      keep_args+=(! -path "./$k/*")
    done
    find . -type f ! -name '*.py' "${keep_args[@]}" -delete
    rm -f "$engine-$ver.dist-info/RECORD"
    for p in $prune; do
      [ -d "$p" ] || { echo "build_engines_carry: prune rule $p matches nothing" >&2; exit 1; }
      rm -rf "$p"
    done
    find . -type d -empty -delete
  )
  zipdir "$work/$engine-src" "$out/$engine.zip"
  cp "$req" "$out/requirements-$engine.txt"
  printf '%s %s: %s\n  deps: %s\n' "$engine" "$ver" \
    "$(cd "$out" && du -b "$engine.zip" "deps-$engine.zip" | tr '\n\t' '  ')" \
    "$(tr '\n' ' ' < "$work/$engine-only.deps")"
done
printf 'common deps: %s: %s\n' "$(cd "$out" && du -b deps-common.zip | cut -f1)" \
  "$(tr '\n' ' ' < "$work/common.deps")"
size=$(du -sb "$out" | cut -f1)
# what travels besides the carry: the working tree (tracked and untracked, not ignored)
tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
printf '%s: %d bytes (%.1f MiB); working tree %d bytes; together %.1f of 64 MiB\n' "$out" \
  "$size" "$(awk -v s="$size" 'BEGIN{print s/1048576}')" "$tree" \
  "$(awk -v s="$((size + tree))" 'BEGIN{print s/1048576}')"
if [ $((size + tree)) -gt "$limit" ]; then
  echo "build_engines_carry: $out and the working tree are over 64 MiB" >&2
  exit 1
fi
