"""`gpuready plan MODEL [workload] [--prices FILE] [--tokens N | --steps N | --hours H]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, build_job, check_input_file, print_json, warn, with_workload

if TYPE_CHECKING:
    from gpuready.plan import PlanResult


def register(app: typer.Typer) -> None:
    app.command("plan", help="Which GPUs hold the job, how long it takes there and what it costs.")(plan_cmd)


@with_workload
def plan_cmd(
    model: Annotated[str | None, typer.Argument(metavar="MODEL", help="preset, hub id, config.json or folder")] = None,
    prices: Annotated[Path | None, typer.Option(help="CSV gpu,price_per_gpu_hour over the default prices")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens to train on")] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps to run")] = None,
    hours: Annotated[float | None, typer.Option(help="hours to rent")] = None,
    gpu: Annotated[
        list[str] | None, typer.Option(help="only this GPU from `gpuready gpus` (repeat for several)")
    ] = None,
    wide: Annotated[bool, typer.Option("--wide", help="all columns, however wide the terminal")] = False,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    from gpuready.catalog.prices import load_prices
    from gpuready.plan import plan

    if prices is not None:
        prices = check_input_file(prices, "--prices")
    only = None
    if gpu:
        from gpuready.catalog import find_gpu

        only = [find_gpu(name).name for name in gpu]
    job = build_job(model, dict(workload_flags or {}))
    result = plan(job.workload, load_prices(prices), tokens=tokens, steps=steps, hours=hours, spec=job.spec, only=only)
    result.assumptions[:0] = job.assumptions
    warn(result.warnings)
    if json_out:
        print_json(result.to_json())
    else:
        render(result, wide)
    return 0 if any(o.fits for o in result.options) else 1


def _hours(h: float | None) -> str:
    if h is None:
        return "?"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def render(result: PlanResult, wide: bool = False) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from gpuready.units import format_bytes

    console = Console()
    cols = ["GPU", "fits", "headroom", "batch", "step", "job", "$/GPU-h", "cost"]
    if console.width < 100 and not wide:  # the hourly price goes (it is in --wide and --json)
        cols.remove("$/GPU-h")
    table = Table(
        title="Plan (best first; batch: the largest that fits)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "GPU" else "right", no_wrap=True)
    for o in result.options:
        cells = {
            "GPU": f"{o.count} x {o.gpu}" if o.count > 1 else o.gpu,
            "fits": "[green]yes[/]" if o.fits else "[red]no[/]",
            "headroom": f"{o.headroom_bytes / 1024**3:.1f} GiB",
            "batch": str(o.max_batch),
            "step": f"{o.step_seconds:.2f} s" if o.step_seconds is not None else "?",
            "job": _hours(o.job_hours),
            "$/GPU-h": f"{o.price_per_gpu_hour:.2f}" if o.price_per_gpu_hour is not None else "?",
            "cost": f"${o.cost:,.2f}" if o.cost is not None else "?",
        }
        table.add_row(*(cells[c] for c in cols))
    console.print(table)
    if result.steps:
        console.print(f"{result.steps:,} steps of {result.tokens_per_step:,} tokens")
    for m in result.mitigations:
        console.print(f"  on {m['gpu']}: {m['change']} -> {format_bytes(m['peak_device_bytes'])}")
    for a in result.assumptions:
        console.print(f"[dim]  - {a}[/dim]", highlight=False)
