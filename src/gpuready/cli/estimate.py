"""`gpuready estimate MODEL [workload] [--gpu NAME | --gpu-memory SIZE] [--trace | --sweep VAR=V1,V2,...]`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import (
    JsonOpt,
    build_job,
    gpu_capacity,
    print_json,
    render_workload_file,
    spinner,
    warn,
    with_workload,
)
from gpuready.errors import InputError
from gpuready.units import format_bytes

if TYPE_CHECKING:
    from gpuready.catalog.cards import GpuMemory
    from gpuready.memory.mitigations import Mitigation
    from gpuready.memory.result import MemoryEstimate
    from gpuready.workload.validate import CheckedWorkload

COLORS = {
    "weights": "blue",
    "gradients": "magenta",
    "optimizer_states": "yellow",
    "optimizer_temporaries": "dark_orange",
    "activations": "green",
    "logits_and_loss": "cyan",
    "kv_cache": "bright_cyan",
    "lora_adapters": "bright_magenta",
    "autocast_weight_copies": "bright_blue",
    "allocator_blocks": "grey50",
}


def register(app: typer.Typer) -> None:
    app.command(
        "estimate",
        help="Predict a job's peak GPU memory (weights, gradients, optimizer, activations, logits, KV cache, "
        "allocator, CUDA context) and whether it fits a GPU.",
    )(estimate_cmd)


@with_workload
def estimate_cmd(
    model: Annotated[
        str | None, typer.Argument(metavar="MODEL", help="preset (gpuready models), hub id, config.json or folder")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="a GPU from `gpuready gpus`, e.g. A100-80GB, rtx4090")] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="GPU memory: 24GiB or 81559MiB (exact), 80GB (what a card sold as 80 GB reports) or a GPU name;"
            " a bare number is refused"
        ),
    ] = None,
    trace: Annotated[
        bool, typer.Option(help="run the real model code on fake tensors (needs gpuready[trace])")
    ] = False,
    sweep: Annotated[
        str | None,
        typer.Option(help="VAR=V1,V2,... one variable, e.g. batch=1,2,4,8: the predicted peak at each value"),
    ] = None,
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    need = gpu_capacity(gpu, gpu_memory)
    if sweep is not None:
        return _sweep(model, sweep, need, trace, json_out, dict(workload_flags or {}))
    job = build_job(model, dict(workload_flags or {}))
    workload = job.workload
    capacity = need.bytes if need else None
    gpu_name = need.gpu.name if need and need.gpu else None
    if need and need.gpu:
        from gpuready.catalog.cards import precision_warning

        warn([w for w in [precision_warning(need.gpu, workload.precision)] if w])
    if trace:
        if workload.as_family:
            raise InputError("--as-family", "sizes the arithmetic estimate; --trace runs the model's own code")
        try:
            from gpuready.memory.trace import trace_estimate
        except ImportError as exc:
            raise InputError("--trace", f"needs the trace extra: pip install 'gpuready[trace]' ({exc})") from None
        with spinner(f"tracing {workload.model} on fake tensors (tens of seconds)"):
            result = trace_estimate(workload, capacity)
    else:
        from gpuready.memory import estimate

        result = estimate(workload, capacity, spec=job.spec)
    if job.assumptions:
        result = replace(result, assumptions=job.assumptions + list(result.assumptions))
    fixes: list[Mitigation] = []
    if capacity is not None and result.fits is False and not trace:
        from gpuready.memory.mitigations import suggest

        fixes = suggest(workload, capacity)
    if json_out:
        data = result.to_json()
        if capacity is not None:
            data["mitigations"] = [m.to_json() for m in fixes]
        _print_json(data, gpu_name, job)
    else:
        from gpuready.workload import describe

        _render_source(job)
        render(result, describe(workload), gpu_name, fixes)
    return 1 if result.fits is False else 0


def _sweep(
    model: str | None, text: str, need: GpuMemory | None, trace: bool, json_out: bool, flags: dict[str, Any]
) -> int:
    """`--sweep VAR=V1,V2,...`: the estimate at each value, as a table with a bar each (or one JSON document)."""
    from gpuready.memory.sweep import checked_sweep, estimate_sweep
    from gpuready.trial.sweep import parse_sweep

    variable, values = parse_sweep(text)
    if trace:
        raise InputError("--sweep", "sweeps the arithmetic estimate; run --trace for one value at a time")
    if flags.get(variable) is not None:
        raise InputError("--sweep", f"{variable} is swept: leave out --{variable.replace('_', '-')}")
    job = build_job(model, flags)
    capacity = need.bytes if need else None
    gpu_name = need.gpu.name if need and need.gpu else None
    # each value read against the model as a flag would be: refusals exit 2, warnings once each
    checked = checked_sweep(job.workload, variable, values)
    said = list(job.warnings)
    for one in checked:
        new = [line for line in one.warnings if line not in said]
        warn(new)
        said += new
    results = estimate_sweep(
        job.workload, variable, values, capacity, find_max_batch=capacity is not None, checked=checked
    )
    if json_out:
        first = results[0]
        data: dict[str, Any] = {
            "model": first.model,
            "variable": variable,
            "gpu_memory_bytes": capacity,
            # each point's `values` as `trial --sweep --json` writes them, so the two read alike
            "points": [{"values": {variable: v}, **_point(r)} for v, r in zip(values, results, strict=True)],
            "assumptions": job.assumptions + list(first.assumptions),
        }
        _print_json(data, gpu_name, job)
    else:
        _render_source(job)
        _render_sweep(variable, values, results, describe_job(job.workload, variable, values), gpu_name)
    return 1 if any(r.fits is False for r in results) else 0


def _print_json(data: dict[str, Any], gpu_name: str | None, job: CheckedWorkload) -> None:
    """One estimate's or one sweep's JSON with the keys both add: the GPU named, the workload file read."""
    if gpu_name:
        data["gpu"] = gpu_name
    if job.source is not None:
        data["workload_file"] = job.source.to_json()
    print_json(data)


def _render_source(job: CheckedWorkload) -> None:
    """What a --workload file said and how it was read, before the figures."""
    if job.source is not None:
        from rich.console import Console

        render_workload_file(job.source, Console())


def _point(r: MemoryEstimate) -> dict[str, Any]:
    keys = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "phase", "breakdown")
    card = ("fits", "headroom_bytes", "max_batch", "allocator_limit_bytes") if r.gpu_memory_bytes is not None else ()
    data = r.to_json()
    return {k: data[k] for k in (*keys, *card)}


def describe_job(workload: Any, variable: str, values: list[int]) -> str:
    """The job's one-line description with the swept variable's part showing the values swept."""
    from gpuready.workload import describe

    swept = ", ".join(str(v) for v in values)
    shown = {
        "batch": (f"batch {workload.batch}", f"batch {swept}"),
        "seq": (f"seq {workload.seq}", f"seq {swept}"),
        "image_size": (f"{workload.image_size} px", f"{swept} px"),
        "new_tokens": (f"+{workload.new_tokens} new tokens", f"+{swept} new tokens"),
        "lora_r": (f"r={workload.lora_r}", f"r={swept}"),
        "grad_accum": (f"grad-accum {workload.grad_accum}", f"grad-accum {swept}"),
    }
    old, new = shown[variable]
    parts = describe(workload).split(" · ")
    if old in parts:
        return " · ".join(new if p == old else p for p in parts)
    hit = [i for i, p in enumerate(parts) if old in p]  # inside a part (lora r=16)
    if hit:
        parts[hit[0]] = parts[hit[0]].replace(old, new)
        return " · ".join(parts)
    return " · ".join([*parts, new])


def _render_sweep(
    variable: str, values: list[int], results: list[MemoryEstimate], summary: str, gpu_name: str | None
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{summary}[/bold]")
    cap = results[0].gpu_memory_bytes
    scale_to = max([cap or 0, *(r.peak_device_bytes for r in results)])
    per_value_max = cap is not None and variable != "batch"  # a max batch per value; a batch sweep has one
    width = max(12, min(40, console.width - 66))  # the bars share the line with the figures
    title = f"Peak on the device by {variable.replace('_', ' ')}"
    if cap is not None:
        title += f" · {format_bytes(cap)}" + (f" ({gpu_name})" if gpu_name else "") + " at ┃"
    table = Table(title=title, title_justify="left")
    table.add_column(variable.replace("_", " "), justify="right")
    table.add_column("peak on device", justify="right")
    if not per_value_max:  # (narrow terminals: the bar shows it too)
        table.add_column("allocated", justify="right")
    if cap is not None:
        table.add_column("fits")
        table.add_column("headroom", justify="right")
    if per_value_max:
        table.add_column("max batch", justify="right")
    table.add_column("")
    for value, r in zip(values, results, strict=True):
        row = [str(value), format_bytes(r.peak_device_bytes)]
        if not per_value_max:
            row.append(format_bytes(r.peak_allocated_bytes))
        if cap is not None:
            row += ["[green]yes[/]" if r.fits else "[red]no[/]", format_bytes(r.headroom_bytes or 0)]
        if per_value_max:
            row.append(str(r.max_batch))
        table.add_row(*row, _sweep_bar(r, cap, scale_to, width))
    console.print(table)
    console.print("[dim]█ live tensors, ▒ allocator cache and CUDA context[/dim]")
    if cap is not None and variable == "batch" and results[0].max_batch is not None:
        console.print(f"largest batch that fits: {results[0].max_batch}")


def _sweep_bar(r: MemoryEstimate, cap: int | None, scale_to: int, width: int) -> Any:
    """One value's bar: live tensors, then cache and context, the card's capacity as ┃ (past it in red)."""
    from rich.text import Text

    live = round(r.peak_allocated_bytes / scale_to * width)
    total = max(live, round(r.peak_device_bytes / scale_to * width))
    cells = [("█", "green")] * live + [("▒", "grey50")] * (total - live)
    if cap is not None:
        marker = round(cap / scale_to * width)
        cells += [("·", "grey30")] * max(0, marker - total)
        cells = [(c, st if i < marker else "red") for i, (c, st) in enumerate(cells)]
        cells.insert(marker, ("┃", "bold"))
    bar = Text()
    for char, style in cells:
        bar.append(char, style=style)
    return bar


def _bar(result: MemoryEstimate, width: int = 60) -> Any:
    """Components as coloured blocks, allocator cache and context shaded, the GPU's capacity as a marker."""
    from rich.text import Text

    cap = result.gpu_memory_bytes or 0
    scale = width / max(cap, result.peak_device_bytes)
    cells: list[tuple[str, str]] = []
    for name, nbytes in result.breakdown.items():
        cells += [("█", COLORS.get(name, "white"))] * round(nbytes * scale)
    cells += [("▒", "grey50")] * round((result.peak_device_bytes - result.peak_allocated_bytes) * scale)
    if cap:
        marker = min(round(cap * scale), width)
        cells += [("·", "grey30")] * max(0, marker - len(cells))
        style = "bold green" if result.fits else "bold red"
        cells.insert(marker, ("┃", style))
    text = Text()
    for char, style in cells:
        text.append(char, style=style)
    return text


def render(result: MemoryEstimate, summary: str, gpu_name: str | None, fixes: list[Mitigation] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{summary}[/bold]")
    params = f"{result.params / 1e9:.2f} B" if result.params >= 1e9 else f"{result.params / 1e6:.1f} M"
    trainable = result.trainable_params
    console.print(
        f"parameters {params}"
        + (f", trainable {trainable:,} ({trainable / max(result.params, 1):.2%})" if trainable else "")
        + f" · estimated by {result.mode}"
    )
    table = Table(title=f"At the peak ({result.phase})", title_justify="left")
    table.add_column("component")
    table.add_column("memory", justify="right")
    table.add_column("share", justify="right")
    for name, nbytes in result.breakdown.items():
        table.add_row(
            f"[{COLORS.get(name, 'white')}]■[/] {name.replace('_', ' ')}",
            format_bytes(nbytes),
            f"{nbytes / max(result.peak_allocated_bytes, 1):.0%}",
        )
    table.add_section()
    table.add_row("peak allocated (tensors, in blocks)", format_bytes(result.peak_allocated_bytes), "")
    table.add_row(
        "[grey50]▒[/] + allocator cache (reserved)",
        format_bytes(result.peak_reserved_bytes - result.peak_allocated_bytes),
        "",
    )
    table.add_row(
        "[grey50]▒[/] + CUDA context, workspaces",
        format_bytes(result.peak_device_bytes - result.peak_reserved_bytes),
        "",
    )
    table.add_row(
        "[bold]peak on the device (nvidia-smi)[/bold]",
        f"[bold]{format_bytes(result.peak_device_bytes)}[/]",
        "",
    )
    console.print(table)
    console.print(_bar(result))
    if result.gpu_memory_bytes is not None:
        where = format_bytes(result.gpu_memory_bytes) + (f" ({gpu_name})" if gpu_name else "")
        allowed = f"{format_bytes(result.allocator_limit_bytes or 0)} allowed (the card less the context and margin)"
        if result.fits:
            console.print(
                f"[bold green]fits[/] in {where}: reserves {format_bytes(result.reserved_on_card_bytes or 0)} of the "
                f"{allowed}, {format_bytes(result.headroom_bytes or 0)} headroom"
                + (" (freeing its cache on the way)" if result.cache_releases else "")
                + f"; largest batch that fits: {result.max_batch}"
            )
        else:
            console.print(
                f"[bold red]does not fit[/] in {where}: reserves {format_bytes(result.peak_reserved_bytes)}, "
                f"{format_bytes(-(result.headroom_bytes or 0))} over the {allowed}, even after freeing its cache; "
                f"largest batch that fits: {result.max_batch}"
            )
            if fixes:
                fix = Table(title="What would fit", title_justify="left")
                fix.add_column("change", no_wrap=True)  # a flag set to copy: never broken
                fix.add_column("peak on the device", justify="right")
                fix.add_column("fits")
                fix.add_column("note")
                for m in fixes:
                    ok = "[green]yes[/]" if m.fits else "[red]no[/]"
                    fix.add_row(m.change, format_bytes(m.peak_device_bytes), ok, m.note)
                console.print(fix)
    from rich.text import Text

    from gpuready.cli.layout import wrap

    console.print("[dim]assumptions:[/dim]")
    for assumption in result.assumptions:
        for line in wrap(assumption, console.width, "    ", "  - "):
            console.print(Text(line, style="dim"), highlight=False)
