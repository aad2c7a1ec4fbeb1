"""What people mean by a GPU's memory and a GPU's precision, read against the catalog.

`--gpu-memory` takes three spellings, and a bare number is refused (it is ambiguous: 24 GiB, a "24 GB" card,
24 bytes?):
- an exact size in binary units, `24GiB`, `81559MiB`: that many bytes;
- a card's label, `80GB`: what a card sold as "80 GB" reports (the catalog's `usable_bytes`, about 79.7 GiB),
  when some catalog card has that label; other decimal sizes are SI (10^9 bytes per GB);
- a card's name, `A100-80GB`, `rtx4090`: that card's memory from the catalog.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuready.catalog.gpus import USABLE_FRACTION_OF_LABEL, Gpu, find_gpu, load_gpus
from gpuready.errors import InputError
from gpuready.units import GIB, format_gib, parse_size

_BARE = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*$")
_LABEL = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(gb|g)\s*$", re.IGNORECASE)
_HAS_UNIT = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*[a-zA-Z]+\s*$")

# bf16 arithmetic (and bf16 tensor cores) arrived with compute capability 8.0 (Ampere). Source: NVIDIA CUDA C++
# Programming Guide, "Arithmetic Instructions" throughput table (the __nv_bfloat16 rows start at 8.0) and the
# NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), "BF16 ... new in A100".
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class GpuMemory:
    """A capacity the user asked for: bytes, and in words what it was read as."""

    bytes: int
    meaning: str
    gpu: Gpu | None = None  # the card, when a name was given


ALLOWED = "allowed: 24GiB or 81559MiB (exact), 80GB (a card's label) or a GPU name from `gpuready gpus`"


def parse_gpu_memory(text: str, flag: str = "--gpu-memory") -> GpuMemory:
    """Read `--gpu-memory` as described in the module docstring; InputError naming `flag` otherwise."""
    if _BARE.match(text):
        raise InputError(
            flag,
            f"{text.strip()!r} has no unit; write {text.strip()}GiB (exact) or {text.strip()}GB "
            "(a card sold as that many GB), or a GPU name from `gpuready gpus`",
        )
    label = _LABEL.match(text)
    if label:
        gb = float(label.group(1))
        cards = [g for g in load_gpus() if g.memory_gb == gb]
        if cards:
            nbytes = int(gb * GIB * USABLE_FRACTION_OF_LABEL)
            names = ", ".join(g.name for g in cards[:3])
            return GpuMemory(nbytes, f"a {gb:g} GB card ({names}) reports {format_gib(nbytes)}")
    if _HAS_UNIT.match(text):
        try:
            nbytes = parse_size(text, flag)
        except InputError:
            pass
        else:
            if nbytes <= 0:
                raise InputError(flag, "must be more than 0")
            return GpuMemory(nbytes, format_gib(nbytes))
    try:
        card = find_gpu(text)
    except InputError:
        raise InputError(flag, f"{text!r} is neither a size nor a known GPU; {ALLOWED}") from None
    return GpuMemory(card.usable_bytes, f"{card.name} ({format_gib(card.usable_bytes)})", card)


def bf16_supported(gpu: Gpu) -> bool | None:
    """Whether the card computes in bf16 (compute capability >= 8.0); None where the catalog has no figure."""
    if not gpu.compute_capability or gpu.vendor != "NVIDIA":
        return None
    try:
        major, minor = (int(x) for x in gpu.compute_capability.split(".", 1))
    except ValueError:
        return None
    return (major, minor) >= BF16_MIN_COMPUTE_CAPABILITY


def precision_warning(gpu: Gpu, precision: str) -> str | None:
    """A warning when the job asks for bf16 (bf16, or mixed: bf16 autocast) on a card without bf16."""
    if precision not in ("bf16", "mixed") or bf16_supported(gpu) is not False:
        return None
    return (
        f"{gpu.name} (compute capability {gpu.compute_capability}) has no bf16 support (needs 8.0 or newer); "
        "use --precision fp16 or fp32 there"
    )
