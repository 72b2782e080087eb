#!/usr/bin/env bash
# GPU run of the engine integration (one engine per call; see build_engines_carry.sh):
#     benchmarks/run_engines_on_gpu.sh sglang|vllm
# Unpacks .carry/engines-<engine>/*.zip, declares fp8mla's entry points (the GPU machine uses
# src/ through a path, without package metadata), runs tests/integrations for that engine on
# CUDA and, for sglang, times a decode step (JSONL in $OUT/sglang_kit.jsonl).
set -uo pipefail
engine=${1:?usage: run_engines_on_gpu.sh sglang|vllm}
out=${OUT:-.out}; mkdir -p "$out"
site=$(mktemp -d)/site; mkdir -p "$site"
for z in .carry/engines-$engine/*.zip; do unzip -q -o "$z" -d "$site"; done
ep="$site/fp8mla-0.1.0.dist-info"; mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: fp8mla\nVersion: 0.1.0\n' > "$ep/METADATA"
printf '[sglang.srt.plugins]\nfp8mla = fp8mla.integrations.sglang:register\n\n[vllm.general_plugins]\nfp8mla = fp8mla.integrations.vllm:register\n' > "$ep/entry_points.txt"
export FP8MLA_ENGINES_PATH=$site PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee "$out/env.txt"
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/integrations/test_engines_installed.py \
  tests/integrations/test_${engine}_*.py 2>&1 | tee "$out/pytest_$engine.log" | tail -25
if [ "$engine" = sglang ]; then
  timeout 150 python3 benchmarks/bench_sglang_kit.py --out "$out/sglang_kit.jsonl" ${BENCH_ARGS:-} \
    2>"$out/bench_sglang.err" | tail -12
fi
