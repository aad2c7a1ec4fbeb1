"""What every command shares: workload flags, JSON output, the console."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from gpuready.catalog.cards import GpuMemory
    from gpuready.workload import Workload
    from gpuready.workload.formats import WorkloadFile
    from gpuready.workload.validate import CheckedWorkload


F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_WORKLOAD_FILE = "gpuready.toml"

# (name, annotation) of each workload flag. None defaults let a file value stand unless a flag is given.
_WORKLOAD_PARAMS: list[tuple[str, Any]] = [
    ("task", Annotated[str | None, typer.Option(help="train or infer [default: train]")]),
    ("method", Annotated[str | None, typer.Option(help="full, lora or qlora [default: full]")]),
    ("batch", Annotated[int | None, typer.Option(help="micro-batch per GPU [default: 1]")]),
    (
        "seq",
        Annotated[int | None, typer.Option(help="tokens per sequence (prompt for infer) [default: 2048]")],
    ),
    ("new_tokens", Annotated[int | None, typer.Option(help="tokens generated per sequence [default: 0]")]),
    (
        "decoding",
        Annotated[
            str | None,
            typer.Option(help="generation: greedy, or sample (temperature, top-k, top-p) [default: greedy]"),
        ],
    ),
    ("image_size", Annotated[int | None, typer.Option(help="pixels per side, vision [default: 224]")]),
    ("precision", Annotated[str | None, typer.Option(help="bf16, fp16, fp32 or mixed [default: bf16]")]),
    (
        "autocast",
        Annotated[
            bool | None,
            typer.Option(
                "--autocast/--no-autocast",
                help="forward under torch.autocast over 16-bit weights (the HF Trainer's bf16/fp16 switch)",
            ),
        ],
    ),
    (
        "kbit_prep",
        Annotated[
            bool | None,
            typer.Option(
                "--kbit-prep/--no-kbit-prep",
                help="QLoRA: peft's prepare_model_for_kbit_training before the adapters (fp32 embeddings, norms, head)",
            ),
        ],
    ),
    ("optim", Annotated[str | None, typer.Option(help="adamw, adamw8bit, sgd, adafactor [default: adamw]")]),
    (
        "grad_ckpt",
        Annotated[bool | None, typer.Option("--grad-ckpt/--no-grad-ckpt", help="activation checkpointing")],
    ),
    ("grad_accum", Annotated[int | None, typer.Option(help="gradient accumulation steps [default: 1]")]),
    ("lora_r", Annotated[int | None, typer.Option(help="LoRA rank [default: 16]")]),
    ("lora_targets", Annotated[str | None, typer.Option(help="LoRA modules, comma-separated")]),
    (
        "lora_dtype",
        Annotated[
            str | None, typer.Option(help="LoRA adapters' dtype: fp32 (peft's) or bf16 (TRL's QLoRA) [default: fp32]")
        ],
    ),
    ("attn", Annotated[str | None, typer.Option(help="sdpa, eager or flash [default: sdpa]")]),
    ("gpus", Annotated[int | None, typer.Option(help="GPUs [default: 1]")]),
    (
        "shard",
        Annotated[str | None, typer.Option(help="none, ddp, fsdp, zero1, zero2, zero3 [default: none]")],
    ),
    (
        "as_family",
        Annotated[
            str | None,
            typer.Option(help="size the model as this model_type: llama, qwen2, gemma2, ... (unmodelled configs)"),
        ],
    ),
    (
        "workload_file",
        Annotated[
            Path | None,
            typer.Option(
                "--workload",
                help="workload file: gpuready TOML, axolotl / LLaMA-Factory / torchtune YAML, TRL or "
                "TrainingArguments JSON (format detected from the content)",
            ),
        ],
    ),
]
_NAMES = [name for name, _ in _WORKLOAD_PARAMS]


def build_workload(model: str | None, flags: dict[str, Any]) -> Workload:
    """Merge the workload file (explicit, else ./gpuready.toml) with flags; flags win."""
    return build_workload_and_source(model, flags)[0]


def build_workload_and_source(model: str | None, flags: dict[str, Any]) -> tuple[Workload, WorkloadFile | None]:
    """The workload and, where a file was read, what it said (its format, the keys used and those ignored)."""
    from gpuready.errors import InputError
    from gpuready.workload import make_workload

    file_arg = flags.pop("workload_file", None)
    fields: dict[str, Any] = {}
    source = None
    path = Path(file_arg) if file_arg else Path(DEFAULT_WORKLOAD_FILE)
    if file_arg or path.is_file():
        from gpuready.workload.formats import read_workload_file  # only when a file is read

        source = read_workload_file(path)
        fields.update(source.fields)
    from_file = set(fields)
    given = {k: v for k, v in flags.items() if v is not None}
    fields.update(given)
    if model:
        fields["model"] = model
        given["model"] = model
    if source is not None:
        for name, why in source.problems.items():
            if name in given:  # a flag says what the file could not
                continue
            if name == "gpus" and fields.get("shard", "none") == "none":
                continue
            raise InputError("--workload", f"{source.path}: {why}")
    if "model" not in fields:
        if source is not None and source.format != "gpuready":
            why = f"the {source.label} file names no model; give MODEL (a preset, hub id or config)"
            raise InputError("MODEL", why)
        raise InputError("MODEL", "no model given; name a preset (see `gpuready models`), a config.json or folder")
    try:
        return make_workload(**fields), source
    except InputError as exc:
        key = exc.field.removeprefix("--").replace("-", "_")
        if key in from_file and key not in given:  # the value came from the workload file: name it there
            raise InputError("--workload", f"{path}: {key}: {exc.message}") from None
        raise


def render_workload_file(source: WorkloadFile, console: Any) -> None:
    """What a tool's config file said and what gpuready did with each key, for a person (80 columns)."""
    from rich.markup import escape
    from rich.table import Table

    from gpuready.workload.formats import EMPTY, NO_EFFECT, NOT_READ

    title = f"workload file {escape(source.path)} ({source.label}, detected)"
    if source.format == "gpuready":
        console.print(f"[bold]{title}[/bold]")
        return
    table = Table(title=title, title_justify="left", title_style="bold")
    table.add_column("key in the file", no_wrap=True)
    table.add_column("value", overflow="fold", max_width=24)
    table.add_column("gpuready", overflow="fold")
    for m in source.mapped:
        value = "" if m.value is None else json.dumps(m.value) if not isinstance(m.value, str) else m.value
        to = m.to if isinstance(m.to, str) else json.dumps(m.to)
        table.add_row(escape(m.key), escape(value), escape(f"{m.field} = {to}" if m.field else to))
    console.print(table)
    for line in source.notes:
        console.print(f"  [dim]assumed: {escape(line)}[/dim]")
    for item in source.warnings:
        console.print(f"  [yellow]not modelled[/yellow]: {escape(item.key)} ({escape(item.detail)})")
    for reason, label in ((NO_EFFECT, "ignored, no effect on memory"), (NOT_READ, "ignored, not read by gpuready")):
        keys = [i.key for i in source.ignored if i.reason == reason]
        if keys:
            console.print(f"  [dim]{label} ({len(keys)}): {escape(', '.join(keys))}[/dim]")
    empty = [i.key for i in source.ignored if i.reason == EMPTY]
    if empty:
        console.print(f"  [dim]empty, so unset ({len(empty)} keys; named in --json)[/dim]")


def build_job(model: str | None, flags: dict[str, Any]) -> CheckedWorkload:
    """build_workload, then read against its model (LoRA targets, positions, unmodelled types); warnings go to
    stderr here, once, and the assumption lines travel with the result."""
    from dataclasses import replace

    from gpuready.workload.validate import check_workload

    workload, source = build_workload_and_source(model, flags)
    job = replace(check_workload(workload), source=source)
    warn(job.warnings)
    return job


def warn(lines: list[str]) -> None:
    for line in lines:
        sys.stderr.write(f"gpuready: warning: {' '.join(line.split())}\n")


def with_workload(func: F) -> F:
    """Add the docs/cli.md workload flags to a command; it receives `workload_flags: dict` instead."""
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)  # string annotations -> objects Typer can read
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
        if p.name != "workload_flags"
    ]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
        for name, ann in _WORKLOAD_PARAMS
    ]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {name: kwargs.pop(name, None) for name in _NAMES}
        return func(*args, workload_flags=flags, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p for p in own]
    wrapper.__signature__ = sig.replace(parameters=params + extra)  # type: ignore[attr-defined]
    annotations = {k: v for k, v in hints.items() if k != "workload_flags"}
    annotations.update(dict(_WORKLOAD_PARAMS))
    wrapper.__annotations__ = annotations
    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    """One JSON document on stdout, nothing else there (docs/cli.md)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON document on stdout")]


def gpu_capacity(gpu: str | None, gpu_memory: str | None) -> GpuMemory | None:
    """`--gpu NAME` or `--gpu-memory SIZE` (never both) as bytes and what they were read as; None for neither."""
    from gpuready.catalog.cards import GpuMemory, parse_gpu_memory
    from gpuready.errors import InputError

    if gpu and gpu_memory:
        raise InputError("--gpu", "give either --gpu or --gpu-memory, not both")
    if gpu:
        from gpuready.catalog import find_gpu

        card = find_gpu(gpu)
        return GpuMemory(card.usable_bytes, card.name, card)
    if gpu_memory:
        return parse_gpu_memory(gpu_memory, "--gpu-memory")
    return None


def check_output_file(path: Path, flag: str) -> Path:
    """Refuse, before any work, a file that cannot be written: a folder, a missing or read-only parent folder."""
    import os

    from gpuready.errors import InputError

    target = path.expanduser()
    if target.is_dir():
        raise InputError(flag, f"{path} is a folder; give a file name inside it")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.exists():
        raise InputError(flag, f"{path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise InputError(flag, f"{path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(flag, f"{path}: no permission to write in {parent}")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(flag, f"{path}: the file is read-only")
    return target


def check_input_file(path: Path, flag: str) -> Path:
    """Refuse, before any work, a file that cannot be read: missing, a folder, unreadable."""
    import os

    from gpuready.errors import InputError

    target = path.expanduser()
    if not target.exists():
        raise InputError(flag, f"{path}: no such file")
    if target.is_dir():
        raise InputError(flag, f"{path} is a folder; give a file")
    if not os.access(target, os.R_OK):
        raise InputError(flag, f"{path}: no permission to read it")
    return target


def write_text_file(path: Path, text: str, flag: str) -> None:
    """Write a result file; a failure after the checks above (full disk, a race) is one line, exit 1."""
    from gpuready.errors import GpureadyError

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GpureadyError(f"{flag}: could not write {path} ({exc.strerror or exc})") from None


@contextlib.contextmanager
def spinner(label: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while a long step runs; nothing when stderr is not a terminal
    (pipes, --json captured by scripts, tests)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        progress.add_task(label, total=None)
        yield
