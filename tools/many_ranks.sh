#!/bin/sh
# Issue 40's rows for a machine with many cores (the GPU machine has 16): the start-up
# transient at 8 and 16 ranks (tools/transient.py: the slowest rank's us per call for calls
# 1 / 2-10 / 11-50 / 51-100 / 101-300), then pydist-bench all_reduce at 16 ranks beside MPICH
# when mpi4py is importable (else beside gloo). From the source tree, no venv:
#     PYTHON=python3 sh tools/many_ranks.sh        (17 s on the 2-core VM)
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
export PYTHONPATH=src PYDIST_AUTH_TOKEN=${PYDIST_AUTH_TOKEN:-many-ranks-check-0123456789abcdef}
echo "many-ranks: $(nproc) cores, $(uname -r)"
status=0
for ranks in 8 16; do
    timeout 240 $PY tools/transient.py --no-counters --ranks "$ranks" --runs 3 || status=1
done
if $PY -c "import mpi4py" 2>/dev/null; then compare=mpi; else compare=gloo; fi
timeout 300 $PY -m pydist.bench --op all_reduce --nproc 16 --sizes 4,1K,64K,1M,16M --iters 30 --warmup 5 \
    --compare "$compare" || status=1
exit $status
