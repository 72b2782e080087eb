#!/usr/bin/env bash
# One GPU session: environment, the kernel test suite, the tuning sweep and the benchmark.
# Usage: benchmarks/run_on_gpu.sh OUT_DIR [STEPS]   (STEPS: comma list of tests,tune,bench,
# seed,demo; default tests,tune,bench). Logs and results land in OUT_DIR.
set -uo pipefail
out=${1:?usage: run_on_gpu.sh OUT_DIR [STEPS]}
steps=${2:-tests,tune,bench}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
has() { [[ ",$steps," == *",$1,"* ]]; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$out/env.txt"
make .venv/.fp8mla-installed >"$out/make.log" 2>&1 || { echo "make failed"; tail "$out/make.log"; }
py=.venv/bin/python
if ! $py -c 'import torch, fp8mla' 2>/dev/null; then py=python3; export PYTHONPATH=$PWD/src; fi
$py -m fp8mla info | tee -a "$out/env.txt"
if has tests; then
  timeout 300 $py -m pytest -q --timeout 120 -p no:cacheprovider \
    tests/test_attention.py tests/test_cache.py tests/test_codec.py tests/test_wrapper_errors.py \
    tests/test_reference.py tests/test_bench_impls.py tests/test_cli_info.py tests/test_fp8_codes.py tests/test_demo.py ${EXTRA_TESTS:-} \
    2>&1 | tee "$out/pytest.log" | tail -15
fi
if has tune; then
  timeout 240 $py benchmarks/tune_decode.py --json "$out/tune.json" >"$out/tune.log" 2>&1
  sed -n '/best per case/,$p' "$out/tune.log"
fi
sg=()
[ -f .carry/sglang_0_5_2_decode_attention.py ] && sg=(--sglang-module .carry/sglang_0_5_2_decode_attention.py)
if has bench; then
  timeout 300 $py -m fp8mla bench --sections goals --out "$out" "${sg[@]}" ${BENCH_ARGS:-} 2>"$out/bench.err" | tee "$out/bench.log" | tail -40
fi
for section in seed extend sweep; do
  if has $section; then
    timeout ${SECTION_TIMEOUT:-240} $py -m fp8mla bench --sections $section --out "$out" "${sg[@]}" \
      2>"$out/bench_$section.err" | tee "$out/bench_$section.log" | grep -v "^note:" | tail -45
  fi
done
if has demo; then
  timeout 300 $py -m fp8mla demo 2>&1 | tee "$out/demo.log" | tail -30
fi
