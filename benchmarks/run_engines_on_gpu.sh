#!/usr/bin/env bash
# GPU run of the engine integration, both engines in one call (carry: build_engines_carry.sh):
#     run(carry=[".carry/engines"], command="benchmarks/run_engines_on_gpu.sh")
# `benchmarks/run_engines_on_gpu.sh vllm` (or `sglang`) runs one engine. vLLM goes first. Per
# engine, each step under its own time limit, all of them within ENGINES_BUDGET_S (default
# 440 s; a step stopped at its limit gets SIGINT, so pytest still writes its summary, and
# SIGKILL 15 s later: the whole script ends within about 7.6 minutes):
#   unpack   deps-common.zip, deps-<engine>.zip and <engine>.zip of the carry into a fresh
#            folder (Python's zipfile), with the engine's pins as requirements.txt and a
#            dist-info declaring fp8mla's entry points (the machine uses src/ by path)
#   probe    the environment (python, torch, GPU, triton; where each package the engine
#            imports comes from: the machine or the carry, and its version), then
#            `import <engine>` and fp8mla's plugin registration, with the traceback if not
#   pytest   tests/integrations for that engine on CUDA; for vLLM these include the full
#            CUDA-graph tests (capture through vLLM's capture path, replays with new lengths
#            and block tables against the float64 reference)
#   bench    a decode step through the engine's attention path, fp8mla beside the engine's
#            own FP8 path, eagerly and in a CUDA graph: bench_vllm_step.py (FP8MLA and
#            TRITON_MLA backends, fp8mla's wrapper alone) and bench_sglang_kit.py (fp8mla and
#            SGLang's triton backend), appending to $OUT/<gpu>.jsonl
# sglang runs its bench before its pytest, so that a run short of time loses tests that ran
# before (the SGLang plugin's), not the records.
# Logs, in $OUT (default .out/; a device call returns at most 8 files): summary.txt (each step:
# status, seconds), probe.log (unpack and probe of both engines), pytest_<engine>.log,
# bench.log, and <gpu>.jsonl (the records, in `fp8mla bench`'s format, labelled with RUN_ID:
# append its lines to benchmarks/results/<gpu>.jsonl). The end of the output repeats the
# summary and the failing tests.
# Exit status: the first failing step's (124 when it ran out of time); 2 for a missing carry.
# Knobs: PYTHON (python3), ENGINES_CARRY (.carry/engines), ENGINES_BUDGET_S (440), RUN_ID
#        (the records' run label; default the bench's start time), PYTEST_ARGS,
#        VLLM_BENCH_ARGS, SGLANG_BENCH_ARGS.
set -uo pipefail
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm sglang)
for engine in "${engines[@]}"; do
  case $engine in
    sglang | vllm) ;;
    *) echo "usage: run_engines_on_gpu.sh [vllm] [sglang]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
carry=${ENGINES_CARRY:-.carry/engines}
budget=${ENGINES_BUDGET_S:-440}
deadline=$((SECONDS + budget))
out=${OUT:-.out}
mkdir -p "$out"
summary=$out/summary.txt
# this run's logs only (a stale one would be read back into the summary)
rm -f "$out"/{summary,probe,bench}.txt "$out"/{probe,bench}.log "$out"/pytest_*.log
: > "$summary"
export PYTHONUNBUFFERED=1
run_id=${RUN_ID:+--run-id "$RUN_ID"}
first_rc=0

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - SECONDS)); }
# step NAME MAX_S LOG CMD...: CMD under `timeout` (SIGINT first, so pytest still prints its
# summary, then SIGKILL 15 s later), output to the console and appended to LOG; at most MAX_S
# seconds and never past the deadline. Sets $rc, and $first_rc on the first failure.
step() {
  local name=$1 max=$2 log=$3 t0=$SECONDS t
  shift 3
  t=$(left)
  [ "$max" -lt "$t" ] && t=$max
  if [ "$t" -lt 15 ]; then
    rc=125
    note "$(printf '%-14s SKIPPED  (%d s left of the %d s budget)' "$name" "$(left)" "$budget")"
  else
    timeout -s INT -k 15 "$t" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    local status=ok
    [ "$rc" -ne 0 ] && status="FAILED rc=$rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="TIMED OUT after ${t}s"
    note "$(printf '%-14s %-22s %4d s  %s' "$name" "$status" $((SECONDS - t0)) "$log")"
  fi
  [ "$rc" -ne 0 ] && [ "$first_rc" -eq 0 ] && first_rc=$rc
  return 0
}

note "run_engines_on_gpu ${engines[*]}: $(date -u +%FT%TZ), budget ${budget}s, carry $carry"
for engine in "${engines[@]}"; do
  for f in "$carry/$engine.zip" "$carry/deps-$engine.zip" "$carry/deps-common.zip"; do
    [ -f "$f" ] && continue
    note "missing $f: build the carry here with benchmarks/build_engines_carry.sh and pass" \
      "carry=[\"$carry\"] to the run"
    exit 2
  done
done
sites=$(mktemp -d "${TMPDIR:-/tmp}/fp8mla-engines.XXXXXX")
trap 'rm -rf "$sites"' EXIT
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}

for engine in "${engines[@]}"; do
  site=$sites/$engine
  step "$engine unpack" 60 "$out/probe.log" "$py" - "$site" "$carry" "$engine" <<'EOF'
import os, shutil, sys, zipfile
site, carry, engine = sys.argv[1:]
for name in ("deps-common.zip", f"deps-{engine}.zip", f"{engine}.zip"):
    with zipfile.ZipFile(os.path.join(carry, name)) as f:
        f.extractall(site)
        print(f"{engine}: {name}: {len(f.namelist())} files")
# the engine's pins, read by tests/integrations/test_engines_installed.py
shutil.copyfile(os.path.join(carry, f"requirements-{engine}.txt"), f"{site}/requirements.txt")
ep = f"{site}/fp8mla-0.1.0.dist-info"
os.makedirs(ep, exist_ok=True)
open(f"{ep}/METADATA", "w").write("Metadata-Version: 2.1\nName: fp8mla\nVersion: 0.1.0\n")
open(f"{ep}/entry_points.txt", "w").write(
    "[sglang.srt.plugins]\nfp8mla = fp8mla.integrations.sglang:register\n\n"
    "[vllm.general_plugins]\nfp8mla = fp8mla.integrations.vllm:register\n"
)
EOF
  [ "$rc" -ne 0 ] && { note "$engine: unpack failed: see above"; continue; }

  export FP8MLA_ENGINES_PATH=$site FP8MLA_ENGINES_ONLY=$engine

  step "$engine probe" 60 "$out/probe.log" "$py" - "$engine" <<'EOF'
import importlib, importlib.metadata as md, importlib.util, platform, sys, time, traceback
engine = sys.argv[1]
from integrations.engines_path import ENGINES, use_engines

cuda = use_engines()
import torch, triton

print(f"== {engine}: python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {cuda}"
      + (f": {torch.cuda.get_device_name()}" if cuda else " (device cpu)"))
names = ["transformers", "huggingface_hub", "tokenizers", "safetensors", "pydantic",
         "fastapi", "openai", "aiohttp", "PIL", "requests", "yaml", "numpy", "torchvision",
         "sgl_kernel", "flashinfer", "xgrammar", "llguidance", "tvm_ffi", "zmq", "msgspec"]
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

  if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    note "$(printf '%-14s skipped (no CUDA GPU: it times with CUDA events)' "$engine bench")"
    bench=()
  elif [ "$engine" = vllm ]; then
    # shellcheck disable=SC2206
    bench=("$py" benchmarks/bench_vllm_step.py --out "$out" $run_id ${VLLM_BENCH_ARGS:-})
  else
    # shellcheck disable=SC2206
    bench=("$py" benchmarks/bench_sglang_kit.py --out "$out" $run_id ${SGLANG_BENCH_ARGS:-})
  fi
  # pytest.main under a SIGINT handler of its own: a timed-out run still prints its summary
  # even where the caller started us with SIGINT ignored (background jobs); then os._exit, so
  # that an engine's threads or exit hooks cannot keep a finished run alive past its limit
  # (SGLang's suite once finished in 114 s and was stopped at 124 s while exiting)
  # shellcheck disable=SC2206
  tests=("$py" -c 'import os, signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
rc = pytest.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
os._exit(int(rc))' -q -p no:cacheprovider --tb=short
    -o faulthandler_timeout="${FAULTHANDLER_S:-120}" --durations=10
    tests/integrations/test_engines_installed.py tests/integrations/test_${engine}_*.py
    ${PYTEST_ARGS:-})
  if [ "$engine" = vllm ]; then
    step "vllm pytest" 130 "$out/pytest_vllm.log" "${tests[@]}"
    [ ${#bench[@]} -gt 0 ] && step "vllm bench" 150 "$out/bench.log" "${bench[@]}"
  else
    [ ${#bench[@]} -gt 0 ] && step "sglang bench" 100 "$out/bench.log" "${bench[@]}"
    step "sglang pytest" 160 "$out/pytest_sglang.log" "${tests[@]}"
  fi
done

echo
echo "===== summary (${engines[*]}, $((SECONDS - deadline + budget)) s) ====="
cat "$summary"
for engine in "${engines[@]}"; do
  log=$out/pytest_$engine.log
  [ -f "$log" ] || continue
  grep -E '^(FAILED|ERROR) ' "$log" | sort -u | head -40 | tee -a "$summary"
  last=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -1)
  note "$engine pytest: ${last:-no result line (see $log)}"
done
jsonl=$(ls "$out"/*.jsonl 2>/dev/null | head -1)
[ -n "$jsonl" ] && note "records: $(wc -l < "$jsonl") lines in $jsonl"
exit "$first_rc"
