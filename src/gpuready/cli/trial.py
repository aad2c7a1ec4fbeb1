"""`gpuready trial` (measure a job on this GPU) and `gpuready history` (past trials from the database)."""

# No `from __future__ import annotations`: Typer reads these annotations at runtime through with_workload.
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuready.cli.common import (
    JsonOpt,
    build_job,
    check_input_file,
    check_output_file,
    print_json,
    with_workload,
)
from gpuready.units import format_gib

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
    return format_gib(value) if isinstance(value, int | float) else "?"


@with_workload
def trial_cmd(
    target: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL|COMMAND", help="a model, or after `--` the command to run", show_default=False),
    ] = None,
    sweep: Annotated[str | None, typer.Option(help="VAR=V1,V2,... one variable, e.g. batch=1,2,4,8")] = None,
    sweep_arg: Annotated[
        str | None, typer.Option("--sweep-arg", help="--flag=V1,V2,... substituted into your command")
    ] = None,
    find_max: Annotated[str | None, typer.Option("--find-max", help="batch or seq: the largest that runs")] = None,
    nproc: Annotated[int | None, typer.Option(help="processes (GPUs) for the probe, launched with torchrun")] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds before a point is ended and recorded")] = None,
    chart: Annotated[
        Path | None, typer.Option(help="write a chart: .png (needs gpuready[chart]) or .svg; the folder must exist")
    ] = None,
    db: DbOpt = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="do not record in the results database")] = False,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="emulate a smaller card, e.g. 24GiB, 80GB or L4: PyTorch's allocator is capped at it, less the "
            "CUDA context"
        ),
    ] = None,
    json_out: JsonOpt = False,
    *,
    workload_flags: dict[str, Any],
) -> int:
    from gpuready.errors import GpureadyError, InputError
    from gpuready.store import ResultsDB
    from gpuready.trial import api
    from gpuready.trial.preflight import missing_for_trial
    from gpuready.trial.sweep import parse_sweep, parse_sweep_arg

    tokens = list(target or [])
    is_command = bool(sweep_arg) or len(tokens) > 1 or (len(tokens) == 1 and not _is_model(tokens[0]))
    if chart is not None:
        if chart.suffix.lower() not in (".png", ".svg"):
            raise InputError("--chart", f"{chart}: allowed: a .png or .svg file name")
        chart = check_output_file(chart, "--chart")
    if db is not None and not no_db:
        db = check_output_file(db, "--db")
    # everything the user typed is checked before the machine is asked whether it can run a trial
    emulate = None
    workload = None
    parsed = None
    parsed_arg = None
    if is_command:
        if sweep or find_max:
            raise InputError("--sweep" if sweep else "--find-max", "with your own command use --sweep-arg --flag=V1,V2")
        given = [name for name, value in workload_flags.items() if value is not None]
        if given:
            flag = "--" + given[0].replace("_", "-") if given[0] != "workload_file" else "--workload"
            raise InputError(flag, "workload flags apply to the built-in probe; use --sweep-arg for a command")
        if gpu_memory:
            raise InputError("--gpu-memory", "applies to the built-in probe; your command sets its own limits")
        parsed_arg = parse_sweep_arg(sweep_arg) if sweep_arg else None
    else:
        if not tokens:
            raise InputError("MODEL", "name a model (see `gpuready models`) or give a command after `--`")
        job = build_job(tokens[0], workload_flags)
        workload = job.workload
        if workload.as_family:
            raise InputError("--as-family", "sizes the estimate; the trial runs the model's own code")
        parsed = parse_sweep(sweep) if sweep else None
        if gpu_memory:
            from gpuready.catalog.cards import parse_gpu_memory

            emulate = parse_gpu_memory(gpu_memory, "--gpu-memory").bytes
    missing = missing_for_trial("command", nproc=None) if is_command else missing_for_trial("probe", nproc=nproc)
    if missing:
        raise GpureadyError(f"trial: this machine cannot run it: {'; '.join(missing)}; nothing was run")
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
            if progress is not None:
                progress.update(task, total=len(parsed_arg[1]) if parsed_arg else 1)
            result = api.trial_command(
                tokens, sweep_arg=parsed_arg, timeout=timeout, db=database, on_point=on_point, on_line=on_line
            )
        else:
            assert workload is not None
            if progress is not None:
                progress.update(task, total=len(parsed[1]) if parsed else (None if find_max else 1))
            var = find_max or (parsed[0] if parsed else "batch")
            predict = api.estimator_predictor(workload, var)
            result = api.trial_probe(
                workload,
                sweep=parsed,
                find_max=find_max,
                nproc=nproc,
                timeout=timeout,
                emulate_gpu_bytes=emulate,
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

        try:
            written = write_chart(result, chart, predict)
        except OSError as exc:  # the folder was checked before the trial; it can still vanish or fill up
            why = exc.strerror or str(exc)
            raise GpureadyError(f"--chart: could not write {chart} ({why}); the runs are recorded") from None
        if written.suffix != chart.suffix:
            sys.stderr.write(f"gpuready: warning: --chart: matplotlib is not installed; wrote {written} instead\n")
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


def first_call_line(points: list[Any]) -> str | None:
    """For a generation trial (the probe times the request by its second generate() call): what the first call
    took, which on Hopper and Blackwell builds cuDNN's attention plans, one per new length (docs/steptime.md)."""
    for p in points:
        times = p.detail.get("step_times") or []
        if p.ok and p.detail.get("generate_calls") == 2 and len(times) == 2 and times[1] > 0:
            first, warm = times
            return (
                f"first generate() call: {first:.3f} s, {first / warm:.1f}x the timed (warm) call; a request longer "
                "than any before it pays this once per new length (cuDNN's attention plans on Hopper and Blackwell)"
            )
    return None


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
    cold = first_call_line(result.points)
    if cold:
        console.print(cold, markup=False, highlight=False)
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


RUN_KINDS = ("probe", "command")
RUN_STATUSES = ("ok", "partial", "failed", "interrupted", "running", "done")
FINISHED = ("ok", "partial", "failed")  # `--status done` (gpuready 0.1's word): finished, whatever the outcome


def history_cmd(
    model: Annotated[str | None, typer.Option("--model", help="model or command contains this text")] = None,
    kind: Annotated[str | None, typer.Option(help="probe or command")] = None,
    status: Annotated[
        str | None, typer.Option(help="ok, partial, failed, interrupted, running; done = ok, partial or failed")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name contains this text")] = None,
    limit: Annotated[int, typer.Option(help="newest N runs", min=1)] = 20,
    db: DbOpt = None,
    wide: Annotated[bool, typer.Option("--wide", help="all columns, however wide the terminal")] = False,
    json_out: JsonOpt = False,
) -> int:
    from gpuready.errors import InputError
    from gpuready.store import ResultsDB

    if kind is not None and kind.lower() not in RUN_KINDS:
        raise InputError("--kind", f"got {kind!r}; allowed: {', '.join(RUN_KINDS)}")
    if status is not None and status.lower() not in RUN_STATUSES:
        raise InputError("--status", f"got {status!r}; allowed: {', '.join(RUN_STATUSES)}")
    if db is not None:
        db = check_input_file(db, "--db")
    with ResultsDB(db) as database:
        runs = database.runs(target=model, kind=kind, gpu=gpu, limit=None)
    if status is not None:
        wanted = FINISHED if status.lower() == "done" else (status.lower(),)
        runs = [r for r in runs if r.outcome in wanted]
    runs = runs[:limit]
    if json_out:
        print_json({"db": str(database.path), "runs": [r.to_json() for r in runs]})
        return 0
    import datetime as dt

    from rich.console import Console
    from rich.table import Table

    console = Console()
    narrow = console.width < 100 and not wide
    from rich import box

    table = Table(
        title="trial history",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    cols = ["id", "when", "kind", "target", "gpu", "variable", "points", "max", "largest peak", "status"]
    if narrow:  # kind, GPU and the swept variable go (--wide and --json have them); max where no run has one
        drop = {"gpu", "variable", "kind"} | ({"max"} if all(r.max_value is None for r in runs) else set())
        cols = [c for c in cols if c not in drop]
    longest = max((min(len(r.target), 40) for r in runs), default=6)
    for col in cols:
        if col == "target":  # a model name stays whole; a long command wraps at its spaces
            table.add_column(col, min_width=min(longest, 32))
        else:
            table.add_column(col, no_wrap=True)
    styles = {"ok": "green", "partial": "yellow", "failed": "red", "interrupted": "yellow"}
    for r in runs:
        peaks = [int(p["peak_device_bytes"]) for p in r.points if p.get("ok") and p.get("peak_device_bytes")]
        when = dt.datetime.fromtimestamp(r.started_at).strftime("%m-%d %H:%M" if narrow else "%Y-%m-%d %H:%M")
        ok = sum(1 for p in r.points if p.get("ok"))
        outcome = r.outcome
        cells = {
            "id": str(r.id),
            "when": when,
            "kind": r.kind,
            "target": r.target if len(r.target) <= 40 else r.target[:39] + "…",
            "gpu": r.gpu or "?",
            "variable": r.variable or "-",
            "points": f"{ok}/{len(r.points)} ok",
            "max": "-" if r.max_value is None else str(r.max_value),
            "largest peak": _gib(max(peaks)) if peaks else "-",
            "status": f"[{styles[outcome]}]{outcome}[/]" if outcome in styles else outcome,
        }
        table.add_row(*(cells[c] for c in cols))
    console.print(f"results database: {database.path}", highlight=False, soft_wrap=True)
    console.print(table)
    if not runs:
        console.print("no runs" + (" match these filters" if any((model, kind, status, gpu)) else " yet"))
    return 0
