"""Link shaping for the netns harness: tc's rate/time/loss notation, and a host link's shaping.

``parse_rate``, ``parse_delay`` and ``parse_loss`` accept tc's notation ("200mbit", "20ms",
"1%") or plain numbers and raise ValueError naming the setting for anything else (unknown
unit, negative, a rate under 8kbit, a loss over 1). :class:`Shaping` holds one link's
settings and renders the tbf qdisc that caps its rate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")


def _parse(value: str | float, units: dict[str, float], what: str, default_unit: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        match = _QUANTITY.match(str(value).lower())
        if not match or (match.group(2) or default_unit) not in units:
            raise ValueError(f"{what}: cannot parse {value!r} (units: {', '.join(units)})")
        number = float(match.group(1)) * units[match.group(2) or default_unit]
    if number < 0:
        raise ValueError(f"{what}: expected a non-negative value, got {value!r}")
    return number


def parse_rate(rate: str | float) -> int:
    """Bits per second from tc's notation ("200mbit", "1gbit", "10mbps" = bytes) or a number."""
    bits = int(_parse(rate, _RATE_UNITS, "rate", "bit"))
    if bits < 8000:
        raise ValueError(f"rate: expected at least 8kbit, got {rate!r}")
    return bits


def parse_delay(delay: str | float) -> float:
    """Seconds from "20ms", "1.5s", "300us" or a number of seconds."""
    return _parse(delay, _TIME_UNITS, "delay", "s")


def parse_loss(loss: str | float) -> float:
    """A probability from 0.01 or "1%"."""
    if isinstance(loss, str) and loss.strip().endswith("%"):
        value = _parse(loss.strip()[:-1], {"": 1.0}, "loss", "") / 100
    else:
        value = _parse(loss, {"": 1.0}, "loss", "")
    if value > 1:
        raise ValueError(f"loss: expected a probability in [0, 1] or a percentage, got {loss!r}")
    return value


@dataclass(frozen=True)
class Shaping:
    """One host link's shaping: ``rate`` in bit/s each way; ``delay`` (s) and ``loss`` on what
    the host sends."""
    rate: int | None = None
    delay: float = 0.0
    loss: float = 0.0

    @classmethod
    def of(cls, rate=None, delay=None, loss=None) -> Shaping:
        return cls(None if rate is None else parse_rate(rate), 0.0 if delay is None else parse_delay(delay),
                   0.0 if loss is None else parse_loss(loss))

    def tbf(self, dev: str) -> list[str]:
        """tc lines for ``dev``'s root: a tbf whose bucket holds 1 ms of traffic but at least
        64 KiB (a whole GSO packet, so tbf need not split it) and whose queue holds 20 ms of
        traffic but at least 256 KiB (room for a TCP burst without drops at low rates)."""
        if not self.rate:
            return []
        per_second = self.rate / 8
        burst = max(64 * 1024, int(per_second * 1e-3))
        limit = burst + max(256 * 1024, int(per_second * 20e-3))
        return [f"qdisc add dev {dev} root handle 1: tbf rate {self.rate}bit burst {burst} limit {limit}"]
