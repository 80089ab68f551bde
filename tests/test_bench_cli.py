"""pydist-bench smoke runs at tiny sizes: rows are produced and the arithmetic is right.
Nothing here is timed (benchmarks are a CLI, never asserts)."""
import dataclasses
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from pydist.bench import cli, injob, timing
from pydist.bench.backends import BACKENDS, mpiexec_path
from pydist.bench.ops import OPS, bandwidths, iterations, size_plan
from pydist.bench.report import BackendResult, Meta, format_table
from pydist.bench.sizes import format_size, parse_size, parse_sizes
from pydist.bench.status_line import StatusLine
from pydist.testing import free_port
from pydist.testing.commands import finish, kill_group, run_command, start_command

BENCH = [sys.executable, "-m", "pydist.bench"]
TINY = ["--sizes", "4:64", "--iters", "2", "--warmup", "1", "--nproc", "2"]
TINY_SIZES = [4, 8, 16, 32, 64]  # what --sizes 4:64 asks for
MARKER = f"pydist-bench-test-{uuid.uuid4().hex}"  # in every worker's environment, to find leftovers


def marked_processes() -> list[int]:
    """Pids of live processes started by these tests (their environment holds MARKER)."""
    found = []
    for pid in set(filter(str.isdigit, os.listdir("/proc"))) - {str(os.getpid())}:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if MARKER.encode() in environ.read():
                    with open(f"/proc/{pid}/stat") as stat:
                        if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture(autouse=True)
def no_leftover_workers():
    yield
    deadline = time.monotonic() + 5
    while marked_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes() == [], "pydist-bench left worker processes running"


def run_bench(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_command(BENCH + list(args), timeout=timeout,
                       env={**os.environ, "PYDIST_BENCH_TEST_MARKER": MARKER, **(env or {})})


def check_report(report: dict, op: str, keys: list[str], sizes: list[int], nproc: int = 2) -> None:
    """A JSON report's structure and arithmetic: every backend of ``keys`` (the main one
    first) ran; one row per size planned from ``sizes``, in order; in each row a timed result
    for every backend, with the iterations asked for (capped by the budget) and the
    bandwidths of its time, and every other backend's ratio to the main one."""
    assert report["op"] == op and report["nproc"] == nproc and report["main"] == keys[0]
    assert [(backend["key"], backend["status"]) for backend in report["backends"]] == [(key, "ok") for key in keys]
    assert [(row["bytes"], row["count"]) for row in report["rows"]] == size_plan(op, sizes, report["dtype"], nproc)
    factor = report["busbw_factor"]
    assert factor == pytest.approx(OPS[op].bus_factor(nproc))
    for row in report["rows"]:
        assert list(row["results"]) == keys and list(row["ratios"]) == keys[1:], row
        for key in keys:
            result = row["results"][key]
            assert result["time_us"] > 0, row
            planned = iterations(row["bytes"], report["iters"], report["warmup"], report["budget"])
            assert (result["iters"], result["warmup"]) == planned, row
            algbw = row["bytes"] / (result["time_us"] * 1e-6) / 1e9
            assert result["algbw_gbps"] == pytest.approx(algbw, rel=1e-6)
            assert result["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-6)
        main = row["results"][keys[0]]["time_us"]
        for key in keys[1:]:
            assert row["ratios"][key] == pytest.approx(row["results"][key]["time_us"] / main, rel=1e-6)


def table_lines(stdout: str) -> list[list[str]]:
    """The table's rows (not its # comments), split into cells."""
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def test_size_specs():
    assert parse_sizes("4:64") == [4, 8, 16, 32, 64]
    assert parse_sizes("1K:16K:4") == [1024, 4096, 16384]
    assert parse_sizes("4,64K,1M") == [4, 65536, 1 << 20]
    assert parse_sizes("256M") == [256 << 20]
    for bad in ("0", "x", "4:2", "-1"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_size_units_ranges_and_names():
    assert [parse_size(text) for text in ("7", "1k", "2KiB", "3MB", "1G")] == [7, 1024, 2048, 3 << 20, 1 << 30]
    assert parse_sizes("64,4:16") == [4, 8, 16, 64]
    assert parse_sizes("4:4") == [4] and parse_sizes("1:100:10") == [1, 10, 100]
    assert parse_sizes("4:100") == [4, 8, 16, 32, 64]
    for bad in ("4:64:1", "4:64:x", "4::", "", "4,,8", "1T", "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_sizes(bad)
    assert [format_size(n) for n in (4, 65536, 3 << 19, 1 << 30)] == ["4 B", "64 KiB", "1.5 MiB", "1 GiB"]


def test_split_ops_round_counts_to_whole_blocks_per_rank():
    assert size_plan("all_gather", [4, 8, 16, 64], "float32", 3) == [(12, 3), (60, 15)]
    assert size_plan("all_to_all", [1024], "float64", 4) == [(1024, 128)]
    assert size_plan("all_reduce", [1, 4, 8], "float64", 2) == [(8, 1)]
    assert size_plan("sendrecv", [4, 6], "int8", 2) == [(4, 4), (6, 6)]
    assert size_plan("barrier", [4, 1024], "float32", 2) == [(0, 0)]  # no data: one row


def test_busbw_factors_follow_nccl_tests():
    factors = {op: spec.bus_factor(4) for op, spec in OPS.items()}
    assert factors == {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0,
                       "all_to_all": 0.75, "sendrecv": 1.0, "barrier": 0.0}
    assert bandwidths("all_reduce", 2_000_000_000, 2.0, 4) == (1.0, 1.5)


def test_large_sizes_get_fewer_iterations():
    assert iterations(4, 20, 5, 1 << 30) == (20, 5)
    assert iterations(256 << 20, 20, 5, 1 << 30) == (4, 1)
    assert iterations(64 << 20, 20, 5, 1 << 30) == (16, 4)
    assert iterations(256 << 20, 2, 0, 1 << 30) == (2, 0)
    assert iterations(1 << 30, 20, 5, 0) == (20, 5)


class ScriptedComm:
    """Two ranks as timing.time_size sees them: the other rank's per-iteration times are
    ``theirs``; the test's clock (perf_counter) makes this rank's ``mine``."""

    size = 2

    def __init__(self, theirs: list[float]) -> None:
        self.theirs, self.calls, self.barriers = np.array(theirs), 0, 0

    def call(self, op, inp, out):
        def run():
            self.calls += 1
        return run

    def barrier(self):
        self.barriers += 1

    def max_across_ranks(self, values):
        return np.maximum(values, self.theirs)


@pytest.mark.parametrize("op, per_call", [("all_reduce", 1), ("sendrecv", 2)])
def test_a_rows_time_is_the_median_of_the_slowest_ranks_iterations(op, per_call, monkeypatch):
    """Each iteration counts at its slowest rank (MAX across ranks); the row is the median of
    those, per one-way transfer (sendrecv's timed call is a round trip)."""
    mine, theirs = [0.004, 0.001, 0.009, 0.002, 0.003], [0.002, 0.006, 0.001, 0.002, 0.008]
    ticks = iter(t for elapsed in mine for t in (10.0, 10.0 + elapsed))  # start and end of each timed call
    monkeypatch.setattr(timing, "perf_counter", lambda: next(ticks))
    comm = ScriptedComm(theirs)
    seconds = timing.time_size(comm, op, 16, "float32", iters=5, warmup=2)
    slowest = [0.004, 0.006, 0.009, 0.002, 0.008]  # per iteration, the larger of the two ranks'
    assert seconds == pytest.approx(float(np.median(slowest)) / per_call)  # 0.006 / per_call
    assert comm.calls == 7 and comm.barriers == 7  # warm-up calls too, each after a barrier


def test_table_marks_missing_values_and_notes():
    meta = Meta("pydist-bench --compare gloo,mpi", "all_reduce", 2, "float32", 2, 1, 0, 2, 0.5)
    main = BackendResult("pydist", "pydist", rows={4: {"seconds": 1e-4, "iters": 2, "warmup": 1},
                                                   8: {"seconds": 2e-4, "iters": 2, "warmup": 1}})
    gloo = BackendResult("gloo", "gloo", "failed", "boom\nsecond line", {4: {"seconds": 3e-4, "iters": 2, "warmup": 1}})
    mpi = BackendResult("mpi", "mpi", "unavailable", "not installed")
    lines = format_table(meta, [(4, 1), (8, 2)], [main, gloo, mpi]).splitlines()
    assert lines[0].endswith("(host: 2 cpus, load 0.50)")
    assert lines[1] == "# command: pydist-bench --compare gloo,mpi"
    assert "# note: gloo: failed: boom" in lines and "#   second line" in lines
    assert "# note: mpi: unavailable: not installed" in lines
    header = lines[-3]
    assert header.startswith("#        bytes") and "gloo/pydist" in header and "mpi us" not in header
    assert lines[-2].split() == ["4", "1", "100.0", "0.00", "0.00", "300.0", "0.00", "3.00"]
    assert lines[-1].split() == ["8", "2", "200.0", "0.00", "0.00", "-", "-", "-"]


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_prints_a_table_row_per_size(op):
    done = run_bench("--op", op, *TINY)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line and not line.startswith("#")]
    assert [(int(r[0]), int(r[1])) for r in rows] == size_plan(op, TINY_SIZES, "float32", 2)
    assert all(len(r) == 5 and float(r[2]) > 0 for r in rows)  # bytes, count, us, algbw, busbw
    assert f"{op} pydist 1/1 backends" in done.stderr  # progress lines (plain: stderr is not a tty)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_produces_rows_with_consistent_bandwidths(op):
    done = run_bench("--op", op, "--json", *TINY)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    check_report(report, op, ["pydist"], TINY_SIZES)
    assert all((row["bytes"] > 0 and row["count"] > 0) == (op != "barrier") for row in report["rows"])


@pytest.mark.slow
def test_table_output_names_the_command_and_has_a_row_per_size():
    done = run_bench("--op", "all_reduce", *TINY)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("pydist-bench --op all_reduce" in line for line in lines if line.startswith("#"))
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [4, 8, 16, 32, 64]
    assert [int(r[1]) for r in rows] == [1, 2, 4, 8, 16]


@pytest.mark.slow
def test_compare_with_gloo():
    pytest.importorskip("torch")
    done = run_bench("--op", "all_reduce", "--json", "--compare", "gloo", *TINY, timeout=180)
    assert done.returncode == 0, done.stderr
    check_report(json.loads(done.stdout), "all_reduce", ["pydist", "gloo"], TINY_SIZES)


@pytest.mark.slow
def test_compare_with_pydist_over_tls(tmp_path):
    """pydist+tls: every byte over mutual TLS, certificates made for the run and removed after."""
    pytest.importorskip("cryptography")
    done = run_bench("--json", "--compare", "pydist-tls", "--transport", "tcp", *TINY, timeout=180,
                     env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    check_report(json.loads(done.stdout), "all_reduce", ["pydist", "pydist-tls"], TINY_SIZES)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
def test_compare_with_mpi():
    done = run_bench("--op", "broadcast", "--json", "--compare", "mpi", *TINY, timeout=180)
    assert done.returncode == 0, done.stderr
    check_report(json.loads(done.stdout), "broadcast", ["pydist", "mpi"], TINY_SIZES)


@pytest.mark.slow
def test_backend_mpi_runs_or_says_why_not():
    """--backend mpi is pydist's own MPI backend: it runs, or says what is not installed."""
    done = run_bench("--op", "all_reduce", "--backend", "mpi", *TINY)
    if BACKENDS["pydist-mpi"].unavailable() is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and "--backend mpi:" in done.stderr, done.stderr
        assert "not installed" in done.stderr, done.stderr


def test_progress_rewrites_one_line_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = StatusLine(stream)
    progress.update("a")
    progress.update("b")
    progress.clear()
    assert stream.getvalue() == "\r\x1b[Ka\r\x1b[Kb\r\x1b[K"


def test_plot_without_matplotlib_says_how_to_install_it_here(monkeypatch, tmp_path):
    """From a source checkout: the bench extra, editable, into the running interpreter;
    elsewhere: pip install matplotlib into it."""
    from pydist.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    root = Path(__file__).resolve().parent.parent
    with pytest.raises(plot.PlotUnavailable) as missing:
        plot.require()
    assert str(missing.value) == (f"--plot needs matplotlib: cd {root} && {sys.executable} -m pip install -e "
                                  "'.[bench]' (make test-venv installs it too)")
    installed = str(tmp_path / "site-packages" / "pydist")
    assert plot.install_hint(installed) == f"{sys.executable} -m pip install matplotlib"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "bench.png"
    done = run_bench("--op", "all_reduce", "--plot", str(out), *TINY)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_unavailable_compare_backend_is_a_note(monkeypatch, capsys):
    missing = dataclasses.replace(BACKENDS["mpi"], modules=("pydist_bench_no_such_module",))
    monkeypatch.setitem(BACKENDS, "mpi", missing)
    monkeypatch.setenv("PYDIST_BENCH_TEST_MARKER", MARKER)
    assert cli.main(["--compare", "mpi", *TINY]) == 0
    out = capsys.readouterr().out
    assert "# note: mpi: unavailable: not installed" in out and "mpi us" not in out
    rows = table_lines(out)
    assert [int(r[0]) for r in rows] == TINY_SIZES and all(len(r) == 5 for r in rows)  # pydist's columns only


@pytest.mark.slow
def test_usage_errors_exit_2():
    assert run_bench("--sizes", "64:4").returncode == 2
    assert run_bench("--op", "sendrecv", "--nproc", "1").returncode == 2
    assert run_bench("--compare", "nccl").returncode == 2


@pytest.mark.slow
def test_timeout_stops_every_worker():
    done = run_bench("--sizes", "64M", "--iters", "5000", "--budget", "0", "--timeout", "1")  # ~30 s of work
    assert done.returncode == 1 and "timed out after 1 s" in done.stderr, done.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job


@pytest.mark.slow
@pytest.mark.parametrize("signum, started_by", [(signal.SIGINT, None), (signal.SIGTERM, None),
                                                (signal.SIGINT, _ignore_sigint)],
                         ids=["SIGINT", "SIGTERM", "SIGINT, inherited as ignored"])
def test_ctrl_c_or_sigterm_stops_every_worker(signum, started_by):
    proc = start_command(BENCH + ["--sizes", "64M", "--iters", "5000", "--budget", "0"],
                         env={**os.environ, "PYDIST_BENCH_TEST_MARKER": MARKER}, preexec_fn=started_by)
    try:
        deadline = time.monotonic() + 30
        while len(marked_processes()) < 3 and time.monotonic() < deadline:  # the CLI and its 2 workers
            time.sleep(0.05)
        proc.send_signal(signum)
        err = finish([proc], 30)[0].stderr
    finally:
        kill_group(proc)  # the CLI and its workers, if the test failed before they stopped
        proc.wait()
    assert proc.returncode == 130 and "interrupted" in err, err


# --- inside an already launched job: every process is one rank, rank 0 prints ----------

LAUNCH = [sys.executable, "-m", "pydist.run"]
IN_JOB = ["-m", "pydist.bench", "--sizes", "4K:64K", "--iters", "3", "--warmup", "1"]


def run_jobs(*commands: list[str], timeout: float = 60) -> list[tuple[int, str, str]]:
    """Run the commands side by side, each in a session of its own (pydist.testing.commands:
    every pipe read at once; at the timeout every session still running is killed)."""
    env = {**os.environ, "PYDIST_BENCH_TEST_MARKER": MARKER}
    done = finish([start_command(command, env=env) for command in commands], timeout)
    return [(c.returncode, c.stdout, c.stderr) for c in done]


def rank_lines(text: str, rank: int) -> list[str]:
    """The lines pydist-run forwarded from ``rank``, without its ``[rankN]:`` prefix."""
    prefix = f"[rank{rank}]:"
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def silent(out: str, err: str, rank: int) -> bool:
    """True if ``rank`` printed nothing on stdout and no pydist-bench line on stderr (libraries' warnings aside)."""
    return rank_lines(out, rank) == [] and not any("pydist-bench" in line for line in rank_lines(err, rank))


def table_rows(lines: list[str]) -> list[list[str]]:
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.slow
def test_in_a_launched_job_rank_0_prints_the_table():
    [(code, out, err)] = run_jobs(LAUNCH + ["--nproc-per-node", "2"] + IN_JOB)
    assert code == 0, err
    lines = rank_lines(out, 0)
    assert lines[0].startswith("# pydist-bench all_reduce  backends=pydist  nproc=2 ranks on 1 host "
                               "(launched by pydist-run)  dtype=float32  iters=3 warmup=1"), lines
    assert lines[1] == "# command: pydist-bench " + " ".join(IN_JOB[2:])
    assert lines[2].split() == ["#", "bytes", "count", "pydist", "us", "algbw", "GB/s", "busbw", "GB/s"]
    rows = table_rows(lines)
    assert [(int(r[0]), int(r[1])) for r in rows] == [(4096 << i, 1024 << i) for i in range(5)]
    assert all(len(r) == 5 and float(r[2]) > 0 and r[3] == r[4] for r in rows)  # 2 ranks: busbw = algbw
    assert silent(out, err, 1)  # the other rank prints nothing


@pytest.mark.slow
def test_in_a_launched_job_compare_runs_gloo_after_pydist():
    pytest.importorskip("torch")
    [(code, out, err)] = run_jobs(LAUNCH + ["--nproc-per-node", "2"] + IN_JOB + ["--compare", "gloo"])
    assert code == 0, err
    lines = rank_lines(out, 0)
    assert "backends=pydist,gloo  nproc=2 ranks on 1 host" in lines[0]
    header = [line for line in lines if line.startswith("#  ")][0]
    assert header.split()[-5:] == ["gloo", "us", "busbw", "GB/s", "gloo/pydist"]
    rows = table_rows(lines)
    assert [int(r[0]) for r in rows] == [4096 << i for i in range(5)]
    assert all(len(r) == 8 and float(r[2]) > 0 and float(r[5]) > 0 for r in rows)
    for r in rows:
        assert float(r[7]) == pytest.approx(float(r[5]) / float(r[2]), rel=0.02, abs=0.01)
    assert "gloo 2/2 backends" in err  # rank 0's progress: gloo ran second
    assert silent(out, err, 1)


@pytest.mark.slow
def test_two_nodes_on_loopback_each_launched_by_its_own_pydist_run():
    port = free_port()
    node = LAUNCH + ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     f"127.0.0.1:{port}", "--rdzv-id", "x", "--rdzv-conf", "join_timeout=20"] + IN_JOB + ["--json"]
    results = run_jobs(node, node)
    assert [code for code, _, _ in results] == [0, 0], results
    [first] = [out for _, out, _ in results if rank_lines(out, 0)]  # c10d picks which node is rank 0
    report = json.loads("\n".join(rank_lines(first, 0)))
    assert report["job"] == {"launcher": "pydist-run", "hosts": 1, "backends": ["pydist"]}
    check_report(report, "all_reduce", ["pydist"], [4096 << i for i in range(5)])
    assert all(silent(out, err, 1) for _, out, err in results)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
                    reason="mpi4py or mpiexec is missing")
def test_under_mpiexec_pydist_and_mpi_side_by_side():
    [(code, out, err)] = run_jobs([mpiexec_path(), "-n", "2", *BENCH, *IN_JOB[2:], "--compare", "mpi"])
    assert code == 0, err
    assert out.count("# pydist-bench") == 1 and "(launched by mpiexec" in out  # rank 0 only
    rows = table_rows(out.splitlines())
    assert [int(r[0]) for r in rows] == [4096 << i for i in range(5)]
    assert all(len(r) == 8 and float(r[2]) > 0 and float(r[5]) > 0 for r in rows)


@pytest.mark.slow
def test_in_a_job_mpi_backends_need_mpiexec_and_usage_errors_name_the_rank():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = run_command(BENCH + ["--nproc", "3"], timeout=30,
                       env={**os.environ, **env, "PYDIST_BENCH_TEST_MARKER": MARKER})
    assert done.returncode == 2
    assert "pydist-bench (rank 1): error: --nproc 3 contradicts the launched job's world size (2)" in done.stderr
    done = run_command(BENCH + ["--backend", "mpi"], timeout=30,
                       env={**os.environ, **env, "PYDIST_BENCH_TEST_MARKER": MARKER})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("pydist-bench: error: rank 1: --backend mpi: "), done.stderr


def test_job_place_comes_from_the_launchers_variables():
    assert injob.place({}) is None
    assert injob.place({"RANK": "3", "WORLD_SIZE": "4"}) == injob.Place(3, 4)
    assert injob.place({"PMI_RANK": "1", "PMI_SIZE": "2"}) == injob.Place(1, 2)
    assert injob.place({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8"}) == injob.Place(0, 8)
    assert injob.place({"RANK": "0"}) is None


class FakeComm:
    """Rank ``rank`` of ``size``; the other ranks' contributions to max_across_ranks are ``theirs``."""

    def __init__(self, rank: int, size: int, theirs: list) -> None:
        self.rank, self.size, self.theirs = rank, size, list(theirs)

    def max_across_ranks(self, values):
        return np.maximum(values, self.theirs.pop(0))


def test_ranks_agree_to_skip_a_backend_that_some_rank_lacks(capsys):
    # rank 0 can run gloo and mpi; rank 2 of 3 lacks gloo: every rank skips it, rank 0's note names rank 2
    gloo, mpi = BackendResult("gloo", "gloo"), BackendResult("mpi", "mpi")
    injob.agree_on_availability(FakeComm(0, 3, [np.array([0, 0, 1, 0, 0, 0.0])]), [gloo, mpi])
    assert (gloo.status, gloo.note) == ("unavailable", "on rank 2 (their stderr says why)")
    assert mpi.status == "ok" and capsys.readouterr().err == ""
    # rank 2 itself says why; rank 1, which has it, skips it too
    lacking = BackendResult("gloo", "gloo", "unavailable", "not installed")
    injob.agree_on_availability(FakeComm(2, 3, [np.array([0, 0, 0.0])]), [lacking])
    assert capsys.readouterr().err == "pydist-bench: error: rank 2: --compare gloo: unavailable: not installed\n"
    having = BackendResult("gloo", "gloo")
    injob.agree_on_availability(FakeComm(1, 3, [np.array([1, 0, 1.0])]), [having])
    assert having.status == "unavailable" and capsys.readouterr().err == ""


def test_hosts_are_counted_by_name():
    mine = FakeComm(1, 3, [np.array([5.0, 0, 5.0])])
    assert injob.count_hosts(mine) == 2


@pytest.mark.slow
def test_in_a_launched_job_timeout_stops_the_rank_and_names_it():
    slow = ["-m", "pydist.bench", "--sizes", "64M", "--iters", "5000", "--budget", "0", "--timeout", "1"]
    [(code, out, err)] = run_jobs(LAUNCH + ["--nproc-per-node", "2"] + slow)
    assert code != 0 and table_rows(rank_lines(out, 0)) == []
    assert "pydist-bench: error: rank 0: pydist timed out after 1 s" in err \
        or "pydist-bench: error: rank 1: pydist timed out after 1 s" in err, err


def test_transport_tcp_keeps_every_backends_bytes_on_sockets():
    """--transport tcp: pydist's workers run without shared memory and MPICH's without its
    same-host shortcut, on UCX's tcp transport; gloo is always on tcp; auto changes nothing."""
    from pydist.bench.launch import _commands
    tcp = {"transport": "tcp", "plan": []}
    pydist_env = [env for _, env in _commands(BACKENDS["pydist"], 2, tcp)]
    assert len(pydist_env) == 2 and all(env["PYDIST_SHM"] == "0" for env in pydist_env)
    [(_, mpi_env)] = _commands(BACKENDS["mpi"], 2, tcp)
    assert mpi_env["MPIR_CVAR_NOLOCAL"] == "1" and mpi_env["UCX_TLS"] == "tcp,self"
    auto = {"transport": "auto", "plan": []}
    auto_envs = [env for _, env in _commands(BACKENDS["pydist"], 2, auto)]
    assert all(env.get("PYDIST_SHM") == os.environ.get("PYDIST_SHM") for env in auto_envs)


@pytest.mark.slow
def test_transport_tcp_table_beside_gloo():
    if BACKENDS["gloo"].unavailable():
        pytest.skip(BACKENDS["gloo"].unavailable())
    done = run_bench("--transport", "tcp", "--compare", "gloo", *TINY)
    assert done.returncode == 0, done.stderr
    rows = table_lines(done.stdout)
    assert [int(r[0]) for r in rows] == TINY_SIZES and all(len(r) == 8 and float(r[5]) > 0 for r in rows)
