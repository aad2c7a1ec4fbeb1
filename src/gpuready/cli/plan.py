"""`gpuready plan MODEL [workload] [--prices FILE] [--tokens N | --steps N | --hours H]`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, build_job, check_input_file, print_json, warn, with_workload

if TYPE_CHECKING:
    from gpuready.plan import PlanResult


def register(app: typer.Typer) -> None:
    app.command("plan", help="Which GPUs hold the job, how fast it runs there and what the work costs.")(plan_cmd)


@with_workload
def plan_cmd(
    model: Annotated[str | None, typer.Argument(metavar="MODEL", help="preset, hub id, config.json or folder")] = None,
    prices: Annotated[Path | None, typer.Option(help="CSV gpu,price_per_gpu_hour over the default prices")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens to train on (or generate)")] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps (inference: requests) to run")] = None,
    hours: Annotated[float | None, typer.Option(help="hours to rent")] = None,
    gpu: Annotated[
        list[str] | None, typer.Option(help="only this GPU from `gpuready gpus` (repeat for several)")
    ] = None,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    from gpuready.catalog.prices import load_prices
    from gpuready.plan import plan
    from gpuready.plan.calibrate import stored_factors

    if prices is not None:
        prices = check_input_file(prices, "--prices")
    cards = None
    if gpu:
        from gpuready.catalog import find_gpu

        cards = tuple(find_gpu(name) for name in gpu)
    job = build_job(model, dict(workload_flags or {}))
    result = plan(
        job.workload,
        load_prices(prices),
        tokens=tokens,
        steps=steps,
        hours=hours,
        calibration=stored_factors(),
        gpus=cards,
        spec=job.spec,
    )
    result.assumptions[:0] = job.assumptions
    warn(result.warnings)
    if json_out:
        print_json(result.to_json())
    else:
        render(result)
    return 0 if any(o.runs for o in result.options) else 1


def _hours(h: float | None) -> str:
    if h is None:
        return "?"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:,.1f} h"


def _rate(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x / 1000:,.1f}k" if x >= 10_000 else f"{x:,.0f}"


def _money(x: float | None) -> str:
    """Dollars with cents, or two significant digits below 10 cents ($0.052, $0.00021)."""
    if x is None:
        return "?"
    if x >= 0.1 or x <= 0:
        return f"${x:,.2f}"
    digits = 1 - math.floor(math.log10(x))
    return f"${x:.{digits}f}"


def render(result: PlanResult) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpuready.plan.plan import UNIT_LABEL

    unit_short = "tok/s" if result.unit == "tokens" else "img/s"
    per = "$/" + UNIT_LABEL[result.unit].replace(" tokens", " tok").replace(" images", " img")
    by_job = result.ranked_by == "job cost"
    with_length = any(o.job_hours is not None for o in result.options)
    table = Table(title=f"Plan: ranked by {result.ranked_by} (best first)", title_justify="left")
    # 80 columns: the per-unit cost without a length, the job's time and cost with one
    cols = (
        ["GPU", "fits", unit_short, "step", "$/GPU-h", "job", "cost"]
        if with_length
        else ["GPU", "fits", "batch", unit_short, "step", "$/GPU-h", per]
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "GPU" else "right")
    marks: list[str] = []
    for o in result.options:
        if o.fits:
            fit = "[green]yes[/]"
        elif o.mitigation:
            marks.append(f"{o.gpu}: {o.mitigation}")
            fit = f"[yellow]*{len(marks)}[/]"
        else:
            fit = "[red]no[/]"
        name = f"{o.count} x {o.gpu}" if o.count > 1 else o.gpu
        rate = _rate(o.throughput) if o.runs else "-"
        step = f"{o.step_seconds:.2f} s" if o.step_seconds is not None and o.runs else "-"
        price = f"{o.price_per_gpu_hour:.2f}" if o.price_per_gpu_hour is not None else "?"
        if with_length:
            tail = [_hours(o.job_hours) if o.runs else "-", _money(o.cost) if o.runs else "-"]
            row = [name, fit, rate, step, price, *tail]
        else:
            row = [name, fit, str(o.max_batch), rate, step, price, _money(o.cost_per_unit) if o.runs else "-"]
        table.add_row(*row)
    console = Console()
    console.print(table)
    if marks:
        console.print("  fits with a change that keeps the work, timed with it:")
    for i, m in enumerate(marks, start=1):
        console.print(f"  *{i} {m}")
    console.print(f"  {result.cost_formula}")
    best = next((o for o in result.options if o.runs and o.cost_per_unit is not None), None)
    if best is not None and best.throughput:
        scale = "1e6" if result.unit == "tokens" else "1e3"
        units = best.throughput * (best.step_seconds or 0)
        console.print(
            f"  {best.gpu}: {best.price_per_gpu_hour:.2f} x {best.count} x {best.step_seconds:.3f} s"
            f" / {units:,.0f} x {scale} / 3600 = {_money(best.cost_per_unit)}"
        )
    if result.steps and by_job:
        console.print(f"  {result.steps:,} steps of {result.units_per_step:,} {result.unit}")
    for sug in result.mitigations:
        console.print(f"  on {result.mitigations_gpu}: {sug.change} -> {sug.peak_device_bytes / 2**30:.1f} GiB")
    for a in result.assumptions:
        console.print(f"[dim]  - {a}[/dim]")
