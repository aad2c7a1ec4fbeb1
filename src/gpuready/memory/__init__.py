"""The memory estimator: peak GPU memory of a job, by phase and component."""

from gpuready.memory.estimate import estimate, largest_batch
from gpuready.memory.result import MemoryEstimate

__all__ = ["MemoryEstimate", "estimate", "largest_batch"]
