"""The device layer's failure: which call failed, on which rank and which device."""
from __future__ import annotations

from ..core.errors import DistBackendError


class DeviceError(DistBackendError):
    """A device call failed or was refused (a CUDA error, a broken IPC rule, memory in use).

    ``call`` is the operation (``cudaIpcOpenMemHandle``, ``close``...), ``where`` the rank and
    device that made it (``rank 1, cuda:0``); both lead the message.
    """

    def __init__(self, call: str, where: str, message: str):
        super().__init__(f"{call} on {where}: {message}")
        self.call = call
        self.where = where
