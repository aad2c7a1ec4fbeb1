"""Byte units, the one place they are defined: binary (KiB, MiB, GiB, TiB: what nvidia-smi and allocators count)
and decimal (kB, MB, GB, TB: what GPU vendors print on the box and disk tools print as rates); sizes as people
write them (24GiB, 80GB, 81559MiB, 1.5TiB, 123456 bytes) and as gpuready prints them."""

from __future__ import annotations

import re

from gpuready.errors import InputError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB
KB = 1000
MB = 1000 * KB
GB = 1000 * MB
TB = 1000 * GB

_UNITS = {
    "": 1,
    "b": 1,
    "k": KB,
    "kb": KB,
    "m": MB,
    "mb": MB,
    "g": GB,
    "gb": GB,
    "t": TB,
    "tb": TB,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
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
        if value < KIB or unit == "GiB":
            break
        value /= KIB
    if unit == "B":
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.2f} {unit}"


def format_gib(n: float, digits: int = 2) -> str:
    """Always in GiB, for columns of GPU memory that compare by eye: 79.65 GiB, 0.61 GiB."""
    return f"{n / GIB:.{digits}f} GiB"


def format_rate(bytes_per_second: float | None) -> str:
    """A transfer rate in decimal megabytes, as disk tools print it: 1,234 MB/s."""
    return "-" if bytes_per_second is None else f"{bytes_per_second / MB:,.0f} MB/s"
