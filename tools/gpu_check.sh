#!/bin/sh
# make gpu-check: every test marked gpu, on a GPU machine, from the source tree (no venv:
# the machine's own python3 with torch and pytest; PYTHONPATH=src). Prints the machine, one
# line per test (PASSED / FAILED / SKIPPED and why), then tools/gpu_bench.py's table.
# Exit status: 0 when the tests and the benchmark both succeeded.
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
$PY - <<'PYEOF'
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}, "
      f"{torch.cuda.device_count()} device(s)")
PYEOF
log=$(mktemp)
PYTHONPATH=src timeout 600 $PY -m pytest -m gpu -o addopts="" -p no:cacheprovider -q -rA \
    tests/test_torch_gpu.py >"$log" 2>&1
status=$?
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|error" "$log" || cat "$log"
rm -f "$log"
echo "gpu-check: time per call, pydist's group beside gloo against gloo (tools/gpu_bench.py)"
PYTHONPATH=src timeout 300 $PY tools/gpu_bench.py --sizes 4,64K,1M,16M,64M --iters 10 || status=1
exit $status
