"""Key-value stores for rendezvous and coordination, as torch.distributed has them.

``HashStore`` (in-process), ``FileStore`` (a shared file), ``TCPStore`` (served over TCP by
the master rank) and ``PrefixStore`` (a key namespace over another store), all with the
API of the abstract :class:`Store`.
"""
from ._base import Store
from .file import FileStore
from .hash import HashStore
from .prefix import PrefixStore
from .tcp import TCPStore

__all__ = ["Store", "HashStore", "FileStore", "TCPStore", "PrefixStore"]
