"""`gpuready check [MODEL] [workload] [--quick] [--find-max] [--html FILE]`: the preflight, one verdict."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import (
    JsonOpt,
    build_workload_and_source,
    print_json,
    render_workload_file,
    with_workload,
)

if TYPE_CHECKING:
    from gpuready.check import CheckResult

MARK = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]", "skip": "[dim]skip[/]"}


def register(app: typer.Typer) -> None:
    app.command(
        "check",
        help="The preflight for one job: task, size, image, trial (or the plan without a GPU), storage; one verdict.",
    )(check_cmd)


@with_workload
def check_cmd(
    model: Annotated[str | None, typer.Argument(help="preset, hub id, config.json or folder")] = None,
    quick: Annotated[bool, typer.Option(help="skip the live torch probe and the trial")] = False,
    find_max: Annotated[bool, typer.Option("--find-max", help="trial: find the largest batch that runs")] = False,
    gpu_memory: Annotated[
        str | None, typer.Option(help="size against this much GPU memory instead of this GPU")
    ] = None,
    requirements: Annotated[Path | None, typer.Option(help="the project's requirements file")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="also write the report as an HTML file")] = None,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    from gpuready.check import check
    from gpuready.units import parse_size

    workload, source = build_workload_and_source(model, dict(workload_flags or {}))
    capacity = parse_size(gpu_memory, "--gpu-memory") if gpu_memory else None
    result = check(workload, gpu_memory_bytes=capacity, quick=quick, find_max=find_max, requirements=requirements)
    if html_out is not None:
        html_out.write_text(render_html(result), encoding="utf-8")
    if json_out:
        data = result.to_json()
        if source is not None:
            data["workload_file"] = source.to_json()
        print_json(data)
    else:
        if source is not None:
            from rich.console import Console

            render_workload_file(source, Console())
        render(result)
    return 0 if result.ready else 1


def render(result: CheckResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="gpuready check", title_justify="left")
    table.add_column("step")
    table.add_column("")
    table.add_column("result", overflow="fold")
    for step in result.steps:
        table.add_row(step.name, MARK[step.status], step.summary)
        for c in step.checks:
            if c["status"] == "fail":
                table.add_row("", MARK["fail"], f"{c['name']}: {c['detail']}")
    console.print(table)
    verdict = "[bold green]READY[/]" if result.ready else "[bold red]NOT READY[/]"
    console.print(verdict)
    for fix in result.fixes:
        console.print(f"  fix: {fix}")


def render_html(result: CheckResult) -> str:
    colors = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781"}
    rows = []
    for step in result.steps:
        rows.append(
            f"<tr><td>{html.escape(step.name)}</td><td style='color:{colors[step.status]}'>{step.status}</td>"
            f"<td>{html.escape(step.summary)}</td></tr>"
        )
        for c in step.checks:
            rows.append(
                f"<tr><td></td><td style='color:{colors.get(c['status'], '#000')}'>{html.escape(c['status'])}</td>"
                f"<td>{html.escape(c['name'])}: {html.escape(str(c['detail']))}</td></tr>"
            )
    fixes = "".join(f"<li><code>{html.escape(f)}</code></li>" for f in result.fixes)
    verdict = "READY" if result.ready else "NOT READY"
    return (
        "<!doctype html><meta charset='utf-8'><title>gpuready check</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:.3em .8em;vertical-align:top}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f6f8fa}</style>"
        f"<h1>gpuready check: {verdict}</h1><table>{''.join(rows)}</table>"
        + (f"<h2>What to do</h2><ul>{fixes}</ul>" if fixes else "")
    )
