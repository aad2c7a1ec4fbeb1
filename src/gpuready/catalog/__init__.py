"""The GPU catalog: specs from data/gpus.csv, compute capability and architecture from data/architectures.csv
(every row cites its source)."""

from gpuready.catalog.gpus import (
    Gpu,
    GpuArchitecture,
    card_for_device,
    find_architecture,
    find_gpu,
    load_architectures,
    load_gpus,
)

__all__ = [
    "Gpu",
    "GpuArchitecture",
    "card_for_device",
    "find_architecture",
    "find_gpu",
    "load_architectures",
    "load_gpus",
]
