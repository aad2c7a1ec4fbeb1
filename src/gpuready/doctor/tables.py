"""The doctor's data tables (data/*.csv, every row with its source), loaded once into frozen rows.

- cuda_driver.csv: CUDA toolkit minor -> the Linux driver bundled with it and the minor-version-compatibility
  floor of its major family (NVIDIA release notes, Table 3; CUDA Compatibility guide).
- torch_wheels.csv: torch release -> the CUDA wheel variants published for it, their GPU architectures and
  whether the variant is what plain `pip install torch` gets from PyPI (RELEASE.md, builder scripts, PRs).
GPU names -> compute capability is the catalog's (gpuready.catalog.find_architecture, catalog/data/).
- docker_images.csv: official pytorch/pytorch image tags known to exist.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from importlib import resources

from packaging.version import InvalidVersion, Version

Capability = tuple[int, int]


def parse_capability(text: str) -> Capability:
    """'8.6' -> (8, 6); 'sm_86' / 'compute_86' -> (8, 6); 'sm_100' -> (10, 0)."""
    text = text.strip()
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major), int(minor)
    digits = re.sub(r"^(sm|compute)_", "", text).rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def format_capability(cc: Capability) -> str:
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class CudaDriverRow:
    cuda: str
    min_driver_linux: str
    mvc_min_driver_linux: str
    source: str

    @property
    def major(self) -> int:
        return int(self.cuda.split(".")[0])


@dataclass(frozen=True)
class WheelRow:
    torch: str  # release family: "2.5"
    variant: str  # "cu124"
    cuda: str  # "12.4"
    archs: tuple[Capability, ...]  # empty = unknown
    ptx: Capability | None  # the arch also shipped as PTX (JIT on newer GPUs)
    status: str  # stable | experimental
    pypi_default: str  # yes | no | unknown
    python: str  # "3.9-3.12"
    source: str

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def cuda_tuple(self) -> tuple[int, int]:
        major, minor = self.cuda.split(".")
        return int(major), int(minor)

    @property
    def index_url(self) -> str:
        # URL pattern of PyTorch's wheel indexes (https://docs.astral.sh/uv/guides/integration/pytorch)
        return f"https://download.pytorch.org/whl/{self.variant}"

    def supports_python(self, major: int, minor: int) -> bool | None:
        try:
            low, high = self.python.split("-")
        except ValueError:
            return None
        return Version(low) <= Version(f"{major}.{minor}") <= Version(high)


@dataclass(frozen=True)
class DockerImageRow:
    image: str
    torch: str
    cuda: str
    cudnn: str
    source: str


def _rows(name: str) -> list[dict[str, str]]:
    with resources.files("gpuready.doctor").joinpath(f"data/{name}").open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@functools.cache
def cuda_driver_table() -> tuple[CudaDriverRow, ...]:
    return tuple(
        CudaDriverRow(r["cuda"], r["min_driver_linux"], r["mvc_min_driver_linux"], r["source"])
        for r in _rows("cuda_driver.csv")
    )


@functools.cache
def wheel_table() -> tuple[WheelRow, ...]:
    rows = []
    for r in _rows("torch_wheels.csv"):
        rows.append(
            WheelRow(
                torch=r["torch"],
                variant=r["variant"],
                cuda=r["cuda"],
                archs=tuple(parse_capability(a) for a in r["archs"].split()),
                ptx=parse_capability(r["ptx"]) if r["ptx"] else None,
                status=r["status"],
                pypi_default=r["pypi_default"],
                python=r["python"],
                source=r["source"],
            )
        )
    return tuple(rows)


@functools.cache
def docker_image_table() -> tuple[DockerImageRow, ...]:
    return tuple(
        DockerImageRow(r["image"], r["torch"], r["cuda"], r["cudnn"], r["source"]) for r in _rows("docker_images.csv")
    )


def mvc_min_driver(cuda_major: int) -> str | None:
    """The lowest Linux driver that runs any toolkit of this CUDA major (minor-version compatibility)."""
    rows = [r for r in cuda_driver_table() if r.major == cuda_major]
    return rows[0].mvc_min_driver_linux if rows else None


def bundled_driver(cuda: str) -> str | None:
    """The Linux driver NVIDIA bundled with this CUDA minor: enough for every feature of that toolkit."""
    for row in cuda_driver_table():
        if row.cuda == cuda:
            return row.min_driver_linux
    return None


def driver_version_key(text: str) -> tuple[int, ...]:
    """'535.104.05' -> (535, 104, 5) for comparisons; unparseable parts count as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.strip().split("."))


def cuda_for_driver(driver: str) -> str | None:
    """Newest CUDA minor whose bundled driver is <= this driver (what `nvidia-smi` would print, roughly)."""
    have = driver_version_key(driver)
    best = None
    for row in cuda_driver_table():
        if driver_version_key(row.min_driver_linux) <= have:
            best = row.cuda
    return best


def torch_release(version: str) -> str | None:
    """'2.5.1+cu124' -> '2.5'."""
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    return f"{v.major}.{v.minor}"


def wheels_for(release: str) -> tuple[WheelRow, ...]:
    return tuple(r for r in wheel_table() if r.torch == release)


def covers(row: WheelRow, cc: Capability) -> bool | None:
    """Does the wheel run on a GPU of this capability? None when the table has no arch list for it.

    A cubin for sm_XY runs on the same major with minor >= Y; PTX compute_XY JIT-compiles for any CC >= X.Y
    (torch/cuda/__init__.py `_check_cubins`, CUDA programming guide); environment.md §3.3."""
    if not row.archs:
        return None
    if any(a[0] == cc[0] and a[1] <= cc[1] for a in row.archs):
        return True
    return row.ptx is not None and cc >= row.ptx
