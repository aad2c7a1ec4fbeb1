"""How the storage package runs other programs (rsync, rclone), through gpuready.process's `Running`.

Every call is an argv list (never a shell string) with a timeout. Tests inject a fake `Runner`.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuready.process import Running, sigterm_as_interrupt

LineCallback = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0
    interrupted: bool = False  # Ctrl-C or SIGTERM reached gpuready; the child was stopped


class Runner(Protocol):
    """Runs argv with a timeout; `on_line` receives stdout lines (split on newline and carriage return).
    `ours`: the child stays in gpuready's process group and stops when gpuready is interrupted or dies."""

    def which(self, name: str) -> str | None: ...

    def run(
        self, argv: list[str], timeout: float, on_line: LineCallback | None = None, *, ours: bool = False
    ) -> RunResult: ...


class SubprocessRunner:
    """The real runner: started through gpuready.process, stdout streamed line by line, ended at the timeout."""

    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def run(
        self, argv: list[str], timeout: float, on_line: LineCallback | None = None, *, ours: bool = False
    ) -> RunResult:
        with sigterm_as_interrupt() if ours else contextlib.nullcontext():
            return self._run(argv, timeout, on_line, ours)

    def _run(self, argv: list[str], timeout: float, on_line: LineCallback | None, ours: bool) -> RunResult:
        def line(text: str) -> None:
            if on_line is not None and text.strip():
                on_line(text)

        # '\r' ends a line too (rsync's progress redraws); at the timeout a copy of ours gets SIGTERM and 1 s,
        # anything else SIGKILL at once; on Ctrl-C the child is stopped and what it wrote is still reported
        done = Running(
            argv,
            timeout=timeout,
            ours=ours,
            on_line=line if on_line is not None else None,
            universal_newlines=True,
            kill_grace=1.0 if ours else 0.0,
            interrupt_returns=True,
        ).wait()
        if done.error is not None:
            return RunResult(tuple(argv), 127, "", f"{argv[0]}: {done.error.strerror or done.error}")
        return RunResult(
            tuple(argv),
            -1 if done.returncode is None else done.returncode,  # -1: ended at its timeout
            "\n".join(done.stdout_lines),
            done.stderr,
            timed_out=done.timed_out,
            seconds=done.seconds,
            interrupted=done.interrupted,
        )
