"""Reading every rank's flight-recorder file and saying where the ranks diverged.

For each group (matched across ranks by name), from the traces alone:

- a table: per rank, the last sequence number it started and the last it completed, and
  the state of its last operation;
- ``mismatch``: the first sequence number at which ranks called different operations (or
  the same with a different dtype, count, root or reduce op), naming both sides: "rank 1
  called all_gather(float32, 8) at seq 5 while rank 0 called all_reduce(float32, 8, SUM)";
- ``behind``: ranks that never reached the furthest operation, with the operation they did
  not reach and the ranks that did;
- ``stuck``: ranks inside an operation that never finished;
- ``failed``: each rank's first failed operation and its error;
- ranks of the group without a file.

``count`` is compared only for collectives whose counts must agree on every rank
(all_to_all's and gather/scatter of objects may differ).
"""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

#: calls that run the same collective (a rank may use either form)
_SAME_COLLECTIVE = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
                    "all_to_all_single": "all_to_all", "gather_object": "gather",
                    "gather_single": "gather",
                    "scatter_object_list": "scatter"}
_COUNT_AGREES = {"broadcast", "all_reduce", "reduce", "all_gather", "reduce_scatter", "gather", "scatter"}
_ERROR_CHARS = 300


def load(paths: list[str]) -> list[dict]:
    """The trace files in ``paths`` (directories are searched for pydist_trace_rank*.json),
    one dict per rank (the newest file of a rank wins)."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files.extend(sorted(glob.glob(os.path.join(path, "pydist_trace_rank*.json"))))
        else:
            files.append(path)
    ranks: dict[int, dict] = {}
    for name in files:
        with open(name) as file:
            trace = json.load(file)
        trace["file"] = name
        rank = trace["rank"]
        if rank not in ranks or trace.get("time_dumped", 0) > ranks[rank].get("time_dumped", 0):
            ranks[rank] = trace
    return [ranks[r] for r in sorted(ranks)]


def call_text(entry: dict) -> str:
    """``all_reduce(float32, 8, SUM)``: the call as the analyzer names it."""
    parts = []
    if entry.get("dtype"):
        parts += [entry["dtype"], str(entry.get("count", 0))]
    if entry.get("root") is not None:
        parts.append(f"root {entry['root']}")
    if entry.get("reduce_op"):
        parts.append(entry["reduce_op"])
    return f"{entry['op']}({', '.join(parts)})"


def signature(entry: dict) -> tuple:
    """What must agree across ranks at one sequence number."""
    op = _SAME_COLLECTIVE.get(entry["op"], entry["op"])
    count = entry.get("count") if op in _COUNT_AGREES and not entry["op"].endswith("_object") else None
    return op, entry.get("dtype") if count is not None else None, count, entry.get("root"), entry.get("reduce_op")


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _error_text(entry: dict) -> str:
    text = (entry.get("error") or "").splitlines()[0] if entry.get("error") else "(no error text)"
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 3] + "..."


@dataclass
class GroupReport:
    """What the traces say about one group."""
    name: str
    ranks: list[int]
    table: list[tuple[int, int | None, int | None, str]] = field(default_factory=list)
    mismatch: list[str] = field(default_factory=list)
    behind: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not (self.mismatch or self.behind or self.stuck or self.failed or self.missing)


def _by_seq(group: dict) -> dict[int, dict]:
    return {e["seq"]: e for e in group["entries"] if e.get("seq")}


def _mismatches(by_rank: dict[int, dict[int, dict]]) -> list[str]:
    """The first sequence number whose calls differ, as one line per differing side."""
    for seq in sorted(set().union(*(calls.keys() for calls in by_rank.values()))):
        sides: dict[tuple, list[int]] = defaultdict(list)
        for rank, calls in sorted(by_rank.items()):
            if seq in calls:
                sides[signature(calls[seq])].append(rank)
        if len(sides) < 2:
            continue
        ordered = sorted(sides.items(), key=lambda item: (-len(item[1]), item[1][0]))
        reference_ranks = ordered[0][1]
        reference = by_rank[reference_ranks[0]][seq]
        lines = []
        for _, ranks in ordered[1:]:
            call = by_rank[ranks[0]][seq]
            lines.append(f"{_ranks_text(ranks)} called {call_text(call)} at seq {seq} while "
                         f"{_ranks_text(reference_ranks)} called {call_text(reference)}")
        later = sum(1 for s in set().union(*(c.keys() for c in by_rank.values())) if s > seq)
        if later:
            lines.append(f"(operations after seq {seq} are not compared: "
                         "once calls differ, later ones pair up wrongly)")
        return lines
    return []


def analyze_group(name: str, members: list[int], groups: dict[int, dict], dumped: dict[int, float]) -> GroupReport:
    """``groups``: rank -> that rank's record of the group; ``dumped``: rank -> dump time (mono)."""
    report = GroupReport(name, members, missing=sorted(set(members) - set(groups)))
    by_rank = {rank: _by_seq(group) for rank, group in groups.items()}
    last_started: dict[int, int | None] = {}
    for rank, group in sorted(groups.items()):
        calls = by_rank[rank]
        started = max(calls, default=None)
        completed = max((s for s, e in calls.items() if e["state"] == "completed"), default=None)
        last_started[rank] = started
        last = calls[started] if started is not None else None
        state = f"{call_text(last)} {last['state']}" if last else "no operation"
        queued = sum(1 for e in group["entries"] if e["state"] == "queued")
        report.table.append((rank, started, completed, state + (f", {queued} queued" if queued else "")))
        if last is not None and last["state"] == "started":
            since = dumped[rank] - last["mono_started"] if last.get("mono_started") else 0.0
            report.stuck.append(f"rank {rank} is in seq {started} {call_text(last)}, started {since:.1f} s "
                                "before its trace was written")
        first_failure = next((e for s, e in sorted(calls.items()) if e["state"] == "failed"), None)
        if first_failure is not None:
            report.failed.append(f"rank {rank} seq {first_failure['seq']} {call_text(first_failure)}: "
                                 f"{_error_text(first_failure)}")
    report.mismatch = _mismatches(by_rank)
    furthest = max((s for s in last_started.values() if s is not None), default=None)
    if furthest is not None:
        for rank, started in sorted(last_started.items()):
            if started is not None and started >= furthest:
                continue
            missed = (started or 0) + 1
            callers: dict[str, list[int]] = defaultdict(list)
            for other, seqs in sorted(by_rank.items()):
                if missed in seqs:
                    callers[call_text(seqs[missed])].append(other)
            reached = "; ".join(f"{call} (started by {_ranks_text(ranks)})" for call, ranks in callers.items())
            last_text = f"; its last was seq {started} {call_text(by_rank[rank][started])}" if started else ""
            report.behind.append(f"rank {rank} never reached seq {missed} {reached or '?'}{last_text}")
    return report


def analyze(traces: list[dict]) -> list[GroupReport]:
    """One report per group found in ``traces`` (one dict per rank, as ``load`` returns).
    Groups are matched across ranks by name; several groups of one name (the torch plugin
    names all its groups "torch") by creation order, reported as NAME, NAME#2, ..."""
    groups: dict[str, dict[int, dict]] = defaultdict(dict)
    members: dict[str, list[int]] = {}
    dumped = {trace["rank"]: trace.get("mono_dumped", 0.0) for trace in traces}
    for trace in traces:
        seen: dict[str, int] = defaultdict(int)
        for group in trace["groups"]:  # in creation order: the k-th group named N is the same group on every rank
            name = group["name"] if not seen[group["name"]] else f"{group['name']}#{seen[group['name']] + 1}"
            seen[group["name"]] += 1
            groups[name][trace["rank"]] = group
            members.setdefault(name, group["ranks"])
    return [analyze_group(name, members[name], groups[name], dumped) for name in groups]


def _when_written(trace: dict) -> str:
    """Why a trace file was written, saying once whether a failure came first: "on exit",
    "on exit after a failure", "on demand, after a failure", "when it failed: <error>"."""
    reason, failure = trace["reason"], trace.get("first_failure")
    if failure and failure == reason:
        return f"when it failed: {reason}"
    after = ", after a failure" if failure and "after a failure" not in reason else ""
    return f"{reason}{after}" if reason.startswith("on ") else f"on {reason}{after}"


def format_report(traces: list[dict], reports: list[GroupReport]) -> str:
    """The analyzer's text: files, then per group the table and the findings."""
    lines = [f"pydist flight recorder: {len(traces)} rank file(s)"]
    for trace in traces:
        where = f" ({trace['endpoint']})" if trace.get("endpoint") else ""
        lines.append(f"  rank {trace['rank']}: {trace['host']}{where} pid {trace['pid']}, "
                     f"written {_when_written(trace)}")
    for report in reports:
        lines.append("")
        lines.append(f"group {report.name} (ranks {', '.join(map(str, report.ranks))})")
        lines.append(f"  {'rank':>5}  {'started':>8}  {'completed':>9}  last operation")
        for rank, started, completed, state in report.table:
            lines.append(f"  {rank:>5}  {_seq(started):>8}  {_seq(completed):>9}  {state}")
        for title, items in (("MISMATCH", report.mismatch), ("BEHIND", report.behind), ("STUCK", report.stuck),
                             ("FAILED", report.failed)):
            lines.extend(f"  {title}: {item}" for item in items)
        if report.missing:
            lines.append(f"  NO TRACE from {_ranks_text(report.missing)} (not written: killed, or still running)")
        if report.healthy:
            lines.append("  consistent: every rank called the same operations and none failed")
    return "\n".join(lines)


def _seq(value: int | None) -> str:
    return "-" if value is None else str(value)


def main_text(paths: list[str]) -> str:
    traces = load(paths)
    if not traces:
        raise FileNotFoundError(f"no pydist_trace_rank*.json in {', '.join(paths)}")
    return format_report(traces, analyze(traces))


def as_json(paths: list[str]) -> dict[str, Any]:
    """The findings as data (for scripts): per group the table and the finding lists."""
    traces = load(paths)
    if not traces:
        raise FileNotFoundError(f"no pydist_trace_rank*.json in {', '.join(paths)}")
    return {report.name: {"ranks": report.ranks, "table": report.table, "mismatch": report.mismatch,
                          "behind": report.behind, "stuck": report.stuck, "failed": report.failed,
                          "missing": report.missing} for report in analyze(traces)}
