"""`gpuready bench` (run one fixed job on this machine and record what it delivered) and `gpuready compare`
(bench records side by side, the cost of the work, a verdict; `--html` for a page with charts)."""

# No `from __future__ import annotations`: Typer reads these annotations at runtime through with_workload.
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, build_workload, print_json, with_workload

DbOpt = Annotated[
    Path | None,
    typer.Option("--db", help="results database (default: the user's data folder/gpuready/results.db)"),
]


def register(app: typer.Typer) -> None:
    app.command(
        "bench",
        help=(
            "Benchmark this machine on one fixed job for --minutes: time to ready, the doctor's verdict, throughput"
            " and its stability, GPU health (throttling, Xid, ECC), peak memory, disk speed, price."
            " `gpuready bench MODEL (workload flags)`, by default llama-3.2-1b full fine-tune, batch 4, seq 1024,"
            " or `gpuready bench -- python train.py`."
        ),
        context_settings={"allow_interspersed_args": True},
    )(bench_cmd)
    app.command(
        "compare",
        help="Bench records side by side: start-up, environment, stability, throughput, price, cost per unit of work.",
    )(compare_cmd)


def _fmt_rate(value: float | None, unit: str | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} {unit or ''}/s".strip() if value >= 100 else f"{value:,.2f} {unit or ''}/s".strip()


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _is_model(token: str) -> bool:
    from gpuready.cli.trial import _is_model as is_model

    return is_model(token)


@with_workload
def bench_cmd(
    target: Annotated[
        list[str] | None, typer.Argument(help="MODEL, or after `--` the command to run", show_default=False)
    ] = None,
    minutes: Annotated[
        float | None, typer.Option(help="minutes the job runs after its first step (default: 5; a command: to its end)")
    ] = None,
    nproc: Annotated[int | None, typer.Option(help="GPUs for the built-in job (torchrun; DDP when > 1)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random weights and tokens")] = 0,
    ordered_at: Annotated[
        str | None,
        typer.Option("--ordered-at", help="when you ordered the machine (ISO time or epoch): time to ready from it"),
    ] = None,
    price_per_hour: Annotated[
        float | None, typer.Option("--price-per-hour", help="what the GPUs used cost per hour (default: catalog)")
    ] = None,
    prices: Annotated[Path | None, typer.Option(help="CSV gpu,price_per_gpu_hour laid over the catalog's")] = None,
    disk_path: Annotated[Path, typer.Option("--disk-path", help="folder whose disk is tested")] = Path("."),
    disk_size: Annotated[str, typer.Option("--disk-size", help="bytes written by the disk test, at most")] = "1GiB",
    no_disk: Annotated[bool, typer.Option("--no-disk", help="skip the disk test")] = False,
    interval: Annotated[
        float | None, typer.Option(help="seconds per throughput interval (default: max(5, run/30))")
    ] = None,
    label: Annotated[str | None, typer.Option(help="the platform's name in compare (default: host name)")] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds before the job is ended and recorded")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the record (JSON) here")] = None,
    db: DbOpt = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="do not record in the results database")] = False,
    json_out: JsonOpt = False,
    *,
    workload_flags: dict[str, Any],
) -> int:
    from gpuready.bench import run as bench_run
    from gpuready.bench.ready import parse_ordered_at
    from gpuready.errors import InputError
    from gpuready.store import ResultsDB
    from gpuready.units import parse_size

    tokens = list(target or [])
    is_command = len(tokens) > 1 or (len(tokens) == 1 and not _is_model(tokens[0]))
    if price_per_hour is not None and price_per_hour < 0:
        raise InputError("--price-per-hour", "a price ≥ 0")
    if interval is not None and interval <= 0:
        raise InputError("--interval", "seconds > 0")
    if not no_disk and not disk_path.is_dir():
        raise InputError("--disk-path", f"{disk_path}: not a folder (or give --no-disk)")
    when = parse_ordered_at(ordered_at) if ordered_at else None
    size = parse_size(disk_size, "--disk-size")
    price_table = None
    if prices is not None:
        from gpuready.catalog.prices import load_prices

        price_table = load_prices(prices)
    workload = None
    if is_command:
        if any(v is not None for v in workload_flags.values()):
            raise InputError("--batch", "workload flags apply to the built-in job, not to your command")
        if nproc is not None:
            raise InputError("--nproc", "applies to the built-in job; launch your command with torchrun yourself")
    elif tokens or any(v is not None for v in workload_flags.values()):
        flags = {k: v for k, v in workload_flags.items() if v is not None}
        if not tokens and "workload_file" not in flags:
            flags = {**{k: v for k, v in bench_run.DEFAULT_JOB.items() if k != "model"}, **flags}
        workload = build_workload(tokens[0] if tokens else bench_run.DEFAULT_JOB["model"], flags)
    database = None if no_db else ResultsDB(db)
    stream = sys.stderr if json_out else sys.stdout
    progress = _BenchProgress() if sys.stderr.isatty() else None

    def on_line(line: str) -> None:
        if is_command:  # the user's own output; the probe's chatter stays hidden
            stream.write(line + "\n")
            stream.flush()

    try:
        if progress is not None:
            progress.start()
        record = bench_run.bench(
            workload,
            command=tokens if is_command else None,
            minutes=minutes,
            nproc=nproc,
            seed=seed,
            ordered_at=when,
            price_per_hour=price_per_hour,
            prices=price_table,
            disk_path=None if no_disk else disk_path,
            disk_size_bytes=size,
            interval_seconds=interval,
            label=label,
            timeout=timeout,
            db=database,
            on_progress=progress.update if progress is not None else None,
            on_line=on_line,
        )
    finally:
        if progress is not None:
            progress.stop()
        if database is not None:
            database.close()
    if output is not None:
        import json

        try:
            output.write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError("--output", f"{output}: cannot write ({exc.strerror})") from None
    if json_out:
        print_json(record.to_json())
    else:
        _render_record(record, output)
    if record.status == "interrupted":
        return 130
    return 0 if record.ok else 1


class _BenchProgress:
    """The progress bar: a spinner while checking and loading, a bar over --minutes while the job runs."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("bench: checking the machine", total=None)

    def start(self) -> None:
        self.bar.start()

    def stop(self) -> None:
        self.bar.stop()

    def update(self, p: Any) -> None:
        texts = {
            "checking": "bench: checking the machine",
            "loading": "bench: loading the job",
            "disk": "bench: testing the disk",
            "done": "bench: done",
        }
        if p.phase == "running":
            rate = _fmt_rate(p.per_second, p.unit)
            self.bar.update(
                self.task,
                description=f"bench: step {p.steps}, {rate}",
                total=p.total_seconds,
                completed=min(p.elapsed_seconds, p.total_seconds or p.elapsed_seconds),
            )
        else:
            self.bar.update(self.task, description=texts.get(p.phase, p.phase))


def _render_record(record: Any, output: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    r = record
    if r.status == "no_gpu":
        console.print(f"[red]bench: {r.error}[/red]", highlight=False)
        if output is not None:
            console.print(f"record: {output}")
        return
    gpus = r.machine.gpus
    gpu = f"{len(gpus)} x {gpus[0].name}" if gpus else "no GPU"
    table = Table(title=f"bench: {r.machine.label} ({gpu})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    status = r.status if r.ok else f"[red]{r.status}[/red]: {r.error}"
    table.add_row("status", status)
    table.add_row("job", r.job.description)
    ref = {"ordered_at": "ordered", "boot": "boot", "container_start": "container start", "bench_start": "bench start"}
    table.add_row("time to ready", f"{_fmt_seconds(r.ready.seconds)} from {ref[r.ready.reference]}")
    doc = r.doctor
    doc_text = "ready" if doc.ready else (f"[red]not ready[/red]: {doc.cause}" if doc.ready is False else "unknown")
    if doc.warned:
        doc_text += f" ({len(doc.warned)} warnings)"
    table.add_row("doctor", doc_text)
    tp = r.throughput
    if tp.median_per_second is not None:
        table.add_row(
            "throughput",
            f"{_fmt_rate(tp.effective_per_second, tp.unit)} effective, median interval "
            f"{_fmt_rate(tp.median_per_second, tp.unit)}, spread {tp.spread or 0:.1%}",
        )
        table.add_row("stable", f"{_fmt_seconds(tp.stable_seconds)} of {_fmt_seconds(tp.ran_seconds)}")
    h = r.health
    if h.samples:
        throttle = ", ".join(f"{k} {v:.0f} s" for k, v in h.throttle_seconds.items() if k != "idle") or "none"
        table.add_row(
            "GPU",
            f"SM {h.sm_clock_mhz_median or 0:.0f}/{h.max_sm_clock_mhz or 0} MHz, "
            f"{h.power_watts_median or 0:.0f}/{h.power_limit_watts or 0:.0f} W, max {h.temperature_c_max} °C; "
            f"throttle: {throttle}",
        )
        xid = ", ".join(str(e["xid"]) for e in h.xid_events) or ("none" if h.xid_supported else "not readable")
        ecc = (
            "n/a" if h.ecc_uncorrected_new is None else f"{h.ecc_corrected_new} corr., {h.ecc_uncorrected_new} uncorr."
        )
        table.add_row("faults", f"Xid: {xid}; new ECC errors: {ecc}")
    m = r.memory
    if m.peak_device_bytes is not None:
        from gpuready.units import format_bytes

        table.add_row(
            "peak memory",
            f"{format_bytes(m.peak_device_bytes)} device, {format_bytes(m.peak_reserved_bytes)} reserved"
            f" of {format_bytes(m.gpu_total_bytes)}",
        )
    if r.disk is not None:
        from gpuready.units import format_rate

        d = r.disk
        disk_text = (
            f"[red]{d.error}[/red]"
            if d.error
            else f"write {format_rate(d.write_bytes_per_second)}, read {format_rate(d.read_bytes_per_second)},"
            f" {d.random_read_iops or 0:,.0f} 4k reads/s" + ("" if d.direct else " (through the page cache)")
        )
        table.add_row(f"disk {d.path}", disk_text)
    price = f"${r.price.per_hour:.2f}/h" if r.price.per_hour is not None else "unknown"
    table.add_row("price", f"{price} ({r.price.source})")
    console.print(table)
    for e in r.errors[1:]:
        console.print(f"[yellow]note[/yellow]: {e}", highlight=False)
    if r.output_tail:
        console.print("the job's last output lines:")
        for ln in r.output_tail[-10:]:
            console.print(f"  {ln}", markup=False, highlight=False)
    if output is not None:
        console.print(f"record: {output}  (compare records: gpuready compare A.json B.json --html page.html)")


def compare_cmd(
    records: Annotated[list[Path], typer.Argument(help="bench records (JSON from `gpuready bench -o`)")],
    work: Annotated[
        float | None,
        typer.Option(help="the job's work in the records' unit (tokens, images, runs) (default: 1 h on the fastest)"),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(
            help="CSV over the records' prices: label,price_per_hour (per platform) or gpu,price_per_gpu_hour"
            " (as plan --prices, times the GPUs used)"
        ),
    ] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="write a self-contained page with charts")] = None,
    json_out: JsonOpt = False,
) -> int:
    from gpuready.bench.compare import compare, load_records

    loaded = load_records(records)
    by_label, by_gpu = _compare_prices(prices) if prices is not None else (None, None)
    result = compare(loaded, work=work, price_per_hour=by_label, gpu_prices=by_gpu)
    if html_out is not None:
        from gpuready.errors import InputError
        from gpuready.report.compare_html import render_compare

        try:
            html_out.write_text(render_compare(result), encoding="utf-8")
        except OSError as exc:
            raise InputError("--html", f"{html_out}: cannot write ({exc.strerror})") from None
    if json_out:
        print_json(result.to_json())
    else:
        _render_compare(result, html_out)
    return 0 if result.best is not None else 1


def _compare_prices(path: Path) -> tuple[dict[str, float] | None, Any]:
    """(label -> price per hour, None) or (None, a catalog-style table) from --prices."""
    import csv

    from gpuready.errors import InputError

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("--prices", f"{path}: cannot read ({exc.strerror})") from None
    reader = csv.DictReader(text.splitlines())
    fields = set(reader.fieldnames or [])
    from gpuready.catalog.prices import load_prices, price_cell

    if {"gpu", "price_per_gpu_hour"} <= fields:
        return None, load_prices(path)
    if not {"label", "price_per_hour"} <= fields:
        raise InputError("--prices", f"{path}: needs a CSV header with label,price_per_hour or gpu,price_per_gpu_hour")
    out: dict[str, float] = {}
    for n, row in enumerate(reader, start=2):
        out[row["label"].strip()] = price_cell(row, "price_per_hour", str(path), n)
    return out, None


def _render_compare(result: Any, html_out: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = result.rows
    table = Table(title="compare", show_header=True)
    table.add_column("", style="bold")
    for r in rows:
        table.add_column(r.label, overflow="fold")

    def line(name: str, values: list[str]) -> None:
        table.add_row(name, *values)

    line("GPU", [f"{r.gpu_count} x {r.gpu}" if r.gpu else "none" for r in rows])
    line("status", [r.status if r.completed else f"[red]{r.status}[/red]" for r in rows])
    line("start-up", [f"{_fmt_seconds(r.startup_seconds)} ({r.startup_reference})" for r in rows])
    line("environment", [f"{len(r.env_problems)} problems" if r.env_problems else "ok" for r in rows])
    line("stable", [f"{_fmt_seconds(r.stable_seconds)} of {_fmt_seconds(r.ran_seconds)}" for r in rows])
    line("throughput", [_fmt_rate(r.effective_per_second, r.unit) for r in rows])
    line("spread", ["-" if r.spread is None else f"{r.spread:.1%}" for r in rows])
    line("price/h", ["-" if r.price_per_hour is None else f"${r.price_per_hour:.2f}" for r in rows])
    line("reruns p", [f"{r.rerun_probability:.0%}" for r in rows])
    line(
        f"cost/{result.unit_label}",
        ["-" if r.cost_per_unit is None else f"${r.cost_per_unit:.4f}" for r in rows],
    )
    console.print(table)
    if result.work_units:
        console.print(
            f"work W = {result.work_units:,.0f} {result.unit or ''} ({result.work_basis}); {result.formula}",
            highlight=False,
        )
    for w in result.warnings:
        console.print(f"[yellow]warning[/yellow]: {w}", highlight=False)
    console.print(f"verdict: [bold]{result.best or 'none'}[/bold]")
    for reason in result.reasons:
        console.print(f"  - {reason}", highlight=False)
    if html_out is not None:
        console.print(f"page: {html_out}")
