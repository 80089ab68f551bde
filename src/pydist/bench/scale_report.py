"""The numbers of ``pydist-bench --scale``: each run's rank events summarized, as a table or JSON.

A run is what :func:`.scale.run_ranks` returns: ``nproc``, ``ranks`` (each rank's ``rank``
event, see :mod:`.scale_worker`) and ``store`` (rank 0's ``store`` event). :func:`summarize`
turns it into rows of ``{"median", "max"}`` over the ranks (``max``: the slowest or largest
rank) and the store's counts; the table has one row per quantity and two columns per N.
"""
from __future__ import annotations

import json
from statistics import median

from ..core.init_marks import INIT_DONE, INIT_START, RECORDS_EXCHANGED, STORE_READY, TRANSPORT_READY
from .scale_worker import SIZES

#: (key, label, digits) of the per-rank rows, in table order; times in ms, all_reduce in µs.
RANK_ROWS = (
    ("import_ms", "import (process start -> import pydist) ms", 1),
    ("store_connect_ms", "store connected (init start ->) ms", 1),
    ("records_ms", "records exchanged (store connected ->) ms", 1),
    ("rendezvous_ms", "= store/rendezvous ms", 1),
    ("connect_ms", "transport connected (records ->) ms", 1),
    ("init_barrier_ms", "init barrier (transport ->) ms", 1),
    ("connections_ms", "= connections (records -> init returned) ms", 1),
    ("init_ms", "init_process_group ms", 1),
    ("total_ms", "total (process start -> init returned) ms", 1),
    ("rss_init_mib", "RSS after init MiB", 1),
    ("rss_end_mib", "RSS after all_reduce MiB", 1),
    ("fds_init", "open fds after init", 0),
    ("sockets_init", "sockets after init", 0),
    ("fds_end", "open fds after all_reduce", 0),
    ("sockets_end", "sockets after all_reduce", 0),
    *((f"all_reduce_{n}_first_us", f"all_reduce {n} B first call us", 1) for n in SIZES),
    *((f"all_reduce_{n}_us", f"all_reduce {n} B next calls us", 1) for n in SIZES),
)


def _rank_values(event: dict) -> dict[str, float]:
    """One rank's per-rank quantities (all_reduce's "next calls": its median)."""
    m, ms = event["marks"], 1e3
    values = {
        "import_ms": (event["imported"] - event["spawned"]) * ms,
        "store_connect_ms": (m[STORE_READY] - m[INIT_START]) * ms,
        "records_ms": (m[RECORDS_EXCHANGED] - m[STORE_READY]) * ms,
        "rendezvous_ms": (m[RECORDS_EXCHANGED] - m[INIT_START]) * ms,
        "connect_ms": (m[TRANSPORT_READY] - m[RECORDS_EXCHANGED]) * ms,
        "init_barrier_ms": (m[INIT_DONE] - m[TRANSPORT_READY]) * ms,
        "connections_ms": (m[INIT_DONE] - m[RECORDS_EXCHANGED]) * ms,
        "init_ms": (m[INIT_DONE] - m[INIT_START]) * ms,
        "total_ms": (m[INIT_DONE] - event["spawned"]) * ms,
    }
    for when, usage in (("init", event["after_init"]), ("end", event["after_all_reduce"])):
        values.update({f"rss_{when}_mib": usage["rss_mib"], f"fds_{when}": usage["fds"],
                       f"sockets_{when}": usage["sockets"]})
    for n in SIZES:
        timed = event["all_reduce"][str(n)]
        values[f"all_reduce_{n}_first_us"] = timed["first"] * 1e6
        values[f"all_reduce_{n}_us"] = median(timed["times"]) * 1e6
    return values


def _slowest_per_call(events: list[dict], n: int) -> float:
    """µs: the median over the timed calls of the slowest rank's time of each (nccl-tests' way)."""
    per_rank = [event["all_reduce"][str(n)]["times"] for event in events]
    return median(max(times) for times in zip(*per_rank)) * 1e6


def _store(store: dict, events: list[dict]) -> dict:
    """The store server's counts during init, its rate over the init window, and after init."""
    init, end = store["init"], store["end"]
    total = sum(init["requests"].values())
    window = max(e["marks"][INIT_DONE] for e in events) - min(e["marks"][INIT_START] for e in events)
    return {"requests": dict(sorted(init["requests"].items(), key=lambda item: -item[1])), "total": total,
            "per_second": total / window if window > 0 else 0.0, "init_window_ms": window * 1e3,
            "peak_connections": init["peak_connections"], "opened": init["opened"],
            "after_init": sum(end["requests"].values()) - total}


def summarize(run: dict) -> dict:
    """``nproc``, ``rows`` (key -> {"median", "max"} over the ranks) and ``store``."""
    events = [run["ranks"][r] for r in sorted(run["ranks"])]
    values = [_rank_values(event) for event in events]
    rows = {key: {"median": median(v[key] for v in values), "max": max(v[key] for v in values)}
            for key, _, _ in RANK_ROWS}
    for n in SIZES:
        rows[f"all_reduce_{n}_us"]["max"] = _slowest_per_call(events, n)
    return {"nproc": run["nproc"], "rows": rows, "store": _store(run["store"], events)}


def _store_rows(summaries: list[dict]) -> list[tuple[str, list[float | None], int]]:
    """(label, one value per N, digits) of the store's rows; every request kind seen at any N."""
    kinds = list(dict.fromkeys(kind for s in summaries for kind in s["store"]["requests"]))
    rows: list[tuple[str, list[float | None], int]] = [
        ("store requests during init", [s["store"]["total"] for s in summaries], 0)]
    rows += [(f"  {kind}", [s["store"]["requests"].get(kind, 0) for s in summaries], 0) for kind in kinds]
    rows += [("store requests/s during init", [s["store"]["per_second"] for s in summaries], 0),
             ("store connections, peak", [s["store"]["peak_connections"] for s in summaries], 0),
             ("store connections, opened", [s["store"]["opened"] for s in summaries], 0),
             ("store requests after init", [s["store"]["after_init"] for s in summaries], 0)]
    return rows


def _cell(value: float | None, digits: int, width: int) -> str:
    return f"{'' if value is None else f'{value:.{digits}f}':>{width}}"


def format_table(summaries: list[dict], title: str, command: str) -> str:
    """The table: comment header, then per quantity a row with median and max for each N
    (the store's rows: one value per N, under "med")."""
    label_width, width = 46, 10
    lines = [title, f"# command: {command}",
             "# med: median over the ranks; max: the slowest rank (all_reduce next calls: the median over the "
             "calls of the slowest rank's time)",
             "#" + " " * (label_width - 1) + "".join(f"{'N=' + str(s['nproc']):>{2 * width}}" for s in summaries),
             f"{'# quantity':<{label_width}}" + "".join(f"{'med':>{width}}{'max':>{width}}" for _ in summaries)]
    for key, label, digits in RANK_ROWS:
        cells = "".join(_cell(s["rows"][key]["median"], digits, width) + _cell(s["rows"][key]["max"], digits, width)
                        for s in summaries)
        lines.append(f"{label:<{label_width}}{cells}")
    for label, values, digits in _store_rows(summaries):
        lines.append(f"{label:<{label_width}}" + "".join(_cell(v, digits, width) + " " * width for v in values))
    return "\n".join(lines)


def to_json(summaries: list[dict], meta: dict) -> str:
    """The JSON document: ``meta`` and one summary per N."""
    return json.dumps({**meta, "runs": summaries}, indent=2)
