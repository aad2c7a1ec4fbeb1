"""The packages and requirements steps: nvidia-* CUDA wheels, duplicate installs, conda/pip overlap, dependency
conflicts, pip check, nvcc, and the requirements file checked against what is installed."""

from __future__ import annotations

import re

from gpuready.doctor.checks.base import Check, DoctorFacts, _torch_fix
from gpuready.doctor.packages import TorchBuild
from gpuready.doctor.requirements import RequirementStatus, check_requirements


def _package_checks(facts: DoctorFacts, build: TorchBuild | None) -> list[Check]:
    step = "packages"
    scan = facts.packages
    out = []
    majors = scan.nvidia_cuda_majors()
    if len(majors) > 1:
        shown = "; ".join(f"CUDA {m}: {', '.join(n[:3])}" for m, n in sorted(majors.items()))
        stray = [
            n
            for m, names in majors.items()
            for n in names
            if build and build.cuda and m != int(build.cuda.split(".")[0])
        ]
        out.append(
            Check(
                "nvidia-wheels",
                "fail",
                f"nvidia-* wheels for more than one CUDA major ({shown}); two NCCL/cuDNN builds break torch",
                f"python -m pip uninstall -y {' '.join(stray)}" if stray else None,
                step,
            )
        )
    elif majors:
        ((m, names),) = majors.items()
        ok = build is None or build.cuda is None or int(build.cuda.split(".")[0]) == m
        out.append(
            Check(
                "nvidia-wheels",
                "pass" if ok else "warn",
                f"{len(names)} nvidia-* CUDA {m} wheels"
                + ("" if ok else f"; torch is built for CUDA {build.cuda if build else '?'}"),
                None,
                step,
            )
        )
    else:
        out.append(Check("nvidia-wheels", "pass", "no nvidia-* CUDA wheels installed", None, step))
    dups = {n: g for n, g in scan.duplicates().items() if n != "torch"}
    if dups or scan.leftovers:
        parts = [f"{n} in {len(g)} places ({', '.join(d.version for d in g)})" for n, g in list(dups.items())[:5]]
        if scan.leftovers:
            parts.append("leftovers of interrupted pip runs: " + ", ".join(scan.leftovers[:3]))
        fix = ("rm -rf " + " ".join(scan.leftovers[:3])) if scan.leftovers else None
        out.append(Check("duplicate-packages", "warn", "; ".join(parts), fix, step))
    else:
        out.append(Check("duplicate-packages", "pass", "each package installed once", None, step))
    conda = set(scan.conda_packages)
    if conda:
        pip_also = sorted(
            d.name for d in scan.installed().values() if d.name in conda and (d.installer or "") != "conda"
        )
        torch_mix = "pytorch" in conda and "torch" in scan.installed()
        if pip_also or torch_mix:
            overlap = pip_also + (["pytorch (conda) + torch (pip)"] if torch_mix else [])
            out.append(
                Check(
                    "conda-pip",
                    "warn",
                    "conda and pip both installed: " + ", ".join(overlap[:6]),
                    None,
                    step,
                )
            )
        else:
            out.append(
                Check(
                    "conda-pip",
                    "pass",
                    f"conda environment ({len(conda)} conda packages), no overlap",
                    None,
                    step,
                )
            )
    else:
        out.append(Check("conda-pip", "pass", "not a conda environment", None, step))
    if scan.conflicts:
        missing = [
            hit.group(1) for c in scan.conflicts if (hit := re.search(r" requires (.+), which is not installed$", c))
        ]
        out.append(
            Check(
                "dependency-conflicts",
                "warn",
                f"{len(scan.conflicts)} conflict(s): " + "; ".join(scan.conflicts[:3]),
                "python -m pip install " + " ".join(f"'{r}'" for r in missing[:5]) if missing else None,
                step,
            )
        )
    else:
        out.append(
            Check(
                "dependency-conflicts",
                "pass",
                "installed packages meet each other's requirements",
                None,
                step,
            )
        )
    if facts.pip_check is not None:
        pc = facts.pip_check
        if pc.timed_out or pc.error:
            out.append(Check("pip-check", "warn", f"pip check did not run: {pc.error or 'timed out'}", None, step))
        elif pc.returncode == 0:
            out.append(Check("pip-check", "pass", pc.stdout.strip() or "no broken requirements", None, step))
        else:
            lines = [ln for ln in (pc.stdout + pc.stderr).splitlines() if ln.strip()]
            out.append(Check("pip-check", "warn", "; ".join(lines[:3]) or f"exit {pc.returncode}", None, step))
    nvcc = facts.system.nvcc
    out.append(
        Check(
            "nvcc",
            "pass",
            f"nvcc {facts.nvcc_version or '?'} at {nvcc} (system toolkit; pip torch uses its own CUDA)"
            if nvcc
            else "no nvcc (not needed for pip wheels; only to build CUDA extensions)",
            None,
            step,
        )
    )
    return out


def _requirement_fix(status: RequirementStatus, facts: DoctorFacts) -> str:
    if status.name == "torch":
        version = status.installed if status.problem == "wrong_variant" else None
        if version is None:
            m = re.search(r"==\s*([0-9][^,;\s]*)", status.requirement)
            version = m.group(1) if m else None
        fix = _torch_fix(facts, version)
        if fix:
            return fix
    return f"python -m pip install '{status.requirement}'"


def _requirement_checks(facts: DoctorFacts, build: TorchBuild | None) -> list[Check]:
    step = "requirements"
    reqs = facts.requirements
    if reqs is None:
        return [
            Check(
                "requirements",
                "pass",
                "no requirements.txt or pyproject.toml in this folder; give one with --requirements FILE",
                None,
                step,
            )
        ]
    variant = build.variant if build is not None else None
    statuses = check_requirements(reqs, facts.packages, variant, gpu_job=True)
    bad = [s for s in statuses if s.problem not in ("ok", "unchecked")]
    out = [
        Check(
            f"requirement {s.name}",
            "fail",
            s.detail,
            _requirement_fix(s, facts),
            step,
        )
        for s in bad
    ]
    unchecked = f"; not checked: {', '.join(reqs.unchecked[:3])}" if reqs.unchecked else ""
    out.insert(
        0,
        Check(
            "requirements",
            "fail" if bad else "pass",
            f"{len(statuses) - len(bad)} of {len(statuses)} requirements of {reqs.path} met{unchecked}",
            None,
            step,
        ),
    )
    return out
