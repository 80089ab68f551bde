"""Loaded first by every Python worker pydist-run starts (this directory leads PYTHONPATH).

Records an uncaught exception in $TORCHELASTIC_ERROR_FILE in the format of torch's
``@record`` (so the launcher reports its type, message and traceback without any
decorator in user code), then imports the sitecustomize this one shadows, if any.
"""
import json
import os
import sys
import time
import traceback


def _record_uncaught_exceptions(path: str) -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            if not os.path.exists(path):  # torch's @record may have written it already
                data = {"message": {"message": f"{kind.__name__}: {value}", "extraInfo": {
                    "py_callstack": "".join(traceback.format_exception(kind, value, tb)),
                    "timestamp": str(int(time.time()))}}}
                with open(path, "w") as out:
                    json.dump(data, out)
        except Exception:  # the report is best effort; the exception itself goes on
            pass
        previous(kind, value, tb)

    sys.excepthook = hook


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if os.environ.get("TORCHELASTIC_ERROR_FILE"):
    _record_uncaught_exceptions(os.environ["TORCHELASTIC_ERROR_FILE"])
_chain_next_sitecustomize()
