"""The choices a torch group of the "pydist" backend is made with: its engine and where its
CUDA tensors go.

``pg_options=pydist.torch.Options("mpi")``, ``pg_options="mpi"`` or the environment variable
PYDIST_BACKEND=mpi run the group on pydist's MPI backend instead of the native one (under
mpiexec); ``Options(cuda=...)`` or PYDIST_CUDA name the torch backend of its CUDA tensors
where the backend string names none. A new_group without pg_options follows the latest
default group (``remember_default``).
"""
from __future__ import annotations

from typing import Any

from ..core.settings import settings

ENGINES = ("pydist", "mpi")
CUDA_CHOICES = ("pydist", "gloo", "nccl")
_default: dict[str, str] = {}  # the latest default group's engine and cuda choice, followed by its new_groups


class Options:
    """torch's ``pg_options`` for the "pydist" backend: ``engine`` is "pydist" (native) or "mpi";
    ``cuda`` the backend of CUDA tensors where the backend string names none: "gloo" or "nccl"
    (a torch backend the group makes beside pydist) or "pydist"; None: PYDIST_CUDA."""

    def __init__(self, engine: str = "pydist", cuda: str | None = None):
        self.engine = _check_engine(engine, "Options(engine)")
        if cuda is not None and (not isinstance(cuda, str) or cuda.lower() not in CUDA_CHOICES):
            raise ValueError(f"Options(cuda): expected one of {', '.join(CUDA_CHOICES)} or None, got {cuda!r}")
        self.cuda = cuda.lower() if cuda is not None else None

    def __repr__(self) -> str:
        return f"pydist.torch.Options({self.engine!r}, cuda={self.cuda!r})"


def _check_engine(name: Any, what: str) -> str:
    if not isinstance(name, str) or name.lower() not in ENGINES:
        raise ValueError(f"{what}: {name!r} is not a pydist backend; expected one of {', '.join(ENGINES)}")
    return name.lower()


def engine_of(options: Any, default_group: bool) -> str:
    """The engine a group runs on: its ``pg_options``, else (a new_group) the default group's,
    else PYDIST_BACKEND, else the native one. ValueError/TypeError for options it cannot read."""
    if isinstance(options, Options):
        return options.engine
    if isinstance(options, str):
        return _check_engine(options, "pg_options")
    if options is not None:
        raise TypeError(f"pg_options: expected pydist.torch.Options or a backend name, got {type(options).__name__}")
    if not default_group and "engine" in _default:
        return _default["engine"]
    return settings().backend


def cuda_choice(options: Any, default_group: bool) -> str:
    """The backend of a group's CUDA tensors where its backend string names none: its
    ``pg_options``, else (a new_group) the default group's, else PYDIST_CUDA."""
    if isinstance(options, Options) and options.cuda is not None:
        return options.cuda
    if not default_group and "cuda" in _default:
        return _default["cuda"]
    return settings().cuda


def remember_default(engine: str, cuda: str) -> None:
    """A default group was made with these: its new_groups without pg_options follow them."""
    _default.update(engine=engine, cuda=cuda)
