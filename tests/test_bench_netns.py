"""pydist-bench --netns HxM: the benchmark as a multi-node job in network namespaces."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pydist.bench import cli, netns_job, session
from pydist.testing.netns import require_netns

BENCH = [sys.executable, "-m", "pydist.bench"]


def test_shape_is_hosts_by_ranks():
    assert netns_job.parse_shape("2x2") == netns_job.Shape(2, 2)
    assert str(netns_job.parse_shape(" 3X1 ")) == "3x1"
    for bad in ("2", "1x4", "2x0", "axb", "2x2x2"):
        with pytest.raises(ValueError, match="HOSTSxRANKS|at least 2 hosts"):
            netns_job.parse_shape(bad)


def test_the_job_gets_every_argument_but_the_namespace_ones():
    argv = ["--netns", "2x2", "--sizes", "4,1M", "--link=1gbit", "--compare", "gloo", "--netns=3x1", "--link", "x",
            "--nics", "2", "--nics=3"]
    assert netns_job.forwarded(argv) == ["--sizes", "4,1M", "--compare", "gloo"]
    assert netns_job.job_args(argv)[:4] == ["--sizes", "4,1M", "--compare", "gloo"]
    command = netns_job.host_command(netns_job.Shape(2, 3), 1, "10.0.0.1", ["--sizes", "4"])
    assert command[1:] == ["-m", "pydist.run", "--nnodes", "2", "--nproc-per-node", "3", "--node-rank", "1",
                           "--master-addr", "10.0.0.1", "--master-port", str(netns_job.MASTER_PORT),
                           "-m", "pydist.bench", "--sizes", "4"]


@pytest.mark.parametrize("argv, message", [
    (["--link", "1gbit"], "--link shapes the links of a --netns job: give --netns too"),
    (["--nics", "2"], "--nics gives the hosts of a --netns job interfaces: give --netns too"),
    (["--netns", "2x2", "--nproc", "4"], "--nproc contradicts --netns 2x2"),
    (["--netns", "2x2", "--transport", "tcp"], "--transport tcp with --netns"),
    (["--netns", "1x2"], "expected at least 2 hosts of at least 1 rank, got '1x2'"),
])
def test_contradictory_options_are_usage_errors(argv, message, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_a_two_host_job_prints_rank_zeros_table():
    require_netns()
    done = subprocess.run(BENCH + ["--netns", "2x1", "--sizes", "4,64K", "--iters", "2", "--warmup", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nproc=2 ranks on 2 hosts (launched by pydist-run)" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+[\d.]+", line)]
    assert [int(row.split()[0]) for row in rows] == [4, 65536], done.stdout
    assert "[rank" not in done.stdout
    assert "# command: pydist-bench --netns 2x1 --sizes 4,64K --iters 2 --warmup 1\n" in done.stdout, done.stdout


def test_the_table_of_a_netns_job_shows_the_command_the_user_typed():
    """Issue 48: its "# command:" line left out --netns (the ranks saw only what they were given)."""
    typed = ["--netns", "2x2", "--link", "1gbit", "--sizes", "4,1M"]
    args = cli.build_parser().parse_args(netns_job.job_args(typed))
    args.nproc = 4  # what a rank of the 2x2 job finds
    meta = session.make_meta(netns_job.job_args(typed), args)
    assert meta.command == "pydist-bench --netns 2x2 --link 1gbit --sizes 4,1M"


@pytest.mark.slow
def test_a_two_host_job_compares_pydist_over_tls():
    """The pydist+tls column of a launched job: certificates made by the bench, a TLS store
    of its own (the launcher's stays plain, and so does the pydist column)."""
    require_netns()
    pytest.importorskip("cryptography")
    done = subprocess.run(BENCH + ["--netns", "2x1", "--sizes", "4,64K", "--iters", "2", "--warmup", "1",
                                   "--compare", "pydist-tls"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+[\d.]+", line)]
    assert [(int(row[0]), len(row)) for row in rows] == [(4, 8), (65536, 8)], done.stdout  # a row per size
    assert all(float(row[2]) > 0 and float(row[5]) > 0 for row in rows), done.stdout  # both backends timed


@pytest.mark.slow
def test_two_interfaces_per_host_compare_striping_with_one_lane():
    """--nics 2: both interfaces named to pydist (striped past PYDIST_STRIPE_BYTES); the
    pydist-1nic column is the same job on one lane."""
    require_netns()
    done = subprocess.run(BENCH + ["--netns", "2x1", "--nics", "2", "--sizes", "4,4M", "--iters", "2", "--warmup", "1",
                                   "--compare", "pydist-1nic"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "backends=pydist,pydist 1 nic" in done.stdout, done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+[\d.]+", line)]
    assert [(int(row[0]), len(row)) for row in rows] == [(4, 8), (4 << 20, 8)], done.stdout  # a row per size
    assert all(float(row[2]) > 0 and float(row[5]) > 0 for row in rows), done.stdout  # both backends timed
