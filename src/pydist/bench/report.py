"""Results of a run, as nccl-tests-style table or as JSON.

A :class:`BackendResult` holds one backend's measured seconds per size (``rows``, keyed by
bytes) and its status: ``ok``, ``unavailable`` (cannot run here, e.g. not installed: not run)
or ``failed`` (stopped partway: the sizes it finished are kept). Times are printed in µs,
bandwidths in GB/s (1e9 B/s), ratios as other backend's time / main backend's time, so a
ratio above 1 means the main backend is faster. Missing values print as ``-`` (JSON null).
A run inside a launched job (:mod:`.injob`) also says who launched it and on how many hosts
(:class:`Job`: the table's first line, the JSON's ``job``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .ops import OPS, bandwidths


@dataclass
class BackendResult:
    key: str
    label: str
    status: str = "ok"
    note: str = ""
    rows: dict[int, dict] = field(default_factory=dict)  # bytes -> {"seconds", "iters", "warmup"}


@dataclass
class Job:
    """The launched job a run was part of (see :mod:`.injob`)."""

    launcher: str  # "torchrun/pydist-run", "mpiexec (MPICH Hydra)", ...
    hosts: int  # distinct host names among the ranks
    backends: list[str]  # the labels of the backends run, main first


@dataclass
class Meta:
    """What was run: printed in the table header and the JSON document."""

    command: str
    op: str
    nproc: int
    dtype: str
    iters: int
    warmup: int
    budget: int
    cpus: int
    load: float  # 1-minute load average at the start: a busy host makes noisy numbers
    job: Job | None = None  # None: the CLI started the workers itself, on this host


def measure(meta: Meta, result: BackendResult, nbytes: int) -> dict | None:
    """Time (µs), algbw and busbw (GB/s), iterations of ``result`` at ``nbytes``; None if not measured."""
    row = result.rows.get(nbytes)
    if row is None:
        return None
    algbw, busbw = bandwidths(meta.op, nbytes, row["seconds"], meta.nproc)
    return {"time_us": row["seconds"] * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw, "iters": row["iters"],
            "warmup": row["warmup"]}


def _ratio(main: dict | None, other: dict | None) -> float | None:
    if main is None or other is None or main["time_us"] <= 0:
        return None
    return other["time_us"] / main["time_us"]


def to_json(meta: Meta, plan: list[tuple[int, int]], results: list[BackendResult]) -> str:
    """The JSON document: meta, backends (status, note) and one row per size."""
    main = results[0]
    rows = []
    for nbytes, count in plan:
        measured = {r.key: measure(meta, r, nbytes) for r in results if r.rows}
        rows.append({"bytes": nbytes, "count": count, "results": measured,
                     "ratios": {r.key: _ratio(measured.get(main.key), measured[r.key])
                                for r in results[1:] if r.rows}})
    fields = {key: value for key, value in meta.__dict__.items() if key != "job"}
    if meta.job is not None:
        fields["job"] = meta.job.__dict__
    document = {**fields, "busbw_factor": OPS[meta.op].bus_factor(meta.nproc), "main": main.key,
                "backends": [{"key": r.key, "label": r.label, "status": r.status, "note": r.note} for r in results],
                "rows": rows}
    return json.dumps(document, indent=2)


def _cell(value: float | None, width: int, digits: int) -> str:
    return f"{'-' if value is None else f'{value:.{digits}f}':>{width}}"


def _title(meta: Meta) -> str:
    """The first line: what ran, on what (for a launched job: ranks, hosts, launcher, backends)."""
    common = f"dtype={meta.dtype}  iters={meta.iters} warmup={meta.warmup}"
    host = f"{meta.cpus} cpus, load {meta.load:.2f}"
    if meta.job is None:
        return f"# pydist-bench {meta.op}  nproc={meta.nproc}  {common}   (host: {host})"
    job, hosts = meta.job, "host" if meta.job.hosts == 1 else "hosts"
    return (f"# pydist-bench {meta.op}  backends={','.join(job.backends)}  nproc={meta.nproc} ranks on {job.hosts} "
            f"{hosts} (launched by {job.launcher})  {common}   (rank 0's host: {host})")


def format_table(meta: Meta, plan: list[tuple[int, int]], results: list[BackendResult]) -> str:
    """The table: comment header (what ran, the command, notes), then one row per size."""
    main, shown = results[0], [r for r in results[1:] if r.rows]
    lines = [_title(meta), f"# command: {meta.command}"]
    for result in results:
        if result.status != "ok":
            note = result.note.replace("\n", "\n#   ")
            lines.append(f"# note: {result.label}: {result.status}: {note}")
    headers = [("bytes", 14), ("count", 11), (f"{main.label} us", 12), ("algbw GB/s", 12), ("busbw GB/s", 12)]
    for other in shown:
        headers += [(f"{other.label} us", 12), ("busbw GB/s", 12), (f"{other.label}/{main.label}", 13)]
    widths = [max(width, len(name) + 2) for name, width in headers]
    lines.append("#" + "".join(f"{name:>{w}}" for (name, _), w in zip(headers, widths))[1:])
    for nbytes, count in plan:
        first = measure(meta, main, nbytes)
        cells = [f"{nbytes:>{widths[0]}}", f"{count:>{widths[1]}}"]
        values = [(first["time_us"] if first else None, 1), (first["algbw_gbps"] if first else None, 2),
                  (first["busbw_gbps"] if first else None, 2)]
        for other in shown:
            measured = measure(meta, other, nbytes)
            values += [(measured["time_us"] if measured else None, 1),
                       (measured["busbw_gbps"] if measured else None, 2), (_ratio(first, measured), 2)]
        cells += [_cell(value, w, digits) for (value, digits), w in zip(values, widths[2:])]
        lines.append("".join(cells))
    return "\n".join(lines)
