"""`gpuready trial -- COMMAND` and `gpuready history` through the CLI entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuready.cli.app import main


def test_trial_command_json_and_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuready.trial.preflight.missing_for_trial", lambda kind, nproc: [])  # as on a GPU machine
    db = str(tmp_path / "r.db")
    script = tmp_path / "t.py"
    script.write_text("import sys\nprint('hi')\nsys.exit(0 if int(sys.argv[1].split('=')[1]) < 4 else 1)\n")
    code = main(["trial", "--json", "--db", db, "--sweep-arg", "--bs=1,4", "--", sys.executable, str(script)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # one point failed: the answer is "no"
    assert [p["ok"] for p in out["points"]] == [True, False]
    assert set(out["points"][0]) >= {
        "values",
        "ok",
        "error",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_device_bytes",
        "step_seconds",
        "throughput",
    }
    assert main(["history", "--json", "--db", db]) == 0
    hist = json.loads(capsys.readouterr().out)
    assert hist["runs"][0]["kind"] == "command" and len(hist["runs"][0]["points"]) == 2
    assert hist["runs"][0]["status"] == "partial"  # 1 of 2 points ran: not "done"


def test_bad_sweep_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["trial", "gpt2", "--sweep", "colour=1,2", "--db", str(tmp_path / "r.db")]) == 2
    assert "--sweep" in capsys.readouterr().err


def test_trial_without_a_gpu_says_what_is_missing_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuready.nvml import NvmlReport

    monkeypatch.setattr(
        "gpuready.nvml.read_nvml",
        lambda: NvmlReport(error="NVML: NVML Shared Library Not Found", error_kind="library_not_found"),
    )
    db = tmp_path / "r.db"
    for args in (["gpt2", "--find-max", "batch"], ["--", sys.executable, "-c", "print(1)"]):
        code = main(["trial", "--db", str(db), *args])
        err = capsys.readouterr().err
        assert code == 1
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "no NVIDIA driver" in err and "nothing was run" in err
    assert not db.exists()  # no run was recorded, no point ran


def test_trial_probe_names_missing_torch() -> None:
    from gpuready.nvml import NvmlGpu, NvmlReport
    from gpuready.trial.preflight import missing_for_trial

    def gpu() -> NvmlReport:
        return NvmlReport(driver_version="580.0", gpus=(NvmlGpu(index=0),))

    missing = missing_for_trial("probe", read_nvml=gpu, has_module=lambda name: name != "torch")
    assert missing == ["torch not installed (pip install 'gpuready[trial]')"]
    assert missing_for_trial("command", read_nvml=gpu, has_module=lambda name: False) == []
    none = missing_for_trial("command", read_nvml=lambda: NvmlReport(driver_version="580.0"))
    assert none and none[0].startswith("no GPU visible")
    two = missing_for_trial("probe", nproc=2, read_nvml=gpu, has_module=lambda name: True)
    assert two == ["--nproc 2 needs 2 GPUs; this machine has 1"]


def test_history_refuses_an_unknown_kind_and_a_missing_db(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["history", "--kind", "banana", "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuready: error: --kind:") and "probe, command" in err and err.count("\n") == 1
    assert main(["history", "--db", "/nonexistent/x.db"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuready: error: --db:") and "no such file" in err and err.count("\n") == 1


def test_history_shows_failed_and_partial_runs_as_such(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from gpuready.store import ResultsDB

    path = tmp_path / "r.db"
    with ResultsDB(path) as db:
        failed = db.start_run("probe", "gpt2", "batch", None)
        db.add_point(failed, {"values": {"batch": 1}, "ok": False, "status": "error", "error": "no torch"})
        db.finish_run(failed, "done")  # as gpuready before 0.2 recorded it
        partial = db.start_run("probe", "gpt2", "batch", None)
        db.add_point(partial, {"values": {"batch": 1}, "ok": True, "status": "ok"})
        db.add_point(partial, {"values": {"batch": 2}, "ok": False, "status": "oom"})
        db.finish_run(partial, "partial")
    assert main(["history", "--db", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["status"] for r in runs] == ["partial", "failed"]
    assert main(["history", "--db", str(path), "--status", "failed", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [failed]
    assert main(["history", "--db", str(path), "--status", "done", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert main(["history", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    assert "partial" in out and "failed" in out and "done" not in out


def test_run_status_tells_ok_partial_failed() -> None:
    from gpuready.trial.api import run_status
    from gpuready.trial.result import Point

    ok = Point(values={"batch": 1}, ok=True, status="ok")
    bad = Point(values={"batch": 2}, ok=False, status="oom")
    assert run_status([ok], False) == "ok"
    assert run_status([ok, bad], False) == "partial"
    assert run_status([bad], False) == "failed"
    assert run_status([], False) == "failed"
    assert run_status([ok, bad], True) == "interrupted"
    assert run_status([ok, bad], False, found_max=1) == "ok"
    assert run_status([bad], False, found_max=0) == "failed"


def test_a_generation_trial_shows_what_its_first_call_took() -> None:
    from gpuready.cli.trial import first_call_line
    from gpuready.trial.result import Point

    def point(**detail: object) -> Point:
        return Point(values={}, ok=True, status="ok", step_seconds=2.0, detail=dict(detail))

    line = first_call_line([point(generate_calls=2, step_times=[7.0, 2.0])])
    assert line is not None and line.startswith("first generate() call: 7.000 s, 3.5x the timed (warm) call")
    assert first_call_line([point(step_times=[0.5, 0.4])]) is None  # a prefill's two forwards
    assert first_call_line([point(generate_calls=1, step_times=[7.0])]) is None  # calibration's single call
