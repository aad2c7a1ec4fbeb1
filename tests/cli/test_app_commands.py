"""The command table of cli/app.py, by which a run registers only its own command's module."""

from __future__ import annotations

import typer

from gpuready.cli import app as app_module


def _names(app: typer.Typer) -> set[str]:
    names = {c.name for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups}
    return {n for n in names if n}


def test_each_module_registers_exactly_the_commands_the_table_names() -> None:
    for module, commands in app_module.COMMAND_MODULES.items():
        assert _names(app_module.build_app((module,))) == set(commands), module


def test_a_run_builds_only_its_commands_module() -> None:
    assert app_module._modules_for(["estimate", "llama-3.1-8b", "--batch", "2"]) == ("gpuready.cli.estimate",)
    assert app_module._modules_for(["storage", "dupes", "/data"]) == ("gpuready.cli.storage",)
    assert app_module._modules_for(["manifest", "verify", "x"]) == ("gpuready.cli.sync",)
    everything = tuple(app_module.COMMAND_MODULES)
    assert app_module._modules_for([]) == everything
    assert app_module._modules_for(["--help"]) == everything
    assert app_module._modules_for(["-h", "estimate"]) == everything
    assert app_module._modules_for(["no-such-command"]) == everything


def test_the_whole_app_has_every_command() -> None:
    expected = {c for commands in app_module.COMMAND_MODULES.values() for c in commands}
    assert _names(app_module.app) == expected


def test_an_unknown_command_is_refused_with_the_usage_exit_code(capsys: object) -> None:
    assert app_module.main(["no-such-command"]) == 2


def test_a_command_run_alone_still_answers_its_help() -> None:
    assert app_module.main(["estimate", "--help"]) == 0
