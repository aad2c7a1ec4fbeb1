"""The project's requirements against what is installed: missing, wrong version, wrong build variant.

PEP 440 ignores the local label in `==` (packaging: `SpecifierSet("==2.5.1").contains("2.5.1+cpu")` is
True), so
`torch==2.5.1` is "satisfied" by a CPU wheel; for a GPU job the build variant is checked separately
(environment.md §9.2). Index lines (`--index-url https://download.pytorch.org/whl/cu121`) carry the
intended variant.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gpuready.doctor.packages import TORCH_FAMILY, InstalledDist, PackageScan
from gpuready.errors import InputError

Problem = Literal["ok", "missing", "wrong_version", "wrong_variant", "missing_extra", "unchecked"]

_INDEX = re.compile(r"^(?:-i|--index-url|--extra-index-url)[\s=]+(\S+)")
_VARIANT_IN_URL = re.compile(r"/whl/(?:nightly/)?(cpu|cu\d+|rocm[\d.]+)/?$")


@dataclass(frozen=True)
class RequirementsFile:
    path: str
    requirements: tuple[Requirement, ...]
    index_variants: tuple[str, ...]  # cu121 from --index-url .../whl/cu121
    unchecked: tuple[str, ...]  # lines we do not check: -e, URLs, options


@dataclass(frozen=True)
class RequirementStatus:
    requirement: str
    name: str
    problem: Problem
    installed: str | None
    detail: str


def _strip(line: str) -> str:
    line = re.sub(r"(^|\s)#.*$", "", line).strip()
    return re.sub(r"\s--hash[=\s]\S+", "", line).strip()


def _read_txt(path: Path, seen: set[Path]) -> tuple[list[Requirement], list[str], list[str]]:
    if path.resolve() in seen:
        return [], [], []
    seen.add(path.resolve())
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("--requirements", f"cannot read {path}: {exc.strerror}") from exc
    reqs: list[Requirement] = []
    variants: list[str] = []
    unchecked: list[str] = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = _strip(raw)
        if not line:
            continue
        if line.startswith(("-r ", "--requirement")):
            include = path.parent / line.split(None, 1)[1].split("=", 1)[-1].strip()
            more, more_variants, more_unchecked = _read_txt(include, seen)
            reqs += more
            variants += more_variants
            unchecked += more_unchecked
            continue
        index = _INDEX.match(line)
        if index:
            m = _VARIANT_IN_URL.search(index.group(1))
            if m:
                variants.append(m.group(1))
            continue
        if line.startswith("-"):
            unchecked.append(line)
            continue
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement:
            unchecked.append(line)
    return reqs, variants, unchecked


def read_requirements(path: Path) -> RequirementsFile:
    """requirements*.txt (with -r includes and index lines) or pyproject.toml ([project].dependencies)."""
    if path.name == "pyproject.toml":
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InputError("--requirements", f"cannot read {path}: {exc}") from exc
        reqs, unchecked = [], []
        for line in data.get("project", {}).get("dependencies", []):
            try:
                reqs.append(Requirement(line))
            except InvalidRequirement:
                unchecked.append(line)
        return RequirementsFile(str(path), tuple(reqs), (), tuple(unchecked))
    reqs, variants, unchecked = _read_txt(path, set())
    return RequirementsFile(str(path), tuple(reqs), tuple(variants), tuple(unchecked))


def find_requirements(folder: Path) -> Path | None:
    """requirements.txt, else pyproject.toml with [project].dependencies, in the given folder."""
    txt = folder / "requirements.txt"
    if txt.is_file():
        return txt
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            return None
        if data.get("project", {}).get("dependencies"):
            return pyproject
    return None


def _env(env: object, extra: str) -> dict[str, str]:
    """The marker environment with `extra` set (packaging's Environment is a TypedDict)."""
    values = {str(k): str(v) for k, v in dict(env).items()}  # type: ignore[call-overload]
    values["extra"] = extra
    return values


def _variant_of(dist: InstalledDist, torch_variant: str | None) -> str | None:
    if dist.name == "torch" and torch_variant:
        return torch_variant
    return dist.local_label


def check_requirements(
    reqs: RequirementsFile, scan: PackageScan, torch_variant: str | None = None, gpu_job: bool = True
) -> tuple[RequirementStatus, ...]:
    """Classify each requirement; `torch_variant` is the installed torch's build (cpu, cu124) from its
    files."""
    installed = scan.installed()
    env = default_environment()
    out: list[RequirementStatus] = []
    wanted_variant = reqs.index_variants[0] if reqs.index_variants else None
    for req in reqs.requirements:
        text = str(req)
        if req.marker is not None and not req.marker.evaluate(_env(env, "")):
            continue  # not for this platform / interpreter
        name = canonicalize_name(req.name)
        dist = installed.get(name)
        if dist is None:
            out.append(RequirementStatus(text, name, "missing", None, f"{text}: not installed"))
            continue
        if req.url:
            out.append(RequirementStatus(text, name, "unchecked", dist.version, "URL requirement, not compared"))
            continue
        if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            out.append(
                RequirementStatus(text, name, "wrong_version", dist.version, f"{text}: {dist.version} installed")
            )
            continue
        variant = _variant_of(dist, torch_variant) if name in TORCH_FAMILY else None
        if name in TORCH_FAMILY and gpu_job and variant == "cpu":
            out.append(
                RequirementStatus(
                    text,
                    name,
                    "wrong_variant",
                    dist.version,
                    f"{text} is met by {dist.version} only because PEP 440 ignores the +label: it is a CPU-only build",
                )
            )
            continue
        if name in TORCH_FAMILY and wanted_variant and variant and variant not in (wanted_variant, "unknown"):
            out.append(
                RequirementStatus(
                    text,
                    name,
                    "wrong_variant",
                    dist.version,
                    f"the file's index asks for {wanted_variant}; {dist.version} is {variant}",
                )
            )
            continue
        missing_extras = []
        for extra in sorted(req.extras):
            for dep_text in dist.requires:
                try:
                    dep = Requirement(dep_text)
                except InvalidRequirement:
                    continue
                if dep.marker is None or not dep.marker.evaluate(_env(env, extra)):
                    continue
                if dep.marker.evaluate(_env(env, "")):
                    continue  # not extra-specific
                if canonicalize_name(dep.name) not in installed:
                    missing_extras.append(f"{dep.name} (extra {extra})")
        if missing_extras:
            out.append(
                RequirementStatus(
                    text, name, "missing_extra", dist.version, f"{text}: missing {', '.join(missing_extras)}"
                )
            )
            continue
        out.append(RequirementStatus(text, name, "ok", dist.version, f"{name} {dist.version}"))
    return tuple(out)
