"""The memory estimator: peak GPU memory of a job, by phase and component."""

from gpuready.memory.result import MemoryEstimate

__all__ = ["MemoryEstimate"]
