"""`gpuready storage [PATH]` and `storage dupes PATH...`; the progress bars and path display `manifest` and `sync`
share (cli/sync.py)."""

# no `from __future__ import annotations`: with_workload copies this module's annotations as they are, and
# typer does not resolve string annotations of a wrapped function (the --json flag became --json-out).

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from gpuready.cli.common import JsonOpt, build_workload, print_json, with_workload
from gpuready.units import format_bytes, parse_size


class _StorageGroup(TyperGroup):
    """`storage [PATH]` and `storage dupes PATH...` side by side: anything that is not a subcommand name is
    handed to the hidden `show` command (a plain optional argument on the group would swallow `dupes`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["show", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """`storage --help` shows the hidden `show` command's PATH and options (they are what `storage` takes)."""
        show = self.commands.get("show")
        if show is None:
            super().format_help(ctx, formatter)
            return
        sub = ctx.__class__(show, info_name=ctx.info_name, parent=ctx.parent)
        show.format_usage(sub, formatter)
        self.format_help_text(ctx, formatter)
        show.format_options(sub, formatter)
        self.format_commands(ctx, formatter)


def register(app: typer.Typer) -> None:
    storage_app = typer.Typer(
        cls=_StorageGroup,
        help="Mounts, caches and advice (`storage [PATH]`); duplicate files (`storage dupes PATH...`).",
    )
    storage_app.command("show", hidden=True, help="Mounts, caches, project folders and advice.")(storage_cmd)
    storage_app.command("dupes", help="Find duplicate files; remove or hard-link them with a plan.")(dupes_cmd)
    app.add_typer(storage_app, name="storage")


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def make_console() -> Any:
    from rich.console import Console

    return Console()


# stages that count files, not bytes (storage/dupes.py): labelled as files, never as "6/6 bytes"
_FILE_STAGES = ("listing", "hashing small files")


def progress_amount(stage: str, done: int, total: int) -> str:
    """What a progress bar shows after the bar: files for the counting stages, bytes for the others."""
    from rich.filesize import decimal

    if stage in _FILE_STAGES:
        return f"{done:,}/{total:,} files" if total else f"{done:,} files"
    return f"{decimal(done)}/{decimal(total)}" if total else decimal(done)


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A stage-aware progress callback drawing rich bars on stderr; a no-op under --json and when stderr is not a
    terminal (a log or a pipe gets no bars, nor the blank line a finished bar leaves).

    Redrawn from the callback (at most 10 times a second), never from a refresh thread: `storage dupes`
    forks readers only while no other thread runs (storage/dupes.py `_read_small`)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda stage, done, total: None
        return
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    tasks: dict[str, Any] = {}
    drawn = [0.0]
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[amount]}"),
        console=Console(stderr=True),
        transient=True,
        auto_refresh=False,
    ) as bar:

        def update(stage: str, done: int, total: int) -> None:
            amount = progress_amount(stage, done, total)
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None, amount=amount)
            bar.update(tasks[stage], completed=done, total=total or None, amount=amount)
            now = time.monotonic()
            if now - drawn[0] >= 0.1:
                bar.refresh()
                drawn[0] = now

        yield update


# --------------------------------------------------------------------------------------------- storage


@with_workload
def storage_cmd(
    path: Annotated[str | None, typer.Argument(help="the folder the job will write to")] = None,
    model: Annotated[str | None, typer.Option(help="project the job of this model onto the disk")] = None,
    keep_checkpoints: Annotated[int, typer.Option(help="checkpoints kept at once")] = 2,
    dataset_size: Annotated[str | None, typer.Option(help="dataset size on disk, e.g. 200GB")] = None,
    fast: Annotated[bool, typer.Option("--fast", help="do not size caches and project folders")] = False,
    all_mounts: Annotated[bool, typer.Option("--all", help="also list /proc, /sys, /etc bind mounts")] = False,
    json_out: JsonOpt = False,
    *,
    workload_flags: dict[str, Any],
) -> None:
    from gpuready.errors import InputError
    from gpuready.storage import storage_report

    workload = None
    if model or workload_flags.get("workload_file"):
        workload = build_workload(model, dict(workload_flags))
    elif Path("gpuready.toml").is_file():
        # a project file is used when it names a model; without one there is simply nothing to project
        with contextlib.suppress(InputError):
            workload = build_workload(None, dict(workload_flags))
    report = storage_report(
        path,
        workload=workload,
        keep_checkpoints=keep_checkpoints,
        dataset_bytes=parse_size(dataset_size, "--dataset-size") if dataset_size else 0,
        measure=not fast,
        include_internal=all_mounts,
    )
    does_not_fit = report.projection is not None and report.projection["fits"] is False
    if json_out:
        print_json(report.to_json())
    else:
        _print_storage(report)
    if does_not_fit:
        raise typer.Exit(1)


def _print_storage(report: Any) -> None:
    from rich.table import Table

    con = make_console()
    t = Table(title="Mounts" + (f" ({', '.join(report.mounts.platforms)} layout)" if report.mounts.platforms else ""))
    for col in ("mount", "kind", "fs", "source", "size", "free", "holds", "typical on this platform"):
        t.add_column(col, overflow="fold")
    for m in report.mounts.mounts:
        life = ""
        if m.layout:
            life = _life(m.layout)
        t.add_row(
            m.mount_point,
            m.kind,
            m.fstype,
            m.source,
            format_bytes(m.total_bytes),
            format_bytes(m.free_bytes),
            ", ".join(m.holds),
            life,
        )
    con.print(t)
    for s in report.mounts.layout:
        if s.exists and s.mount_point != s.path:
            con.print(f"  {s.platform} {s.path} lives on {s.mount_point}: {_life(s.layout)}")
    ct = Table(title="Caches")
    for col in ("cache", "path", "size", "disk", "system disk?"):
        ct.add_column(col, overflow="fold")
    for c in report.caches:
        if not c.exists:
            continue
        ct.add_row(c.name, c.path, format_bytes(c.size_bytes), c.mount_point or "?", _yn(c.on_system_disk))
    con.print(ct)
    moves = [c for c in report.caches if c.commands and c.exists]
    if moves:
        con.print(f"[bold]To move caches to {report.data_folder}:[/bold]")
        for c in moves:
            con.print(f"  # {c.label}" + (f" ({c.note})" if c.note else ""))
            for cmd in c.commands:
                con.print(f"  {cmd}", markup=False, highlight=False)
    if report.project:
        pt = Table(title="Checkpoints and logs in this project")
        for col in ("folder", "kind", "size", "files", "system disk?"):
            pt.add_column(col, overflow="fold")
        for p in report.project:
            pt.add_row(p.path, p.kind, format_bytes(p.size_bytes), str(p.files), _yn(p.on_system_disk))
        con.print(pt)
    if report.projection:
        pr = report.projection
        items = ", ".join(f"{k} {format_bytes(v)}" for k, v in pr["items"].items() if v)
        con.print(
            f"[bold]Projection[/bold] on {pr['mount_point']}: needs {format_bytes(pr['need_bytes'])} "
            f"({items}); free {format_bytes(pr['free_bytes'])}: {pr['message']}"
        )
        for a in pr["assumptions"]:
            con.print(f"  - {a}")
    for tip in report.advice:
        con.print(f"[yellow]advice:[/yellow] {tip}")


def _yn(value: object) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _life(layout: Any) -> str:
    stop, release = _yn(layout.survives_stop), _yn(layout.survives_release)
    return f"{layout.role}; typically survives stop: {stop}, release: {release}"


# --------------------------------------------------------------------------------------------- dupes


def shown(path: str) -> str:
    """A name as printed: one file is one line, the terminal never receives raw control bytes, and two
    different names never print alike. Escapes, the same whatever else the name holds: a backslash is always
    `\\\\`; a byte that is not UTF-8 (surrogateescape) is `\\xNN`, the byte; a character that is not
    printable is `\\xNN` below 0x80 (where the character and its byte agree), else `\\uNNNN` or
    `\\UNNNNNNNN`, the code point (U+0085 is `\\u0085`, never confused with the byte 0x85)."""
    if path.isprintable() and "\\" not in path:
        return path
    out = []
    for c in path:
        o = ord(c)
        if c == "\\":
            out.append("\\\\")
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8
            out.append(f"\\x{o - 0xDC00:02x}")
        elif c.isprintable():
            out.append(c)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


def write_json_streaming(out: Any, data: dict[str, Any], key: str, items: Iterator[dict[str, Any]]) -> None:
    """`print_json(data)` with the list `data[key]` (None in `data`) written item by item from `items`: the same
    text, without holding the whole document (200k files, 20k groups: 116 MB of peak memory before)."""
    import json

    text = json.dumps(data, indent=2, default=str)
    # at the top level and never inside a string (a quote in a string is escaped)
    head, tail = text.split(f'\n  "{key}": null', 1)
    out.write(f'{head}\n  "{key}": [')
    sep = "\n    "
    chunk: list[str] = []  # written 256 items at a time (one system call each under PYTHONUNBUFFERED=1)
    for item in items:
        chunk.append(sep + json.dumps(item, indent=2, default=str).replace("\n", "\n    "))
        sep = ",\n    "
        if len(chunk) == 256:
            out.write("".join(chunk))
            chunk.clear()
    out.write("".join(chunk) + ("\n  ]" if sep != "\n    " else "]") + tail + "\n")


def dupes_cmd(
    paths: Annotated[list[str], typer.Argument(help="folders or files to scan")],
    min_size: Annotated[str, typer.Option(help="ignore files smaller than this")] = "1",
    remove: Annotated[bool, typer.Option("--remove", help="plan removing every copy but the first")] = False,
    hardlink: Annotated[bool, typer.Option("--hardlink", help="plan replacing copies by hard links")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the plan, change nothing")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="carry out the plan")] = False,
    no_hf_names: Annotated[
        bool, typer.Option("--no-hf-names", hidden=True, help="no effect: every file is read (kept for old scripts)")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    import sys

    from gpuready.errors import InputError
    from gpuready.storage.dedupe import apply_plan, make_plan
    from gpuready.storage.dupes import find_duplicates

    del no_hf_names  # blob names are never trusted any more (issue 9); the flag stays accepted
    if remove and hardlink:
        raise InputError("--remove/--hardlink", "choose one")
    min_bytes = parse_size(min_size, "--min-size")
    with progress_bars(not json_out) as progress:
        report = find_duplicates(paths, min_size=min_bytes, progress=progress)
    plan = make_plan(report, "remove" if remove else "hardlink") if (remove or hardlink) else None
    applied = apply_plan(plan) if plan is not None and yes and not dry_run else None
    if json_out:
        data = report.to_json(groups=False)
        if plan is not None:
            data["plan"] = plan.to_json()
            data["applied"] = applied.to_json() if applied else None
        write_json_streaming(sys.stdout, data, "groups", (g.to_json() for g in report.groups))
        return
    # plain writes: rich's per-line rendering cost ~0.1 ms a line, slower than the scan on 200k files; joined
    # 256 groups at a time: under PYTHONUNBUFFERED=1 (set in many container images) each write is a system call
    out = sys.stdout
    lines: list[str] = []
    for i, g in enumerate(report.groups, 1):
        lines.append(f"{format_bytes(g.size)} x {g.n_inodes} copies ({g.digest[:19]}...)\n")
        lines.extend(f"  {shown(p)}\n" for p in g.paths)
        if i % 256 == 0:
            out.write("".join(lines))
            lines.clear()
    out.write("".join(lines))
    out.write(
        f"{len(report.groups)} group(s), {format_bytes(report.reclaimable_bytes)} reclaimable; scanned "
        f"{report.files_scanned} files ({format_bytes(report.bytes_scanned)}), "
        f"read {format_bytes(report.bytes_read)}\n"
    )
    for label, items in (
        ("unreadable folders skipped", report.unreadable_dirs),
        ("unreadable files", report.unreadable_files),
        ("files changed while hashed (not grouped)", report.changed_files),
    ):
        if items:
            out.write(f"{len(items)} {label}: {', '.join(shown(i) for i in items[:10])}\n")
    if report.symlinks_skipped:
        out.write(f"{report.symlinks_skipped} symlink(s) not followed\n")
    if plan is None:
        return
    removals = sum(1 for s in plan.steps if s.action == "remove")
    links = len(plan.steps) - removals
    what = ", ".join(t for t in (f"remove {removals}" if removals else "", f"hard-link {links}" if links else "") if t)
    out.write(f"Plan: {what or 'nothing to do'} file(s), freeing {format_bytes(plan.reclaimable_bytes)}\n")
    for s in plan.steps:
        out.write(f"  {s.action} {shown(s.path)}\n      keep {shown(s.keep)}\n")
        if s.note and s.action != plan.action:
            out.write(f"      why {s.action}: {s.note}\n")
    if plan.protected:
        out.write(f"Protected, left as they are ({len(plan.protected)}):\n")
        for prot in plan.protected:
            out.write(f"  {shown(prot.path)}: {prot.reason}\n")
    if applied is None:
        out.write("dry run: nothing changed\n" if dry_run else "nothing changed; add --yes to carry out the plan\n")
        return
    out.write(f"done: {len(applied.done)}, freed {format_bytes(applied.freed_bytes)}\n")
    for path, why in applied.skipped:
        out.write(f"skipped {shown(path)}: {why}\n")
