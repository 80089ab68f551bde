"""torch Work objects over pydist's Work.

``PydistWork`` subclasses ``torch.distributed.Work``: ``wait`` re-raises pydist's error,
``get_future`` returns a torch Future resolving to the output tensors (failing, as torch's
own futures do, with a RuntimeError that names pydist's error), and
``_source_rank`` reports the sender of a receive from any source (what torch's ``recv``
asks for). The future is set on pydist's callback runner, so its ``then`` callbacks may
wait on other collectives of the same group (torch's PowerSGD hook does), as on gloo.
``end_record_when_done`` ends a torch profiler record when the work completes, on the
callback runner (never in the issuing thread: the profiler marks the event asynchronous);
``wait`` returns once it has ended, so a profiler stopped right after sees the event. For
CUDA tensors (pydist's device engine: pydist.groups.device_work) ``wait`` and
``synchronize`` make the caller's current stream wait, and the future is stream-aware
(``torch.futures.Future(devices=...)``): it is set where the setting thread's stream waits
for the call, so its ``wait`` and ``value`` order the reader's stream after it, as NCCL's.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist

from ..groups.callbacks import RUNNER
from ..groups.device_work import DeviceWork
from ..groups.work import Work


class PydistWork(tdist.Work):
    """A torch Work completed by one or more pydist Works."""

    _works: list[Work] | tuple[()] = ()  # (defaults for FinishedWork, which sets none of them)
    _after: Callable[[], None] | None = None
    _future: torch.futures.Future | None = None
    _profiled = False

    def __init__(self, works: Work | list[Work] | None, outputs: list[Any],
                 after: Callable[[], None] | None = None):
        super().__init__()
        self._works = [] if works is None else works if isinstance(works, list) else [works]
        self._outputs = outputs
        self._after = after
        self._lock = threading.Lock()  # guards _after (wait and the future may both finish) and the countdown
        self._future: torch.futures.Future | None = None
        self._profiled = False  # the future ends a profiler record; wait() waits for it

    @classmethod
    def all_of(cls, works: list[Work], outputs: list[Any]) -> PydistWork:
        return cls(works, outputs)

    def _finish(self, timeout: float | None = None) -> None:
        """Wait for every part (within ``timeout`` seconds each, if given), then run ``after`` once."""
        for work in self._works:
            work.wait(timeout)
        if self._after is not None:
            with self._lock:
                after, self._after = self._after, None
                if after is not None:
                    after()

    def wait(self, timeout=None) -> bool:
        self._finish(timeout if timeout else None)
        if self._profiled:
            assert self._future is not None
            self._future.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self):
        return next((work.exception() for work in self._works if work.exception() is not None), None)

    def result(self) -> list[Any]:
        self.wait()
        return self._outputs

    def _source_rank(self) -> int:
        source = self._works[-1].source_rank() if self._works else None
        return -1 if source is None else source

    source_rank = _source_rank

    def synchronize(self) -> None:
        """Device work: the current stream waits for it (CPU work: nothing to synchronise)."""
        for work in self._works:
            if isinstance(work, DeviceWork):
                work.synchronize()

    def _devices(self) -> list[str]:
        """The CUDA devices of the parts' tensors (none for CPU work)."""
        return sorted({str(work.torch_device) for work in self._works
                       if isinstance(work, DeviceWork) and work.torch_device is not None})

    def get_future(self) -> torch.futures.Future:
        """A torch Future set (on pydist's callback runner) when every part is done."""
        if self._future is None:
            source: torch.futures.Future = torch.futures.Future(devices=self._devices() or None)
            self._future = _failing_in_cpp(source)
            self._set_when_done(source)
        return self._future

    def end_record_when_done(self, record: Any) -> None:
        """End the profiler ``record`` (from ``_record_function_with_args_enter``) when every
        part is done; the future then resolves once the record has ended."""
        assert self._future is None, "end_record_when_done before any get_future"
        source: torch.futures.Future = torch.futures.Future(devices=self._devices() or None)
        # attached before completion can be set: a callback added to a done future runs here
        self._future = torch.ops.profiler._call_end_callbacks_on_jit_fut(record, _failing_in_cpp(source))
        self._profiled = True
        self._set_when_done(source, hop=True)

    def _set_when_done(self, future: torch.futures.Future, hop: bool = False) -> None:
        """Set ``future`` when every part is done; ``hop``: on the callback runner even when
        the parts are already done (else it is set at once, in the calling thread)."""
        remaining = [len(self._works)]

        def settle() -> None:
            try:
                self._finish()
            except BaseException as error:  # noqa: BLE001 - delivered through the future
                future.set_exception(error)
            else:
                future.set_result(self._outputs)

        def complete() -> None:
            if hop:
                RUNNER.run(settle)
            else:
                settle()

        def one_done(_work: Work) -> None:
            with self._lock:  # parts may complete on different runner threads
                remaining[0] -= 1
                if remaining[0]:
                    return
            complete()

        if not self._works:
            complete()
        for work in self._works:
            work.add_done_callback(one_done)


class FinishedWork(PydistWork):
    """The Work of a call that had run, and succeeded, when it was returned (a blocking call
    whose Work torch keeps: see calls.torch_work): a PydistWork of no parts (the class defaults:
    done at once, its future set with the outputs), made without PydistWork's lock."""

    def __init__(self, outputs: list[Any]):
        tdist.Work.__init__(self)
        self._outputs = outputs


def _failing_in_cpp(source: torch.futures.Future) -> torch.futures.Future:
    """A future that takes ``source``'s value, or fails where torch's C++ reads it (DDP's
    reducer) when ``source`` was given an exception: torch's Python ``set_exception`` stores
    the exception as the value, an error only to Python readers; a ``then`` callback that
    raises sets the C++ error."""
    return source.then(_value_of)


def _value_of(future: torch.futures.Future) -> Any:
    return future.value()  # raises the exception that set_exception stored
