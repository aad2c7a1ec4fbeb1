"""`gpuready image`: which torch release, CUDA wheel variant, driver minimum and official image suit the
project and
the GPU, from the data tables only; with `--check`, whether this machine's install is one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from gpuready.catalog import find_architecture, find_gpu
from gpuready.doctor.advice import VariantOption, install_command, options_for
from gpuready.doctor.checks import DoctorFacts
from gpuready.doctor.requirements import read_requirements
from gpuready.doctor.snapshot import load_snapshot
from gpuready.doctor.tables import (
    Capability,
    bundled_driver,
    docker_image_table,
    format_capability,
    mvc_min_driver,
    parse_capability,
    torch_release,
    wheel_table,
)
from gpuready.errors import InputError


@dataclass(frozen=True)
class ImageOption:
    torch: str
    variant: str
    cuda: str
    min_driver: str | None  # minor-version-compatibility floor of the CUDA major
    full_driver: str | None  # the driver bundled with that CUDA minor
    covers_gpu: bool | None
    driver_fit: str | None
    python_ok: bool | None
    status: str
    pypi_default: str
    usable: bool
    command: str
    source: str


@dataclass(frozen=True)
class ImageAdvice:
    gpu: str | None
    compute_capability: str | None
    driver: str | None
    driver_cuda: str | None
    python: str | None
    torch_spec: str | None
    torch_version: str | None  # an exact version when the project pins one
    recommended: ImageOption | None
    options: tuple[ImageOption, ...]
    docker_images: tuple[str, ...]
    notes: tuple[str, ...] = ()
    check_ok: bool | None = None
    check_problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _option(o: VariantOption, version: str | None) -> ImageOption:
    return ImageOption(
        torch=o.row.torch,
        variant=o.row.variant,
        cuda=o.row.cuda,
        min_driver=mvc_min_driver(o.row.cuda_major),
        full_driver=bundled_driver(o.row.cuda),
        covers_gpu=o.covers_gpus,
        driver_fit=o.driver,
        python_ok=o.python_ok,
        status=o.row.status,
        pypi_default=o.row.pypi_default,
        usable=o.usable,
        command=install_command(o.row, version),
        source=o.row.source,
    )


def _torch_spec_from_requirements(path: Path) -> SpecifierSet | None:
    for req in read_requirements(path).requirements:
        if canonicalize_name(req.name) == "torch":
            return req.specifier
    return None


def _pinned(spec: SpecifierSet | None) -> str | None:
    if spec is None:
        return None
    for s in spec:
        if s.operator in ("==", "===") and "*" not in s.version:
            return s.version
    return None


def _matching_releases(spec: SpecifierSet | None) -> list[str]:
    releases = sorted({r.torch for r in wheel_table()}, key=Version, reverse=True)
    if spec is None or not str(spec):
        return releases
    return [r for r in releases if any(spec.contains(f"{r}.{p}", prereleases=True) for p in range(10))]


def advise_image(
    requirements: Path | None = None,
    snapshot: Path | None = None,
    gpu: str | None = None,
    facts: DoctorFacts | None = None,
    check: bool = False,
) -> ImageAdvice:
    """Pick torch+CUDA variants for the GPU (from --gpu, the snapshot, else this machine) and the
    project's torch."""
    notes: list[str] = []
    spec: SpecifierSet | None = None
    driver: str | None = None
    driver_cuda: tuple[int, int] | None = None
    python: tuple[int, int] | None = None
    caps: list[Capability] = []
    gpu_name = gpu
    snap = load_snapshot(snapshot, "--snapshot") if snapshot else None
    if requirements is not None:
        spec = _torch_spec_from_requirements(requirements)
        if spec is None:
            notes.append(f"{requirements} does not name torch: every release in the table is allowed")
    elif snap is not None and snap.get("torch"):
        spec = SpecifierSet(f"=={str(snap['torch']['version']).split('+', 1)[0]}")
    if snap is not None:
        driver = (snap.get("driver") or {}).get("version")
        cuda_text = (snap.get("driver") or {}).get("cuda")
        driver_cuda = tuple(int(x) for x in cuda_text.split(".")[:2]) if cuda_text else None  # type: ignore[assignment]
        py = str((snap.get("python") or {}).get("version", ""))
        python = (int(py.split(".")[0]), int(py.split(".")[1])) if py.count(".") >= 1 else None
        if gpu is None:
            for g in snap.get("gpus") or []:
                if g.get("compute_capability"):
                    caps.append(parse_capability(g["compute_capability"]))
                    gpu_name = gpu_name or g.get("name")
    elif facts is not None:
        driver = facts.nvml.driver_version
        driver_cuda = facts.nvml.cuda_driver
        parts = facts.system.python_version.split(".")
        python = (int(parts[0]), int(parts[1]))
        if gpu is None:
            caps = [g.compute_capability for g in facts.nvml.gpus if g.compute_capability]
            gpu_name = facts.nvml.gpus[0].name if facts.nvml.gpus else None
    if gpu is not None:
        row = find_architecture(gpu)
        gpu_name = row.name if row else None
        if row is None:
            card = find_gpu(gpu)  # a looser spelling of a catalog card ('4090'); InputError naming the known GPUs
            row, gpu_name = find_architecture(card.name), card.name
        if row is None or row.capability is None:
            raise InputError("--gpu", f"{gpu!r}: compute capability unknown (not an NVIDIA GPU?)")
        caps = [row.capability]
        if facts is None and snap is None:
            notes.append("no driver known: pick a machine whose driver is at least the variant's minimum")
    if not caps:
        notes.append("no GPU known (give --gpu NAME): architectures not checked")
    releases = _matching_releases(spec)
    if not releases:
        raise InputError("--requirements", f"torch{spec} matches no release in the table (2.0 - 2.13)")
    version = _pinned(spec)
    # the newest release with a variant this machine can use; its GPU architecture list may be unknown to the
    # table (recent releases), then the newest release whose list is known to cover the GPU is named too
    newest: tuple[str, list[VariantOption]] | None = None
    checked: tuple[str, VariantOption] | None = None
    for release in releases:
        opts = options_for(release, driver_cuda, driver, caps, python)
        if newest is None and any(o.usable for o in opts):
            newest = (release, opts)
        verified = [o for o in opts if o.usable and o.row.archs and o.covers_gpus is not False]
        if verified:
            checked = (release, verified[0])
            break
    if newest is None:
        chosen_release = releases[0]
        options = options_for(chosen_release, driver_cuda, driver, caps, python)
        if any(o.covers_gpus is False for o in options):
            cc = ", ".join(format_capability(c) for c in caps)
            notes.append(f"no torch variant in the table supports compute capability {cc}; nothing to recommend")
        else:
            notes.append("no torch variant in the table suits this driver and Python; nothing to recommend")
    elif caps and checked is not None:
        # a known GPU: the newest release whose wheels are known to carry its architecture
        chosen_release = checked[0]
        options = options_for(chosen_release, driver_cuda, driver, caps, python)
        if newest[0] != chosen_release:
            cc = ", ".join(format_capability(c) for c in caps)
            notes.append(
                f"torch {newest[0]} is newer, but its GPU architecture list is not in the table; torch "
                f"{chosen_release} is the newest known to cover compute capability {cc}"
            )
    else:
        chosen_release, options = newest
        if caps:
            cc = ", ".join(format_capability(c) for c in caps)
            notes.append(
                f"warning: no torch release in the table is known to cover compute capability {cc}; "
                f"torch {chosen_release}'s architecture list is not in the table, so it is not checked"
            )
    pinned = version if version and torch_release(version) == chosen_release else None
    shown = tuple(_option(o, pinned) for o in options)
    recommended = None
    if newest is not None:
        recommended = next((o for o in shown if o.usable and o.covers_gpu is not False), None)
    images: tuple[str, ...] = ()
    if recommended is not None:
        images = tuple(
            r.image
            for r in docker_image_table()
            if torch_release(r.torch) == recommended.torch
            and (pinned is None or r.torch == pinned)
            and any(o.cuda == r.cuda and o.usable and o.covers_gpu is not False for o in shown)
        )
    check_ok: bool | None = None
    problems: list[str] = []
    if check:
        if facts is None:
            raise InputError("--check", "needs this machine's facts")
        build = facts.packages.torch_builds[0] if facts.packages.torch_builds else None
        if build is None:
            problems.append("torch is not installed")
        else:
            if spec is not None and str(spec) and not spec.contains(build.version, prereleases=True):
                problems.append(f"torch {build.version} does not meet torch{spec}")
            ok_variants = {o.variant for o in shown if o.usable and o.covers_gpu is not False}
            if build.variant not in ok_variants:
                problems.append(
                    f"torch {build.version} is {build.variant}; suitable here: "
                    + (", ".join(sorted(ok_variants)) or "none")
                )
        check_ok = not problems
    return ImageAdvice(
        gpu=gpu_name,
        compute_capability=", ".join(sorted({format_capability(c) for c in caps})) or None,
        driver=driver,
        driver_cuda=f"{driver_cuda[0]}.{driver_cuda[1]}" if driver_cuda else None,
        python=f"{python[0]}.{python[1]}" if python else None,
        torch_spec=str(spec) if spec is not None else None,
        torch_version=pinned,
        recommended=recommended,
        options=shown,
        docker_images=images,
        notes=tuple(notes),
        check_ok=check_ok,
        check_problems=tuple(problems),
    )
