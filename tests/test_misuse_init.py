"""Misuse of init_process_group, and calls before it: a clear ValueError/TypeError at the
call, before anything blocks, naming the argument (helpers: tests/misuse_support.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from misuse_support import SHORT, clean_process_world, misuse, quick, run2, transport  # noqa: F401 - fixtures used by every test here

import pydist as dist
from pydist.testing import free_port, run_processes
from pydist.testing.commands import run_command

# -- init_process_group --------------------------------------------------------------------

def test_init_twice_threads(transport):
    def fn(rank, size):
        with pytest.raises(ValueError, match="twice"):
            dist.init_process_group("pydist", store=dist.HashStore(), rank=rank, world_size=size)

    run2(fn, transport)


@pytest.mark.slow
def test_init_twice_process():
    results = run_processes(2, misuse.init_twice, init="env", timeout=60)
    for result in results:
        assert result["again"]["error"] == "ValueError" and "twice" in result["again"]["message"], result
        assert result["still_works"] == [2.0, 2.0]


@pytest.mark.parametrize("backend", ["gloo", "nccl", "GLOO", "ucc", "bogus"])  # "mpi" is a backend: test_mpi_backend
def test_init_bad_backend(backend):
    # rank 1 of a tcp:// rendezvous nobody serves: a late check would block on the store
    error = quick(lambda: dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                                  rank=1, world_size=2, timeout=SHORT),
                  ValueError, "pydist")
    assert backend in str(error) and "backend" in str(error)


def test_init_backend_not_a_string():
    quick(lambda: dist.init_process_group(5, store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT),
          TypeError, "backend")


@pytest.mark.parametrize("backend", [None, "pydist", "PYDIST", dist.Backend.PYDIST])
def test_init_valid_backends(backend):
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    assert dist.get_backend() == "pydist"
    tensor = np.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("rank, world_size", [(2, 2), (5, 2), (-1, 2), (-3, 4), (0, 0)])
def test_init_rank_out_of_range_store(rank, world_size):
    error = quick(lambda: dist.init_process_group(store=dist.HashStore(), rank=rank, world_size=world_size,
                                                  timeout=SHORT), ValueError, "rank|world_size")
    assert str(rank) in str(error) or str(world_size) in str(error)


@pytest.mark.parametrize("scheme", ["tcp", "env"])
@pytest.mark.parametrize("rank", [2, 7, -2])
def test_init_rank_out_of_range_rendezvous(scheme, rank, monkeypatch):
    port = free_port()
    if scheme == "env":
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        call = lambda: dist.init_process_group("pydist", timeout=SHORT)  # noqa: E731
    else:
        call = lambda: dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{port}",  # noqa: E731
                                               rank=rank, world_size=2, timeout=SHORT)
    error = quick(call, ValueError, "rank")
    assert str(rank) in str(error)


def test_init_rank_out_of_range_file_leaves_no_file(tmp_path):
    path = tmp_path / "sharedfile"
    quick(lambda: dist.init_process_group("pydist", init_method=f"file://{path}", rank=3, world_size=2,
                                          timeout=SHORT), ValueError, "rank")
    # seed 002: a file:// init needs a file that does not exist; a rejected call must not
    # leave one behind for the next init_process_group on that path
    assert not path.exists(), f"rejected file:// init left {path} ({path.stat().st_size} bytes)"


def test_init_store_and_init_method():
    error = quick(lambda: dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{free_port()}",
                                                  store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT),
                  ValueError, "init_method")
    assert "store" in str(error)


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])
def test_init_env_missing_variable(missing, monkeypatch):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "2"}
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for name, value in env.items():
        if name == missing:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    quick(lambda: dist.init_process_group("pydist", timeout=SHORT), ValueError, missing)
    quick(lambda: dist.init_process_group("pydist", init_method="env://", timeout=SHORT), ValueError, missing)


@pytest.mark.parametrize("name, value", [("MASTER_PORT", "abc"), ("RANK", "x"), ("WORLD_SIZE", "two")])
def test_init_env_not_a_number(name, value, monkeypatch):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "2", name: value}
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    quick(lambda: dist.init_process_group("pydist", timeout=SHORT), ValueError, name)


# -- calls before init_process_group --------------------------------------------------------

BEFORE_INIT = {
    "all_reduce": lambda: dist.all_reduce(np.ones(2)),
    "broadcast": lambda: dist.broadcast(np.ones(2), src=0),
    "reduce": lambda: dist.reduce(np.ones(2), dst=0),
    "all_gather": lambda: dist.all_gather([np.ones(2)], np.ones(2)),
    "gather": lambda: dist.gather(np.ones(2), dst=0),
    "scatter": lambda: dist.scatter(np.ones(2), src=0),
    "barrier": lambda: dist.barrier(),
    "send": lambda: dist.send(np.ones(2), dst=1),
    "recv": lambda: dist.recv(np.ones(2), src=1),
    "isend": lambda: dist.isend(np.ones(2), dst=1),
    "new_group": lambda: dist.new_group([0]),
    "get_rank": lambda: dist.get_rank(),
    "get_world_size": lambda: dist.get_world_size(),
}


@pytest.mark.parametrize("name", list(BEFORE_INIT))
def test_call_before_init(name):
    quick(BEFORE_INIT[name], ValueError, "init_process_group")


@pytest.mark.slow
def test_env_init_in_child_process_missing_master_addr():
    """A fresh process (no MASTER_ADDR in its environment) gets the ValueError too."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    code = ("import pydist as dist\n"
            "try:\n"
            "    dist.init_process_group('pydist', rank=0, world_size=1)\n"
            "except ValueError as e:\n"
            "    print('ValueError', e)\n")
    out = run_command([sys.executable, "-c", code], env=env, timeout=60)
    assert out.stdout.startswith("ValueError") and "MASTER_ADDR" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
def test_a_rank_that_never_registers_is_named(clean_process_world):
    """Rank 1 of 2 never comes: init's error names it, not only the store key it waited for."""
    from datetime import timedelta

    from pydist.store import HashStore
    with pytest.raises(dist.DistStoreError) as raised:
        dist.init_process_group(store=HashStore(), rank=0, world_size=2, timeout=timedelta(seconds=1))
    assert "ranks [1] never registered" in str(raised.value), str(raised.value)
