"""torch.distributed's debug level: ``DebugLevel`` (OFF, INFO, DETAIL), ``get_debug_level()``,
``set_debug_level(level)`` and ``set_debug_level_from_env()``.

As in torch 2.13 the level is one per process, read from ``TORCH_DISTRIBUTED_DEBUG`` when
pydist is imported (so importing pydist with an invalid value raises ValueError, as importing
torch.distributed does) and again at each ``set_debug_level_from_env()``; unset means OFF.

DETAIL makes the flight recorder of groups created from then on note each call's file and
line (as ``PYDIST_DEBUG=detail`` does). What torch's DETAIL also turns on, a check that every
rank called the same collective with the same dtype and size, pydist always does (call
fingerprints, raising DesyncError).
"""
from __future__ import annotations

import enum
import os

from ..debug.recorder import set_call_sites

#: The variable torch reads (its values are case-insensitive).
VARIABLE = "TORCH_DISTRIBUTED_DEBUG"


class DebugLevel(enum.Enum):
    """torch.distributed.DebugLevel: OFF (0), INFO (1), DETAIL (2). As torch's, a level
    converts to int (``int(level)``, ``DebugLevel(2)``) but is neither equal to nor ordered
    with ints."""

    OFF = 0
    INFO = 1
    DETAIL = 2

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


_level = DebugLevel.OFF


def get_debug_level() -> DebugLevel:
    """The debug level of this process."""
    return _level


def set_debug_level(level: DebugLevel) -> None:
    """Set the debug level of this process (a ``DebugLevel``; TypeError for anything else,
    as torch's)."""
    global _level
    if not isinstance(level, DebugLevel):
        raise TypeError(f"set_debug_level: expected a pydist.DebugLevel (OFF, INFO or DETAIL), "
                        f"got {type(level).__name__} {level!r}")
    _level = level
    set_call_sites(level is DebugLevel.DETAIL)


def set_debug_level_from_env() -> None:
    """Set the debug level from ``TORCH_DISTRIBUTED_DEBUG``: OFF, INFO or DETAIL in any case;
    unset means OFF; any other value (the empty one too, as in torch) raises ValueError."""
    text = os.environ.get(VARIABLE)
    level = DebugLevel.OFF if text is None else DebugLevel.__members__.get(text.upper())
    if level is None:
        raise ValueError(f"The value of {VARIABLE} must be OFF, INFO, or DETAIL; got {text!r}.")
    set_debug_level(level)


set_debug_level_from_env()
