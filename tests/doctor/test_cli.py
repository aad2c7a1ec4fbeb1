"""The real CLI on this machine (CI has no GPU): a fast answer, a failed check, exit 1, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuready.nvml import read_nvml

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "gpuready", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.skipif(read_nvml().available, reason="this machine has an NVIDIA driver")
def test_doctor_without_gpu_fails_cleanly(tmp_path: Path) -> None:
    out = run("doctor", "--json", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    data = json.loads(out.stdout)
    assert data["ready"] is False and data["cause"]["name"] == "nvidia-driver"
    assert {"name", "status", "detail", "fix"} <= set(data["checks"][0])


def test_bad_requirements_path_is_exit_2(tmp_path: Path) -> None:
    out = run("doctor", "--requirements", str(tmp_path / "nope.txt"), "--fast")
    assert out.returncode == 2 and "--requirements" in out.stderr and "Traceback" not in out.stderr


def test_env_snapshot_and_diff(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    assert run("env", "snapshot", "-o", str(a)).returncode == 0
    same = run("env", "diff", str(a), str(a), "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"] is True
    data = json.loads(a.read_text())
    data["packages"]["torch"] = "0.0.1"
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    changed = run("env", "diff", str(a), str(b), "--json")
    assert changed.returncode == 1
    assert any(c["key"] == "packages.torch" for c in json.loads(changed.stdout)["changes"])


def test_image_for_a_gpu_by_name() -> None:
    out = run("image", "--gpu", "T4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["compute_capability"] == "7.5" and data["recommended"]["command"].startswith("python -m pip")


@pytest.mark.gpu
@pytest.mark.skipif(not read_nvml().available, reason="needs an NVIDIA GPU and driver")
def test_doctor_on_a_gpu_machine_runs_the_probe(tmp_path: Path) -> None:
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-m", "gpuready", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    data = json.loads(out.stdout)
    assert data["probe"] == "ran"
    probe = next(c for c in data["checks"] if c["name"] in ("torch-cuda", "torch-import"))
    assert probe["status"] in ("pass", "fail") and probe["detail"]
