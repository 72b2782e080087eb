#!/usr/bin/env bash
# GPU run of the lightning indexer (DeepSeek Sparse Attention's token selection): its tests,
# then `fp8mla bench --sections indexer` beside vLLM's Triton fallback, then the goals, met or
# missed (printed last).
# Usage: benchmarks/run_indexer_on_gpu.sh OUT_DIR
# Carry (git-ignored, 15 KB):
#   .carry/vllm_indexer/mqa_logits_triton.py
#       vLLM's Triton fallback of DeepGEMM's logits (fp8_paged_mqa_logits_triton,
#       vllm/v1/attention/ops/mqa_logits_triton.py of vLLM main @0033bf0; the pinned vllm
#       0.33.0 wheel has no such file). Without it the vllm-triton rows are skipped with a note.
# Steps, each under its own timeout (the whole run ends within ~7 minutes):
#   env     GPU, torch, Triton
#   tests   tests/dsa/test_index_cache.py, test_indexer.py, test_dsa_layer.py (the full-width
#           layer: 128 heads, top-2,048 of 8,192) and tests/bench/test_indexer_bench.py
#   bench   fp8mla bench --sections indexer  ->  OUT_DIR/<gpu>.jsonl, bench_indexer.log
#   goals   the goal lines of this run (python -m fp8mla.bench.indexer_report)
# Knobs: PYTHON (python3), TEST_WORKERS (4), TEST_TIMEOUT (200), BENCH_TIMEOUT (200), RUN_ID,
#        BENCH_ARGS (e.g. "--quick", "--impls fp8mla,vllm-triton").
set -uo pipefail
out=${1:?usage: run_indexer_on_gpu.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
source benchmarks/gpu_common.sh 4
gpu_env "$out"

timeout -s INT "${TEST_TIMEOUT:-200}" $py -m pytest -q "${workers[@]}" -p no:cacheprovider \
  tests/dsa/test_index_cache.py tests/dsa/test_indexer.py tests/dsa/test_dsa_layer.py \
  tests/bench/test_indexer_bench.py 2>&1 | tee "$out/pytest_indexer.log" | tail -15
tests=${PIPESTATUS[0]}

timeout -s INT "${BENCH_TIMEOUT:-200}" $py -m fp8mla bench --sections indexer --out "$out" \
  --no-plot --vllm-indexer-module .carry/vllm_indexer/mqa_logits_triton.py \
  ${RUN_ID:+--run-id "$RUN_ID"} ${BENCH_ARGS:-} \
  2>"$out/bench_indexer.err" | tee "$out/bench_indexer.log" | sed '/^indexer goals:/,$d' | tail -40
bench=${PIPESTATUS[0]}

echo "== tests: exit $tests, bench: exit $bench (logs in $out)"
latest=$(ls -t "$out"/*.jsonl 2>/dev/null | head -1)
if [ -n "$latest" ]; then
  echo "== indexer goals ($latest)"
  $py -m fp8mla.bench.indexer_report "$latest"
fi
[ "$tests" -eq 0 ] && exit "$bench"
exit "$tests"
