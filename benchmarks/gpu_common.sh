# Sourced by the run_*_on_gpu.sh scripts, from the repository root, after `set -uo pipefail`:
# the environment every GPU run shares and the record of the machine it ran on.
#   py        the Python to run ($PYTHON, default python3)
#   workers   pytest-xdist's arguments when the machine has it (-n $TEST_WORKERS, default
#             $1), else none (the suite's cost is compiling kernels: ~110 s with 6 workers on
#             the H200's host, ~350 s in one process). Each worker holds its own GPU memory:
#             16 workers on an 80 GB H100 ran 11 sparse tests out of it (their 2 GiB pools),
#             which passed with 4
#   gpu_env OUT   GPU, driver, clocks, torch and Triton, printed and written to OUT/env.txt
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
workers=()
$py -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-${1:-6}}")

gpu_env() {
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    $py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  } 2>&1 | tee "$1/env.txt"
}
