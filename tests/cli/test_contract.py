"""docs/cli.md is the command-line contract: its command list and each command's `Flags:` line must match the
real `--help` of that command, both ways, so the contract cannot drift from the code unnoticed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuready.cli.app import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
# the help flag every command has; the contract states it once, in its conventions
ALWAYS = {"--help"}
OPTION_LINE = re.compile(r"^  (?:-\w, )?(--[a-z0-9][a-z0-9-]*)(?: / (--[a-z0-9][a-z0-9-]*))?")


def _doc_sections() -> dict[str, set[str]]:
    """command path ("" for the program itself) -> the flags its `Flags:` line lists."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("## The workload") : text.index("## GPU memory")]
    workload = {f for row in table.splitlines() if row.startswith("| `--") for f in _flags(row.split("|")[1])}
    sections: dict[str, set[str]] = {}
    parts = re.split(r"^### `gpuready ?([a-z ]*)`$", text, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        m = re.search(r"^Flags: (.*(?:\n(?!\n).*)*)", body, flags=re.M)
        assert m, f"docs/cli.md: section `gpuready {name}` has no Flags: line"
        line = m.group(1)
        flags = _flags(line)
        if "workload flags" in line:
            flags |= workload
        sections[name.strip()] = flags
    return sections


def _flags(text: str) -> set[str]:
    return {f for code in re.findall(r"`([^`]*)`", text) for f in re.findall(r"--[a-z0-9][a-z0-9-]*", code)}


def _commands(cmd: Any, path: str = "") -> dict[str, Any]:
    """command path -> command, hidden ones left out (typer vendors click, so groups are told by `commands`)."""
    out = {path: cmd}
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        if not getattr(sub, "hidden", False):
            out.update(_commands(sub, f"{path} {name}".strip()))
    return out


def _help_flags(path: str) -> set[str]:
    result = CliRunner().invoke(app, [*path.split(), "--help"], prog_name="gpuready", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    section = result.output.split("Options")[1].split("Commands")[0]
    flags: set[str] = set()
    for line in section.splitlines():
        m = OPTION_LINE.match(line)
        if m:
            flags.update(f for f in m.groups() if f)
    return flags


REAL = _commands(typer.main.get_command(app))
# groups with no options of their own but --help: documented through their subcommands
GROUPS_WITHOUT_OPTIONS = {"env", "manifest"}


def test_every_real_command_has_a_section_in_the_contract() -> None:
    documented = set(_doc_sections())
    missing = set(REAL) - GROUPS_WITHOUT_OPTIONS - documented
    assert not missing, f"docs/cli.md lacks a `### gpuready ...` section for: {sorted(missing)}"
    unknown = documented - set(REAL)
    assert not unknown, f"docs/cli.md documents commands that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize("path", sorted(set(_doc_sections())))
def test_contract_flags_match_the_commands_help(path: str) -> None:
    documented = _doc_sections()[path]
    real = _help_flags(path) - ALWAYS
    only_doc, only_help = sorted(documented - real), sorted(real - documented)
    assert not only_doc, f"`gpuready {path}`: docs/cli.md lists flags its --help lacks: {only_doc}"
    assert not only_help, f"`gpuready {path}`: --help has flags docs/cli.md lacks: {only_help}"
