"""`gpuready check`: the preflight for one job — task, size, image, trial, storage — and one verdict."""

from gpuready.check.check import CheckResult, Step, check

__all__ = ["CheckResult", "Step", "check"]
