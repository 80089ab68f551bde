"""Loaded first by every Python worker pydist-run starts (this directory leads PYTHONPATH).

Records an uncaught exception, or a ``sys.exit`` with a failing status, in
$TORCHELASTIC_ERROR_FILE in the format of torch's ``@record`` (so the launcher reports its
type, message and traceback without any decorator in user code) at the moment it happens,
with that time (``pydist_wall_time``): the launcher names the first failure by when it
happened, not by when its process ended. Then imports the sitecustomize this one shadows.

Two uncaught exceptions are recorded but not printed, because the launcher says them once for
the whole job: a KeyboardInterrupt (a worker gets SIGINT only from the launcher, which prints
"got SIGINT"), and a pydist configuration error (``pydist.core.errors.ConfigurationError``:
a variable, an interface name), flagged ``pydist_configuration`` in the record, which the
launcher prints as one paragraph.
"""
import json
import os
import sys
import time
import traceback


def _write(path: str, message: str, callstack: str, configuration: bool = False) -> bool:
    """Write the error file unless it exists (torch's @record may have written it already);
    True if it was written here."""
    try:
        if os.path.exists(path):
            return False
        now = time.time()
        data = {"message": {"message": message, "extraInfo": {
            "py_callstack": callstack, "timestamp": str(int(now)), "pydist_wall_time": now,
            "pydist_configuration": configuration}}}
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as out:  # then renamed: the launcher never reads half a file
            json.dump(data, out)
        os.replace(partial, path)
        return True
    except Exception:  # the report is best effort; the failure itself goes on
        return False


def _is_configuration_error(kind: type) -> bool:
    return any(base.__name__ == "ConfigurationError" and base.__module__ == "pydist.core.errors"
               for base in kind.__mro__)


def _record_uncaught_exceptions(path: str) -> None:
    previous_hook, previous_exit = sys.excepthook, sys.exit

    def hook(kind, value, tb):
        configuration = _is_configuration_error(kind)
        written = _write(path, f"{kind.__name__}: {value}", "".join(traceback.format_exception(kind, value, tb)),
                         configuration)
        if issubclass(kind, KeyboardInterrupt) or (configuration and written):
            return  # the launcher says it, once for the job
        previous_hook(kind, value, tb)

    def exit(status=None):  # noqa: A001 - replaces sys.exit
        if status not in (None, 0):
            _write(path, f"SystemExit: {status}", "".join(traceback.format_stack()[:-1]))
        previous_exit(status)

    sys.excepthook = hook
    sys.exit = exit


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
