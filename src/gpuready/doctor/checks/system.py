"""The system step: free disk space, RAM, /dev/shm, Jupyter and an SSH server."""

from __future__ import annotations

from gpuready.doctor.checks.base import Check, DoctorFacts
from gpuready.units import GIB, format_bytes

LOW_DISK_BYTES = 10 * GIB  # below this a checkpoint or a model download is likely to fail
LOW_SHM_BYTES = 1 * GIB  # Docker's default /dev/shm is 64 MB; NCCL and DataLoader workers need more
# (https://github.com/NVIDIA/nccl/issues/342, https://github.com/pytorch/torchtitan/issues/853)


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
