"""NVML through a fake pynvml, the probe's subprocesses, requirements, snapshots, image advice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest

from gpuready.doctor import advise_image, diff_snapshots, doctor, load_snapshot, take_snapshot
from gpuready.doctor.packages import parse_torch_version_file
from gpuready.doctor.probe import CommandResult, ProbeResult, RunningCommand, parse_probe
from gpuready.doctor.requirements import read_requirements
from gpuready.errors import InputError
from gpuready.nvml import read_nvml
from tests.doctor.fakes import GIB, FakeNvml, facts, probe_ok, scan, torch_build


def test_nvml_reads_each_gpu_and_unknown_metrics_stay_none() -> None:
    lib = FakeNvml(
        [
            {
                "name": "NVIDIA H200",
                "uuid": "GPU-1",
                "memory": (140 * GIB, GIB),
                "cc": (9, 0),
                "procs": [(77, GIB)],
                "ecc": (3, 0),
                "throttle": 0x41,
            }
        ]
    )
    report = read_nvml(lib)
    assert report.available and report.driver_version == "580.159.04" and report.cuda_driver == (13, 0)
    (g,) = report.gpus
    assert g.compute_capability == (9, 0) and g.memory_free_bytes == 139 * GIB
    assert g.processes is not None and g.processes[0].pid == 77
    assert g.ecc_corrected_volatile == 3 and g.remapped_rows is None  # NotSupported -> unknown
    assert lib.shutdown_called


def test_nvml_without_driver_is_a_report_not_an_exception() -> None:
    report = read_nvml(FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert not report.available and report.error_kind == "driver_not_loaded" and report.gpus == ()


def test_torch_version_file_read_as_text() -> None:
    text = "__version__ = '2.5.1+cu124'\ndebug = False\ncuda: Optional[str] = '12.4'\nhip: Optional[str] = None\n"
    assert parse_torch_version_file(text) == {"cuda": "12.4", "hip": None}


def test_a_hung_child_is_killed_at_its_timeout() -> None:
    result = RunningCommand([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5).wait()
    assert result.timed_out and result.seconds < 5
    probe = parse_probe(result)
    assert probe.timed_out and probe.error is not None


def test_probe_output_is_parsed_and_a_crash_is_a_result() -> None:
    line = (
        'GPUREADY_PROBE {"torch_version": "2.11.0+cu130", "cuda": "13.0", "is_available": true, '
        '"device_count": 1, "devices": [{"name": "NVIDIA H200", "capability": [9, 0]}]}'
    )
    ok = parse_probe(CommandResult(("python",), 0, "noise\n" + line + "\n", "", 4.2))
    assert ok.is_available and ok.devices[0].capability == (9, 0)
    crash = parse_probe(CommandResult(("python",), -11, "", "Segmentation fault", 1.0))
    assert crash.error is not None and "Segmentation fault" in crash.error


def test_requirements_includes_markers_and_pyproject(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("numpy>=1.26 \\\n  --hash=sha256:abc\n")
    (tmp_path / "requirements.txt").write_text(
        "-r base.txt\n--extra-index-url https://download.pytorch.org/whl/cu121\n-e .\n"
        'pywin32>=300; sys_platform == "win32"\ntorch==2.5.1\n'
    )
    reqs = read_requirements(tmp_path / "requirements.txt")
    assert [r.name for r in reqs.requirements] == ["numpy", "pywin32", "torch"]
    assert reqs.index_variants == ("cu121",) and reqs.unchecked == ("-e .",)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.4"]\n')
    assert [str(r) for r in read_requirements(tmp_path / "pyproject.toml").requirements] == ["torch>=2.4"]


def test_snapshot_diff_names_what_changed() -> None:
    a = take_snapshot(facts())
    b = take_snapshot(facts(packages=scan((torch_build("2.11.0+cu128", "12.8"),))))
    diff = diff_snapshots(a, b)
    keys = {c.key: c for c in diff.changes}
    assert keys["torch.version"].before == "2.11.0+cu130" and keys["torch.version"].after == "2.11.0+cu128"
    assert keys["packages.torch"].kind == "changed"
    assert diff_snapshots(a, a).same


def test_snapshot_file_round_trip_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(take_snapshot(facts())))
    assert load_snapshot(path)["torch"]["variant"] == "cu130"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError):
        load_snapshot(tmp_path / "bad.json")


def test_image_for_rtx_5090_and_a_pinned_old_torch(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("torch>=2.4,<2.8\n")
    advice = advise_image(requirements=req, gpu="RTX 5090")
    assert advice.recommended is not None
    # sm_120 first ships in 2.7 cu128 (experimental there), the only variant <2.8 that runs on it
    assert (advice.recommended.torch, advice.recommended.variant) == ("2.7", "cu128")
    assert advice.recommended.min_driver == "525.60.13"


def test_image_for_a_gpu_named_by_the_catalogs_architecture_table() -> None:
    """`--gpu` reads the catalog's one GPU table: cards without a spec row (A40) and looser spellings of spec
    rows ('4090') both resolve; an AMD card is a one-line input error, not a traceback."""
    assert advise_image(gpu="NVIDIA A40").compute_capability == "8.6"
    advice = advise_image(gpu="4090")
    assert (advice.gpu, advice.compute_capability) == ("RTX 4090", "8.9")
    with pytest.raises(InputError, match="compute capability unknown"):
        advise_image(gpu="MI300X")


def test_image_check_fails_for_a_cpu_wheel() -> None:
    f = facts(packages=scan((torch_build("2.11.0+cpu", None),), nvidia=()))
    advice = advise_image(facts=f, check=True)
    assert advice.check_ok is False and "cpu" in advice.check_problems[0]
    assert advise_image(facts=facts(), check=True).check_ok is True


class FakePending:
    def __init__(self, result: ProbeResult) -> None:
        self._result, self.cancelled = result, False

    def result(self) -> ProbeResult:
        return self._result

    def cancel(self) -> None:
        self.cancelled = True


def test_doctor_shows_the_static_verdict_first_then_the_probe() -> None:
    seen = []
    pending = FakePending(probe_ok())
    report = doctor(
        fast=False,
        start_probe=lambda: pending,
        run_pip_check=False,
        on_static=seen.append,
        facts_fn=lambda *a, **k: facts(),
    )
    assert len(seen) == 1 and not seen[0].final and seen[0].probe == "pending"
    assert report.final and report.ready and report.probe == "ran"


def test_doctor_without_driver_drops_the_probe_and_answers_at_once() -> None:
    from tests.doctor.fakes import NO_DRIVER

    pending = FakePending(probe_ok())
    report = doctor(start_probe=lambda: pending, run_pip_check=False, facts_fn=lambda *a, **k: facts(nvml=NO_DRIVER))
    assert pending.cancelled and not report.ready and report.cause is not None
    assert report.cause.name == "nvidia-driver"


def _fake_site(root: Path, name: str, version: str, files: dict[str, str] | None = None) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Dist: filelock\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_scan_finds_two_torch_installs_their_builds_and_leftovers(tmp_path: Path) -> None:
    from gpuready.doctor.packages import scan_packages

    user, venv = tmp_path / "user", tmp_path / "venv"
    _fake_site(user, "torch", "2.5.1+cpu", {"torch/version.py": "cuda = None\nhip = None\n"})
    _fake_site(venv, "torch", "2.5.1", {"torch/version.py": "cuda: Optional[str] = '12.4'\n"})
    (venv / "~orch").mkdir()
    result = scan_packages([str(user), str(venv)], prefix=str(tmp_path))
    assert [(b.version, b.variant) for b in result.torch_builds] == [("2.5.1+cpu", "cpu"), ("2.5.1", "cu124")]
    assert set(result.duplicates()) == {"torch"}
    assert result.leftovers and result.leftovers[0].endswith("~orch")
    assert any("requires filelock" in c for c in result.conflicts)
