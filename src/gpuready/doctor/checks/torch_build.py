"""The python and torch steps read from files: the Python version, the torch install(s) and their build
(CUDA, CPU-only or ROCm), the wheel's CUDA against the driver, and the GPUs' architectures against the wheel's."""

from __future__ import annotations

import os

from gpuready.doctor.advice import driver_fit
from gpuready.doctor.checks.base import Check, DoctorFacts, _capabilities, _driver, _python, _torch_fix
from gpuready.doctor.packages import TorchBuild
from gpuready.doctor.probe import ProbeResult
from gpuready.doctor.tables import covers, mvc_min_driver, parse_capability, torch_release, wheels_for


def _python_check(facts: DoctorFacts, build: TorchBuild | None) -> Check:
    s = facts.system
    where = f"{s.python_version} at {s.python_executable}" + (" (venv)" if s.in_venv else "")
    release = torch_release(build.version) if build else None
    rows = wheels_for(release) if release else ()
    py = _python(facts)
    if rows and py and rows[0].supports_python(*py) is False:
        return Check(
            "python",
            "warn",
            f"{where}; torch {release} wheels are published for Python {rows[0].python}",
            None,
            "python",
        )
    return Check("python", "pass", where, None, "python")


def _torch_checks(facts: DoctorFacts, probe: ProbeResult | None) -> tuple[list[Check], TorchBuild | None]:
    step = "torch"
    scan = facts.packages
    caps = _capabilities(facts)
    if not scan.torch_builds:
        return [
            Check(
                "torch-installed",
                "fail",
                "torch is not installed in this Python",
                _torch_fix(facts, None),
                step,
            )
        ], None
    build = scan.torch_builds[0]
    out = [Check("torch-installed", "pass", f"torch {build.version} in {build.location}", None, step)]
    # two installs, or `import torch` resolving somewhere other than the installed distribution
    origin = scan.torch_import_origin
    shadow = origin is not None and not os.path.realpath(origin).startswith(os.path.realpath(build.location))
    if probe is not None and probe.torch_file and not shadow:
        shadow = not os.path.realpath(probe.torch_file).startswith(os.path.realpath(build.location))
        origin = probe.torch_file if shadow else origin
    if len(scan.torch_builds) > 1 or shadow:
        where = "; ".join(f"{b.version} in {b.location}" for b in scan.torch_builds)
        extra = f"; `import torch` loads {origin}" if shadow else " (the first is imported)"
        uninstall = " && ".join(["python -m pip uninstall -y torch"] * max(2, len(scan.torch_builds)))
        install = _torch_fix(facts, build.version)
        out.append(
            Check(
                "torch-duplicates",
                "fail",
                f"{len(scan.torch_builds)} torch installs: {where}{extra}",
                f"{uninstall} && {install}" if install else uninstall,
                step,
            )
        )
    else:
        out.append(Check("torch-duplicates", "pass", "one torch install", None, step))
    # the build variant, from torch/version.py (corrected by the probe when it ran)
    cuda = probe.cuda if probe is not None and probe.torch_version and not shadow else build.cuda
    variant = build.variant if cuda == build.cuda else ("cu" + cuda.replace(".", "") if cuda else "cpu")
    if build.hip:
        out.append(
            Check(
                "torch-build",
                "fail",
                f"torch {build.version} is a ROCm (AMD) build (hip {build.hip}); it cannot use NVIDIA GPUs",
                _torch_fix(facts, build.version),
                step,
            )
        )
        return out, build
    if cuda is None and (build.version_file_read or probe is not None):
        out.append(
            Check(
                "torch-build",
                "fail",
                f"torch {build.version} is a CPU-only build (torch/version.py: cuda = None)",
                _torch_fix(facts, build.version),
                step,
            )
        )
        return out, build
    if cuda is None:
        out.append(Check("torch-build", "warn", f"torch {build.version}: build unknown", None, step))
        return out, build
    out.append(Check("torch-build", "pass", f"torch {build.version}, built with CUDA {cuda} ({variant})", None, step))
    # wheel CUDA vs driver
    release = torch_release(build.version)
    rows = [r for r in wheels_for(release) if r.variant == variant] if release else []
    major, minor = (int(x) for x in cuda.split(".")[:2])
    drv = _driver(facts)
    dcuda = facts.nvml.cuda_driver
    if dcuda is not None or drv is not None:
        from gpuready.doctor.tables import WheelRow

        row = rows[0] if rows else WheelRow(release or "?", variant, f"{major}.{minor}", (), None, "", "", "", "")
        fit = driver_fit(row, dcuda, drv)
        have = f"driver {drv or '?'} supports CUDA {dcuda[0]}.{dcuda[1]}" if dcuda else f"driver {drv}"
        if fit == "no":
            floor = mvc_min_driver(major)
            fix = _torch_fix(facts, build.version)
            out.append(
                Check(
                    "torch-driver",
                    "fail",
                    f"torch {build.version} is built for CUDA {cuda}; {have}. CUDA {major}.x needs driver "
                    f">= {floor or '?'}",
                    (f"{fix}  (or upgrade the driver to >= {floor})" if fix else f"upgrade the driver to >= {floor}"),
                    step,
                )
            )
        elif fit == "minor_compat":
            out.append(
                Check(
                    "torch-driver",
                    "warn",
                    f"torch is built for CUDA {cuda}; {have}: runs under minor-version compatibility "
                    "(a limited feature set: PTX from a newer toolkit cannot be JIT-compiled)",
                    _torch_fix(facts, build.version),
                    step,
                )
            )
        else:
            out.append(Check("torch-driver", "pass", f"torch CUDA {cuda}; {have}", None, step))
    # architectures
    if caps:
        arch_list = probe.arch_list if probe is not None and probe.arch_list else ()
        missing = []
        for g in facts.nvml.gpus:
            if g.compute_capability is None:
                continue
            if arch_list:
                archs = [a for a in arch_list if a.startswith("sm_")]
                ptx = [parse_capability(a) for a in arch_list if a.startswith("compute_")]
                cc = g.compute_capability
                ok: bool | None = any(
                    parse_capability(a)[0] == cc[0] and parse_capability(a)[1] <= cc[1] for a in archs
                ) or any(cc >= p for p in ptx)
            else:
                ok = covers(rows[0], g.compute_capability) if rows else None
            if ok is False:
                missing.append(g)
            elif ok is None:
                out.append(
                    Check(
                        "torch-arch",
                        "warn",
                        f"architectures of torch {build.version} are not in the table; run without --fast to "
                        "read them from torch",
                        None,
                        step,
                    )
                )
                break
        else:
            shown = " ".join(arch_list) if arch_list else " ".join(f"sm_{a[0]}{a[1]}" for a in rows[0].archs)
            if missing:
                g = missing[0]
                cc = g.compute_capability or (0, 0)
                out.append(
                    Check(
                        "torch-arch",
                        "fail",
                        f"{g.name} (sm_{cc[0]}{cc[1]}) is not among torch {build.version}'s architectures "
                        f"({shown}): kernels fail with 'no kernel image is available'",
                        _torch_fix(facts, build.version),
                        step,
                    )
                )
            else:
                out.append(Check("torch-arch", "pass", f"every GPU is covered by {shown}", None, step))
    return out, build
