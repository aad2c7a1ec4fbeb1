"""cli/coercion.py answers a parameter's value as typer's own pydantic adapter does, for every parameter of every
command, and the CLI parses a workload command without importing pydantic."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import typer
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from gpuready.cli.app import app
from gpuready.cli.coercion import _coercer

SAMPLES: list[Any] = [None, "8", "-3", "0", "08", " 8", "8.0", "x", "", "1e3", "99999999999999999999", "True", 5, 2.5]


def _params() -> list[Any]:
    command = typer.main.get_command(app)
    out, stack = [], [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        out += list(cmd.params)
    return out


def _answer(coercer: Any, value: Any, param: Any) -> Any:
    try:
        got = coercer.coerce(value, param=param, ctx=None)
        return ("ok", type(got).__name__, got if not hasattr(got, "read") else "file")
    except BadParameter as exc:
        return ("refused", exc.message)


def test_every_parameter_answers_as_typers_adapter() -> None:
    params = _params()
    assert len(params) > 50
    compared = 0
    for param in params:
        ours = _coercer(param)
        assert ours is not None, param.name
        typers = build_runtime_param(param.type_descriptor)
        for value in SAMPLES:
            if value is not None and (param.multiple or param.nargs == -1):
                value = [value]
            assert _answer(ours, value, param) == _answer(typers, value, param), (param.name, value)
            compared += 1
    assert compared == len(params) * len(SAMPLES)


def test_the_estimate_command_parses_and_runs_without_pydantic() -> None:
    code = (
        "import sys, io, contextlib; from gpuready.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['estimate', 'gpt2', '--batch', '2', '--seq', '128', '--gpu-memory', '24GiB', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
