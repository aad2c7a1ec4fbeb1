"""`gpuready estimate MODEL [workload] [--gpu NAME | --gpu-memory SIZE] [--trace]`."""

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
    from gpuready.memory.mitigations import Mitigation
    from gpuready.memory.result import MemoryEstimate

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
    json_out: JsonOpt = False,
    workload_flags: dict[str, Any] | None = None,
) -> int:
    need = gpu_capacity(gpu, gpu_memory)
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
        if gpu_name:
            data["gpu"] = gpu_name
        if job.source is not None:
            data["workload_file"] = job.source.to_json()
        print_json(data)
    else:
        from rich.console import Console

        from gpuready.workload import describe

        if job.source is not None:
            render_workload_file(job.source, Console())
        render(result, describe(workload), gpu_name, fixes)
    return 1 if result.fits is False else 0


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
    table.add_row("peak allocated (live tensors)", format_bytes(result.peak_allocated_bytes), "")
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
