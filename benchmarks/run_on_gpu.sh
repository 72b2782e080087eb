#!/usr/bin/env bash
# One GPU session: environment, the kernel test suite, the tuning sweep and the benchmark.
# Usage: benchmarks/run_on_gpu.sh OUT_DIR [STEPS]   (STEPS: comma list of tests,tune,bench,
# seed,host,demo; default tests,bench). Logs and results land in OUT_DIR: the bench sections
# append to OUT_DIR/<gpu>.jsonl, labelled $RUN_ID (default: each section's start time); append
# that file to benchmarks/results/<gpu>.jsonl to keep it. FlashInfer is found through
# $FP8MLA_FLASHINFER (a folder holding the flashinfer package), as `fp8mla bench` does.
set -uo pipefail
out=${1:?usage: run_on_gpu.sh OUT_DIR [STEPS]}
steps=${2:-tests,bench}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
has() { [[ ",$steps," == *",$1,"* ]]; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$out/env.txt"
py=python3
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
$py -m fp8mla info | tee -a "$out/env.txt"
if has tests; then
  # with pytest-xdist, parallel workers (the suite's cost is compiling kernels: ~110 s with 6
  # workers on the H200's host, ~350 s in one process)
  workers=()
  $py -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-6}")
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
for section in goals host seed extend sweep; do
  if has bench && [[ $section == goals || $section == host ]] || has $section; then
    timeout ${SECTION_TIMEOUT:-300} $py -m fp8mla bench --sections $section --out "$out" "${sg[@]}" \
      ${RUN_ID:+--run-id "$RUN_ID"} --no-plot ${BENCH_ARGS:-} 2>"$out/bench_$section.err" \
      | tee "$out/bench_$section.log" | grep -v "^note:" | tail -45
  fi
done
if has demo; then
  timeout 300 $py -m fp8mla demo 2>&1 | tee "$out/demo.log" | tail -30
fi
