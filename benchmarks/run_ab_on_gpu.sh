#!/usr/bin/env bash
# Same-run A/B of source trees on sparse MLA cases (GPU): each tree timed by
# `benchmarks/time_revision.py --sparse` in alternating rounds, then each tree's GPU tests,
# then the table (`benchmarks/ab_sparse.py`, the first tree the base).
# Usage: TREES="main=src roll=.carry/trees/roll" benchmarks/run_ab_on_gpu.sh OUT_DIR
#   TREES    NAME=PATH pairs, PATH a tree's `src` (relative to the repository root or
#            absolute); a tree other than this checkout's travels in the git-ignored carry
#            folder (`git archive REV src | tar -x -C .carry/trees/NAME --strip-components=1`)
#   CASES    the cases (default: the 128-head ping-pong set below); KERNEL plan()'s kernel
#            (default: pingpong; "auto" for the plan's choice); REPS rounds (default: 2)
#   TESTS    pytest arguments run against every tree but the first (default: the ping-pong
#            route's float64 tests; empty: none); TEST_WORKERS (default: 6)
#   DENSE    1: also time the dense decode cases (`time_revision.py` without --sparse) in the
#            same alternating rounds, and run DENSE_TESTS (default: the SM90 dense kernels'
#            tests) against every tree but the first: for a change to code both paths share
#   BUDGET   seconds this script may take (default: none). A step starts only while time
#            remains and its timeout is cut to what remains, so that a device call's limit
#            ends it with its tables printed rather than in the middle of a step
# OUT_DIR gets NAME.ROUND.json (and NAME.dense.ROUND.json) for every timing, timing.log and
# tests.log: few files, as a device machine returns a limited number.
set -uo pipefail
out=${1:?usage: TREES="a=src b=PATH" run_ab_on_gpu.sh OUT_DIR}
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p "$out"
py=${PYTHON:-python3}
: "${TREES:?TREES=\"NAME=PATH ...\" names the trees to time}"
cases=${CASES:-B128_H128_K2048_Q2,B128_H128_K2048,B64_H128_K2048,B128_H64_K2048,T2048_H128_K2048}
# (single-quoted apart: quotes inside ${...} of an assignment are removed, splitting -k's words)
route_tests='tests/dsa/test_sparse_sm90.py tests/dsa/test_sparse_mla.py -k "pingpong or far_from_one or grid"'
dense_tests_default='tests/attention/test_kernels.py -k "wgmma or pingpong or fewrows"'
tests=${TESTS-$route_tests}
dense_tests=${DENSE_TESTS-$dense_tests_default}
start=$SECONDS
# the seconds a step may take: its own limit, cut to what remains of BUDGET (0: none remain)
step_limit() {
  local own=$1
  [ -z "${BUDGET:-}" ] && { echo "$own"; return; }
  local left=$((BUDGET - (SECONDS - start)))
  [ "$left" -lt 10 ] && { echo 0; return; }
  [ "$left" -lt "$own" ] && own=$left
  echo "$own"
}
names=() paths=()
for pair in $TREES; do
  name=${pair%%=*} path=${pair#*=}
  [ "$name" != "$pair" ] && [ -n "$name" ] || { echo "TREES: expected NAME=PATH, got $pair"; exit 2; }
  case $path in /*) ;; *) path=$root/$path ;; esac
  [ -d "$path/fp8mla" ] || { echo "TREES: $path holds no fp8mla package"; exit 2; }
  names+=("$name") paths+=("$path")
done
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader 2>/dev/null
files=() dense_files=()
# time_revision.py for tree $1 into $2 with the remaining arguments; the file joins the
# table's list (the array named by $3) when the run succeeds
time_tree() {
  local i=$1 f=$2 limit
  local -n list=$3
  shift 3
  limit=$(step_limit "${TIME_TIMEOUT:-200}")
  if [ "$limit" -eq 0 ]; then
    echo "${names[$i]}: $(basename "$f") skipped (BUDGET spent)"
    return
  fi
  PYTHONPATH=${paths[$i]} timeout "$limit" $py benchmarks/time_revision.py "$@" \
    --label "${names[$i]}" --json "$f" >> "$out/timing.log" 2>&1 \
    && list+=("$f") || echo "${names[$i]}: $(basename "$f") failed (timing.log)"
}
for ((r = 1; r <= ${REPS:-2}; r++)); do
  for i in "${!names[@]}"; do
    echo "== ${names[$i]} round $r" >> "$out/timing.log"
    time_tree "$i" "$out/${names[$i]}.$r.json" files \
      --sparse "$cases" --sparse-kernel "${KERNEL:-pingpong}"
    [ "${DENSE:-0}" = 1 ] && time_tree "$i" "$out/${names[$i]}.dense.$r.json" dense_files
  done
done
workers=()
$py -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-6}")
# pytest arguments $1 against every tree but the first
test_trees() {
  local args=$1 limit
  for i in "${!names[@]}"; do
    [ "$i" -eq 0 ] && continue
    limit=$(step_limit "${TEST_TIMEOUT:-300}")
    if [ "$limit" -eq 0 ]; then
      echo "tests of ${names[$i]} skipped (BUDGET spent): $args" | tee -a "$out/tests.log"
      continue
    fi
    echo "== tests of ${names[$i]}: $args" | tee -a "$out/tests.log"
    eval "set -- $args"
    PYTHONPATH=${paths[$i]} timeout "$limit" $py -m pytest -q -p no:cacheprovider \
      "${workers[@]}" "$@" >> "$out/tests.log" 2>&1
    echo "exit $?; $(tail -1 "$out/tests.log")"
  done
}
[ -n "$tests" ] && test_trees "$tests"
[ "${DENSE:-0}" = 1 ] && [ -n "$dense_tests" ] && test_trees "$dense_tests"
status=0
if [ ${#files[@]} -gt 0 ]; then
  PYTHONPATH=$root/src $py benchmarks/ab_sparse.py "${files[@]}" || status=1
fi
if [ ${#dense_files[@]} -gt 0 ]; then
  echo
  PYTHONPATH=$root/src $py benchmarks/ab_sparse.py "${dense_files[@]}" || status=1
fi
exit $status
