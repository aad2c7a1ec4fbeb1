"""Default GPU prices (data/prices.csv: per GPU-hour, on-demand, each row with provider, date and source) and
user price files. Prices move weekly; they are defaults to override with `--prices FILE`."""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpuready.errors import InputError


@dataclass(frozen=True)
class Price:
    gpu: str
    per_gpu_hour: float
    provider: str
    tier: str
    date: str
    source: str


def price_cell(row: dict[str, str], column: str, origin: str, line: int) -> float:
    """One price of a `--prices` CSV row: a number, not negative (one-line errors naming the file and line)."""
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise InputError("--prices", f"{origin} line {line}: {column} is not a number") from None
    if value < 0:
        raise InputError("--prices", f"{origin} line {line}: a price cannot be negative")
    return value


def _rows(text: str, origin: str) -> dict[str, Price]:
    out: dict[str, Price] = {}
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or not {"gpu", "price_per_gpu_hour"} <= set(reader.fieldnames):
        raise InputError("--prices", f"{origin}: needs a CSV header with gpu,price_per_gpu_hour")
    for n, row in enumerate(reader, start=2):
        value = price_cell(row, "price_per_gpu_hour", origin, n)
        out[row["gpu"].strip()] = Price(
            row["gpu"].strip(),
            value,
            row.get("provider") or "",
            row.get("tier") or "",
            row.get("date") or "",
            row.get("source") or origin,
        )
    return out


@functools.cache
def default_prices() -> dict[str, Price]:
    text = resources.files("gpuready.catalog").joinpath("data/prices.csv").read_text(encoding="utf-8")
    return _rows(text, "gpuready default prices")


def load_prices(path: Path | None) -> dict[str, Price]:
    """The defaults, with a user's CSV (gpu,price_per_gpu_hour[,provider,...]) laid over them."""
    prices = dict(default_prices())
    if path is None:
        return prices
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("--prices", f"{path}: cannot read ({exc.strerror})") from None
    prices.update(_rows(text, str(path)))
    return prices
