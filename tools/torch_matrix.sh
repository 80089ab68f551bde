#!/bin/sh
# make torch-matrix: the plugin's torch tests against each torch release of TORCH_VERSIONS, one
# venv per release (.venv-torch-<version>, made once, kept), then a table of passes and failures.
#
# Only PyPI (and this machine's local wheels) can be reached: PyPI's Linux torch wheels are the
# CUDA builds, whose libtorch_cuda.so links cuDNN, cuBLAS, NCCL... at import, so each venv gets
# torch with its nvidia-* dependencies (no way around them without a CPU index): about 90 s and
# 4.7 GB a release here; a "+cpu" wheel lying on the machine (2.13.0) needs none of them.
# The tests run on this tree's src/ (PYTHONPATH; the venv's pip install -e . --no-deps gives torch
# the torch.backends entry point). A release's full log is build/torch-matrix/<version>.log.
# Exit status: 0 when every release passed.
set -u
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
VERSIONS=${TORCH_VERSIONS:-"2.8.0 2.11.0 2.13.0 2.14.1"}
TESTS=${TORCH_MATRIX_TESTS:-"tests/test_torch_*.py tests/test_store_torch_protocol.py"}
LOGS=build/torch-matrix
mkdir -p "$LOGS"
table="$LOGS/table"
printf "%-8s %7s %7s %7s %7s %8s %9s\n" torch passed failed errors skipped test_s install_s >"$table"
status=0
for version in $VERSIONS; do
    venv=.venv-torch-$version
    install_s=-
    if [ ! -f "$venv/.installed" ]; then
        start=$(date +%s)
        rm -rf "$venv"
        if ! { $PYTHON -m venv "$venv" &&
               "$venv/bin/pip" install --quiet "torch==$version" numpy pytest pytest-timeout hypothesis \
                   expecttest cryptography &&
               "$venv/bin/pip" install --quiet --no-deps -e .; } >"$LOGS/$version.install.log" 2>&1; then
            echo "torch-matrix: installing torch $version failed (see $LOGS/$version.install.log)"
            printf "%-8s %s\n" "$version" "install failed" >>"$table"
            status=1
            continue
        fi
        touch "$venv/.installed"
        install_s=$(( $(date +%s) - start ))
        echo "torch-matrix: torch $version installed in ${install_s} s, $(du -sh "$venv" | cut -f1)"
    fi
    start=$(date +%s)
    # shellcheck disable=SC2086 # TESTS is a list of globs
    PYTHONPATH=src PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -m pytest -q -rfE $TESTS >"$LOGS/$version.log" 2>&1 || status=1
    test_s=$(( $(date +%s) - start ))
    summary=$(tail -n 1 "$LOGS/$version.log")
    count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE "[0-9]+" || echo 0; }
    printf "%-8s %7s %7s %7s %7s %8s %9s\n" "$version" "$(count passed)" "$(count failed)" "$(count error)" \
        "$(count skipped)" "$test_s" "$install_s" >>"$table"
    echo "torch-matrix: torch $version: $summary"
    grep -E "^(FAILED|ERROR) " "$LOGS/$version.log" | cut -c1-160
done
echo
cat "$table"
exit $status
