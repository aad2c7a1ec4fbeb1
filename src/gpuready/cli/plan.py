"""`gpuready plan MODEL [workload] [--prices FILE] [--tokens N | --steps N | --hours H]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, build_workload, print_json, with_workload

if TYPE_CHECKING:
    from gpuready.plan import PlanResult


def register(app: typer.Typer) -> None:
    app.command("plan", help="Which GPUs hold the job, how long it takes there and what it costs.")(plan_cmd)


@with_workload
def plan_cmd(
    model: Annotated[str | None, typer.Argument(help="preset, hub id, config.json or folder")] = None,
    prices: Annotated[Path | None, typer.Option(help="CSV gpu,price_per_gpu_hour over the default prices")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens to train on")] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps to run")] = None,
    hours: Annotated[float | None, typer.Option(help="hours to rent")] = None,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    from gpuready.catalog.prices import load_prices
    from gpuready.plan import plan

    workload = build_workload(model, dict(workload_flags or {}))
    result = plan(workload, load_prices(prices), tokens=tokens, steps=steps, hours=hours)
    if json_out:
        print_json(result.to_json())
    else:
        render(result)
    return 0 if any(o.fits for o in result.options) else 1


def _hours(h: float | None) -> str:
    if h is None:
        return "?"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def render(result: PlanResult) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpuready.units import format_bytes

    table = Table(title="Plan (best first)", title_justify="left")
    for col in ("GPU", "fits", "headroom", "max batch", "step", "job", "$/GPU-h", "cost"):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    for o in result.options:
        table.add_row(
            f"{o.count} x {o.gpu}" if o.count > 1 else o.gpu,
            "[green]yes[/]" if o.fits else "[red]no[/]",
            format_bytes(o.headroom_bytes),
            str(o.max_batch),
            f"{o.step_seconds:.2f} s" if o.step_seconds is not None else "?",
            _hours(o.job_hours),
            f"{o.price_per_gpu_hour:.2f}" if o.price_per_gpu_hour is not None else "?",
            f"${o.cost:,.2f}" if o.cost is not None else "?",
        )
    console = Console()
    console.print(table)
    if result.steps:
        console.print(f"{result.steps:,} steps of {result.tokens_per_step:,} tokens")
    for m in result.mitigations:
        console.print(f"  on {m['gpu']}: {m['change']} -> {format_bytes(m['peak_device_bytes'])}")
    for a in result.assumptions:
        console.print(f"[dim]  - {a}[/dim]")
