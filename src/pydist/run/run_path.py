"""``python -m pydist.run.run_path SCRIPT [ARGS]``: run SCRIPT with ``runpy.run_path`` as
``__main__`` (what ``pydist-run --run-path`` starts in every worker, as torchrun does)."""
import runpy
import sys

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
