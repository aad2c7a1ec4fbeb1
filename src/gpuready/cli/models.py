"""`gpuready models` and `gpuready gpus`: the built-in presets and the GPU catalog."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, print_json

if TYPE_CHECKING:
    from gpuready.catalog import Gpu


def register(app: typer.Typer) -> None:
    app.command("models", help="List the built-in model presets with parameter counts and sources.")(models_cmd)
    app.command("gpus", help="List the GPU catalog (memory, bandwidth, bf16 TFLOP/s, source).")(gpus_cmd)


WideOpt = Annotated[bool, typer.Option("--wide", help="add the source column, however wide the terminal")]


def models_cmd(wide: WideOpt = False, json_out: JsonOpt = False) -> None:
    from gpuready.models import load_presets, resolve_model

    rows: list[dict[str, Any]] = []
    for p in load_presets():
        spec = resolve_model(p.name)
        rows.append(
            {
                "name": p.name,
                "hub_id": p.hub_id,
                "kind": spec.kind,
                "type": spec.model_type,
                "params": spec.params,
                "source": p.source,
            }
        )
    if json_out:
        print_json({"models": rows})
        return
    from rich import box
    from rich.table import Table

    console = _console(wide)
    table = Table(
        title="Built-in models (any hub id of the same name resolves to the preset)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,  # 54 presets with hub ids up to 37 characters: whole at 80 columns
    )
    cols = ["name", "hub id", "type", "params"] + (["source"] if wide else [])
    for col in cols:
        table.add_column(col, justify="right" if col == "params" else "left", no_wrap=True)
    for r in rows:
        params = r["params"]
        shown = f"{params / 1e9:.{1 if params >= 1e11 else 2}f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"
        table.add_row(r["name"], r["hub_id"], r["type"], shown, *([r["source"]] if wide else []))
    console.print(table)
    if not wide:
        console.print("[dim]sources: --wide or --json[/dim]")


def gpus_cmd(wide: WideOpt = False, json_out: JsonOpt = False) -> None:
    from dataclasses import asdict

    from gpuready.catalog import load_gpus

    gpus = load_gpus()
    if json_out:
        print_json({"gpus": [asdict(g) | {"usable_bytes": g.usable_bytes} for g in gpus]})
        return
    from rich import box
    from rich.table import Table

    from gpuready.catalog.cards import bf16_supported
    from gpuready.units import format_gib

    console = _console(wide)
    table = Table(
        title="GPU catalog (memory: the label; reports: what the driver shows)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    cols = ["name", "memory", "reports", "GB/s", "bf16 TFLOP/s", "cc"] + (["source"] if wide else [])
    for col in cols:
        table.add_column(col, justify="left" if col in ("name", "source") else "right", no_wrap=True)
    for g in gpus:
        bf16 = f"{g.bf16_dense_tflops:g}" if g.bf16_dense_tflops else "?"
        if bf16_supported(g) is False:  # compute capability below 8.0: no bf16 (the catalog gives fp16 only)
            bf16 = f"no ({g.fp16_dense_tflops:g} fp16)" if g.fp16_dense_tflops else "no bf16"
        table.add_row(
            g.name,
            f"{g.memory_gb:g} GB",
            format_gib(g.usable_bytes),
            f"{g.mem_bw_gbs:g}" if g.mem_bw_gbs else "?",
            bf16,
            _cc(g, wide),
            *([g.source_url] if wide else []),
        )
    console.print(table)
    if not wide:
        console.print("[dim]sources: --wide or --json; bf16 needs compute capability (cc) 8.0 or newer[/dim]")


def _console(wide: bool) -> Any:
    """The terminal's console; with --wide one as wide as the table needs (lines longer than the terminal)."""
    from rich.console import Console

    return Console(width=400) if wide else Console()


def _cc(gpu: Gpu, wide: bool) -> str:
    """Compute capability as `8.9`; other vendors' architecture (AMD's gfx target) only with --wide."""
    if gpu.compute_capability:
        return gpu.compute_capability
    return (gpu.architecture or "?") if wide else "-"
