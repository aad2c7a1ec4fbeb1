"""`gpuready doctor`, `gpuready env snapshot|diff`, `gpuready image`: is this image ready, what changed,
what fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, print_json

if TYPE_CHECKING:
    from gpuready.doctor import DoctorReport, ImageAdvice, SnapshotDiff

RequirementsOpt = Annotated[
    Path | None,
    typer.Option("--requirements", help="requirements.txt or pyproject.toml [default: the one in this folder]"),
]
_STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}
_STEPS = {
    "driver": "1. NVIDIA driver",
    "gpu": "2. GPUs (NVML)",
    "python": "3. Python",
    "torch": "4. PyTorch and CUDA",
    "packages": "5. Packages",
    "requirements": "6. Project requirements",
    "system": "7. Disks, memory, services",
}


def register(app: typer.Typer) -> None:
    app.command("doctor", help="Is this machine's image ready for the job? Checks, the one cause, and the fix.")(
        doctor_cmd
    )
    env_app = typer.Typer(help="Record an environment, or compare two.", no_args_is_help=True)
    env_app.command("snapshot", help="Write this environment as JSON: python, packages, torch/CUDA, driver, GPUs.")(
        snapshot_cmd
    )
    env_app.command("diff", help="What changed between two snapshots (exit 1 when they differ).")(diff_cmd)
    app.add_typer(env_app, name="env")
    app.command("image", help="Which torch + CUDA wheel variant, driver minimum and image suit the project and GPU.")(
        image_cmd
    )


def _render(report: DoctorReport, title: str) -> None:
    """The checks as a list under their steps: each detail wrapped at spaces, each fix's command whole."""
    from rich.console import Console
    from rich.text import Text

    from gpuready.cli.layout import fix_lines, wrap

    console = Console()
    width = console.width
    console.print(Text(title, style="bold"))
    last = None
    for c in report.checks:
        if c.step != last:
            console.print(Text(_STEPS.get(c.step, c.step), style="bold"))
            last = c.step
        lines = wrap(f"{c.name}: {c.detail}", width, indent=" " * 8, first=" " * 8)
        first = Text("  ")
        first.append(f"{c.status:<4}", style=_STYLE[c.status])
        first.append("  " + lines[0].lstrip())
        console.print(first, highlight=False)
        for line in lines[1:]:
            console.print(Text(line), highlight=False)
        if c.fix:
            for i, line in enumerate(fix_lines(c.fix, width, " " * 13)):
                text = Text(line) if i else Text(" " * 8 + "fix: " + line.lstrip())
                console.print(text, highlight=False)
    _verdict(report, console)


def _verdict(report: DoctorReport, console: Any) -> None:
    from rich.text import Text

    from gpuready.cli.layout import fix_lines, wrap

    when = "" if report.final else " (from files; the live torch probe is still running)"
    if report.ready:
        console.print(f"[green bold]READY[/]{when} in {report.seconds:.2f} s; torch probe: {report.probe}")
    else:
        console.print(f"[red bold]NOT READY[/]{when} in {report.seconds:.2f} s; torch probe: {report.probe}")
    if report.cause is not None:
        for line in wrap(f"{report.cause.name}: {report.cause.detail}", console.width, " " * 9, "  cause: "):
            console.print(Text(line), highlight=False)
        if report.cause.fix:
            for i, line in enumerate(fix_lines(report.cause.fix, console.width, " " * 9)):
                console.print(Text("  fix:   " + line.lstrip() if i == 0 else line), highlight=False)


def doctor_cmd(
    requirements: RequirementsOpt = None,
    fast: Annotated[bool, typer.Option("--fast", help="skip the live torch probe and pip check")] = False,
    probe_timeout: Annotated[float, typer.Option(help="seconds the torch probe may take")] = 60.0,
    json_out: JsonOpt = False,
) -> int:
    from gpuready.doctor import doctor
    from gpuready.errors import InputError

    if requirements is not None and not requirements.is_file():
        raise InputError("--requirements", f"{requirements} is not a file")

    def early(report: DoctorReport) -> None:
        from rich.console import Console

        _verdict(report, Console())

    report = doctor(requirements, fast=fast, on_static=None if json_out else early, probe_timeout=probe_timeout)
    if json_out:
        print_json(report.to_dict())
    else:
        _render(report, "gpuready doctor")
    return 0 if report.ready else 1


def snapshot_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="file to write the JSON snapshot to")],
    json_out: JsonOpt = False,
) -> None:
    from gpuready.cli.common import check_output_file, write_text_file
    from gpuready.doctor import gather_facts, take_snapshot

    output = check_output_file(output, "--output")
    snap = take_snapshot(gather_facts(requirements=None, cwd=Path("/nonexistent-gpuready")))
    write_text_file(output, json.dumps(snap, indent=2) + "\n", "--output")
    summary = {
        "file": str(output),
        "packages": len(snap["packages"]),
        "torch": (snap["torch"] or {}).get("version"),
        "driver": snap["driver"]["version"],
        "gpus": len(snap["gpus"]),
    }
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"wrote {output}: {summary['packages']} packages, torch {summary['torch']}, "
            f"driver {summary['driver']}, {summary['gpus']} GPU(s)"
        )


def diff_cmd(
    a: Annotated[Path, typer.Argument(help="first snapshot")],
    b: Annotated[Path, typer.Argument(help="second snapshot")],
    json_out: JsonOpt = False,
) -> int:
    from gpuready.doctor import diff_snapshots, load_snapshot

    diff: SnapshotDiff = diff_snapshots(load_snapshot(a, "A"), load_snapshot(b, "B"))
    if json_out:
        print_json(
            {
                "same": diff.same,
                "changes": [{"key": c.key, "kind": c.kind, "a": c.before, "b": c.after} for c in diff.changes],
            }
        )
    else:
        from rich.console import Console
        from rich.table import Table

        if diff.same:
            typer.echo("the two environments are the same")
        else:
            table = Table(title=f"{a} -> {b}: {len(diff.changes)} change(s)")
            for col in ("what", "", str(a), str(b)):
                table.add_column(col, overflow="fold")
            for c in diff.changes:
                table.add_row(c.key, c.kind, str(c.before if c.before is not None else "-"), str(c.after or "-"))
            Console().print(table)
    return 0 if diff.same else 1


def image_cmd(
    requirements: RequirementsOpt = None,
    snapshot: Annotated[Path | None, typer.Option("--snapshot", help="an env snapshot to advise for")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU name, e.g. H100, RTX 5090, T4")] = None,
    check: Annotated[bool, typer.Option("--check", help="exit 1 unless this machine's torch is suitable")] = False,
    json_out: JsonOpt = False,
) -> int:
    from gpuready.doctor import advise_image, gather_facts
    from gpuready.doctor.requirements import find_requirements
    from gpuready.errors import InputError

    if requirements is not None and snapshot is not None:
        raise InputError("--requirements", "give --requirements or --snapshot, not both")
    if requirements is None and snapshot is None:
        requirements = find_requirements(Path.cwd())
    facts = None
    if snapshot is None or check:
        facts = gather_facts(requirements=None, cwd=Path("/nonexistent-gpuready"))
    advice: ImageAdvice = advise_image(requirements, snapshot, gpu, facts, check)
    if json_out:
        print_json(advice.to_dict())
    else:
        _render_image(advice)
    return 1 if advice.check_ok is False else 0


def _render_image(advice: ImageAdvice) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"GPU {advice.gpu or '?'} (compute capability {advice.compute_capability or '?'}), driver "
        f"{advice.driver or '?'} (CUDA {advice.driver_cuda or '?'}), Python {advice.python or '?'}, "
        f"torch{advice.torch_spec or ' (any)'}"
    )
    from rich import box
    from rich.text import Text

    from gpuready.cli.layout import command_lines

    narrow = console.width < 100
    table = Table(title="torch wheel variants", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["torch", "variant", "driver >=", "all features", "GPU", "driver", "status"]
    if not narrow:
        cols.append("PyPI default")
    for col in cols:
        table.add_column(col, no_wrap=True)
    yes = {True: "yes", False: "[red]no[/]", None: "?"}
    for o in advice.options:
        cells = {
            "torch": o.torch,
            "variant": o.variant,
            "driver >=": o.min_driver or "?",
            "all features": o.full_driver or "?",
            "GPU": yes[o.covers_gpu] if advice.compute_capability else "?",
            "driver": o.driver_fit or "?",
            "status": o.status,
            "PyPI default": o.pypi_default,
        }
        table.add_row(*(cells[c] for c in cols))
    console.print(table)
    if advice.recommended:
        console.print("[bold]install:[/]")
        for line in command_lines(advice.recommended.command, console.width, "  "):
            console.print(Text(line), highlight=False)
        console.print(f"driver needed: >= {advice.recommended.min_driver} (CUDA {advice.recommended.cuda})")
    else:
        console.print("[bold red]no install to recommend[/]: see the notes")
    for image in advice.docker_images:
        console.print(f"image: {image}")
    for note in advice.notes:
        console.print(f"note: {note}")
    if advice.check_ok is not None:
        if advice.check_ok:
            console.print("[green]this machine's torch is suitable[/]")
        for p in advice.check_problems:
            console.print(f"[red]{p}[/]")
