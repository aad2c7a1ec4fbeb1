"""The GPU catalog: specs from data/gpus.csv (every row cites its source)."""

from gpuready.catalog.gpus import Gpu, find_gpu, load_gpus

__all__ = ["Gpu", "find_gpu", "load_gpus"]
