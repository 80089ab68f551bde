"""What each backend's workers run: connecting, and one zero-argument call per operation.

A Comm exposes ``rank``, ``size``, ``barrier()``, ``max_across_ranks(values)`` (element-wise
maximum of a float64 numpy array over all ranks), ``call(op, inp, out)`` (a closure running
the operation once on preallocated numpy buffers; ``out`` is None for in-place ops) and
``close()``. :class:`TorchStyleComm` drives a ``torch.distributed``-like module — pydist
itself, or torch with gloo — through its public API exactly as a user calls it;
:class:`MpiComm` drives mpi4py's buffer methods (Allreduce, Allgather, ...). The
``connect_*`` functions join the group of the current process (rendezvous from the
environment: MASTER_ADDR/PORT, RANK, WORLD_SIZE, else the launcher's own variables as
pydist's env:// reads them, e.g. mpiexec's PMI_RANK; or MPI under mpiexec). torch and mpi4py
are imported only inside the functions that need them.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np

Call = Callable[[], Any]


def ping_pong(rank: int, send: Callable[[int], Any], recv: Callable[[int], Any]) -> Call:
    """Rank 0 sends to rank 1 and waits for the reply; rank 1 echoes; other ranks idle."""
    if rank == 0:
        return lambda: (send(1), recv(1))
    if rank == 1:
        return lambda: (recv(0), send(0))
    return lambda: None


class TorchStyleComm:
    """A torch.distributed-like ``dist`` module; ``wrap`` turns numpy buffers into its tensors
    (``host_wrap``: for the timings, which stay on the host); ``sync``, when set, follows each
    call (a device's stream: .devices)."""

    def __init__(self, dist: Any, wrap: Callable[[np.ndarray], Any] = lambda array: array) -> None:
        self.dist, self.wrap, self.host_wrap = dist, wrap, wrap
        self.sync: Callable[[], Any] | None = None
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def barrier(self) -> None:
        self.dist.barrier()

    def max_across_ranks(self, values: np.ndarray) -> np.ndarray:
        result = values.copy()
        self.dist.all_reduce(self.host_wrap(result), op=self.dist.ReduceOp.MAX)
        return result

    def call(self, op: str, inp: np.ndarray, out: np.ndarray | None) -> Call:
        once = self._call(op, inp, out)
        sync = self.sync
        return once if sync is None else lambda: (once(), sync())

    def _call(self, op: str, inp: np.ndarray, out: np.ndarray | None) -> Call:
        d, x, y = self.dist, self.wrap(inp), None if out is None else self.wrap(out)
        calls: dict[str, Call] = {
            "all_reduce": lambda: d.all_reduce(x),
            "all_gather": lambda: d.all_gather_into_tensor(y, x),
            "reduce_scatter": lambda: d.reduce_scatter_tensor(y, x),
            "broadcast": lambda: d.broadcast(x, src=0),
            "all_to_all": lambda: d.all_to_all_single(y, x),
            "barrier": d.barrier,
        }
        if op == "sendrecv":
            return ping_pong(self.rank, lambda peer: d.send(x, peer), lambda peer: d.recv(x, peer))
        return calls[op]

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiComm:
    """mpi4py's COMM_WORLD with numpy buffers (all_reduce in place, like torch's)."""

    def __init__(self) -> None:
        from mpi4py import MPI
        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_across_ranks(self, values: np.ndarray) -> np.ndarray:
        result = np.empty_like(values)
        self.comm.Allreduce(values, result, op=self.mpi.MAX)
        return result

    def call(self, op: str, inp: np.ndarray, out: np.ndarray | None) -> Call:
        c, in_place = self.comm, self.mpi.IN_PLACE
        calls: dict[str, Call] = {
            "all_reduce": lambda: c.Allreduce(in_place, inp),
            "all_gather": lambda: c.Allgather(inp, out),
            "reduce_scatter": lambda: c.Reduce_scatter_block(inp, out),
            "broadcast": lambda: c.Bcast(inp, root=0),
            "all_to_all": lambda: c.Alltoall(inp, out),
            "barrier": c.Barrier,
        }
        if op == "sendrecv":
            return ping_pong(self.rank, lambda peer: c.Send(inp, peer), lambda peer: c.Recv(inp, peer))
        return calls[op]

    def close(self) -> None:
        """Nothing to do: mpi4py finalizes MPI at interpreter exit."""


def connect_pydist(timeout: float) -> TorchStyleComm:
    """pydist's own backend, env:// rendezvous."""
    import pydist
    pydist.init_process_group("pydist", timeout=timedelta(seconds=timeout))
    return TorchStyleComm(pydist)


#: The environment of the "pydist 1 nic" column: striping off, so one lane per peer.
ONE_LANE = {"PYDIST_STRIPE_BYTES": "0"}


@contextmanager
def _environment(values: dict[str, str]):
    """``values`` set in os.environ meanwhile, the previous ones put back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def connect_pydist_one_lane(timeout: float) -> TorchStyleComm:
    """pydist's own backend on one interface however many PYDIST_SOCKET_IFNAME names (striping
    off while it connects): the baseline of striping."""
    with _environment(ONE_LANE):
        return connect_pydist(timeout)


#: Where pydist-bench's launchers put the certificates they made for the pydist+tls column
#: (not PYDIST_TLS_*: the launcher's own store and the other columns stay without TLS).
BENCH_TLS = ("BENCH_TLS_CERT", "BENCH_TLS_KEY", "BENCH_TLS_CA")


def connect_pydist_tls(timeout: float) -> TorchStyleComm:
    """pydist's own backend over mutual TLS, the store included: with PYDIST_TLS_* set (a job
    run with TLS) env:// as usual; else with the BENCH_TLS_* certificates, on a TLS store of
    its own that rank 0 serves and announces through the job's plain one."""
    import pydist
    from pydist.net.tls import VARIABLES
    if all(os.environ.get(name) for name in VARIABLES):
        return connect_pydist(timeout)
    if not all(os.environ.get(name) for name in BENCH_TLS):
        raise RuntimeError(f"pydist+tls needs {', '.join(VARIABLES)} on every rank of a launched job")
    wait = timedelta(seconds=timeout)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    plain = pydist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=wait)
    os.environ.update(zip(VARIABLES, (os.environ[name] for name in BENCH_TLS)))
    if rank == 0:
        store = pydist.TCPStore(plain.client_address(), 0, size, is_master=True, timeout=wait, wait_for_workers=False)
        plain.set("pydist-bench/tls-store", f"{plain.client_address()} {store.port}")
    else:
        host, port = plain.get("pydist-bench/tls-store").decode().split()
        store = pydist.TCPStore(host, int(port), size, timeout=wait)
    plain.close()
    pydist.init_process_group("pydist", store=store, rank=rank, world_size=size, timeout=wait)
    return TorchStyleComm(pydist)


def connect_pydist_mpi(timeout: float) -> TorchStyleComm:
    """pydist's MPI backend under mpiexec."""
    import pydist
    pydist.init_process_group("mpi", timeout=timedelta(seconds=timeout))
    return TorchStyleComm(pydist)


def _export_torch_env() -> None:
    """torch's env:// reads only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: set them from
    what the launcher exported (mpiexec's PMI_RANK, ...) the way pydist's env:// finds them."""
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if all(os.environ.get(name) for name in names):
        return
    from pydist.rendezvous import launch_info
    info = launch_info()
    for name, value in zip(names, (info.rank, info.world_size, info.master_addr, info.master_port)):
        os.environ[name] = str(value)


def connect_gloo(timeout: float) -> TorchStyleComm:
    """torch.distributed with gloo on CPU tensors (zero-copy views of the numpy buffers)."""
    import warnings

    _export_torch_env()

    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    return TorchStyleComm(dist, torch.from_numpy)


def connect_nccl(timeout: float) -> TorchStyleComm:
    """torch.distributed with NCCL (CUDA buffers only: pydist-bench --device cuda); it refuses
    several ranks on one GPU ("Duplicate GPU detected")."""
    import torch
    import torch.distributed as dist

    _export_torch_env()
    index = int(os.environ["RANK"]) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    dist.init_process_group("nccl", timeout=timedelta(seconds=timeout), device_id=torch.device("cuda", index))
    return TorchStyleComm(dist, torch.from_numpy)


def connect_mpi(timeout: float) -> MpiComm:
    """mpi4py on COMM_WORLD (the MPI library has its own notion of timeouts: none)."""
    return MpiComm()
