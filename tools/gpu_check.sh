#!/bin/sh
# make gpu-check: the GPU checks of issue 47 item 6 in one call (tools/gpu_check.py), from the
# source tree, no venv (the machine's own python3 with torch, numpy and pytest). Without a CUDA
# GPU it says so in one line and exits 0; on one it prints a row per check and writes the
# table to $OUT/gpu-check.md (or build/gpu-check.md). Exit status 0 when no check failed.
cd "$(dirname "$0")/.." || exit 2
PYTHONPATH=src exec "${PYTHON:-python3}" tools/gpu_check.py "$@"
