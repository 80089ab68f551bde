"""torch's store as pydist's transport uses it.

pydist tells a store's timeout from its other failures by pydist's DistStoreError; torch's
stores raise torch.distributed.DistStoreError, which is not one. ``TorchStore`` forwards
every call and raises pydist's class instead (the torch error as its cause). ``prefixed``
gives a namespace of it (torch's PrefixStore), as pydist's PrefixStore does for pydist's stores.

A loop must not poll this store with short ``wait`` calls: torch's TCPStore client logs two
warnings ("waitForInput ... likely a timeout", "... timed out after") each time one of its
waits expires. ``check`` logs nothing; a wait that ends because its keys came logs nothing
(see transport/shm/sharing.py, which waits for a late rank this way).
"""
from __future__ import annotations

from typing import Any

import torch.distributed as tdist

from ..core.errors import DistStoreError


class TorchStore:
    """Wraps a torch store; every method call maps torch's DistStoreError to pydist's."""

    def __init__(self, store: Any, underlying: TorchStore | None = None):
        self._store = store
        self._underlying = underlying

    def prefixed(self, prefix: str) -> TorchStore:
        """A namespace of this store: every key ``k`` is ``prefix/k`` in it."""
        return TorchStore(tdist.PrefixStore(prefix, self._store), underlying=self)

    @property
    def underlying_store(self) -> TorchStore | None:
        """The store this namespace was made of (``prefixed``); None for one that was not."""
        return self._underlying

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
