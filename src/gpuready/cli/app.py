"""The `gpuready` program: one Typer app; each command lives in its own module and registers itself."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from gpuready.cli import coercion
from gpuready.errors import GpureadyError

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer with click as a dependency
    from click import exceptions as click_exc  # type: ignore[no-redef]

coercion.install()  # typer's parameters without a pydantic TypeAdapter where none is needed (cli/coercion.py)

app = typer.Typer(
    name="gpuready",
    help="Will your deep-learning job run on that GPU? Size it, check the image, trial-run it, keep your files.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # plain help: rich markup would eat "[trace]", "[default: ...]" and other brackets in the texts
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from gpuready import __version__

        typer.echo(f"gpuready {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show the full traceback of an error")] = False,
) -> None:
    """Will your deep-learning job run on that GPU? Size it, check the image, trial-run it, keep your files."""


# Each module defines `register(app)`. Keep this list sorted; one line per command group.
COMMAND_MODULES = (
    "gpuready.cli.bench",
    "gpuready.cli.check",
    "gpuready.cli.doctor",
    "gpuready.cli.estimate",
    "gpuready.cli.models",
    "gpuready.cli.plan",
    "gpuready.cli.storage",
    "gpuready.cli.trial",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and maps every error to one line on stderr and docs/cli.md's exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        result = app(args=args, prog_name="gpuready", standalone_mode=False)
    except GpureadyError as exc:
        if debug:
            raise
        sys.stderr.write(f"gpuready: error: {_one_line(str(exc))}\n")
        return exc.exit_code
    except click_exc.NoArgsIsHelpError:
        return 0
    except click_exc.ClickException as exc:
        if debug:
            raise
        sys.stderr.write(f"gpuready: error: {_one_line(exc.format_message())}\n")
        return 2 if isinstance(exc, click_exc.UsageError) else exc.exit_code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("gpuready: aborted\n")
        return 130
    except KeyboardInterrupt:
        sys.stderr.write("gpuready: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except SystemExit as exc:  # typer's --show-completion / --install-completion exit by themselves
        return exc.code if isinstance(exc.code, int) else 0
    except Exception as exc:  # a bug in gpuready: still one line, the traceback behind --debug
        if debug:
            raise
        sys.stderr.write(
            f"gpuready: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(run again with --debug for the traceback, and please report it)\n"
        )
        return 1
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
