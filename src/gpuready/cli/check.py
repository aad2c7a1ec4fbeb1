"""`gpuready check [MODEL] [workload] [--quick] [--find-max] [--html FILE]`: the preflight, one verdict."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import (
    JsonOpt,
    build_job,
    check_input_file,
    check_output_file,
    gpu_capacity,
    print_json,
    render_workload_file,
    spinner,
    warn,
    with_workload,
    write_text_file,
)

if TYPE_CHECKING:
    from gpuready.check import CheckResult


def register(app: typer.Typer) -> None:
    app.command(
        "check",
        help="The preflight for one job: task, size, image, trial (or the plan without a GPU), storage; one verdict.",
    )(check_cmd)


@with_workload
def check_cmd(
    model: Annotated[str | None, typer.Argument(metavar="MODEL", help="preset, hub id, config.json or folder")] = None,
    quick: Annotated[bool, typer.Option(help="skip the live torch probe and the trial")] = False,
    find_max: Annotated[bool, typer.Option("--find-max", help="trial: find the largest batch that runs")] = False,
    gpu: Annotated[str | None, typer.Option(help="size against this GPU from `gpuready gpus`, not this one")] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(help="size against this much memory: 24GiB (exact), 80GB (a card's label) or a GPU name"),
    ] = None,
    requirements: Annotated[Path | None, typer.Option(help="the project's requirements file")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="also write the report as an HTML file")] = None,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    from gpuready.check import check

    if html_out is not None:
        html_out = check_output_file(html_out, "--html")
    if requirements is not None:
        requirements = check_input_file(requirements, "--requirements")
    need = gpu_capacity(gpu, gpu_memory)
    job = build_job(model, dict(workload_flags or {}))
    warnings = list(job.warnings)
    if need and need.gpu:
        from gpuready.catalog.cards import precision_warning

        bf16 = precision_warning(need.gpu, job.workload.precision)
        if bf16:
            warn([bf16])
            warnings.append(bf16)
    label = "checking: the size, the image" + ("" if quick else " (a live torch probe, up to a minute), the trial")
    with spinner(label):
        result = check(
            job.workload,
            gpu_memory_bytes=need.bytes if need else None,
            gpu_label=need.gpu.name if need and need.gpu else None,
            spec=job.spec,
            warnings=warnings,
            quick=quick,
            find_max=find_max,
            requirements=requirements,
            framework=job.source.format if job.source is not None else None,
        )
    if html_out is not None:
        write_text_file(html_out, render_html(result), "--html")
    if json_out:
        data = result.to_json()
        if job.source is not None:
            data["workload_file"] = job.source.to_json()
        print_json(data)
    else:
        if job.source is not None:
            from rich.console import Console

            render_workload_file(job.source, Console())
        render(result)
    return 0 if result.ready else 1


def render(result: CheckResult) -> None:
    """One line per step (and per failed or warned check), wrapped under its column; names and commands whole."""
    from rich.console import Console
    from rich.text import Text

    from gpuready.catalog import load_gpus
    from gpuready.cli.layout import fix_lines, wrap

    console = Console()
    width = console.width
    names = tuple(g.name for g in load_gpus())
    console.print(Text("gpuready check", style="bold"))
    styles = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}

    def row(step: str, status: str, text: str) -> None:
        lines = wrap(text, width, " " * 17, first=" " * 17, keep=names)
        head = Text(f"  {step:<8} ")
        head.append(f"{status:<4}", style=styles[status])
        head.append("  " + lines[0].lstrip())
        console.print(head, highlight=False)
        for line in lines[1:]:
            console.print(Text(line), highlight=False)

    for step in result.steps:
        row(step.name, step.status, step.summary)
        for c in step.checks:
            line = f"{c['name']}: {c['detail']}"
            if c["status"] in ("fail", "warn") and line not in step.summary:
                row("", c["status"], line)
    verdict = "[bold green]READY[/]" if result.ready else "[bold red]NOT READY[/]"
    console.print(verdict)
    for fix in result.fixes:
        for i, line in enumerate(fix_lines(fix, width, " " * 7)):
            console.print(Text(("  fix: " + line.lstrip()) if i == 0 else line), highlight=False)


def render_html(result: CheckResult) -> str:
    import html  # only for --html: not at start-up

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
