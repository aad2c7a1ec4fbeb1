"""`gpuready manifest create|verify` and `gpuready sync SRC DEST`."""

# no `from __future__ import annotations`: typer reads these functions' annotations as they are (cli/storage.py).

import os
from typing import Annotated, Any

import typer

from gpuready.cli.common import JsonOpt, print_json
from gpuready.cli.storage import escape, make_console, progress_bars, shown
from gpuready.units import format_bytes


def register(app: typer.Typer) -> None:
    manifest_app = typer.Typer(no_args_is_help=True, help="Checksum manifests that b3sum -c / sha256sum -c accept.")
    manifest_app.command("create", help="Hash every file under DIR into FILE (+ FILE.json).")(manifest_create_cmd)
    manifest_app.command("verify", help="Name every changed, missing and extra file; exit 1 on any.")(
        manifest_verify_cmd
    )
    app.add_typer(manifest_app, name="manifest")
    app.command("sync", help="Copy SRC to DEST with rsync (rclone for remotes), then verify DEST.")(sync_cmd)


# --------------------------------------------------------------------------------------------- manifest


def manifest_create_cmd(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="folder to hash")],
    output: Annotated[str, typer.Option("-o", "--output", help="manifest file (e.g. manifest.b3)")],
    algo: Annotated[str | None, typer.Option(help="blake3 or sha256 [default: by extension, else blake3]")] = None,
    json_out: JsonOpt = False,
) -> None:
    from gpuready.storage import create_manifest

    with progress_bars(not json_out) as progress:
        res = create_manifest(directory, output, algorithm=algo, progress=lambda d, t: progress("hashing", d, t))
    if json_out:
        print_json(res.to_json())
    else:
        con = make_console()
        con.print(
            f"{res.manifest}: {res.files} files, {format_bytes(res.total_bytes)} ({res.algorithm}), "
            f"{res.seconds:.1f} s; counts in {res.meta}"
        )
        for label, items in (
            ("changed while read (left out)", res.changed_files),
            ("unreadable files (left out)", res.unreadable_files),
            ("unreadable folders (skipped)", res.unreadable_dirs),
        ):
            for p in items:
                con.print(f"[red]{label}:[/red] {escape(shown(p))}", highlight=False)
        if res.symlinks_skipped:
            con.print(f"{res.symlinks_skipped} symlink(s) leaving the tree not followed")
    if not res.complete:
        raise typer.Exit(1)


def manifest_verify_cmd(
    file: Annotated[str, typer.Argument(metavar="FILE", help="manifest written by `manifest create`")],
    directory: Annotated[
        str | None, typer.Argument(metavar="[DIR]", help="folder to check [default: the manifest's folder]")
    ] = None,
    root: Annotated[str | None, typer.Option(help="same as DIR")] = None,
    algo: Annotated[str | None, typer.Option(help="blake3 or sha256 [default: recorded, else by extension]")] = None,
    json_out: JsonOpt = False,
) -> None:
    from gpuready.errors import InputError
    from gpuready.storage import verify_manifest

    if directory is not None and root is not None and directory != root:
        raise InputError("--root", "give the folder once, as DIR or as --root")
    with progress_bars(not json_out) as progress:
        res = verify_manifest(
            file, directory or root, algorithm=algo, progress=lambda d, t: progress("verifying", d, t)
        )
    if json_out:
        print_json(res.to_json())
    else:
        _print_verify(res)
    if not res.ok:
        raise typer.Exit(1)


def _print_verify(res: Any) -> None:
    con = make_console()
    for label, items in (
        ("changed", res.changed),
        ("missing", res.missing),
        ("extra", res.extra),
        ("unreadable", res.unreadable),
        ("changed while read", res.changed_during_read),
    ):
        if label == "extra" and not res.extra_fails:
            for p in items:
                con.print(f"[yellow]in DEST only (kept):[/yellow] {escape(shown(p))}", highlight=False)
            continue
        for p in items:
            con.print(f"[red]{label}:[/red] {escape(shown(p))}", highlight=False)
    if res.malformed_lines:
        con.print(f"[red]{res.malformed_lines} malformed line(s) in the manifest[/red]")
    if res.incomplete_manifest:
        con.print("[red]the manifest has fewer lines than its .json says: it was cut short[/red]")
    status = "OK" if res.ok else "FAILED"
    con.print(
        f"{status}: {res.checked}/{res.expected_files} files checked under {escape(shown(res.root))} "
        f"({res.seconds:.1f} s)",
        highlight=False,
    )
    if res.recorded_root and os.path.realpath(res.recorded_root) != os.path.realpath(res.root):
        con.print(
            f"(made under {escape(shown(res.recorded_root))}; checked here. To check that folder: gpuready "
            f"manifest verify {escape(shown(res.manifest))} {escape(shown(res.recorded_root))})",
            highlight=False,
        )


# --------------------------------------------------------------------------------------------- sync


def sync_cmd(
    src: Annotated[str, typer.Argument(metavar="SRC", help="folder to copy")],
    dest: Annotated[str, typer.Argument(metavar="DEST", help="folder, host:path, or rclone remote:path")],
    checksum: Annotated[bool, typer.Option("--checksum", help="rsync compares content, not size+time")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show what would be copied")] = False,
    delete: Annotated[
        bool, typer.Option("--delete", help="also delete files in DEST that SRC lacks (lists them; needs --yes)")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="carry out --delete")] = False,
    bwlimit: Annotated[str, typer.Option(help="limit the copy rate, e.g. 20M (bytes/s; rsync --bwlimit)")] = "",
    timeout: Annotated[float, typer.Option(help="seconds before the copy is stopped")] = 24 * 3600,
    json_out: JsonOpt = False,
) -> None:
    from gpuready.storage import SubprocessRunner, sync

    with progress_bars(not json_out) as progress:
        res = sync(
            src,
            dest,
            runner=SubprocessRunner(),
            timeout=timeout,
            checksum=checksum,
            dry_run=dry_run,
            delete=delete,
            yes=yes,
            bwlimit=bwlimit,
            copy_progress=lambda d, t: progress("copying", d, t),
            verify_progress=lambda d, t: progress("verifying", d, t),
        )
    if json_out:
        print_json(res.to_json())
    else:
        con = make_console()
        if res.verify is not None:
            _print_verify(res.verify)
        for p in res.differences:
            con.print(f"[red]differs:[/red] {escape(shown(p))}", highlight=False)
        for p in res.to_delete:
            con.print(f"  would delete {escape(shown(p))}", highlight=False)
        for note in res.notes:
            con.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
        con.print(
            f"{'OK' if res.ok else 'NOT DONE'}: {escape(res.message)} ({res.source_files} files, "
            f"{format_bytes(res.source_bytes)}, {res.tool})",
            highlight=False,
        )
        if res.fix:
            con.print(f"[bold]fix:[/bold] {escape(res.fix)}", highlight=False)
    if res.interrupted:
        raise typer.Exit(130)
    if not res.ok and not dry_run and not res.to_delete and not (delete and not yes):
        raise typer.Exit(1)
