"""From facts to checks: each `{name, status, detail, fix}`, grouped by step, and the one cause when torch
cannot use the GPU. Pure functions of the facts and the probe result, so every diagnosis is testable on a CPU.
Failure causes and their evidence: ../shared/reference/environment.md §5-§6."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gpuready.doctor.advice import best_variant, driver_fit, install_command, newest_release_with
from gpuready.doctor.packages import PackageScan, TorchBuild
from gpuready.doctor.probe import CommandResult, ProbeResult
from gpuready.doctor.requirements import RequirementsFile, RequirementStatus, check_requirements
from gpuready.doctor.system import SystemInfo, kernel_driver_version
from gpuready.doctor.tables import (
    Capability,
    covers,
    format_capability,
    mvc_min_driver,
    parse_capability,
    torch_release,
    wheels_for,
)
from gpuready.nvml import BAD_THROTTLE_MASK, NvmlGpu, NvmlReport, throttle_names
from gpuready.units import GIB, format_bytes

Status = Literal["pass", "warn", "fail"]

LOW_DISK_BYTES = 10 * GIB  # below this a checkpoint or a model download is likely to fail
LOW_SHM_BYTES = 1 * GIB  # Docker's default /dev/shm is 64 MB; NCCL and DataLoader workers need more
# (https://github.com/NVIDIA/nccl/issues/342, https://github.com/pytorch/torchtitan/issues/853)

# the causes that stop torch from using the GPU, in the order the doctor names them
CAUSE_ORDER = (
    "nvidia-driver",
    "torch-installed",
    "torch-duplicates",
    "torch-build",
    "torch-driver",
    "torch-arch",
    "cuda-visible-devices",
    "ld-library-path",
    "torch-import",
    "torch-cuda",
    "cuda-libraries",
)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None
    step: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DoctorFacts:
    """Everything read without importing torch."""

    nvml: NvmlReport
    packages: PackageScan
    system: SystemInfo
    requirements: RequirementsFile | None = None
    nvcc_version: str | None = None
    pip_check: CommandResult | None = None
    own_pids: tuple[int, ...] = ()  # the doctor's own children (the probe): not "other processes"


@dataclass(frozen=True)
class ProbeState:
    """What happened to the live probe: its result, or why there is none."""

    result: ProbeResult | None = None
    skipped: str | None = None  # "--fast", "no NVIDIA driver", "pending"


# ---- helpers -----------------------------------------------------------------------------------------------


def _capabilities(facts: DoctorFacts) -> list[Capability]:
    return [g.compute_capability for g in facts.nvml.gpus if g.compute_capability is not None]


def _driver(facts: DoctorFacts) -> str | None:
    return facts.nvml.driver_version or kernel_driver_version(facts.system.kernel_driver)


def _python(facts: DoctorFacts) -> tuple[int, int] | None:
    parts = facts.system.python_version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None


def _torch_fix(facts: DoctorFacts, version: str | None) -> str | None:
    """The install command for torch (this version if the table knows a variant for it) that suits this
    machine."""
    caps = _capabilities(facts)
    release = torch_release(version) if version else None
    option = best_variant(release, facts.nvml.cuda_driver, _driver(facts), caps, _python(facts)) if release else None
    if option is not None and option.covers_gpus is not False:
        return install_command(option.row, version)
    newest = newest_release_with(facts.nvml.cuda_driver, _driver(facts), caps, _python(facts))
    if newest is None:
        return None
    return install_command(newest.row, None)


def _visible_gpus(value: str | None, gpus: tuple[NvmlGpu, ...]) -> tuple[int, str]:
    """How many GPUs CUDA will see under CUDA_VISIBLE_DEVICES, as CUDA parses it: empty = none; the list
    stops at
    the first invalid entry; UUID prefixes allowed (CUDA programming guide, environment variables)."""
    if value is None:
        return len(gpus), "unset (all GPUs visible)"
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    seen = 0
    for entry in entries:
        if re.fullmatch(r"\d+", entry):
            ok = int(entry) < len(gpus)
        elif entry.startswith(("GPU-", "MIG-")):
            ok = any(g.uuid and g.uuid.startswith(entry) for g in gpus) or entry.startswith("MIG-")
        else:
            ok = False
        if not ok:
            return seen, f"{value!r}: entry {entry!r} matches no GPU, so CUDA stops there"
        seen += 1
    return seen, repr(value)


def _site_packages_lib(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path


# ---- steps -------------------------------------------------------------------------------------------------


def _driver_checks(facts: DoctorFacts) -> list[Check]:
    nvml, sysinfo = facts.nvml, facts.system
    step = "driver"
    if nvml.error is not None:
        kernel = kernel_driver_version(sysinfo.kernel_driver)
        if nvml.error_kind == "pynvml_missing":
            return [
                Check(
                    "nvidia-driver",
                    "warn" if kernel else "fail",
                    f"cannot read GPUs: {nvml.error}" + (f"; kernel driver {kernel} is loaded" if kernel else ""),
                    "python -m pip install nvidia-ml-py",
                    step,
                )
            ]
        if "mismatch" in nvml.error.lower():
            return [
                Check(
                    "nvidia-driver",
                    "fail",
                    f"{nvml.error}: the driver libraries were upgraded while the old kernel module is loaded",
                    "sudo reboot (or unload and reload the nvidia kernel modules)",
                    step,
                )
            ]
        if nvml.error_kind == "no_permission":
            return [
                Check(
                    "nvidia-driver",
                    "fail",
                    nvml.error,
                    "check permissions on /dev/nvidia* (group video)",
                    step,
                )
            ]
        if kernel or sysinfo.device_files:
            return [
                Check(
                    "nvidia-driver",
                    "fail",
                    f"{nvml.error}; kernel driver {kernel or '?'} and {len(sysinfo.device_files)} "
                    f"/dev/nvidia* "
                    "present: the driver's user-space libraries (libnvidia-ml.so.1, libcuda.so.1) are "
                    "not visible",
                    "start the container with the GPU runtime: docker run --gpus all ... "
                    "(NVIDIA Container Toolkit; NVIDIA_DRIVER_CAPABILITIES=compute,utility)",
                    step,
                )
            ]
        return [
            Check(
                "nvidia-driver",
                "fail",
                f"no NVIDIA GPU or driver on this machine ({nvml.error}; no /proc/driver/nvidia, no /dev/nvidia*)",
                "run on a machine with an NVIDIA GPU; in Docker add --gpus all (NVIDIA Container Toolkit); "
                "on your own server install the driver: sudo ubuntu-drivers install",
                step,
            )
        ]
    if not nvml.gpus:
        return [
            Check(
                "nvidia-driver",
                "fail",
                f"driver {nvml.driver_version} is loaded but NVML lists no GPU",
                "check NVIDIA_VISIBLE_DEVICES / the container's --gpus flag; `nvidia-smi -L` lists what is attached",
                step,
            )
        ]
    checks = [Check("nvidia-driver", "pass", f"driver {nvml.driver_version or 'unknown'}", None, step)]
    cuda = nvml.cuda_driver
    checks.append(
        Check(
            "driver-cuda",
            "pass",
            f"the driver supports CUDA up to {cuda[0]}.{cuda[1]}" if cuda else "CUDA version of the driver: unknown",
            None,
            step,
        )
    )
    return checks


def _gpu_checks(facts: DoctorFacts) -> list[Check]:
    out = []
    step = "gpu"
    for g in facts.nvml.gpus:
        n = f"gpu{g.index}"
        mem = (
            f"{format_bytes(g.memory_total_bytes)} total, {format_bytes(g.memory_used_bytes)} used, "
            f"{format_bytes(g.memory_free_bytes)} free"
        )
        cc = format_capability(g.compute_capability) if g.compute_capability else "unknown"
        pcie = (
            f"PCIe Gen{g.pcie_gen or '?'} x{g.pcie_width or '?'} (max Gen{g.pcie_gen_max or '?'} "
            f"x{g.pcie_width_max or '?'}; idle GPUs lower their link)"
        )
        out.append(
            Check(
                n,
                "pass",
                f"{g.name or '?'} {g.uuid or ''}, compute capability {cc}, {mem}, {pcie}",
                None,
                step,
            )
        )
        if g.processes is None:
            out.append(Check(f"{n}-processes", "pass", "processes on the GPU: unknown", None, step))
        elif others := [p for p in g.processes if p.pid not in facts.own_pids]:
            held = sum(p.used_bytes or 0 for p in others)
            pids = ", ".join(str(p.pid) for p in others[:8])
            out.append(
                Check(
                    f"{n}-processes",
                    "warn",
                    f"{len(others)} other process(es) hold {format_bytes(held)} (pid {pids})",
                    f"stop them if they are yours: kill {pids.split(',')[0]}",
                    step,
                )
            )
        else:
            out.append(Check(f"{n}-processes", "pass", "no other process holds GPU memory", None, step))
        health: list[tuple[Status, str]] = []
        if g.ecc_uncorrected_volatile:
            health.append(("fail", f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors since boot"))
        if g.ecc_corrected_volatile:
            health.append(("warn", f"{g.ecc_corrected_volatile} corrected ECC errors since boot"))
        rows = g.remapped_rows
        if rows is not None and (rows.pending or rows.failure):
            health.append(
                (
                    "fail",
                    "row remapping " + ("failed" if rows.failure else "pending: a GPU reset is required"),
                )
            )
        elif rows is not None and rows.uncorrectable:
            health.append(("warn", f"{rows.uncorrectable} rows remapped after uncorrectable errors"))
        if g.throttle_reasons is not None and g.throttle_reasons & BAD_THROTTLE_MASK:
            health.append(("warn", "clocks held back: " + ", ".join(throttle_names(g.throttle_reasons))))
        known = [
            f"ECC {'on' if g.ecc_enabled else 'off' if g.ecc_enabled is not None else 'unknown'}",
            "remapped rows " + (f"{rows.correctable}/{rows.uncorrectable}" if rows else "n/a"),
            "throttle "
            + (", ".join(throttle_names(g.throttle_reasons)) or "none" if g.throttle_reasons is not None else "n/a"),
        ]
        if health:
            worst: Status = "fail" if any(s == "fail" for s, _ in health) else "warn"
            out.append(
                Check(
                    f"{n}-health",
                    worst,
                    "; ".join(t for _, t in health),
                    "ask the provider for another GPU (or reset it: sudo nvidia-smi -r -i " + str(g.index) + ")",
                    step,
                )
            )
        else:
            out.append(Check(f"{n}-health", "pass", "; ".join(known), None, step))
        mode_notes = [
            "MIG " + ("on" if g.mig_enabled else "off" if g.mig_enabled is not None else "unknown"),
            "persistence " + ("on" if g.persistence_enabled else "off" if g.persistence_enabled is not None else "?"),
        ]
        if g.mig_enabled:
            out.append(
                Check(
                    f"{n}-mode",
                    "warn",
                    "; ".join(mode_notes) + ": CUDA sees MIG slices, one per process",
                    "select a slice: export CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L lists them)",
                    step,
                )
            )
        elif g.persistence_enabled is False:
            out.append(
                Check(
                    f"{n}-mode",
                    "warn",
                    "; ".join(mode_notes) + ": the first CUDA call is slower",
                    "sudo nvidia-smi -pm 1",
                    step,
                )
            )
        else:
            out.append(Check(f"{n}-mode", "pass", "; ".join(mode_notes), None, step))
    return out


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


def _visibility_checks(facts: DoctorFacts, build: TorchBuild | None) -> list[Check]:
    step = "torch"
    out = []
    gpus = facts.nvml.gpus
    value = facts.system.env_value("CUDA_VISIBLE_DEVICES")
    if gpus:
        seen, how = _visible_gpus(value, gpus)
        if seen == 0:
            out.append(
                Check(
                    "cuda-visible-devices",
                    "fail",
                    f"CUDA_VISIBLE_DEVICES={how} hides every GPU: NVML sees {len(gpus)}, CUDA will see 0",
                    "unset CUDA_VISIBLE_DEVICES",
                    step,
                )
            )
        elif value is not None and seen < len([e for e in value.split(",") if e.strip()]):
            out.append(
                Check(
                    "cuda-visible-devices",
                    "warn",
                    f"CUDA_VISIBLE_DEVICES={how}; CUDA will see {seen} GPU(s)",
                    "export CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(len(gpus))),
                    step,
                )
            )
        else:
            out.append(Check("cuda-visible-devices", "pass", f"CUDA_VISIBLE_DEVICES {how}: {seen} GPU(s)", None, step))
    dirs = facts.system.ld_library_dirs
    wheel_cuda = build is not None and build.cuda is not None and bool(facts.packages.nvidia_cuda_majors())
    if dirs and wheel_cuda:
        names = "; ".join(f"{d.path} ({', '.join(d.cuda_libraries[:4])})" for d in dirs)
        keep = [
            e
            for e in (facts.system.env_value("LD_LIBRARY_PATH") or "").split(":")
            if e and e not in {d.path for d in dirs}
        ]
        out.append(
            Check(
                "ld-library-path",
                "warn",
                f"LD_LIBRARY_PATH holds CUDA libraries that can shadow the torch wheel's own: {names}",
                f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH",
                step,
            )
        )
    else:
        out.append(
            Check(
                "ld-library-path",
                "pass",
                "no CUDA libraries on LD_LIBRARY_PATH"
                if not dirs
                else "CUDA libraries on LD_LIBRARY_PATH (torch has no pip CUDA libraries to shadow)",
                None,
                step,
            )
        )
    return out


def _probe_checks(facts: DoctorFacts, state: ProbeState, build: TorchBuild | None) -> list[Check]:
    """The live probe confirms or corrects the static verdict."""
    step = "torch"
    probe = state.result
    if probe is None:
        why = state.skipped or "not run"
        return [
            Check(
                "torch-cuda",
                "warn",
                f"live torch probe skipped ({why}); the verdict rests on files",
                None,
                step,
            )
        ]
    if probe.error is not None:
        return [
            Check(
                "torch-cuda",
                "fail",
                probe.error,
                "check the driver: nvidia-smi; sudo dmesg | grep -i xid" if probe.timed_out else None,
                step,
            )
        ]
    text = probe.messages
    if probe.import_error is not None:
        fix = _torch_fix(facts, build.version if build else None)
        if "nvJitLink" in text or "undefined symbol" in text:
            cause = "a CUDA library from LD_LIBRARY_PATH was loaded instead of the wheel's"
            fix = "unset LD_LIBRARY_PATH"
        elif "nccl" in text.lower():
            cause = "two NCCL libraries (nvidia-nccl-cu11 and -cu12, or a system libnccl)"
        elif "cannot open shared object" in text or "not found in the system path" in text:
            cause = "the wheel's nvidia-* CUDA libraries are missing"
        else:
            cause = "import torch failed"
        return [Check("torch-import", "fail", f"{cause}: {probe.import_error}", fix, step)]
    out: list[Check] = []
    if probe.is_available:
        out.append(
            Check(
                "torch-cuda",
                "pass",
                f"torch {probe.torch_version}: cuda.is_available() True, {probe.device_count} device(s), "
                f"probe {probe.seconds:.1f} s",
                None,
                step,
            )
        )
        if probe.kernel_error:
            kernel_fix = _torch_fix(facts, probe.torch_version)
            out.append(Check("torch-arch", "fail", f"a CUDA kernel failed: {probe.kernel_error}", kernel_fix, step))
    else:
        found = re.search(r"found version (\d+)", text)
        if probe.cuda is None and probe.hip is None:
            detail = f"torch {probe.torch_version} is a CPU-only build: {probe.init_error or 'no CUDA'}"
            fix = _torch_fix(facts, probe.torch_version)
        elif found:
            v = int(found.group(1))
            detail = (
                f"the driver is too old for torch {probe.torch_version} (CUDA {probe.cuda}): it reports CUDA "
                f"{v // 1000}.{(v % 1000) // 10}"
            )
            fix = _torch_fix(facts, probe.torch_version)
        elif probe.init_error and "No CUDA GPUs are available" in probe.init_error:
            detail = f"torch sees no GPU: {probe.init_error}"
            fix = "unset CUDA_VISIBLE_DEVICES"
        else:
            detail = f"cuda.is_available() is False: {text or 'no message'}"
            fix = None
        out.append(Check("torch-cuda", "fail", detail, fix, step))
    # which CUDA libraries were really loaded
    ld_dirs = {d.path.rstrip("/") for d in facts.system.ld_library_dirs}
    loaded = probe.loaded_libraries
    foreign = [p for p in loaded if os.path.dirname(p).rstrip("/") in ld_dirs and not _site_packages_lib(p)]
    foreign = [p for p in foreign if not re.search(r"/lib(cuda|nvidia-ml)\.so", p)]
    if probe.cudnn_error:
        keep = [
            e
            for e in (facts.system.env_value("LD_LIBRARY_PATH") or "").split(":")
            if e and e.rstrip("/") not in ld_dirs
        ]
        fix = f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH"
        out.append(Check("cuda-libraries", "fail", f"cuDNN failed: {probe.cudnn_error}", fix, step))
    elif foreign:
        out.append(
            Check(
                "cuda-libraries",
                "warn",
                "loaded from LD_LIBRARY_PATH instead of the wheel: " + ", ".join(foreign[:4]),
                "unset LD_LIBRARY_PATH",
                step,
            )
        )
    elif loaded:
        where = sorted({os.path.dirname(p) for p in loaded if not re.search(r"/lib(cuda|nvidia-ml)\.so", p)})
        cudnn = f"cuDNN {probe.cudnn_version}; " if probe.cudnn_version else ""
        out.append(Check("cuda-libraries", "pass", f"{cudnn}CUDA libraries loaded from {', '.join(where)}", None, step))
    return out


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


def _system_checks(facts: DoctorFacts) -> list[Check]:
    step = "system"
    s = facts.system
    out = []
    for m in s.mounts:
        kind = "system disk" if m.mountpoint == "/" else "data disk"
        low = m.free_bytes < LOW_DISK_BYTES
        out.append(
            Check(
                f"disk {m.mountpoint}",
                "warn" if low else "pass",
                f"{kind} {m.device} ({m.fstype}): {format_bytes(m.free_bytes)} free of {format_bytes(m.total_bytes)}",
                "free space or put checkpoints and caches on a larger disk (gpuready storage)" if low else None,
                step,
            )
        )
    if s.ram_total_bytes is not None:
        out.append(
            Check(
                "ram",
                "pass",
                f"{format_bytes(s.ram_total_bytes)} total, {format_bytes(s.ram_available_bytes)} available",
                None,
                step,
            )
        )
    if s.shm_total_bytes is not None:
        low = s.shm_total_bytes < LOW_SHM_BYTES
        out.append(
            Check(
                "dev-shm",
                "warn" if low else "pass",
                f"/dev/shm {format_bytes(s.shm_total_bytes)}"
                + (": too small for NCCL and DataLoader workers (Docker's default is 64 MB)" if low else ""),
                "start the container with --shm-size=16g (or --ipc=host)" if low else None,
                step,
            )
        )
    else:
        out.append(Check("dev-shm", "warn", "/dev/shm: not mounted", None, step))
    out.append(Check("jupyter", "pass", f"Jupyter {s.jupyter}" if s.jupyter else "no Jupyter", None, step))
    ssh = {
        True: "an SSH server (sshd) is running",
        False: "no SSH server running",
        None: "SSH server: unknown",
    }
    out.append(Check("ssh-server", "pass", ssh[s.ssh_server], None, step))
    return out


def evaluate(facts: DoctorFacts, state: ProbeState) -> tuple[tuple[Check, ...], Check | None]:
    """All checks in step order, and the one cause (the first failing check in CAUSE_ORDER, else the
    first fail)."""
    probe = state.result
    checks = _driver_checks(facts)
    checks += _gpu_checks(facts)
    torch_checks, build = _torch_checks(facts, probe)
    checks.insert(len(checks), _python_check(facts, build))
    checks += torch_checks
    checks += _visibility_checks(facts, build)
    checks += _probe_checks(facts, state, build)
    checks += _package_checks(facts, build)
    checks += _requirement_checks(facts, build)
    checks += _system_checks(facts)
    # a probe failure that repeats a static cause under the same name keeps the static one first
    fails = [c for c in checks if c.status == "fail"]
    cause = None
    for name in CAUSE_ORDER:
        cause = next((c for c in fails if c.name == name), None)
        if cause is not None:
            break
    if cause is None and fails:
        cause = fails[0]
    return tuple(checks), cause
