"""The driver and GPU steps: is an NVIDIA driver loaded and which CUDA it supports, and each GPU's memory,
other processes, health (ECC, remapped rows, throttling) and mode (MIG, persistence)."""

from __future__ import annotations

from gpuready.doctor.checks.base import Check, DoctorFacts, Status
from gpuready.doctor.system import kernel_driver_version
from gpuready.doctor.tables import format_capability
from gpuready.nvml import BAD_THROTTLE_MASK, throttle_names
from gpuready.units import format_bytes


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
