"""The Work of an async collective on device tensors, with NCCL's stream semantics.

Behaviour
    A device call with ``async_op=True`` runs in two parts: the host part (the group's queue
    runs it: barriers with the peers, work enqueued on the group's stream, an end event
    recorded after it) and the device part (that work, running on the device). ``wait()``
    waits for the host part only (within ``timeout``, re-raising its error), then makes the
    waiting thread's *current stream* wait for the end event: the CPU does not wait for the
    device, and work the caller enqueues after ``wait()`` sees the results (torch >= 2.8's
    ProcessGroupNCCL). ``synchronize()`` is the same. The call's tensors stay referenced until
    ``wait()`` (and their memory is kept from reuse until the group's stream is past them,
    whatever the caller does: ``Device.keep_alive``). ``is_completed()`` says whether the
    device part is done too. ``get_future()``: a Future set with the output tensors once the
    device part is done (a callback thread waits for the end event, within the call's
    deadline); torch's plugin makes its own stream-aware torch Future instead
    (``torch.futures.Future(devices=...)``, pydist.torch.work).

Failure modes
    The host part's error is raised by ``wait`` and set on the future; a device error or a
    dead peer while the callback thread waits for the end event is set on the future.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..core.deadline import Deadline
from .callbacks import RUNNER
from .work import Work

#: How long a future's callback thread waits for the device part (beyond it: the error).
FUTURE_SECONDS = 1800.0


class DeviceWork(Work):
    """An async device call's Work (module docstring): ``host`` is the group's Work of the host
    part; ``plan`` (engines.device.StreamPlan) holds the end event and the arrays. Every
    method of Work is answered from them."""

    def __init__(self, host: Work, device: Any, plan: Any, outputs: list[Any], timeout: float | None = None):
        """``timeout``: how long ``wait()`` without one waits (None: as the host Work, unbounded)."""
        super().__init__(host.description, outputs)
        self.host = host
        self.timeout = timeout
        self.device = device
        self.plan = plan
        self.outputs = outputs
        self.description = host.description
        self._future: concurrent.futures.Future | None = None

    @property
    def torch_device(self) -> Any:
        """The torch device of the call's tensors (None for the stand-in)."""
        return getattr(self.device, "torch_device", None)

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Wait for the host part, then make the current stream wait for the device part."""
        self.host.wait(self.timeout if timeout is None else timeout)
        self._stream_waits()
        return True

    def synchronize(self) -> None:
        """The current stream waits for the device part (the host part first, as ``wait``)."""
        self.wait()

    def _stream_waits(self) -> None:
        end = self.plan.end
        if end is not None:
            self.device.current_stream().wait_event(end)
        self.plan.arrays = []

    def is_completed(self) -> bool:
        """Whether both parts are done (never waits)."""
        end = self.plan.end
        return self.host.is_completed() and (end is None or self.host.exception() is not None or end.query())

    def is_success(self) -> bool:
        return self.is_completed() and self.host.is_success()

    def exception(self) -> BaseException | None:
        return self.host.exception()

    def result(self) -> list[Any]:
        self.wait()
        return self.outputs

    def source_rank(self) -> int | None:
        return self.host.source_rank()

    def add_done_callback(self, callback: Callable[[Work], None]) -> None:
        """Call ``callback(self)`` once the host part is done."""
        self.host.add_done_callback(lambda _work: callback(self))

    def get_future(self) -> concurrent.futures.Future:
        """A Future of the output tensors, set once the device part is done."""
        if self._future is None:
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._future = future

            def settle(_work: Work) -> None:
                RUNNER.run(lambda: self._settle(future))
            self.host.add_done_callback(settle)
        return self._future

    def _settle(self, future: concurrent.futures.Future) -> None:
        try:
            self.host.wait()
            end = self.plan.end
            if end is not None:
                end.synchronize(Deadline.after(FUTURE_SECONDS), f"{self.description} on the device")
        except BaseException as error:  # noqa: BLE001 - delivered through the future
            future.set_exception(error)
        else:
            future.set_result(self.outputs)

    def __repr__(self) -> str:
        return f"<DeviceWork {self.description} {'done' if self.is_completed() else 'pending'}>"
