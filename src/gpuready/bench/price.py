"""The price of the GPUs a bench used: `--price-per-hour`, else the catalog's default price for the card NVML
names, times the GPUs the job ran on (catalog prices are per GPU-hour; catalog/prices.py)."""

from __future__ import annotations

import re

from gpuready.bench.record import Price
from gpuready.catalog import load_gpus
from gpuready.catalog.prices import Price as CatalogPrice
from gpuready.catalog.prices import default_prices


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", re.sub(r"\(.*?\)", "", text.lower()))]


def catalog_name(nvml_name: str, memory_bytes: int | None = None) -> str | None:
    """The catalog row for the card NVML reports ('NVIDIA H200' -> 'H200 SXM', 'NVIDIA A100-SXM4-80GB' ->
    'A100 SXM 80GB'): rows whose model number is in the name, the one with most of its words there, then the
    one closest in memory. None when no row matches."""
    key = "".join(_words(nvml_name))
    best: tuple[int, int, float, str] | None = None
    for gpu in load_gpus():
        words = _words(gpu.name)
        model = next((w for w in words if any(c.isdigit() for c in w)), None)
        if model is None or model not in key:
            continue
        hits = sum(1 for w in words if w in key)
        mem_gap = abs(gpu.usable_bytes - memory_bytes) / gpu.usable_bytes if memory_bytes else 0.0
        # more of the row's words, then the longer model number ('a10g' over 'a10'), then the nearer memory
        score = (hits, len(model), -mem_gap, gpu.name)
        if best is None or score[:3] > best[:3]:
            best = score
    return best[3] if best else None


def bench_price(
    per_hour: float | None,
    gpu_name: str | None,
    gpu_count: int,
    memory_bytes: int | None = None,
    prices: dict[str, CatalogPrice] | None = None,
) -> Price:
    if per_hour is not None:
        return Price(per_hour=per_hour, source="--price-per-hour")
    if not gpu_name:
        return Price(source="unknown: no GPU name to look up; give --price-per-hour")
    name = catalog_name(gpu_name, memory_bytes)
    table = prices if prices is not None else default_prices()
    row = table.get(name) if name else None
    if row is None:
        return Price(source=f"unknown: no catalog price for {gpu_name!r}; give --price-per-hour")
    return Price(
        per_hour=row.per_gpu_hour * max(1, gpu_count),
        source=f"catalog: {row.gpu} {row.per_gpu_hour}/GPU-hour x {max(1, gpu_count)} ({row.provider}, {row.date},"
        f" {row.source})",
    )
