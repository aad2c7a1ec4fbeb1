"""The price of the GPUs a bench used: `--price-per-hour`, else the catalog's default price for the card NVML
names, times the GPUs the job ran on (catalog prices are per GPU-hour; catalog/prices.py)."""

from __future__ import annotations

from gpuready.bench.record import Price
from gpuready.catalog import card_for_device
from gpuready.catalog.prices import Price as CatalogPrice
from gpuready.catalog.prices import default_prices


def catalog_name(nvml_name: str, memory_bytes: int | None = None) -> str | None:
    """The catalog row for the card NVML reports ('NVIDIA H200' -> 'H200 SXM'; gpuready.catalog.card_for_device,
    the device's total memory deciding between sizes). None when no row matches."""
    card = card_for_device(nvml_name, memory_bytes)
    return card.name if card else None


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
