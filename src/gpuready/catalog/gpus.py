"""GPU specs. Memory is the vendor's marketing figure in GB (10^9); usable memory is what the driver reports.

data/gpus.csv: one row per card with its datasheet (source_url). Tensor-core rates are dense (vendors' sparse
headline figures halved) per dtype: bf16, fp16 (equal to bf16 from Ampere on; the only tensor-core figure on
Turing/Volta, which have no bf16 or TF32 units, so their bf16 and tf32 cells are empty), tf32, fp8; fp32 is the
non-tensor rate. GeForce cards list the FP32-accumulate rate PyTorch uses. link_gbs is the GPU-to-GPU bandwidth
as vendors list it (both directions together): NVLink where the board has it built in, else the PCIe slot.
How each figure was checked: ../shared/reference/catalog_and_cost.md §3 (merged into docs/steptime.md).

data/architectures.csv: GPU name -> compute capability and architecture (developer.nvidia.com/cuda-gpus; AMD's
ROCm table for its gfx targets), for every card gpuready knows by name: the catalog's cards take theirs from it,
and so does the doctor for a GPU named with `--gpu` (also cards with no spec row, such as the A40 or GH200).
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from importlib import resources

from gpuready.errors import InputError
from gpuready.units import GIB, MIB

# NVML total / label on the H200 we measured: 143771 MiB / 141 GiB
USABLE_FRACTION_OF_LABEL = 143771 * MIB / (141 * GIB)


@dataclass(frozen=True)
class Gpu:
    name: str
    vendor: str
    memory_gb: float
    mem_bw_gbs: float | None
    bf16_dense_tflops: float | None
    fp32_tflops: float | None
    compute_capability: str | None  # "9.0", from data/architectures.csv; None for other vendors
    source_url: str
    fp16_dense_tflops: float | None = None
    tf32_dense_tflops: float | None = None
    link_gbs: float | None = None
    notes: str = ""
    architecture: str | None = None  # "Hopper", "CDNA3 (ROCm gfx942)", from data/architectures.csv

    @property
    def usable_bytes(self) -> int:
        """Memory the driver reports as total. Vendors' "GB" on GPUs are GiB less what ECC and firmware hold:
        the H200's "141 GB" reads 143,771 MiB in NVML (../shared/calibration/README.md), 0.9958 of 141 GiB.
        We apply that factor to every card's label; `--gpu-memory` gives an exact figure instead."""
        return int(self.memory_gb * GIB * USABLE_FRACTION_OF_LABEL)


@dataclass(frozen=True)
class GpuArchitecture:
    """A row of data/architectures.csv."""

    match: str  # the name squeezed to [a-z0-9] ("rtx4090"); a GPU name containing it is this GPU
    name: str
    compute_capability: str | None  # "8.6"; None for other vendors' GPUs
    architecture: str
    source: str

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as numbers, (8, 6)."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".", 1)
        return int(major), int(minor)


@functools.cache
def load_architectures() -> tuple[GpuArchitecture, ...]:
    with resources.files("gpuready.catalog").joinpath("data/architectures.csv").open(encoding="utf-8") as fh:
        return tuple(
            GpuArchitecture(
                match=row["match"],
                name=row["name"],
                compute_capability=row["compute_capability"] or None,
                architecture=row["architecture"],
                source=row["source"],
            )
            for row in csv.DictReader(fh)
        )


def find_architecture(name: str) -> GpuArchitecture | None:
    """Compute capability and architecture by GPU name, as NVML prints it or a person types it ('NVIDIA H100
    80GB HBM3', 'rtx4090', 'Tesla T4', 'A100 SXM 80GB'); the longest matching row wins (A10G over A10)."""
    key = _key(name)
    hits = [row for row in load_architectures() if row.match in key]
    return max(hits, key=lambda row: len(row.match)) if hits else None


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@functools.cache
def load_gpus() -> tuple[Gpu, ...]:
    rows = []
    with resources.files("gpuready.catalog").joinpath("data/gpus.csv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            arch = find_architecture(row["name"])
            rows.append(
                Gpu(
                    name=row["name"],
                    vendor=row["vendor"],
                    memory_gb=float(row["memory_gb"]),
                    mem_bw_gbs=_num(row["mem_bw_gbs"]),
                    bf16_dense_tflops=_num(row["bf16_dense_tflops"]),
                    fp32_tflops=_num(row["fp32_tflops"]),
                    compute_capability=arch.compute_capability if arch else None,
                    source_url=row["source_url"],
                    fp16_dense_tflops=_num(row["fp16_dense_tflops"]),
                    tf32_dense_tflops=_num(row["tf32_dense_tflops"]),
                    link_gbs=_num(row["link_gbs"]),
                    notes=row.get("notes") or "",
                    architecture=arch.architecture if arch else None,
                )
            )
    return tuple(rows)


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def find_gpu(name: str) -> Gpu:
    """Find a GPU by name, forgiving case, punctuation and word order: 'h100', 'A100-40GB', 'rtx4090', '80gb a100'.
    Every word of the query must appear in the name; the catalog's order decides between several (SXM first)."""
    want = _key(name)
    gpus = load_gpus()
    exact = [g for g in gpus if _key(g.name) == want]
    if exact:
        return exact[0]
    words = [_key(w) for w in re.findall(r"[A-Za-z0-9]+", name)]
    partial = [g for g in gpus if words and all(w in _key(g.name) for w in words)]
    if partial:
        return partial[0]
    names = ", ".join(g.name for g in gpus)
    raise InputError("--gpu", f"unknown GPU {name!r}; known: {names}")


# words of driver-reported names that say nothing about which catalog card it is
_DEVICE_NOISE = {"nvidia", "tesla", "geforce", "hbm3", "hbm3e", "hbm2", "hbm2e", "gddr6", "gddr6x", "gb"}


def _device_words(text: str) -> list[str]:
    out = []
    for word in re.split(r"[^a-z0-9]+", re.sub(r"\(.*?\)", "", text.lower())):
        if not word or word in _DEVICE_NOISE:
            continue
        out.append(re.sub(r"^(sxm|pcie)\d$", r"\1", word))  # SXM4/SXM5 -> sxm
    return out


def card_for_device(device_name: str, memory_bytes: int | None = None) -> Gpu | None:
    """The catalog card a driver's device name means ('NVIDIA H200' -> H200 SXM, 'NVIDIA A100-SXM4-80GB' -> A100
    SXM 80GB, 'Tesla T4' -> T4): the card's model number must be in the name; then the card sharing most words
    with it (form factor, memory size), then the one nearest `memory_bytes` (the device's total, when known),
    then the catalog's order (SXM first). None when no card matches."""
    words = _device_words(device_name)
    if not words:
        return None
    best: tuple[int, float, int] | None = None
    found = None
    for i, gpu in enumerate(load_gpus()):
        names = _device_words(gpu.name)
        if not names or names[0] not in words:
            continue
        score = sum(1 for w in words if w in names or any(n.startswith(w) for n in names))
        gap = abs(gpu.usable_bytes - memory_bytes) / gpu.usable_bytes if memory_bytes else 0.0
        key = (score, -gap, -i)
        if best is None or key > best:
            best, found = key, gpu
    return found
