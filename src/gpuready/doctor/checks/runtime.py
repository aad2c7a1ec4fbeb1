"""The torch step at run time: what CUDA will see (CUDA_VISIBLE_DEVICES, CUDA libraries on LD_LIBRARY_PATH)
and what the live torch probe found (import, cuda.is_available(), a kernel, the CUDA libraries really loaded)."""

from __future__ import annotations

import os
import re

from gpuready.doctor.checks.base import Check, DoctorFacts, ProbeState, _torch_fix
from gpuready.doctor.packages import TorchBuild
from gpuready.nvml import NvmlGpu


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


def _site_packages_lib(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path


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
