"""Which torch wheel variant suits a driver and a set of GPUs, from the data tables; and the command to
get it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

from gpuready.doctor.tables import (
    Capability,
    WheelRow,
    bundled_driver,
    covers,
    driver_version_key,
    mvc_min_driver,
    wheel_table,
    wheels_for,
)

DriverFit = Literal["yes", "minor_compat", "no"]


def driver_fit(row: WheelRow, driver_cuda: tuple[int, int] | None, driver: str | None) -> DriverFit | None:
    """Can this driver run the wheel? 'yes' = the driver's CUDA >= the wheel's; 'minor_compat' = same
    major, older
    minor: runs under minor-version compatibility with a limited feature set (no newer PTX JIT); 'no' =
    older major.
    Source: https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html."""
    if driver_cuda is not None:
        if driver_cuda >= row.cuda_tuple:
            return "yes"
        return "minor_compat" if driver_cuda[0] == row.cuda_major else "no"
    if driver is not None:
        floor = mvc_min_driver(row.cuda_major)
        full = bundled_driver(row.cuda)
        if full and driver_version_key(driver) >= driver_version_key(full):
            return "yes"
        if floor and driver_version_key(driver) >= driver_version_key(floor):
            return "minor_compat"
        return "no" if floor else None
    return None


@dataclass(frozen=True)
class VariantOption:
    row: WheelRow
    driver: DriverFit | None
    covers_gpus: bool | None
    python_ok: bool | None

    @property
    def usable(self) -> bool:
        return (
            self.driver in ("yes", "minor_compat", None)
            and self.covers_gpus is not False
            and (self.python_ok is not False)
        )

    def score(self) -> tuple[int, int, int, tuple[int, int]]:
        return (
            1 if self.driver == "yes" else 0,
            1 if self.covers_gpus else 0,
            1 if self.row.status == "stable" else 0,
            self.row.cuda_tuple,
        )


def options_for(
    release: str,
    driver_cuda: tuple[int, int] | None,
    driver: str | None,
    capabilities: list[Capability],
    python: tuple[int, int] | None = None,
) -> list[VariantOption]:
    """Every CUDA variant of a torch release, judged against the driver, the GPUs and Python; best first."""
    out = []
    for row in wheels_for(release):
        fits = [covers(row, cc) for cc in capabilities]
        covered = None if any(f is None for f in fits) else all(fits)
        py = row.supports_python(*python) if python else None
        out.append(VariantOption(row, driver_fit(row, driver_cuda, driver), covered, py))
    return sorted(out, key=lambda o: (o.usable, *o.score()), reverse=True)


def best_variant(
    release: str,
    driver_cuda: tuple[int, int] | None,
    driver: str | None,
    capabilities: list[Capability],
    python: tuple[int, int] | None = None,
) -> VariantOption | None:
    usable = [o for o in options_for(release, driver_cuda, driver, capabilities, python) if o.usable]
    return usable[0] if usable else None


def newest_release_with(
    driver_cuda: tuple[int, int] | None,
    driver: str | None,
    capabilities: list[Capability],
    python: tuple[int, int] | None = None,
) -> VariantOption | None:
    """The newest torch release in the table with a variant this machine can run: with GPUs known, one whose
    architecture list is known to cover them; without, the newest (as `gpuready image` recommends)."""
    releases = sorted({r.torch for r in wheel_table()}, key=Version, reverse=True)
    for release in releases:
        option = best_variant(release, driver_cuda, driver, capabilities, python)
        if option is not None and option.covers_gpus is not False and (option.row.archs or not capabilities):
            return option
    return None


def install_command(row: WheelRow, version: str | None) -> str:
    """pip command for torch from the variant's index. With a full version it pins the +label too: `==2.5.1`
    alone is met by an installed 2.5.1+cpu (PEP 440 ignores local labels) and pip would keep it."""
    if version:
        try:
            base = Version(version).base_version
        except InvalidVersion:
            base = version.split("+", 1)[0]
        spec = f"torch=={base}+{row.variant}"
    else:
        major, minor = row.torch.split(".")
        spec = f"torch>={major}.{minor},<{major}.{int(minor) + 1}"
    return f"python -m pip install '{spec}' --index-url {row.index_url}"
