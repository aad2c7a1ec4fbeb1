"""The machine around Python: disks, RAM, /dev/shm, the kernel driver, GPU-related environment variables,
CUDA libraries on LD_LIBRARY_PATH, Jupyter, an SSH server, nvcc. Read with psutil and the filesystem only."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

# CUDA user-space libraries a pip torch brings itself (the driver's libcuda/libnvidia-ml are not among them)
CUDA_LIB = re.compile(r"^lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvJitLink|nvrtc|cusparse|cufft)\.so")
GPU_ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
)
_PSEUDO_FS = {
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "squashfs",
    "overlay",
    "tmpfs",
    "nsfs",
}


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    device: str
    fstype: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class LibraryDir:
    path: str
    cuda_libraries: tuple[str, ...]  # file names found there


@dataclass(frozen=True)
class SystemInfo:
    python_version: str
    python_executable: str
    in_venv: bool
    mounts: tuple[Mount, ...] = ()
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    kernel_driver: str | None = None  # /proc/driver/nvidia/version, first line
    device_files: tuple[str, ...] = ()  # /dev/nvidia*
    env: tuple[tuple[str, str], ...] = ()  # GPU-related variables that are set
    ld_library_dirs: tuple[LibraryDir, ...] = ()  # LD_LIBRARY_PATH entries holding CUDA libraries
    nvcc: str | None = None  # path
    jupyter: str | None = None  # what was found: a running server or the command
    ssh_server: bool | None = None

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)


def _mounts() -> tuple[Mount, ...]:
    out = []
    try:
        parts = psutil.disk_partitions(all=False)
    except OSError:
        return ()
    seen = set()
    for p in parts:
        if p.fstype in _PSEUDO_FS or p.mountpoint.startswith(("/proc", "/sys", "/dev", "/run", "/snap", "/boot")):
            continue
        try:
            usage = psutil.disk_usage(p.mountpoint)
        except OSError:
            continue
        if p.device in seen and p.mountpoint != "/":
            continue
        seen.add(p.device)
        out.append(Mount(p.mountpoint, p.device, p.fstype, int(usage.total), int(usage.free)))
    if not any(m.mountpoint == "/" for m in out):
        try:
            usage = psutil.disk_usage("/")
            out.insert(0, Mount("/", "?", "?", int(usage.total), int(usage.free)))
        except OSError:
            pass
    return tuple(out)


def library_dirs(ld_library_path: str) -> tuple[LibraryDir, ...]:
    """LD_LIBRARY_PATH entries that hold CUDA libraries (candidates for shadowing the wheel's own)."""
    out = []
    for entry in [e for e in ld_library_path.split(":") if e]:
        try:
            names = sorted(n for n in os.listdir(entry) if CUDA_LIB.match(n))
        except OSError:
            continue
        if names:
            out.append(LibraryDir(entry, tuple(names)))
    return tuple(out)


def _jupyter() -> str | None:
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
        except (psutil.Error, OSError):
            continue
        if re.search(r"jupyter-(lab|notebook|server)|jupyter (lab|notebook|server)", cmd):
            return f"running (pid {proc.pid})"
    path = shutil.which("jupyter")
    return f"installed ({path})" if path else None


def _ssh_server() -> bool | None:
    try:
        return any((p.info.get("name") or "") == "sshd" for p in psutil.process_iter(["name"]))
    except (psutil.Error, OSError):
        return None


def read_system(env: Mapping[str, str] | None = None) -> SystemInfo:
    env = os.environ if env is None else env
    try:
        vm = psutil.virtual_memory()
        ram_total: int | None = int(vm.total)
        ram_avail: int | None = int(vm.available)
    except OSError:
        ram_total = ram_avail = None
    shm_total = shm_free = None
    try:
        shm = psutil.disk_usage("/dev/shm")
        shm_total, shm_free = int(shm.total), int(shm.free)
    except OSError:
        pass
    kernel = None
    with contextlib.suppress(OSError, IndexError):
        kernel = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8").splitlines()[0].strip()
    try:
        devices = tuple(sorted(str(p) for p in Path("/dev").glob("nvidia*")))
    except OSError:
        devices = ()
    return SystemInfo(
        python_version=".".join(str(x) for x in sys.version_info[:3]),
        python_executable=sys.executable,
        in_venv=sys.prefix != sys.base_prefix,
        mounts=_mounts(),
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_avail,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        kernel_driver=kernel,
        device_files=devices,
        env=tuple((k, env[k]) for k in GPU_ENV_VARS if k in env),
        ld_library_dirs=library_dirs(env.get("LD_LIBRARY_PATH", "")),
        nvcc=shutil.which("nvcc")
        or (
            str(Path(env["CUDA_HOME"]) / "bin" / "nvcc")
            if env.get("CUDA_HOME") and (Path(env["CUDA_HOME"]) / "bin" / "nvcc").is_file()
            else None
        ),
        jupyter=_jupyter(),
        ssh_server=_ssh_server(),
    )


def kernel_driver_version(line: str | None) -> str | None:
    """'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...' ->
    '580.159.04'."""
    if not line:
        return None
    m = re.search(r"\s(\d{3,}\.\d+(?:\.\d+)?)\s", line + " ")
    return m.group(1) if m else None
