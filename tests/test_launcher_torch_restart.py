"""pydist-run restarts torch scripts: a failed attempt's keys never reach the next attempt.

torch's env:// rendezvous under an agent uses the store at MASTER_ADDR:MASTER_PORT with no
per-attempt prefix, so a restart that reuses one store hands attempt 1 the peer addresses
(gloo) or shared-memory names (pydist) attempt 0 wrote; each round gets a fresh store.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from pydist.run.agent_rendezvous import NodeRecord, Rendezvous, RendezvousError, RendezvousSettings, Round
from pydist.run.worker_store import WorkerStore
from pydist.store import HashStore, TCPStore
from pydist.testing.commands import run_command

pytest.importorskip("torch")

SCRIPT = str(Path(__file__).parent / "run_scripts" / "torch_restart.py")
SHM_DIR = Path("/dev/shm")


def _our_segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob("pydist-*")}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pydist", "gloo"])
def test_a_torch_script_restarted_after_a_failure_runs_to_the_end(backend):
    """Rank 1 raises after attempt 0's first all_reduce; attempt 1 completes on both ranks."""
    segments_before = _our_segments()
    # 120 s: two attempts of two ranks each importing torch, on a loaded 2-core CI machine
    result = run_command([sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", "--max-restarts", "1",
                          SCRIPT, backend], env=dict(os.environ), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    results = sorted(line for line in result.stdout.splitlines() if "RESULT" in line)
    assert results == ["[rank0]:RESULT 0 1 [3.0, 3.0, 3.0, 3.0]", "[rank1]:RESULT 1 1 [3.0, 3.0, 3.0, 3.0]"]
    assert "restarting the job (1 of 1 restarts)" in result.stderr
    assert _our_segments() <= segments_before


@pytest.mark.slow
def test_each_round_gets_a_fresh_workers_store():
    """Node 0 serves a new store per round and publishes it; the other nodes find it; keys
    written in one round are absent from the next; closing stops the server."""
    job = HashStore()
    settings = RendezvousSettings("job", 2, 2)
    records = tuple(NodeRecord(f"a{i}", f"h{i}", "127.0.0.1", 1, -1) for i in range(2))
    ports = []
    for number in range(2):
        host = WorkerStore(Rendezvous(job, settings, records[0]), Round(number, 0, records), "127.0.0.1", 5)
        other = WorkerStore(Rendezvous(job, settings, records[1]), Round(number, 1, records), "ignored", 5)
        assert other.address == host.address and host.address.addr == "127.0.0.1"
        client = TCPStore("127.0.0.1", host.address.port, is_master=False)
        assert not client.check(["stale"])
        client.set("stale", f"from round {number}")
        client.close()
        other.close()
        host.close()
        ports.append(host.address.port)
    with pytest.raises(RuntimeError):
        TCPStore("127.0.0.1", ports[-1], is_master=False, timeout=timedelta(seconds=1))


def test_a_workers_store_that_cannot_start_fails_every_node_with_the_reason():
    job = HashStore()
    settings = RendezvousSettings("job", 2, 2)
    records = tuple(NodeRecord(f"a{i}", f"h{i}", "192.0.2.1", 1, -1) for i in range(2))
    with pytest.raises(RendezvousError, match="cannot start the workers' store for round 0 on 192.0.2.1") as host:
        WorkerStore(Rendezvous(job, settings, records[0]), Round(0, 0, records), "192.0.2.1", 5)
    with pytest.raises(RendezvousError, match="cannot start the workers' store for round 0") as other:
        WorkerStore(Rendezvous(job, settings, records[1]), Round(0, 1, records), "192.0.2.1", 5)
    assert (host.value.round_number, other.value.round_number) == (0, 0)
    assert Rendezvous(job, settings, records[0]).wait_left(0, 2, timeout=0)


def test_a_node_whose_node_0_never_publishes_gives_up_naming_it():
    settings = RendezvousSettings("job", 2, 2)
    records = tuple(NodeRecord(f"a{i}", f"h{i}", "127.0.0.1", 1, -1) for i in range(2))
    with pytest.raises(RendezvousError, match="round 3's node 0 did not publish workers_store within 0.2s"):
        WorkerStore(Rendezvous(HashStore(), settings, records[1]), Round(3, 1, records), "127.0.0.1", 0.2)
