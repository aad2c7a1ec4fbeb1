"""`gpuready models` and `gpuready gpus`: the built-in presets and the GPU catalog."""

from __future__ import annotations

from typing import Any

import typer

from gpuready.cli.common import JsonOpt, print_json


def register(app: typer.Typer) -> None:
    app.command("models", help="List the built-in model presets with parameter counts and sources.")(models_cmd)
    app.command("gpus", help="List the GPU catalog (memory, bandwidth, bf16 TFLOP/s, source).")(gpus_cmd)


def models_cmd(json_out: JsonOpt = False) -> None:
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
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Built-in models (any hub id of the same name resolves to the preset)")
    for col in ("name", "hub id", "type", "params", "source"):
        table.add_column(col, justify="right" if col == "params" else "left", overflow="fold")
    for r in rows:
        params = r["params"]
        shown = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"
        table.add_row(r["name"], r["hub_id"], r["type"], shown, r["source"])
    Console().print(table)


def gpus_cmd(json_out: JsonOpt = False) -> None:
    from dataclasses import asdict

    from gpuready.catalog import load_gpus

    gpus = load_gpus()
    if json_out:
        print_json({"gpus": [asdict(g) | {"usable_bytes": g.usable_bytes} for g in gpus]})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GPU catalog")
    for col in ("name", "memory", "bandwidth", "bf16 dense", "cc", "source"):
        table.add_column(col, overflow="fold")
    for g in gpus:
        table.add_row(
            g.name,
            f"{g.memory_gb:g} GB",
            f"{g.mem_bw_gbs:g} GB/s" if g.mem_bw_gbs else "?",
            f"{g.bf16_dense_tflops:g} TFLOP/s"
            if g.bf16_dense_tflops
            else (f"none (fp16 {g.fp16_dense_tflops:g})" if g.fp16_dense_tflops else "?"),
            g.compute_capability or "?",
            g.source_url,
        )
    Console().print(table)
