"""Programs the tests run as scripts (``python tests/run_scripts/worker.py``, under a launcher
or mpiexec) and harnesses they import as ``run_scripts.<name>`` (robust_ranks, shrink_ranks)."""
