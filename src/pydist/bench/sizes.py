"""Size specs: ``4``, ``64K``, ``4:256M`` (powers of two), ``1K:1M:4`` (factor 4), comma lists.

Suffixes K, M, G (optionally followed by ``B`` or ``iB``, any case) are binary: 1K = 1024.
A range ``a:b[:factor]`` is a, a*factor, a*factor**2, ... up to and including b (factor
defaults to 2). The result is sorted and without duplicates. Bad specs raise ValueError
with the offending part named.
"""
from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("4", "64K", "256MiB", "1G"); ValueError unless a positive size."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"size {text!r}: expected a number with an optional K, M or G suffix")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size {text!r}: must be at least 1 byte")
    return value


def _parse_range(item: str) -> list[int]:
    parts = item.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"size range {item!r}: expected start:end or start:end:factor")
    start, end = parse_size(parts[0]), parse_size(parts[1])
    factor = 2
    if len(parts) == 3:
        if not parts[2].strip().isdigit() or int(parts[2]) < 2:
            raise ValueError(f"size range {item!r}: the factor must be an integer >= 2")
        factor = int(parts[2])
    if start > end:
        raise ValueError(f"size range {item!r}: start is larger than end")
    sizes = []
    while start <= end:
        sizes.append(start)
        start *= factor
    return sizes


def parse_sizes(spec: str) -> list[int]:
    """All sizes in ``spec`` (comma-separated sizes and ranges), ascending, unique."""
    sizes: set[int] = set()
    for item in spec.split(","):
        if not item.strip():
            raise ValueError(f"sizes {spec!r}: empty item")
        sizes.update(_parse_range(item) if ":" in item else [parse_size(item)])
    return sorted(sizes)


def format_size(nbytes: int) -> str:
    """``nbytes`` for people: "4 B", "64 KiB", "1.5 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
