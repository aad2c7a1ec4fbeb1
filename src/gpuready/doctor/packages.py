"""Installed Python packages, read from their metadata only (never imported): torch's build, duplicates,
CUDA-major mixes among nvidia-* wheels, conda next to pip, and dependency conflicts (what `pip check` finds).

torch's build is read from its `torch/version.py` as text (`cuda = '12.4'`, `hip = None`), so the CLI process
never imports torch. Duplicate and mixed-install checks follow environment.md §6.1.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

TORCH_FAMILY = ("torch", "torchvision", "torchaudio")


@dataclass(frozen=True)
class InstalledDist:
    name: str  # canonical: "nvidia-cudnn-cu12"
    version: str
    location: str  # the sys.path entry it lives in
    installer: str | None = None  # "pip", "conda", "uv" (the INSTALLER file)
    requires: tuple[str, ...] = ()

    @property
    def local_label(self) -> str | None:
        """'2.5.1+cu124' -> 'cu124'."""
        return self.version.split("+", 1)[1] if "+" in self.version else None


@dataclass(frozen=True)
class TorchBuild:
    """One installed torch, as its metadata and version.py say."""

    version: str
    location: str
    cuda: str | None  # torch.version.cuda as written in version.py
    hip: str | None
    version_file_read: bool

    @property
    def variant(self) -> str:
        """cpu, cu124, rocm6.2, or the local label; 'unknown' when nothing says."""
        if self.hip:
            return "rocm" + ".".join(self.hip.split(".")[:2])
        if self.cuda:
            return "cu" + self.cuda.replace(".", "")
        label = self.version.split("+", 1)[1] if "+" in self.version else None
        if label:
            return label
        return "cpu" if self.version_file_read else "unknown"


@dataclass(frozen=True)
class PackageScan:
    dists: tuple[InstalledDist, ...]  # every distribution found, in sys.path order (duplicates included)
    torch_builds: tuple[TorchBuild, ...]  # first = the one `import torch` gets (sys.path order)
    torch_import_origin: str | None  # where `import torch` resolves (find_spec; nothing is imported)
    conflicts: tuple[str, ...]  # "X requires Y, which is not installed" like pip check
    leftovers: tuple[str, ...]  # "~orch" folders from interrupted pip runs
    conda_packages: tuple[str, ...]  # names in conda-meta when this is a conda env

    def installed(self) -> dict[str, InstalledDist]:
        """name -> the distribution Python uses (the first on sys.path)."""
        seen: dict[str, InstalledDist] = {}
        for d in self.dists:
            seen.setdefault(d.name, d)
        return seen

    def duplicates(self) -> dict[str, tuple[InstalledDist, ...]]:
        groups: dict[str, list[InstalledDist]] = {}
        for d in self.dists:
            groups.setdefault(d.name, []).append(d)
        return {n: tuple(g) for n, g in groups.items() if len(g) > 1}

    def nvidia_cuda_majors(self) -> dict[int, tuple[str, ...]]:
        """CUDA major -> nvidia-* wheels built for it (-cu11/-cu12/-cu13 suffix; CUDA 13 wheels often
        unsuffixed)."""
        majors: dict[int, list[str]] = {}
        for name, d in self.installed().items():
            if not name.startswith("nvidia-"):
                continue
            m = re.search(r"-cu(\d+)$", name)
            if m:
                majors.setdefault(int(m.group(1)), []).append(name)
            elif name.startswith(("nvidia-cuda-", "nvidia-cublas", "nvidia-nvjitlink")):
                # only these carry the CUDA major as their own major (cuFFT, cuRAND, cuSPARSE do not)
                try:
                    majors.setdefault(Version(d.version).major, []).append(name)
                except InvalidVersion:
                    continue
        return {k: tuple(sorted(v)) for k, v in majors.items()}


_ASSIGN = re.compile(r"^(cuda|hip)\s*(?::[^=]+)?=\s*(.+?)\s*$", re.MULTILINE)


def parse_torch_version_file(text: str) -> dict[str, str | None]:
    """torch/version.py as text -> {'cuda': '12.4', 'hip': None}."""
    found: dict[str, str | None] = {"cuda": None, "hip": None}
    for key, value in _ASSIGN.findall(text):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            continue
        found[key] = str(parsed) if parsed is not None else None
    return found


def _dist_location(dist: metadata.Distribution) -> str:
    try:
        return str(Path(str(dist.locate_file(""))).resolve())
    except (OSError, TypeError):
        return "?"


def _installer(dist: metadata.Distribution) -> str | None:
    try:
        text = dist.read_text("INSTALLER")
    except OSError:
        return None
    return text.strip() or None if text else None


def _torch_build(dist: metadata.Distribution, version: str, location: str) -> TorchBuild:
    try:
        text = Path(str(dist.locate_file("torch/version.py"))).read_text(encoding="utf-8")
        fields = parse_torch_version_file(text)
        read = True
    except OSError:
        fields, read = {"cuda": None, "hip": None}, False
    return TorchBuild(version, location, fields["cuda"], fields["hip"], read)


def _own_pip_check(dists: dict[str, InstalledDist]) -> list[str]:
    """What `pip check` reports, from metadata with `packaging`: missing and wrong-version dependencies."""
    problems = []
    for d in dists.values():
        for text in d.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = dists.get(canonicalize_name(req.name))
            if dep is None:
                problems.append(f"{d.name} {d.version} requires {req}, which is not installed")
            elif req.specifier and not req.specifier.contains(dep.version, prereleases=True):
                problems.append(f"{d.name} {d.version} has requirement {req}, but you have {dep.name} {dep.version}")
    return problems


def _conda_packages(prefix: str) -> tuple[str, ...]:
    meta = Path(prefix) / "conda-meta"
    if not meta.is_dir():
        return ()
    names = []
    for f in meta.glob("*.json"):
        parts = f.stem.rsplit("-", 2)  # name-version-build
        if len(parts) == 3:
            names.append(canonicalize_name(parts[0]))
    return tuple(sorted(set(names)))


def scan_packages(paths: Sequence[str] | None = None, prefix: str | None = None) -> PackageScan:
    """Read every installed distribution on `paths` (default sys.path) without importing any of them."""
    search = list(paths) if paths is not None else list(sys.path)
    dists: list[InstalledDist] = []
    torch_builds: list[TorchBuild] = []
    leftovers: list[str] = []
    seen_at: set[tuple[str, str]] = set()
    for entry in search:
        if entry and os.path.isdir(entry):
            with contextlib.suppress(OSError):
                leftovers.extend(os.path.join(entry, n) for n in os.listdir(entry) if n.startswith("~") and n != "~")
        for dist in metadata.distributions(path=[entry]):
            md = dist.metadata  # parse METADATA once: .version and .requires would parse it again each
            name = md["Name"]
            if not name:
                continue
            location = _dist_location(dist)
            item = InstalledDist(
                canonicalize_name(name),
                str(md["Version"]),
                location,
                _installer(dist),
                tuple(md.get_all("Requires-Dist") or ()),
            )
            if (item.name, item.location) in seen_at:
                continue  # the same folder reached through two sys.path entries
            seen_at.add((item.name, item.location))
            dists.append(item)
            if item.name == "torch":
                torch_builds.append(_torch_build(dist, item.version, location))
    origin = None
    if paths is None:
        try:
            spec = importlib.util.find_spec("torch")
            origin = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            origin = None
    first: dict[str, InstalledDist] = {}
    for d in dists:
        first.setdefault(d.name, d)
    return PackageScan(
        dists=tuple(dists),
        torch_builds=tuple(torch_builds),
        torch_import_origin=origin,
        conflicts=tuple(_own_pip_check(first)),
        leftovers=tuple(leftovers),
        conda_packages=_conda_packages(prefix or sys.prefix),
    )


def freeze(scan: PackageScan) -> dict[str, str]:
    """name -> version as `pip freeze` would list them (the copy Python imports)."""
    return {name: d.version for name, d in sorted(scan.installed().items())}
