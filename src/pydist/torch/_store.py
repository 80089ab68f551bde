"""torch's store as pydist's transport uses it.

The transport waits on the store in short polls and tells a timeout (poll again) from other
failures by pydist's DistStoreError; torch's stores raise torch.distributed.DistStoreError,
which is not one. ``TorchStore`` forwards every call and raises pydist's class instead
(the torch error as its cause), so a rank arriving late to a group's first shared-memory
collective is waited for instead of failing the first poll.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as tdist

from ..core.errors import DistStoreError


class TorchStore:
    """Wraps a torch store; every method call maps torch's DistStoreError to pydist's."""

    def __init__(self, store: Any):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except tdist.DistStoreError as error:
                raise DistStoreError(str(error)) from error
        return call
