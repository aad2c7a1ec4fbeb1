"""gpuready's own exceptions. Foreign errors are converted to these where the foreign thing is touched."""

from __future__ import annotations


class GpureadyError(Exception):
    """Base class: something gpuready cannot do, told in one line for a person."""

    exit_code = 1


class InputError(GpureadyError):
    """Bad input: names the field and what is allowed. The CLI exits 2."""

    exit_code = 2

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ModelNotFoundError(InputError):
    """A model name that is neither a preset, a local config nor a reachable hub id."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__("MODEL", f"{name!r}: {message}")
