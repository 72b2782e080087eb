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
# OUT_DIR gets NAME.ROUND.json for every timing, timing.log and tests.log: few files, as a
# device machine returns a limited number.
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
tests=${TESTS-$route_tests}
names=() paths=()
for pair in $TREES; do
  name=${pair%%=*} path=${pair#*=}
  [ "$name" != "$pair" ] && [ -n "$name" ] || { echo "TREES: expected NAME=PATH, got $pair"; exit 2; }
  case $path in /*) ;; *) path=$root/$path ;; esac
  [ -d "$path/fp8mla" ] || { echo "TREES: $path holds no fp8mla package"; exit 2; }
  names+=("$name") paths+=("$path")
done
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
files=()
for ((r = 1; r <= ${REPS:-2}; r++)); do
  for i in "${!names[@]}"; do
    f=$out/${names[$i]}.$r.json
    echo "== ${names[$i]} round $r" >> "$out/timing.log"
    PYTHONPATH=${paths[$i]} timeout "${TIME_TIMEOUT:-200}" $py benchmarks/time_revision.py \
      --sparse "$cases" --sparse-kernel "${KERNEL:-pingpong}" --label "${names[$i]}" \
      --json "$f" >> "$out/timing.log" 2>&1 && files+=("$f") \
      || echo "${names[$i]} round $r failed (timing.log)"
  done
done
workers=()
$py -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-6}")
if [ -n "$tests" ]; then
  for i in "${!names[@]}"; do
    [ "$i" -eq 0 ] && continue
    echo "== tests of ${names[$i]}" | tee -a "$out/tests.log"
    eval "set -- $tests"
    PYTHONPATH=${paths[$i]} timeout "${TEST_TIMEOUT:-300}" $py -m pytest -q -p no:cacheprovider \
      "${workers[@]}" "$@" >> "$out/tests.log" 2>&1
    echo "exit $?; $(tail -1 "$out/tests.log")"
  done
fi
[ ${#files[@]} -gt 0 ] && PYTHONPATH=$root/src $py benchmarks/ab_sparse.py "${files[@]}"
