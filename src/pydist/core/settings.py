"""Every PYDIST_* environment variable, declared once: name, type, default, valid values, meaning.

``Settings`` is the table: one field per variable, its metadata saying how the text is
parsed. ``settings()`` parses all of them, once per distinct environment, and is called where
a value takes effect (a group or transport being made, a tool starting), so that a variable set
after fork, or by a test before init, counts. A bad value raises SettingError (a ValueError)
naming the variable, what it expects and what it was given. The site's settings table is ``markdown()``.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SettingError

#: The algorithm names each collective accepts in PYDIST_ALGO_<COLLECTIVE> (the engine's
#: ALGORITHMS table must offer exactly these: tests/test_settings_table.py checks).
ALGORITHM_CHOICES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("shm", "hierarchical", "rails", "recursive_doubling", "ring"),
    "broadcast": ("shm", "hierarchical", "rails", "binomial"),
    "reduce": ("shm", "hierarchical", "binomial"),
    "all_gather": ("shm", "hierarchical", "bruck", "ring"),
    "reduce_scatter": ("shm", "hierarchical", "recursive_doubling", "ring"),
    "all_to_all": ("shm", "pairwise"),
    "gather": ("shm", "linear"),
    "scatter": ("shm", "linear"),
    "barrier": ("shm", "dissemination"),
}


# -- parsers: text -> value, or ValueError saying what was expected ------------------------

Parser = Callable[[str], Any]


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("expected 0 or 1")
    return text == "1"


def _count(minimum: int, multiple: int = 1) -> Parser:
    """A whole number of at least ``minimum`` and a multiple of ``multiple``."""
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum or int(text) % multiple:
            raise ValueError(f"expected a whole number, at least {minimum}"
                             + (f", a multiple of {multiple}" if multiple > 1 else ""))
        return int(text)
    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _choice(*names: str, lower: bool = False) -> Parser:
    def parse(text: str) -> str:
        value = text.lower() if lower else text
        if value not in names:
            raise ValueError(f"expected one of {', '.join(names)}")
        return value
    return parse


def _text(text: str) -> str:
    return text


def _setting(name: str, default: Any, parse: Parser, valid: str, meaning: str) -> Any:
    """One row of the table (a dataclass field; unset or empty means ``default``)."""
    return dataclasses.field(default=default, metadata={
        "variable": name, "parse": parse, "valid": valid, "meaning": meaning})


def _algorithm(collective: str) -> Any:
    choices = ALGORITHM_CHOICES[collective]
    return _setting(f"PYDIST_ALGO_{collective.upper()}", None, _choice(*choices), " / ".join(choices),
                    f"Force the {collective} algorithm (default: chosen by size and topology, "
                    "docs/algorithms.md).")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The PYDIST_* variables in force, parsed (the field order is the settings table's order)."""

    shm: bool = _setting(
        "PYDIST_SHM", True, _flag, "0 / 1",
        "Shared memory between ranks on one host; 0 keeps every byte on TCP.")
    shm_ring_bytes: int = _setting(
        "PYDIST_SHM_RING_BYTES", 1 << 20, _count(4096, 64), "bytes, multiple of 64, >= 4096",
        "Each shared-memory point-to-point ring (one per pair of ranks on a host, each direction).")
    shm_slot_bytes: int = _setting(
        "PYDIST_SHM_SLOT_BYTES", 512 << 10, _count(64, 64), "bytes, multiple of 64, >= 64",
        "Each rank's slot in a group's shared-memory arena (larger collectives go in rounds).")
    max_unexpected_bytes: int = _setting(
        "PYDIST_MAX_UNEXPECTED_BYTES", 64 << 20, _count(1), "bytes, >= 1",
        "Data a rank holds from one peer before posting receives for it; past that it stops "
        "reading from that peer over TCP (the sender then blocks) until a receive wants it.")
    segment_bytes: int = _setting(
        "PYDIST_SEGMENT_BYTES", 4 << 20, _count(1), "bytes, >= 1",
        "Pipeline segment of the network algorithms (4 MiB: fastest measured over TCP, see "
        "docs/algorithms.md; small values exercise multi-segment paths).")
    peer_timeout: float = _setting(
        "PYDIST_PEER_TIMEOUT", 3.0, _seconds, "seconds, >= 0",
        "A peer from which nothing arrives for this long (not even the heartbeat its pydist thread "
        "sends every third of it) is declared dead, naming it: a stopped (SIGSTOP) or stuck process, "
        "or a host or network gone without closing its sockets; it learns, if it wakes, that it was "
        "(EvictedError). 0: no heartbeat; such a peer is found only by the operation timeout.")
    stripe_bytes: int = _setting(
        "PYDIST_STRIPE_BYTES", 1 << 20, _count(0), "bytes, >= 0",
        "A collective's message at least this large is split over one connection per interface "
        "when PYDIST_SOCKET_IFNAME names several (smaller ones use the first); 0: never split.")
    tcp_connect: str = _setting(
        "PYDIST_TCP_CONNECT", "auto", _choice("auto", "eager", "lazy", lower=True), "auto / eager / lazy",
        "When TCP connections are made: eager (every pair at init, a full mesh), lazy (a pair when "
        "it first exchanges a message; ranks of one host with shared memory still at init) or auto "
        "(lazy from 64 ranks).")
    connect_timeout: float = _setting(
        "PYDIST_CONNECT_TIMEOUT", 20.0, _seconds, "seconds, >= 0",
        "At init, a peer whose published address refuses connections for this long is reported as "
        "gone, naming it and the address (it exited, or an earlier run left its address in the "
        "store) instead of being retried until the group's timeout.")
    handshake_timeout: float = _setting(
        "PYDIST_HANDSHAKE_TIMEOUT", 5.0, _seconds, "seconds, >= 0",
        "A connection to a rank's listener or to a store server must prove it belongs within this "
        "long after it was accepted (TLS, then the HELLOs or the store's opening), talking or not, or "
        "it is dropped (logged, rate limited); handshakes run side by side, so idle or slow "
        "connections cannot hold up the job's own. 0: no limit.")
    tcp_reader: str = _setting(
        "PYDIST_TCP_READER", "caller", _choice("caller", "io", lower=True), "caller / io",
        "Who reads a TCP peer's socket for a blocked receive: caller (its own thread, no hand-off; "
        "the I/O thread reads the rest) or io (always the I/O thread).")
    algo_all_reduce: str | None = _algorithm("all_reduce")
    algo_broadcast: str | None = _algorithm("broadcast")
    algo_reduce: str | None = _algorithm("reduce")
    algo_all_gather: str | None = _algorithm("all_gather")
    algo_reduce_scatter: str | None = _algorithm("reduce_scatter")
    algo_all_to_all: str | None = _algorithm("all_to_all")
    algo_gather: str | None = _algorithm("gather")
    algo_scatter: str | None = _algorithm("scatter")
    algo_barrier: str | None = _algorithm("barrier")
    join: bool = _setting(
        "PYDIST_JOIN", False, _flag, "0 / 1",
        "1: this process joins a running job (a replacement: pydist-run --on-failure replace sets "
        "it): init_process_group waits until the job's ranks admit it (pydist.admit_joiners).")
    backend: str = _setting(
        "PYDIST_BACKEND", "pydist", _choice("pydist", "mpi", lower=True), "pydist / mpi",
        "Engine of the torch plugin's groups when pg_options does not name one.")
    cuda: str = _setting(
        "PYDIST_CUDA", "pydist", _choice("pydist", "gloo", "nccl", lower=True), "pydist / gloo / nccl",
        "Backend of the torch plugin's groups for CUDA tensors when neither the backend string "
        "(\"cpu:pydist,cuda:gloo\") nor pg_options names one: gloo or nccl (a torch backend the "
        "group makes beside pydist), or pydist (pydist's own CUDA engine where PYDIST_CUDA_ENGINE=1, "
        "else refused, saying how to ask for it).")
    device_slot_bytes: int = _setting(
        "PYDIST_DEVICE_SLOT_BYTES", 32 << 20, _count(4096, 64), "bytes, multiple of 64, >= 4096",
        "Each of the two slots of the device buffer a rank allocates per group for device tensors "
        "between ranks of one host (CUDA IPC); larger collectives go through it in rounds.")
    device_one_shot_bytes: int = _setting(
        "PYDIST_DEVICE_ONE_SHOT_BYTES", 1 << 20, _count(0), "bytes, >= 0",
        "A device all_reduce among more than two ranks of one host up to this size reads every "
        "rank's data (one barrier a round); larger ones reduce-scatter then all-gather (two).")
    cuda_engine: bool = _setting(
        "PYDIST_CUDA_ENGINE", False, _flag, "0 / 1",
        "1: CUDA tensors run on pydist's own CUDA engine, in pydist's API and the torch plugin "
        "(device to device through CUDA IPC between the ranks of a host, staged through pinned "
        "memory across hosts; docs/guide/gpu.md). Opt-in until make gpu-check has passed on a GPU. "
        "0: pydist refuses them, saying how to ask; in torch they go where PYDIST_CUDA says.")
    cuda_chunk_bytes: int = _setting(
        "PYDIST_CUDA_CHUNK_BYTES", 4 << 20, _count(64, 8), "bytes, multiple of 8, >= 64",
        "Chunk of the staged path that carries CUDA tensors across hosts through pinned host "
        "memory: three chunks in flight (device to host chunk k+1, network chunk k, host to "
        "device chunk k-1; 4 MiB as UCX's CUDA pipeline). A collective of W parts per chunk "
        "(all_gather, all_to_all...) gives each part 1/W of it.")
    cuda_pinned_bytes: int = _setting(
        "PYDIST_CUDA_PINNED_BYTES", 12 << 20, _count(64), "bytes, >= 64 and >= the chunk",
        "Pinned host memory a group's staged path holds at most for its collectives, and as much "
        "again for its send/recv across hosts: pools of chunk buffers, made on first use and "
        "reused. Three chunks let the three stages overlap; fewer run them in turn.")
    host_id: str | None = _setting(
        "PYDIST_HOST_ID", None, _text, "any text",
        "Host identity: ranks with equal ones share memory (default: host name, boot id, "
        "network namespace).")
    advertise_addr: str | None = _setting(
        "PYDIST_ADVERTISE_ADDR", None, _text, "an IP address",
        "Address peers dial to reach this rank (default: the interface that reaches the store).")
    socket_ifname: str | None = _setting(
        "PYDIST_SOCKET_IFNAME", None, _text, "NCCL_SOCKET_IFNAME's syntax",
        "Interfaces for peer connections: comma list of name prefixes, `^` first excludes, `=` "
        "makes names exact (`eth1`, `^docker,lo`, `=eth0`); several: one connection per peer on "
        "each, large messages striped (PYDIST_STRIPE_BYTES); default: GLOO_SOCKET_IFNAME's names "
        "if set, else the interface that reaches the store.")
    auth_token: str | None = _setting(
        "PYDIST_AUTH_TOKEN", None, _text, "any text",
        "Shared secret: stores and peer connections authenticate with it (default: none).")
    tls_cert: str | None = _setting(
        "PYDIST_TLS_CERT", None, _text, "a PEM file",
        "Mutual TLS: this rank's certificate (with PYDIST_TLS_KEY and PYDIST_TLS_CA, all three or "
        "none); the store and peer connections encrypt and refuse peers whose certificate the CA "
        "did not sign (default: no TLS).")
    tls_key: str | None = _setting(
        "PYDIST_TLS_KEY", None, _text, "a PEM file", "Mutual TLS: the private key of PYDIST_TLS_CERT.")
    tls_ca: str | None = _setting(
        "PYDIST_TLS_CA", None, _text, "a PEM file",
        "Mutual TLS: the CA certificate(s) peers' certificates must chain to.")
    trace_buffer: int = _setting(
        "PYDIST_TRACE_BUFFER", 2000, _count(0), "operations, >= 0",
        "Flight recorder: operations kept per group; 0 turns it off.")
    trace_dir: str | None = _setting(
        "PYDIST_TRACE_DIR", None, _text, "a directory",
        "Where each rank writes its flight recorder on a failure and at destroy.")
    debug: str = _setting(
        "PYDIST_DEBUG", "off", _choice("off", "info", "detail", lower=True), "off / info / detail",
        "detail: the flight recorder also notes each call's file and line.")
    timeline: str | None = _setting(
        "PYDIST_TIMELINE", None, _text, "a path; {rank} is replaced",
        "Write every operation as Chrome/Perfetto trace events to this file.")
    bench_launcher_pid: int | None = _setting(
        "PYDIST_BENCH_LAUNCHER_PID", None, _count(1), "a process id",
        "Set by pydist-bench for the ranks it starts (they stop when it is gone); not for users.")
    run_worker: bool = _setting(
        "PYDIST_RUN_WORKER", False, _flag, "0 / 1",
        "Set by pydist-run for its workers: MASTER_ADDR:MASTER_PORT is pydist-run's store, which "
        "torch's env:// then reaches with pydist's client when it authenticates; not for users.")

    def forced_algorithms(self) -> dict[str, str]:
        """{collective: algorithm} for every PYDIST_ALGO_<COLLECTIVE> that is set."""
        forced = {c: getattr(self, f"algo_{c}") for c in ALGORITHM_CHOICES}
        return {c: name for c, name in forced.items() if name is not None}

    def __repr__(self) -> str:  # never print the secret
        shown = {f.name: getattr(self, f.name) for f in FIELDS if f.name != "auth_token"}
        return f"Settings({shown})"


FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(Settings)
VARIABLES: tuple[str, ...] = tuple(f.metadata["variable"] for f in FIELDS)


def parse(environ: Mapping[str, str]) -> Settings:
    """Every variable of ``environ`` parsed; ValueError naming the first bad one."""
    values = {}
    for field in FIELDS:
        name = field.metadata["variable"]
        text = environ.get(name, "")
        if text:
            try:
                values[field.name] = field.metadata["parse"](text)
            except ValueError as error:
                raise SettingError(f"environment variable {name}={text!r}: {error}") from None
    return Settings(**values)


_cache: tuple[tuple[str | None, ...], Settings] | None = None


def settings() -> Settings:
    """The settings of the current environment (parsed again only when a PYDIST_* value changed)."""
    global _cache
    texts = tuple(map(os.environ.get, VARIABLES))
    cached = _cache
    if cached is not None and cached[0] == texts:
        return cached[1]
    value = parse(os.environ)
    _cache = (texts, value)
    return value


def markdown() -> str:
    """The settings as a markdown table (docs/reference/settings.md shows it)."""
    rows = ["| variable | default | valid values | meaning |", "|---|---|---|---|"]
    for field in FIELDS:
        default = field.default
        shown = "unset" if default is None else str(int(default)) if isinstance(default, bool) else str(default)
        meta = field.metadata
        rows.append(f"| `{meta['variable']}` | {shown} | {meta['valid']} | {meta['meaning']} |")
    return "\n".join(rows)
