"""How the storage package runs other programs (rsync, rclone); they are started by gpuready.process.

Every call is an argv list (never a shell string) with a timeout. Tests inject a fake `Runner`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuready.process import end_group, sigterm_as_interrupt, spawn, stop_child

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
        start = time.monotonic()
        try:
            proc = spawn(argv, ours=ours)
        except OSError as exc:
            return RunResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror or exc}")
        timed_out = threading.Event()

        def _kill() -> None:
            timed_out.set()
            if ours:
                stop_child(proc, grace=1.0)
            else:
                end_group(proc, grace=0)

        timer = threading.Timer(timeout, _kill)
        timer.start()
        err_chunks: list[bytes] = []
        err_thread = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read() if proc.stderr else b""))
        err_thread.start()
        out_lines: list[str] = []
        interrupted = False
        try:
            assert proc.stdout is not None
            buf = b""
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    out_lines.append(line)
                    if on_line is not None and line.strip():
                        on_line(line)
            if buf:
                out_lines.append(buf.decode("utf-8", "replace"))
            returncode = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the child too (same group); SIGTERM reached only us: stop it either way
            interrupted = True
            if ours:
                stop_child(proc)
            else:
                end_group(proc)
            returncode = proc.wait()
        finally:
            timer.cancel()
            err_thread.join()
        return RunResult(
            tuple(argv),
            returncode,
            "\n".join(out_lines),
            b"".join(err_chunks).decode("utf-8", "replace"),
            timed_out=timed_out.is_set(),
            seconds=time.monotonic() - start,
            interrupted=interrupted,
        )
