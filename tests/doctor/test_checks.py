"""Every diagnosis from injected facts and probe results."""

from __future__ import annotations

from pathlib import Path

from gpuready.doctor.checks import Check, ProbeState, evaluate
from gpuready.doctor.requirements import read_requirements
from gpuready.doctor.system import LibraryDir
from tests.doctor.fakes import NO_DRIVER, SITE, facts, gpu, nvml, probe_ok, scan, system, torch_build


def by_name(checks: tuple[Check, ...], name: str) -> Check:
    return next(c for c in checks if c.name == name)


def test_healthy_h200_is_ready_and_the_probe_confirms() -> None:
    checks, cause = evaluate(facts(), ProbeState(result=probe_ok()))
    assert cause is None, cause
    assert by_name(checks, "torch-cuda").status == "pass"
    assert by_name(checks, "torch-arch").status == "pass"
    assert by_name(checks, "cuda-libraries").status == "pass"


def test_no_driver_is_the_cause_with_what_to_do() -> None:
    _checks, cause = evaluate(facts(nvml=NO_DRIVER), ProbeState(skipped="no driver"))
    assert cause is not None and cause.name == "nvidia-driver"
    assert "no NVIDIA GPU or driver" in cause.detail
    assert cause.fix and "--gpus all" in cause.fix


def test_cpu_wheel_names_the_cuda_wheel_of_the_same_version() -> None:
    f = facts(packages=scan((torch_build("2.5.1+cpu", None),), nvidia=()), nvml=nvml("535.104.05", 12020))
    _checks, cause = evaluate(f, ProbeState(skipped="--fast"))
    assert cause is not None and cause.name == "torch-build"
    assert "CPU-only" in cause.detail
    # driver 535 supports CUDA 12.2: cu121 is the newest 2.5 variant it runs with every feature
    assert cause.fix == "python -m pip install 'torch==2.5.1+cu121' --index-url https://download.pytorch.org/whl/cu121"


def test_wheel_cuda_newer_than_driver() -> None:
    f = facts(nvml=nvml("570.124.06", 12080))
    _checks, cause = evaluate(f, ProbeState(skipped="--fast"))
    assert cause is not None and cause.name == "torch-driver"
    assert "CUDA 13.0" in cause.detail and "12.8" in cause.detail and "580.65.06" in cause.detail
    assert cause.fix is not None and "'torch==2.11.0+cu128'" in cause.fix


def test_probe_warning_driver_too_old_is_read_when_files_said_nothing() -> None:
    warning = "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."
    probe = probe_ok(is_available=False, device_count=0, warnings=(warning,), arch_list=())
    checks, _ = evaluate(facts(), ProbeState(result=probe))
    c = by_name(checks, "torch-cuda")
    assert c.status == "fail" and "reports CUDA 12.8" in c.detail


def test_architecture_missing_from_the_wheel() -> None:
    f = facts(
        packages=scan((torch_build("2.5.1+cu124", "12.4"),), nvidia=("nvidia-cudnn-cu12",)),
        nvml=nvml("570.124.06", 12080, (gpu(name="NVIDIA GeForce RTX 5090", cc=(12, 0)),)),
    )
    _checks, cause = evaluate(f, ProbeState(skipped="--fast"))
    assert cause is not None and cause.name == "torch-arch"
    assert "sm_120" in cause.detail
    # no 2.5 variant has sm_120: the fix moves to the newest release that has one and suits driver 570
    assert cause.fix is not None and "cu128" in cause.fix


def test_cuda_visible_devices_empty_hides_every_gpu() -> None:
    f = facts(system=system({"CUDA_VISIBLE_DEVICES": ""}))
    probe = probe_ok(is_available=False, device_count=0, init_error="RuntimeError: No CUDA GPUs are available")
    checks, cause = evaluate(f, ProbeState(result=probe))
    assert cause is not None and cause.name == "cuda-visible-devices"
    assert cause.fix == "unset CUDA_VISIBLE_DEVICES"
    assert by_name(checks, "torch-cuda").status == "fail"


def test_cuda_visible_devices_invalid_index() -> None:
    _checks, cause = evaluate(facts(system=system({"CUDA_VISIBLE_DEVICES": "5"})), ProbeState(skipped="--fast"))
    assert cause is not None and cause.name == "cuda-visible-devices" and "'5'" in cause.detail


def test_ld_library_path_shadowing_warns_statically_and_fails_when_cudnn_breaks() -> None:
    ld = (LibraryDir("/usr/lib/x86_64-linux-gnu", ("libcudnn.so.9",)),)
    env = {"LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu:/usr/local/nvidia/lib64"}
    f = facts(system=system(env, ld))
    checks, cause = evaluate(f, ProbeState(skipped="--fast"))
    assert by_name(checks, "ld-library-path").status == "warn"
    assert cause is None
    probe = probe_ok(
        cudnn_error="RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (9, 19, 0) "
        "but found runtime version (9, 14, 0)",
        loaded_libraries=("/usr/lib/x86_64-linux-gnu/libcudnn.so.9",),
    )
    checks, cause = evaluate(f, ProbeState(result=probe))
    assert cause is not None and cause.name == "cuda-libraries"
    assert cause.fix == "export LD_LIBRARY_PATH=/usr/local/nvidia/lib64"


def test_two_torch_installs() -> None:
    builds = (torch_build("2.5.1+cpu", None, "/root/.local/lib/python3.12/site-packages"), torch_build())
    checks, cause = evaluate(facts(packages=scan(builds)), ProbeState(skipped="--fast"))
    dup = by_name(checks, "torch-duplicates")
    assert dup.status == "fail" and "2 torch installs" in dup.detail
    assert cause is not None and cause.name == "torch-duplicates"
    assert dup.fix is not None and dup.fix.count("pip uninstall -y torch") == 2


def test_import_torch_shadowed_by_another_folder_seen_by_the_probe() -> None:
    probe = probe_ok(torch_file="/work/torch/__init__.py")
    checks, _ = evaluate(facts(), ProbeState(result=probe))
    assert by_name(checks, "torch-duplicates").status == "fail"


def test_requirement_pin_met_by_cpu_wheel_is_a_wrong_variant(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.5.1\nnumpy>=1.26\nrequests  # comment\n")
    f = facts(
        packages=scan((torch_build("2.5.1+cpu", None),), extra=(scan().dists[0].__class__("numpy", "1.24.0", SITE),)),
        requirements=read_requirements(req),
    )
    checks, _ = evaluate(f, ProbeState(skipped="--fast"))
    assert by_name(checks, "requirement torch").detail.endswith("it is a CPU-only build")
    assert "1.24.0 installed" in by_name(checks, "requirement numpy").detail
    assert "not installed" in by_name(checks, "requirement requests").detail
    assert by_name(checks, "requirements").status == "fail"


def test_requirement_index_variant_differs(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("--index-url https://download.pytorch.org/whl/cu128\ntorch==2.11.0\n")
    checks, _ = evaluate(facts(requirements=read_requirements(req)), ProbeState(skipped="--fast"))
    c = by_name(checks, "requirement torch")
    assert "asks for cu128" in c.detail and "cu130" in c.detail


def test_gpu_health_and_other_processes() -> None:
    from gpuready.nvml import GpuProcess, RemappedRows

    sick = gpu(remapped_rows=RemappedRows(0, 1, True, False))
    sick = sick.__class__(**{**sick.__dict__, "processes": (GpuProcess(4242, 2 * 1024**3),)})
    checks, cause = evaluate(facts(nvml=nvml(gpus=(sick,))), ProbeState(skipped="--fast"))
    assert by_name(checks, "gpu0-health").status == "fail"
    assert "4242" in by_name(checks, "gpu0-processes").detail
    assert cause is not None and cause.name == "gpu0-health"


def test_small_dev_shm_warns_with_docker_fix() -> None:
    checks, _ = evaluate(facts(system=system(shm=64 * 1024**2)), ProbeState(skipped="--fast"))
    c = by_name(checks, "dev-shm")
    assert c.status == "warn" and c.fix is not None and "--shm-size" in c.fix


def test_mixed_cuda_majors_among_nvidia_wheels() -> None:
    f = facts(packages=scan(nvidia=("nvidia-nccl-cu11", "nvidia-nccl-cu12", "nvidia-cudnn-cu12")))
    checks, _ = evaluate(f, ProbeState(skipped="--fast"))
    assert by_name(checks, "nvidia-wheels").status == "fail"


def test_probe_timeout_is_a_failed_check_not_a_hang() -> None:
    from gpuready.doctor.probe import ProbeResult

    probe = ProbeResult(seconds=60, timed_out=True, error="the torch probe did not finish in 60 s")
    _checks, cause = evaluate(facts(), ProbeState(result=probe))
    assert cause is not None and cause.name == "torch-cuda" and "did not finish" in cause.detail


def test_the_doctors_own_probe_is_not_another_process_on_the_gpu() -> None:
    """Regression: on the H200 the probe's CUDA context (started alongside) was shown as a foreign process."""
    from dataclasses import replace

    from gpuready.nvml import GpuProcess

    busy = replace(gpu(), processes=(GpuProcess(1354, 5 * 1024**3),))
    checks, _ = evaluate(facts(nvml=nvml(gpus=(busy,)), own_pids=(1354,)), ProbeState(skipped="--fast"))
    assert by_name(checks, "gpu0-processes").status == "pass"
    checks, _ = evaluate(facts(nvml=nvml(gpus=(busy,))), ProbeState(skipped="--fast"))
    assert by_name(checks, "gpu0-processes").status == "warn"
