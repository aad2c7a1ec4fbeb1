"""`gpuready trial -- COMMAND` and `gpuready history` through the CLI entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuready.cli.app import main


def test_trial_command_json_and_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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


def test_bad_sweep_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["trial", "gpt2", "--sweep", "colour=1,2", "--db", str(tmp_path / "r.db")]) == 2
    assert "--sweep" in capsys.readouterr().err
