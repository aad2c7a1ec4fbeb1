"""`gpuready trial` (measure a job on this GPU) and `gpuready history` (past trials from the database)."""

# No `from __future__ import annotations`: Typer reads these annotations at runtime through with_workload.
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, build_workload, print_json, with_workload

GIB = 1024**3

DbOpt = Annotated[
    Path | None,
    typer.Option("--db", help="results database [default: the user's data folder/gpuready/results.db]"),
]


def register(app: typer.Typer) -> None:
    app.command(
        "trial",
        help=(
            "Measure a job's real peak memory and speed on this GPU: `gpuready trial MODEL [workload flags]`"
            " with the built-in probe, or `gpuready trial [--sweep-arg --flag=1,2,4] -- python train.py ...`."
        ),
        context_settings={"allow_interspersed_args": True},
    )(trial_cmd)
    app.command("history", help="Past trials from the results database, newest first.")(history_cmd)


def _is_model(token: str) -> bool:
    from gpuready.models import find_preset

    path = Path(token).expanduser()
    if find_preset(token) is not None:
        return True
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        return True
    # a hub id (org/name) that is not a file on disk
    return "/" in token and not path.exists() and not token.startswith((".", "/", "~"))


def _gib(value: Any) -> str:
    return f"{value / GIB:.2f} GiB" if isinstance(value, int | float) else "?"


@with_workload
def trial_cmd(
    target: Annotated[
        list[str] | None, typer.Argument(help="MODEL, or after `--` the command to run", show_default=False)
    ] = None,
    sweep: Annotated[str | None, typer.Option(help="VAR=V1,V2,... one variable, e.g. batch=1,2,4,8")] = None,
    sweep_arg: Annotated[
        str | None, typer.Option("--sweep-arg", help="--flag=V1,V2,... substituted into your command")
    ] = None,
    find_max: Annotated[str | None, typer.Option("--find-max", help="batch or seq: the largest that runs")] = None,
    nproc: Annotated[int | None, typer.Option(help="processes (GPUs) for the probe, launched with torchrun")] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds before a point is ended and recorded")] = None,
    chart: Annotated[Path | None, typer.Option(help="write a chart: .png (matplotlib) or .svg")] = None,
    db: DbOpt = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="do not record in the results database")] = False,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="emulate a smaller card, e.g. 24GiB: PyTorch's allocator is capped at it, less the CUDA context"
        ),
    ] = None,
    json_out: JsonOpt = False,
    *,
    workload_flags: dict[str, Any],
) -> int:
    from gpuready.errors import InputError
    from gpuready.store import ResultsDB
    from gpuready.trial import api
    from gpuready.trial.sweep import parse_sweep, parse_sweep_arg

    tokens = list(target or [])
    is_command = bool(sweep_arg) or len(tokens) > 1 or (len(tokens) == 1 and not _is_model(tokens[0]))
    database = None if no_db else ResultsDB(db)
    stream = sys.stderr if json_out else sys.stdout
    predict = None
    progress, task = _progress(json_out)
    done = 0

    def on_point(point: Any) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            shown = ", ".join(f"{k}={v}" for k, v in point.values.items())
            progress.update(task, advance=1, description=f"{shown}: {point.status} {_gib(point.peak_device_bytes)}")

    def on_line(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    try:
        if progress is not None:
            progress.start()
        if is_command:
            if sweep or find_max:
                raise InputError("--sweep", "with your own command use --sweep-arg --flag=V1,V2,...")
            if any(v is not None for v in workload_flags.values()):
                raise InputError("--batch", "workload flags apply to the built-in probe; use --sweep-arg for a command")
            parsed_arg = parse_sweep_arg(sweep_arg) if sweep_arg else None
            if progress is not None:
                progress.update(task, total=len(parsed_arg[1]) if parsed_arg else 1)
            result = api.trial_command(
                tokens, sweep_arg=parsed_arg, timeout=timeout, db=database, on_point=on_point, on_line=on_line
            )
        else:
            if not tokens:
                raise InputError("MODEL", "name a model (see `gpuready models`) or give a command after `--`")
            workload = build_workload(tokens[0], workload_flags)
            parsed = parse_sweep(sweep) if sweep else None
            if progress is not None:
                progress.update(task, total=len(parsed[1]) if parsed else (None if find_max else 1))
            var = find_max or (parsed[0] if parsed else "batch")
            predict = api.estimator_predictor(workload, var)
            from gpuready.units import parse_size

            result = api.trial_probe(
                workload,
                sweep=parsed,
                find_max=find_max,
                nproc=nproc,
                timeout=timeout,
                emulate_gpu_bytes=parse_size(gpu_memory, "--gpu-memory") if gpu_memory else None,
                db=database,
                predictor=predict,
                on_point=on_point,
            )
    finally:
        if progress is not None:
            progress.stop()
        if database is not None:
            database.close()
    if chart is not None and result.variable:
        from gpuready.trial.chart import write_chart

        written = write_chart(result, chart, predict)
        result = type(result)(**{**result.__dict__, "chart_path": str(written)})
    if json_out:
        print_json(result.to_json())
    else:
        _render(result, predict)
    if result.interrupted:
        return 130
    if result.max_variable is not None:
        return 0 if (result.max or 0) > 0 else 1
    return 0 if result.points and all(p.ok or p.status == "skipped" for p in result.points) else 1


def _progress(json_out: bool) -> tuple[Any, Any]:
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    return progress, progress.add_task("trial", total=None)


def _render(result: Any, predict: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpuready.trial.chart import text_chart

    console = Console()
    table = Table(title=f"trial: {result.target}")
    for col in ("values", "status", "peak allocated", "peak reserved", "peak device", "step s", "throughput"):
        table.add_column(col, justify="left" if col in ("values", "status") else "right")
    for p in result.points:
        table.add_row(
            ", ".join(f"{k}={v}" for k, v in p.values.items()) or "-",
            p.status if p.ok else f"[red]{p.status}[/red]",
            _gib(p.peak_allocated_bytes),
            _gib(p.peak_reserved_bytes),
            _gib(p.peak_device_bytes),
            f"{p.step_seconds:.3f}" if p.step_seconds else "-",
            f"{p.throughput:,.0f} {p.throughput_unit or ''}" if p.throughput else "-",
        )
    console.print(table)
    errors = [p for p in result.points if not p.ok and p.error and p.status != "skipped"]
    for p in errors[:3]:
        console.print(f"[red]{p.status}[/red] at {p.values}: {p.error}", markup=True, highlight=False)
    if len(result.points) > 1:
        for line in text_chart(result, predict):
            console.print(line, markup=False, highlight=False)
    if result.fit is not None:
        f = result.fit
        console.print(f"fit: {_gib(f.fixed_bytes)} fixed + {_gib(f.per_unit_bytes)} per {f.variable}")
    for c in result.calibration:
        console.print(f"measured vs estimator at {c['values']}: {c['error_fraction']:+.1%}")
    if result.max_variable is not None:
        console.print(
            f"largest {result.max_variable} that runs: {result.max}"
            + (f" (estimator predicted {result.predicted_max})" if result.predicted_max else "")
        )
    if result.chart_path:
        console.print(f"chart: {result.chart_path}")
    if result.interrupted:
        console.print("interrupted: the finished points above are kept")


def history_cmd(
    model: Annotated[str | None, typer.Option("--model", help="model or command contains this text")] = None,
    kind: Annotated[str | None, typer.Option(help="probe or command")] = None,
    status: Annotated[str | None, typer.Option(help="ok, done, interrupted")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name contains this text")] = None,
    limit: Annotated[int, typer.Option(help="newest N runs", min=1)] = 20,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> int:
    from gpuready.store import ResultsDB

    with ResultsDB(db) as database:
        runs = database.runs(target=model, kind=kind, status=status, gpu=gpu, limit=limit)
    if json_out:
        print_json({"db": str(database.path), "runs": [r.to_json() for r in runs]})
        return 0
    import datetime as dt

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trial history ({database.path})")
    for col in ("id", "when", "kind", "target", "gpu", "variable", "points", "max", "largest peak", "status"):
        table.add_column(col, overflow="fold")
    for r in runs:
        peaks = [int(p["peak_device_bytes"]) for p in r.points if p.get("ok") and p.get("peak_device_bytes")]
        when = dt.datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M")
        ok = sum(1 for p in r.points if p.get("ok"))
        table.add_row(
            str(r.id),
            when,
            r.kind,
            r.target if len(r.target) <= 40 else r.target[:39] + "…",
            r.gpu or "?",
            r.variable or "-",
            f"{ok}/{len(r.points)} ok",
            "-" if r.max_value is None else str(r.max_value),
            _gib(max(peaks)) if peaks else "-",
            r.status,
        )
    Console().print(table)
    return 0
