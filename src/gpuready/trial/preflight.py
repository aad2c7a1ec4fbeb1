"""What a trial needs before its first point: an NVIDIA driver and GPU (both kinds: memory is read through
NVML), and for the built-in probe torch and transformers. Missing pieces are named, so the trial is not run
point after point to fail the same way (or, for a command, to "pass" with nothing measured)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Literal

from gpuready.nvml import NvmlReport

_DRIVER = {
    "pynvml_missing": "nvidia-ml-py is not installed (pip install nvidia-ml-py)",
    "library_not_found": "no NVIDIA driver (NVML library not found)",
    "driver_not_loaded": "the NVIDIA driver is not loaded",
    "no_permission": "no permission to read the GPUs through NVML",
}


def missing_for_trial(
    kind: Literal["probe", "command"],
    *,
    nproc: int | None = None,
    read_nvml: Callable[[], NvmlReport] | None = None,
    has_module: Callable[[str], bool] | None = None,
) -> list[str]:
    """What this machine lacks for a trial of `kind`, each as a short phrase; empty when it can run."""
    if read_nvml is None:
        from gpuready.nvml import read_nvml as read_nvml_default

        read_nvml = read_nvml_default
    if has_module is None:

        def has_module(name: str) -> bool:
            return importlib.util.find_spec(name) is not None

    missing: list[str] = []
    if kind == "probe":
        lacking = [m for m in ("torch", "transformers") if not has_module(m)]
        if lacking:
            missing.append(f"{' and '.join(lacking)} not installed (pip install 'gpuready[trial]')")
    report = read_nvml()
    if not report.available:
        missing.append(_DRIVER.get(report.error_kind or "", report.error or "NVML did not start"))
    elif not report.gpus:
        missing.append("no GPU visible (NVML counts none; check the container's --gpus)")
    elif nproc is not None and nproc > len(report.gpus):
        missing.append(f"--nproc {nproc} needs {nproc} GPUs; this machine has {len(report.gpus)}")
    return missing
