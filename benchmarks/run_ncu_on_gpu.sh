#!/usr/bin/env bash
# Nsight Compute on one sparse MLA case's kernel (GPU): where its warps wait, by SASS loop
# (`benchmarks/ncu_stalls.py`), with the kernel's duration, issue-slot use and memory
# throughput, for each case named.
# Usage: benchmarks/run_ncu_on_gpu.sh OUT_DIR [CASE ...]   (default: B128_H128_K2048_Q2)
#   KERNEL   plan()'s sparse route (default: pingpong); KREGEX the kernel name's pattern for
#            ncu (default: mla_pingpong); TREE a tree's `src` to profile instead of this one
#   TOP      instructions listed a case (default: 20); NCU_TIMEOUT seconds a case (default: 150)
# OUT_DIR gets CASE.ncu.log and CASE.sass.csv.gz a case (the report itself is removed: large).
set -uo pipefail
out=${1:?usage: run_ncu_on_gpu.sh OUT_DIR [CASE ...]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$out"
py=${PYTHON:-python3}
tree=${TREE:-$PWD/src}
export PYTHONPATH=$tree
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 2; }
status=0
for case in "${@:-B128_H128_K2048_Q2}"; do
  echo "== $case ($tree, kernel ${KERNEL:-pingpong})"
  rep=$out/$case
  timeout "${NCU_TIMEOUT:-150}" "$ncu" --clock-control none -k "regex:${KREGEX:-mla_pingpong}" \
    --launch-skip 2 -c 1 --set full --import-source no -o "$rep" \
    $py benchmarks/profile_case.py --sparse "$case" --kernel "${KERNEL:-pingpong}" \
    > "$rep.ncu.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -f "$rep.ncu-rep" ]; then
    echo "ncu exit $rc (no report): $(tail -2 "$rep.ncu.log")"
    status=1
    continue
  fi
  "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv"
  $py benchmarks/ncu_stalls.py "$rep.sass.csv" --top "${TOP:-20}"
  "$ncu" --import "$rep.ncu-rep" --page details --csv 2>/dev/null \
    | grep -E '"(Duration|Issue Slots Busy|No Eligible|DRAM Throughput|Registers Per Thread)"' \
    | awk -F'","' '{gsub(/"/, "", $NF); print "  " $(NF-2) " " $NF " " $(NF-1)}'
  gzip -f "$rep.sass.csv"
  rm -f "$rep.ncu-rep"
done
exit $status
