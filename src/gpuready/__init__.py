"""gpuready: will your deep-learning job run on that GPU?

The library answers; the CLI only renders. Heavy modules load on first use, so `import gpuready` is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from gpuready.memory import MemoryEstimate, estimate
    from gpuready.workload import Workload, make_workload

_LAZY = {
    "run_bench": ("gpuready.bench", "bench"),
    "compare_benches": ("gpuready.bench", "compare"),
    "estimate": ("gpuready.memory", "estimate"),
    "MemoryEstimate": ("gpuready.memory", "MemoryEstimate"),
    "Workload": ("gpuready.workload", "Workload"),
    "make_workload": ("gpuready.workload", "make_workload"),
}

__all__ = ["MemoryEstimate", "Workload", "__version__", "compare_benches", "estimate", "make_workload", "run_bench"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpuready' has no attribute {name!r}")
