#!/usr/bin/env bash
# GPU run of the engine integration, one engine per call (carry: build_engines_carry.sh):
#     run(carry=[".carry/engines-sglang"], command="benchmarks/run_engines_on_gpu.sh sglang")
#     run(carry=[".carry/engines-vllm"],   command="benchmarks/run_engines_on_gpu.sh vllm")
# Steps, each under its own timeout, all of them within ENGINES_BUDGET_S (default 520 s, inside
# the run tool's 600 s per command; a step stopped at its limit gets SIGINT, so pytest still
# writes its summary, and SIGKILL 15 s later: the whole script ends by about 535 s):
#   unpack   .carry/engines-<engine>/*.zip into a fresh folder (Python's zipfile), with a
#            dist-info declaring fp8mla's entry points (the machine uses src/ by path)
#   probe    the environment (python, torch, GPU, triton; where each package the engine
#            imports comes from: the machine or the carry, and its version), then
#            `import <engine>` and fp8mla's plugin registration, with the traceback if not
#   pytest   tests/integrations for that engine (device cuda when there is one, else cpu)
#   bench    sglang on CUDA only: a decode step through SGLang's kit, fp8mla vs sglang-triton
# Logs, in $OUT (default .out/): summary_<engine>.txt (each step: status, seconds),
# probe_<engine>.log, pytest_<engine>.log, junit_<engine>.xml, bench_sglang.log and
# sglang_kit.jsonl. The end of the output repeats the summary and the failing tests.
# Exit status: pytest's (124 if it ran out of time), else the bench's; 2 for a missing carry.
# Knobs: PYTHON (python3), ENGINES_CARRY (.carry/engines-<engine>), ENGINES_BUDGET_S (520),
#        BENCH_RESERVE_S (130, kept for the bench while pytest runs), PYTEST_ARGS, BENCH_ARGS.
set -uo pipefail
engine=${1:-}
case $engine in
  sglang | vllm) ;;
  *) echo "usage: run_engines_on_gpu.sh sglang|vllm" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
carry=${ENGINES_CARRY:-.carry/engines-$engine}
budget=${ENGINES_BUDGET_S:-520}
deadline=$((SECONDS + budget))
out=${OUT:-.out}
mkdir -p "$out"
summary=$out/summary_$engine.txt
# this run's logs only (a stale one would be read back into the summary)
rm -f "$out"/{unpack,probe,pytest,junit}_"$engine".* "$summary"
[ "$engine" = sglang ] && rm -f "$out/bench_sglang.log" "$out/sglang_kit.jsonl"
: > "$summary"
export PYTHONUNBUFFERED=1

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - SECONDS)); }
# step NAME MAX_S LOG CMD...: CMD under `timeout` (SIGINT first, so pytest still prints its
# summary, then SIGKILL 15 s later), output to the console and LOG; at most MAX_S seconds and
# never past the deadline. Sets $rc.
step() {
  local name=$1 max=$2 log=$3 t0=$SECONDS t
  shift 3
  t=$(left)
  [ "$max" -lt "$t" ] && t=$max
  if [ "$t" -lt 15 ]; then
    rc=125
    note "$(printf '%-7s SKIPPED  (%d s left of the %d s budget)' "$name" "$(left)" "$budget")"
    return
  fi
  timeout -s INT -k 15 "$t" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local status=ok
  [ "$rc" -ne 0 ] && status="FAILED rc=$rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="TIMED OUT after ${t}s"
  note "$(printf '%-7s %-22s %4d s  %s' "$name" "$status" $((SECONDS - t0)) "$log")"
}

note "run_engines_on_gpu $engine: $(date -u +%FT%TZ), budget ${budget}s, carry $carry"
shopt -s nullglob
zips=("$carry"/*.zip)
if [ ${#zips[@]} -eq 0 ]; then
  note "no zips in $carry: build them here with benchmarks/build_engines_carry.sh and pass" \
    "carry=[\"$carry\"] to the run"
  exit 2
fi
site=$(mktemp -d "${TMPDIR:-/tmp}/fp8mla-engines-$engine.XXXXXX")
trap 'rm -rf "$site"' EXIT

step unpack 120 "$out/unpack_$engine.log" "$py" - "$site" "${zips[@]}" <<'EOF'
import sys, zipfile
site, zips = sys.argv[1], sys.argv[2:]
for z in zips:
    with zipfile.ZipFile(z) as f:
        f.extractall(site)
        print(f"{z}: {len(f.namelist())} files")
ep = f"{site}/fp8mla-0.1.0.dist-info"
import os
os.makedirs(ep, exist_ok=True)
open(f"{ep}/METADATA", "w").write("Metadata-Version: 2.1\nName: fp8mla\nVersion: 0.1.0\n")
open(f"{ep}/entry_points.txt", "w").write(
    "[sglang.srt.plugins]\nfp8mla = fp8mla.integrations.sglang:register\n\n"
    "[vllm.general_plugins]\nfp8mla = fp8mla.integrations.vllm:register\n"
)
EOF
[ "$rc" -ne 0 ] && { note "unpack failed: see above"; exit 2; }

export FP8MLA_ENGINES_PATH=$site FP8MLA_ENGINES_ONLY=$engine
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}

step probe 150 "$out/probe_$engine.log" "$py" - "$engine" <<'EOF'
import importlib, importlib.metadata as md, importlib.util, platform, sys, time, traceback
engine = sys.argv[1]
from integrations.engines_path import ENGINES, use_engines

cuda = use_engines()
import torch, triton

print(f"python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {cuda}"
      + (f": {torch.cuda.get_device_name()}" if cuda else " (device cpu)"))
names = ["transformers", "huggingface_hub", "tokenizers", "safetensors", "pydantic",
         "fastapi", "openai", "aiohttp", "PIL", "requests", "yaml", "numpy", "torchvision",
         "sgl_kernel", "flashinfer", "xgrammar", "tvm_ffi", "zmq", "msgspec"]
dists = md.packages_distributions()
for name in names:
    spec = importlib.util.find_spec(name)
    if spec is None:
        print(f"  {name:16s} absent")
        continue
    where = ("carry" if str(ENGINES) in str(spec.origin) else
             "stand-in" if "standins" in str(spec.origin) else "machine")
    try:
        ver = md.version(dists.get(name, [name])[0])
    except Exception:
        ver = "?"
    print(f"  {name:16s} {ver:14s} {where}: {spec.origin}")
t0 = time.time()
try:
    mod = importlib.import_module(engine)
    print(f"import {engine} {md.version(engine)}: ok ({time.time() - t0:.1f} s)")
    importlib.import_module(f"fp8mla.integrations.{engine}").register()
    print(f"fp8mla.integrations.{engine}.register(): ok ({time.time() - t0:.1f} s)")
except BaseException:
    traceback.print_exc()
    sys.exit(1)
EOF

faulthandler=${FAULTHANDLER_S:-150}  # a test running longer gets its stacks dumped to the log
reserve=0
[ "$engine" = sglang ] && reserve=${BENCH_RESERVE_S:-130}
t_pytest=$(($(left) - reserve))
# shellcheck disable=SC2086
# pytest.main under a SIGINT handler of its own: a timed-out run still prints its summary even
# where the caller started us with SIGINT ignored (background jobs)
step pytest "$t_pytest" "$out/pytest_$engine.log" "$py" -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))' -q -p no:cacheprovider \
  --tb=short -o faulthandler_timeout="$faulthandler" --junitxml="$out/junit_$engine.xml" \
  --durations=10 tests/integrations/test_engines_installed.py \
  tests/integrations/test_${engine}_*.py ${PYTEST_ARGS:-}
pytest_rc=$rc

bench_rc=0
if [ "$engine" = sglang ]; then
  if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    # shellcheck disable=SC2086
    step bench 600 "$out/bench_sglang.log" "$py" benchmarks/bench_sglang_kit.py \
      --out "$out/sglang_kit.jsonl" ${BENCH_ARGS:-}
    bench_rc=$rc
  else
    note "bench   skipped (no CUDA GPU: it times with CUDA events)"
  fi
fi

echo
echo "===== summary ($engine, $((SECONDS - deadline + budget)) s) ====="
cat "$summary"
log=$out/pytest_$engine.log
if [ -f "$log" ]; then
  grep -E '^(FAILED|ERROR) ' "$log" | sort -u | head -40 | tee -a "$summary"
  last=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -1)
  note "pytest: ${last:-no result line (see $log)}"
fi
[ "$pytest_rc" -ne 0 ] && exit "$pytest_rc"
exit "$bench_rc"
