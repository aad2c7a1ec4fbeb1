"""Byte sizes as people write them: 24GiB, 80GB, 81559MiB, 1.5TiB, 123456 (bytes)."""

from __future__ import annotations

import re

from gpuready.errors import InputError

KIB = 1024
MIB = 1024**2
GIB = 1024**3

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, field: str = "size") -> int:
    """Parse a size into bytes. GB is 10^9 (as GPU vendors print it), GiB 2^30 (as nvidia-smi's MiB)."""
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise InputError(field, f"{text!r} is not a size; use e.g. 24GiB, 80GB, 81559MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(n: float | None) -> str:
    """Human-readable binary size: 14.96 GiB."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.2f} {unit}"
