#!/usr/bin/env bash
# One GPU session: environment, the kernel test suite, the tuning sweep and the benchmark.
# Usage: benchmarks/run_on_gpu.sh OUT_DIR [STEPS]   (STEPS: comma list of tests,tune,bench,
# seed,host,demo; default tests,bench). Logs and results land in OUT_DIR: the bench sections
# append to OUT_DIR/<gpu>.jsonl, labelled $RUN_ID (default: each section's start time); append
# that file to benchmarks/results/<gpu>.jsonl to keep it. FlashInfer is found through
# $FP8MLA_FLASHINFER (a folder holding the flashinfer package), as `fp8mla bench` does.
# Carry (git-ignored), for the goals section's FlashMLA rows (flashmla-fp8, flashmla-bf16kv):
#   .carry/flashmla/_flashmla_C.abi3.so, _flashmla_extension_C.abi3.so
#       FlashMLA as vLLM 0.26.0 builds it (../shared/flashmla-vllm-0.26); without the folder,
#       $FP8MLA_FLASHMLA, else the rows are skipped with a note. The goals section ends with
#       its goal lines (also: python -m fp8mla.bench.report OUT_DIR/<gpu>.jsonl).
set -uo pipefail
out=${1:?usage: run_on_gpu.sh OUT_DIR [STEPS]}
steps=${2:-tests,bench}
cd "$(dirname "$0")/.."
mkdir -p "$out"
has() { [[ ",$steps," == *",$1,"* ]]; }
source benchmarks/gpu_common.sh 6
gpu_env "$out"
$py -m fp8mla info | tee -a "$out/env.txt"
if has tests; then
  timeout ${TEST_TIMEOUT:-420} $py -m pytest -q "${workers[@]}" --timeout 150 -p no:cacheprovider \
    tests/attention tests/kernels tests/cache tests/bench ${EXTRA_TESTS:-} \
    2>&1 | tee "$out/pytest.log" | tail -25
fi
if has tune; then
  timeout 240 $py benchmarks/tune_decode.py --set ${TUNE_SET:-fewrows} --json "$out/tune.json" >"$out/tune.log" 2>&1
  sed -n '/best per case/,$p' "$out/tune.log"
fi
sg=()
[ -f .carry/sglang_0_5_2_decode_attention.py ] && sg=(--sglang-module .carry/sglang_0_5_2_decode_attention.py)
fm=()
[ -d .carry/flashmla ] && fm=(--flashmla .carry/flashmla)
for section in goals host seed extend sweep; do
  if has bench && [[ $section == goals || $section == host ]] || has $section; then
    extra=() lines=45
    [[ $section == goals ]] && extra=("${fm[@]}") lines=120  # the table and its goal lines
    timeout ${SECTION_TIMEOUT:-300} $py -m fp8mla bench --sections $section --out "$out" "${sg[@]}" \
      "${extra[@]}" ${RUN_ID:+--run-id "$RUN_ID"} --no-plot ${BENCH_ARGS:-} \
      2>"$out/bench_$section.err" | tee "$out/bench_$section.log" | grep -v "^note:" | tail -$lines
  fi
done
if has demo; then
  timeout 300 $py -m fp8mla demo 2>&1 | tee "$out/demo.log" | tail -30
fi
