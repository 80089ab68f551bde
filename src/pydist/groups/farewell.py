"""What a process says to its peers when it ends without destroy_process_group.

Every world that joins with a transport is tracked here (``track``, which also starts
core.exit_cause's recording). At interpreter exit (api.init) ``at_exit`` has each world still
joined (the process's own, and the torch plugin's: its default group's, which its new_groups
share, and any native private one pydist.torch.placement made; torch releases none of them
at exit) tell its peers why this process is ending (``say_goodbye``): the failure that ends
it, so that they name this rank as failed with its exception, or that it exited without
destroy_process_group. A world left before (destroy_process_group) says nothing more: its
goodbye already read as a shutdown.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..core import exit_cause

if TYPE_CHECKING:
    from .world import World

_joined: weakref.WeakSet[World] = weakref.WeakSet()


def track(world: World) -> None:
    """``world`` joined over a transport: it says goodbye at exit unless left before."""
    exit_cause.watch()
    _joined.add(world)


def say_goodbye(world: World, cause: str | None) -> None:
    """Tell ``world``'s peers that this process ends with ``cause`` (None: no failure seen);
    best effort (a peer already gone misses it), nothing when the world has no transport."""
    if world.transport is not None:
        world.transport.announce_exit(cause)


def at_exit() -> None:
    """Every tracked world still joined says goodbye with the cause recorded (exit_cause.cause)."""
    cause = exit_cause.cause()
    for world in list(_joined):
        try:
            say_goodbye(world, cause)
        except Exception:  # noqa: BLE001 - the process is ending; one world's failure must not stop the others
            pass
