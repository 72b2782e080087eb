#!/usr/bin/env bash
# GPU run of sparse MLA attention (DeepSeek Sparse Attention): its tests, then
# `fp8mla bench --sections sparse` with the carried baselines, then the goals, met or missed.
# Usage: benchmarks/run_sparse_on_gpu.sh OUT_DIR
# Carry (git-ignored, ~2.0 MB):
#   .carry/flashmla/_flashmla_C.abi3.so, _flashmla_extension_C.abi3.so
#       FlashMLA's sparse decode/prefill as vLLM 0.26.0 builds them (../shared/flashmla-vllm-0.26)
#   .carry/vllm_sparse/triton_sparse_mla_kernel.py
#       vLLM's TRITON_MLA_SPARSE kernels (split-KV; vllm/v1/attention/ops/, upstream main),
#       else .carry/vllm_sparse/xpu_mla_sparse.py: the pinned vllm 0.33.0 wheel's Triton sparse
#       MLA kernel, which that backend derives from (0.33.0 has no TRITON_MLA_SPARSE)
# Steps, each under its own timeout (the whole run ends within ~6 minutes):
#   env     GPU, torch, Triton
#   tests   tests/dsa and tests/bench/test_sparse_bench.py (pytest-xdist workers when present)
#   bench   fp8mla bench --sections sparse  ->  OUT_DIR/<date>-<gpu>.jsonl, bench_sparse.log
#   goals   the goal lines of this run (python -m fp8mla.bench.sparse_report), printed last
# Knobs: PYTHON (python3), TEST_WORKERS (6), TEST_TIMEOUT (200), BENCH_TIMEOUT (300), RUN_ID,
#        BENCH_ARGS (e.g. "--quick", "--impls fp8mla,flashmla-sparse-fp8").
set -uo pipefail
out=${1:?usage: run_sparse_on_gpu.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
source benchmarks/gpu_common.sh 6
gpu_env "$out"

timeout -s INT "${TEST_TIMEOUT:-200}" $py -m pytest -q "${workers[@]}" -p no:cacheprovider \
  tests/dsa tests/bench/test_sparse_bench.py 2>&1 | tee "$out/pytest_sparse.log" | tail -15
tests=${PIPESTATUS[0]}

vllm=.carry/vllm_sparse/triton_sparse_mla_kernel.py
[ -f "$vllm" ] || vllm=.carry/vllm_sparse/xpu_mla_sparse.py
timeout -s INT "${BENCH_TIMEOUT:-300}" $py -m fp8mla bench --sections sparse --out "$out" \
  --no-plot --flashmla .carry/flashmla --vllm-sparse-module "$vllm" ${RUN_ID:+--run-id "$RUN_ID"} ${BENCH_ARGS:-} \
  2>"$out/bench_sparse.err" | tee "$out/bench_sparse.log" | sed '/^sparse goals:/,$d' | tail -40
bench=${PIPESTATUS[0]}

echo "== tests: exit $tests, bench: exit $bench (logs in $out)"
latest=$(ls -t "$out"/*.jsonl 2>/dev/null | head -1)
if [ -n "$latest" ]; then
  echo "== sparse goals ($latest)"
  $py -m fp8mla.bench.sparse_report "$latest"
fi
[ "$tests" -eq 0 ] && exit "$bench"
exit "$tests"
