"""The records the agents read from the job's store, checked before use.

Every record an agent reads (a node's record, a stop record, where the workers' store is, a
round number) is parsed here: bad JSON, another shape or a field of another type raises
ValueError saying what is wrong, which the rendezvous turns into an error naming the key
(:class:`~pydist.run.agent_rendezvous.MalformedRecord`). With the job's secret (see
:mod:`.secret`) only the job's own agents can write these keys; the checks keep a buggy or
mismatched writer from crashing an agent with a traceback or steering it with a stop record
it never wrote.
"""
from __future__ import annotations

import dataclasses
import json
import signal
from typing import Any, TypeVar

from .failure import WorkerExit

_T = TypeVar("_T")
#: The Python types of a dataclass field's annotation (the annotations are strings here).
_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "int | None": (int, type(None)), "float": (int, float),
                                       "str": (str,), "bool": (bool,)}


def json_object(raw: bytes | str) -> dict[str, Any]:
    """``raw`` as a JSON object. ValueError if it is not one."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def check_fields(value: dict[str, Any], required: dict[str, tuple[type, ...]],
                 optional: dict[str, tuple[type, ...]] | None = None) -> dict[str, Any]:
    """``value`` if it has every ``required`` field, no field outside ``required`` and
    ``optional``, each of its type. ValueError naming the first field that is not."""
    optional = optional or {}
    for name in required:
        if name not in value:
            raise ValueError(f"field {name!r} is missing")
    for name, field_value in value.items():
        types = required.get(name) or optional.get(name)
        if types is None:
            raise ValueError(f"unexpected field {name!r}")
        if not _has_type(field_value, types):
            raise ValueError(f"field {name!r}: expected {' or '.join(t.__name__ for t in types)}, "
                             f"got {type(field_value).__name__}")
    return value


def dataclass_from(cls: type[_T], value: dict[str, Any]) -> _T:
    """An instance of the dataclass ``cls`` (fields of int, int | None, float, str, bool) from ``value``.
    ValueError if a field is missing, unexpected or of another type."""
    required: dict[str, tuple[type, ...]] = {}
    optional: dict[str, tuple[type, ...]] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        types = _TYPES[str(field.type)]
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        (optional if has_default else required)[field.name] = types
    return cls(**check_fields(value, required, optional))


def integer(raw: bytes | str) -> int:
    """``raw`` as a decimal integer. ValueError if it is not one."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text[:40]!r}") from None


_STOP_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "failure": {"exit": (dict,), "restarts_used": (int,)},
    "signal": {"signal": (int,), "host": (str,)},
    "join": {"host": (str,)},
}


def stop_record(raw: bytes | str) -> dict[str, Any]:
    """A round's stop record (see :meth:`~.agent_rendezvous.Rendezvous.request_stop`): its
    reason is failure (with the worker's exit and the restarts used), signal (a signal number
    and the launcher's host) or join (the host). ValueError for anything else."""
    record = json_object(raw)
    reason = record.get("reason")
    if reason not in _STOP_FIELDS:
        raise ValueError(f"field 'reason': expected one of {', '.join(_STOP_FIELDS)}, got {reason!r:.40}")
    check_fields(record, {"reason": (str,), **_STOP_FIELDS[reason]})
    if reason == "failure":
        try:
            dataclass_from(WorkerExit, record["exit"])
        except ValueError as error:
            raise ValueError(f"field 'exit': {error}") from None
    if reason == "signal":
        try:
            signal.Signals(record["signal"])
        except ValueError:
            raise ValueError(f"field 'signal': {record['signal']} is not a signal number") from None
    return record


def workers_store(raw: bytes | str) -> dict[str, Any]:
    """Where a round's workers' store is ({"addr", "port"}), or why node 0 could not start it
    ({"error"}). ValueError for anything else."""
    record = json_object(raw)
    if "error" in record:
        return check_fields(record, {"error": (str,)})
    check_fields(record, {"addr": (str,), "port": (int,)})
    if not 0 < record["port"] < 65536:
        raise ValueError(f"field 'port': expected 1..65535, got {record['port']}")
    return record
