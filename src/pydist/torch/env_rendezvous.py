"""torch's ``env://`` rendezvous under mpiexec, srun or submitit, for the pydist backend.

torch's env:// handler (``init_process_group`` with no ``init_method``) reads RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment (rank and world size also from
the URL) and stops at the first one missing. torchrun and pydist-run set them all; mpiexec
(Open MPI, MPICH), srun and submitit's LocalExecutor set their own variables instead.
:func:`install` (run by ``import pydist.torch``, hence at ``import torch`` through the
backend autoload) wraps that handler: for ``init_process_group`` of the pydist backend
(``"pydist"``, or a ``"cpu:pydist,..."`` list naming it), when one of the four is missing
and a launcher's variables are present, the missing ones are set in ``os.environ`` from
pydist's :func:`~pydist.rendezvous.launch_env.launch_info` (what
``pydist.init_process_group()`` with no arguments uses: rank and size from the launcher,
MASTER_ADDR 127.0.0.1 when every rank is on this host or Slurm's first node, MASTER_PORT
derived from the job id), as do LOCAL_RANK and LOCAL_WORLD_SIZE when missing and known;
the pydist logger says at INFO which it set, and from which launcher; then torch's handler
runs. So ``torch.distributed.init_process_group("pydist")`` works under those launchers, as
DeepSpeed's MPI discovery does it.

The variables set are removed again when the rendezvous then fails (a store that cannot be
reached), so a later attempt looks the launcher up anew. What does not change: every other
backend (gloo, NCCL, ...) and a rendezvous outside ``init_process_group`` (its backend
read from that call's frame) get torch's handler alone, and torch's error where a variable
is missing; with the four set (or rank/world size in the URL) nothing is read or set;
without any launcher's variables torch's own error stands. A launcher's variables that
cannot give what is missing (mpiexec across hosts without MASTER_ADDR) raise a ValueError
naming each missing variable and why.

Under pydist-run (PYDIST_RUN_WORKER=1, TORCHELASTIC_USE_AGENT_STORE=True) with a token
(PYDIST_AUTH_TOKEN, which pydist-run sets by default) or TLS (PYDIST_TLS_*), torch's C++
store client would be refused by the workers' store; there the wrapper yields
:class:`~pydist.torch.agent_store.PydistStore` (a torch Store over pydist's authenticated
client) instead of running torch's handler, for every backend (pydist-run is pydist's
launcher: a gloo job under it needs that client too); torch's ``tcp://`` handler is wrapped
alike, for a URL naming MASTER_ADDR:MASTER_PORT (the workers' store).
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..rendezvous.launch_env import MissingLaunchVariables, detect_launcher, launch_info

SCHEME = "env"
#: What torch's env:// handler requires (RANK and WORLD_SIZE unless given in the URL).
TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MARK = "_pydist_wraps"  # the attribute of the installed wrapper that holds torch's handler
_C10D = "torch.distributed.distributed_c10d"  # the module of torch's init_process_group
_log = logging.getLogger("pydist")


def fill_from_launcher(url: str, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set in ``environ`` (default: os.environ) the variables torch's env:// handler needs for
    ``url`` and does not find, from the launcher's; return those set (none when nothing is
    missing or no launcher's variables are present). ValueError when the launcher's
    variables cannot give them, naming each missing variable once."""
    env = os.environ if environ is None else environ
    query = parse_qs(urlparse(url).query)
    given = {"RANK": "rank" in query, "WORLD_SIZE": "world_size" in query}
    missing = [name for name in TORCH_VARIABLES if not given.get(name) and not env.get(name)]
    launcher = detect_launcher(env)
    if not missing or launcher is None:
        return {}
    rank = int(query["rank"][0]) if "rank" in query else None
    world_size = int(query["world_size"][0]) if "world_size" in query else None
    try:
        info = launch_info(rank, world_size, env)
    except MissingLaunchVariables as error:
        raise ValueError("Error initializing torch.distributed using env:// rendezvous: environment variables "
                         "expected, but neither set nor given by the launcher: " + "; ".join(error.missing)) from None
    values = {"RANK": str(info.rank), "WORLD_SIZE": str(info.world_size), "MASTER_ADDR": info.master_addr,
              "MASTER_PORT": str(info.master_port)}
    filled = {name: values[name] for name in missing}
    for name, value in (("LOCAL_RANK", info.local_rank), ("LOCAL_WORLD_SIZE", info.local_world_size)):
        if value is not None and not env.get(name):
            filled[name] = str(value)
    env.update(filled)
    _log.info("env:// rendezvous: set %s from %s's variables", ", ".join(f"{k}={v}" for k, v in filled.items()),
              launcher.title)
    return filled


def requested_backend() -> str | None:
    """The ``backend`` of the ``torch.distributed.init_process_group`` call running in this
    thread (its frame's local), or None outside one."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "init_process_group" and frame.f_globals.get("__name__") == _C10D:
            backend = frame.f_locals.get("backend")
            return None if backend is None else str(backend)
        frame = frame.f_back
    return None


def names_pydist(backend: str | None) -> bool:
    """Whether ``backend`` ("pydist", or a "cpu:pydist,cuda:nccl" list) names the pydist backend."""
    return backend is not None and any(part.split(":")[-1].strip().lower() == "pydist"
                                       for part in backend.split(","))


Handler = Callable[..., Iterator[tuple[Any, int, int]]]


def _env_wrapper(original: Handler) -> Handler:
    def env_rendezvous(url: str, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        filled = fill_from_launcher(url) if names_pydist(requested_backend()) else {}
        from . import agent_store  # lazily: it imports pydist's store

        try:
            handler = agent_store.agent_store_rendezvous if agent_store.applies() else original
            inner = handler(url, **kwargs)
            found = next(inner)
        except BaseException:
            for name in filled:
                os.environ.pop(name, None)
            raise
        yield found
        yield from inner
    return env_rendezvous


def _tcp_wrapper(original: Handler) -> Handler:
    def tcp_rendezvous(url: str, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        from . import agent_store  # lazily: it imports pydist's store

        if agent_store.applies() and agent_store.targets_workers_store(url):
            return agent_store.agent_store_rendezvous(url, **kwargs)
        return original(url, **kwargs)
    return tcp_rendezvous


def install() -> None:
    """Wrap torch's registered env:// and tcp:// handlers (idempotent; see the module docstring)."""
    from torch.distributed.rendezvous import _rendezvous_handlers

    handlers: dict[str, Handler] = _rendezvous_handlers
    for scheme, wrap in ((SCHEME, _env_wrapper), ("tcp", _tcp_wrapper)):
        original = handlers.get(scheme)
        if original is None or getattr(original, _MARK, None) is not None:
            continue
        wrapper = wrap(original)
        setattr(wrapper, _MARK, original)
        handlers[scheme] = wrapper  # register_rendezvous_handler refuses a scheme already registered


def torch_handler(scheme: str = SCHEME) -> Handler | None:
    """torch's own handler of ``scheme`` (env://), under the wrapper if installed (None if torch has none)."""
    from torch.distributed.rendezvous import _rendezvous_handlers

    handler = _rendezvous_handlers.get(scheme)
    return getattr(handler, _MARK, handler)
