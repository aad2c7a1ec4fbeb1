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


def _version(value: bool) -> None:
    if value:
        from gpuready import __version__

        typer.echo(f"gpuready {__version__}")
        raise typer.Exit(0)


def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show the full traceback of an error")] = False,
) -> None:
    """Will your deep-learning job run on that GPU? Size it, check the image, trial-run it, keep your files."""


# Each module defines `register(app)`, which adds the commands named here (tests/cli/test_app.py checks the names).
# Keep this sorted; one line per module.
COMMAND_MODULES = {
    "gpuready.cli.bench": ("bench", "compare"),
    "gpuready.cli.check": ("check",),
    "gpuready.cli.doctor": ("doctor", "env", "image"),
    "gpuready.cli.estimate": ("estimate",),
    "gpuready.cli.models": ("models", "gpus"),
    "gpuready.cli.plan": ("plan",),
    "gpuready.cli.storage": ("storage",),
    "gpuready.cli.sync": ("manifest", "sync"),
    "gpuready.cli.trial": ("trial", "history"),
}


def build_app(modules: tuple[str, ...] = tuple(COMMAND_MODULES)) -> typer.Typer:
    """The Typer app with the commands of `modules` (all by default)."""
    made = typer.Typer(
        name="gpuready",
        help="Will your deep-learning job run on that GPU? Size it, check the image, trial-run it, keep your files.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        # plain help: rich markup would eat "[trace]", "[default: ...]" and other brackets in the texts
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    made.callback()(_options)
    for name in modules:
        importlib.import_module(name).register(made)
    return made


def _modules_for(args: list[str]) -> tuple[str, ...]:
    """Only the module of the command being run (typer builds every command's parameters when it starts, about a
    tenth of a second for all of them); every module for help, completion or a word that is no command."""
    words = [a for a in args if not a.startswith("-")]
    if words and not any(a in ("-h", "--help") for a in args[: args.index(words[0])]):
        for module, commands in COMMAND_MODULES.items():
            if words[0] in commands:
                return (module,)
    return tuple(COMMAND_MODULES)


def __getattr__(name: str) -> typer.Typer:
    """`app`: the whole app, built when first asked for (tests and typer's tooling use it)."""
    if name == "app":
        made = build_app()
        globals()["app"] = made
        return made
    raise AttributeError(name)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and maps every error to one line on stderr and docs/cli.md's exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        result = build_app(_modules_for(args))(args=args, prog_name="gpuready", standalone_mode=False)
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
