"""At COLUMNS=80 the default views of models, gpus, doctor, history, estimate, plan and check have no line wider
than 80, no name broken across lines, and every command to copy whole (a long one continues with ` \\`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuready.catalog import load_gpus
from gpuready.cli.app import main
from gpuready.cli.layout import command_lines, fix_lines, split_fix, wrap
from gpuready.models import load_presets

WIDTH = 80


@pytest.fixture(autouse=True)
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))


def view(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    main(list(args))
    out = capsys.readouterr().out
    wide = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not wide, f"{args}: lines wider than {WIDTH}: {wide}"
    return out


def whole_on_a_line(out: str, names: list[str]) -> None:
    lines = out.splitlines()
    broken = [n for n in names if not any(n in line for line in lines)]
    assert not broken, f"names broken or missing: {broken}"


def joined(out: str) -> str:
    """The text with shell continuations undone and runs of spaces collapsed: commands read as typed."""
    return re.sub(r" +", " ", re.sub(r" \\\n\s*", " ", out))


def test_models_at_80(capsys: pytest.CaptureFixture[str]) -> None:
    out = view(capsys, "models")
    whole_on_a_line(out, [p.name for p in load_presets()] + [p.hub_id for p in load_presets()])
    assert "https://" not in out  # sources: --wide / --json


def test_gpus_at_80(capsys: pytest.CaptureFixture[str]) -> None:
    out = view(capsys, "gpus")
    whole_on_a_line(out, [g.name for g in load_gpus()])


def test_doctor_at_80_keeps_fix_commands_whole(capsys: pytest.CaptureFixture[str]) -> None:
    main(["doctor", "--fast", "--json"])
    report = json.loads(capsys.readouterr().out)
    out = view(capsys, "doctor", "--fast")
    for check in report["checks"]:
        whole_on_a_line(out, [check["name"]])
        if check["fix"]:
            _, command = split_fix(check["fix"])
            if command:
                assert command in joined(out), command


def test_history_at_80(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from gpuready.store import ResultsDB

    path = tmp_path / "r.db"
    targets = ["meta-llama/Llama-3.1-8B-Instruct", "python train.py --model_name_or_path meta-llama/Llama-3.1-8B"]
    with ResultsDB(path) as db:
        for target in targets:
            run = db.start_run("probe", target, "batch", None)
            db.add_point(run, {"values": {"batch": 1}, "ok": True, "status": "ok", "peak_device_bytes": 3 << 30})
            db.finish_run(run, "ok")
    out = view(capsys, "history", "--db", str(path))
    whole_on_a_line(out, [targets[0], "--model_name_or_path"])


def test_estimate_at_80(capsys: pytest.CaptureFixture[str]) -> None:
    main(["estimate", "llama-3.1-8b", "--gpu", "A100-40GB", "--json"])
    changes = [m["change"] for m in json.loads(capsys.readouterr().out)["mitigations"]]
    out = view(capsys, "estimate", "llama-3.1-8b", "--gpu", "A100-40GB")
    assert changes
    whole_on_a_line(out, [*changes, "A100 SXM 40GB"])


def test_plan_at_80(capsys: pytest.CaptureFixture[str]) -> None:
    out = view(capsys, "plan", "llama-3.2-1b", "--tokens", "1000000000")
    whole_on_a_line(out, [g.name for g in load_gpus()])


def test_check_at_80(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    main(["check", "llama-3.2-1b", "--quick", "--json"])
    fixes = json.loads(capsys.readouterr().out)["fixes"]
    out = view(capsys, "check", "llama-3.2-1b", "--quick")
    whole_on_a_line(out, [g.name for g in load_gpus() if g.name in out.replace("\n", " ")])
    for fix in fixes:
        _, command = split_fix(fix)
        assert (command or fix) in joined(out)


# ------------------------------------------------------------------------------------------------ layout


def test_long_command_continues_between_arguments() -> None:
    cmd = "python -m pip install 'torch==2.13.0+cu130' --index-url https://download.pytorch.org/whl/cu130"
    lines = command_lines(cmd, 60, "  ")
    assert len(lines) == 2 and lines[0].endswith(" \\") and all(len(line) <= 60 for line in lines)
    assert joined("\n".join(lines)).strip() == cmd


def test_quoted_argument_with_spaces_is_never_split() -> None:
    lines = command_lines("pip install 'torch >=2.11, <2.12' --index-url https://x", 24)
    assert any("'torch >=2.11, <2.12'" in line for line in lines)


def test_fix_prose_wraps_and_its_command_stands_alone() -> None:
    fix = "on your own server install the driver: sudo ubuntu-drivers install"
    lines = fix_lines(fix, 40, "  ")
    assert lines[-1].strip() == "sudo ubuntu-drivers install"
    assert split_fix("--method lora (7.18 GiB)") == ("--method lora (7.18 GiB)", None)


def test_wrap_keeps_gpu_names_whole() -> None:
    text = "fits on: " + ", ".join(g.name for g in load_gpus())
    names = tuple(g.name for g in load_gpus())
    lines = wrap(text, 40, keep=names)
    assert all(len(line) <= 40 for line in lines)
    whole_on_a_line("\n".join(lines), list(names))


@pytest.mark.parametrize(
    "args",
    [
        ["llama-3.1-8b", "--method", "lora", "--grad-ckpt", "--gpu", "A100-40GB", "--sweep", "batch=1,2,4,8,16"],
        ["llama-3.2-1b", "--task", "infer", "--gpu", "A100-40GB", "--sweep", "new-tokens=128,4096,32768"],
        ["qwen2.5-0.5b", "--sweep", "seq=512,2048,8192"],
    ],
)
def test_estimate_sweep_at_80(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    out = view(capsys, "estimate", *args)
    values = args[-1].split("=")[1].split(",")
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == values
    assert all("…" not in row for row in rows)  # every bar whole
