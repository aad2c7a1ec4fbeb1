"""The memory estimator: peak GPU memory of a job, by phase and component."""

from gpuready.memory.estimate import estimate, largest_batch
from gpuready.memory.result import MemoryEstimate
from gpuready.memory.sweep import estimate_batches, estimate_sweep

__all__ = ["MemoryEstimate", "estimate", "estimate_batches", "estimate_sweep", "largest_batch"]
