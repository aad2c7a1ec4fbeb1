"""The one place gpuready starts other programs (the doctor's torch probe and pip check, the trial's probe and
the user's command, rsync and rclone for storage).

Every child gets an argv list (never a shell string) and a closed stdin. By default it also gets its own
session, so that a timeout or Ctrl-C can end its whole process tree (a training script's data-loader workers,
torchrun's ranks) and not us. A child that must stop when we stop (rsync copying the user's files: a copy that
goes on after gpuready was interrupted or killed is a copy nobody verifies) is started with `ours=True`: it
stays in our process group, so the terminal's Ctrl-C reaches it directly, and on Linux it is sent SIGTERM
if gpuready dies without cleaning up (prctl PR_SET_PDEATHSIG, prctl(2)).
`Running` / `collect` are the one way to run a child to its end: output read on threads (streamed line by line
to a callback, kept whole or as its last lines), a timeout from the start after which the whole group is ended,
Ctrl-C ending the child before it reaches the caller, and the answer as a `Completed` value.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

KILL_GRACE_SECONDS = 3.0


def spawn(
    argv: Sequence[str],
    *,
    merge_stderr: bool = False,
    text: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    ours: bool = False,
) -> subprocess.Popen[Any]:
    """Start argv with stdout (and stderr, separately or merged into stdout) piped. Raises OSError if the program
    cannot be started (not found, not executable); callers turn that into their own result.
    `ours`: keep the child in our process group and end it if we die (see the module docstring); stop it
    with `stop_child`."""
    return subprocess.Popen(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=text,
        errors="replace" if text else None,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=not ours,  # its own process group: signals reach the whole tree, not us
        preexec_fn=_die_with_parent() if ours else None,  # only a prctl call: no locks taken in the child
    )


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_deathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return set_deathsig


def stop_child(proc: subprocess.Popen[Any], grace: float = KILL_GRACE_SECONDS) -> None:
    """End a child started with `ours=True`: SIGTERM, then SIGKILL after `grace` seconds. Only the child's own
    pid is signalled (its group is ours); a well-behaved child such as rsync ends its helpers itself."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Any:
    """Within the block, SIGTERM to gpuready raises KeyboardInterrupt (as Ctrl-C does), so the caller's clean-up
    (stopping a child, reporting what was done) runs. Only in the main thread; elsewhere a no-op."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def end_group(proc: subprocess.Popen[Any], grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the child's whole process group (grace=0: SIGKILL at once)."""
    steps = ((signal.SIGINT, grace / 2), (signal.SIGTERM, grace / 2)) if grace > 0 else ()
    for sig, wait in steps:
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    # the leader, or grandchildren that outlived it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def kill_group(pid: int) -> None:
    """SIGKILL the process group that `pid` leads (a child from `spawn`, in its own session). For a watchdog
    that holds only the pid: bench's check for a job whose GPU steps stopped (a hung driver)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# How long to wait for the output of a child that has ended (or was ended) to reach its end: grandchildren that
# inherited the pipes can hold them open after the leader is gone; they are ended then (see `Running.wait`).
DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class Completed:
    """A child run to its end (or ended): what `Running.wait` and `collect` return; never raised."""

    argv: tuple[str, ...]
    returncode: int | None  # None when it was ended at its timeout, or could not start
    stdout: str  # with stderr when merged; the last `keep_lines` lines when that was set
    stderr: str
    seconds: float
    timed_out: bool = False
    error: OSError | None = None  # it could not be started (not found, not executable)
    pid: int | None = None
    interrupted: bool = False  # Ctrl-C (or SIGTERM in `sigterm_as_interrupt`) ended it; see `interrupt_returns`

    @property
    def stdout_lines(self) -> list[str]:
        """stdout as lines, without their line ends."""
        return _lines(self.stdout)

    @property
    def stderr_lines(self) -> list[str]:
        return _lines(self.stderr)


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


class _Pump(threading.Thread):
    """Reads one pipe to its end: keeps the text (all of it, or the last `keep` lines) and hands each line to
    `on_line` (a failing callback loses its line, never the output)."""

    def __init__(
        self, pipe: IO[bytes], universal: bool, keep: int | None, on_line: Callable[[str], None] | None
    ) -> None:
        super().__init__(daemon=True)
        # universal newlines: '\r', '\r\n' and '\n' all end a line and read as '\n' (what text-mode pipes give);
        # else only '\n' ends one and a '\r' stays inside it (a progress bar's redraws are one line)
        self._text = io.TextIOWrapper(pipe, encoding="utf-8", errors="replace", newline=None if universal else "\n")
        self._kept: collections.deque[str] = collections.deque(maxlen=keep)
        self._on_line = on_line
        self.start()

    def run(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under us
            for piece in iter(self._text.readline, ""):
                self._kept.append(piece)
                if self._on_line is not None:
                    with contextlib.suppress(Exception):
                        self._on_line(piece[:-1] if piece.endswith("\n") else piece)

    def text(self) -> str:
        return "".join(list(self._kept))


class Running:
    """A child started at once through `spawn`, its output read in the background; `wait()` collects it.

    Args:
        argv: the program and its arguments.
        timeout: seconds from the start; then the child's group is ended (`end_group` with `kill_grace`, or
            `stop_child` for `ours`) and the result says `timed_out`. None: no limit.
        merge_stderr: stderr into stdout (one stream, in order).
        env, cwd, ours: as for `spawn`.
        on_line: called with each stdout line (without its line end), on a reader thread.
        on_start: called with the child's pid before any output is read.
        keep_lines: keep only the last this many lines of each stream (a long training log); None keeps all.
        universal_newlines: '\r' also ends a line (text-mode pipes); else only '\n' does.
        kill_grace: seconds `end_group` gives SIGINT and SIGTERM before SIGKILL (0: SIGKILL at once).
        interrupt_returns: on Ctrl-C, end the child (with KILL_GRACE_SECONDS) and return what it wrote, with
            `interrupted` set, instead of raising: for a caller that reports an interrupted copy itself.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        merge_stderr: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        ours: bool = False,
        on_line: Callable[[str], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        keep_lines: int | None = None,
        universal_newlines: bool = True,
        kill_grace: float = KILL_GRACE_SECONDS,
        interrupt_returns: bool = False,
    ) -> None:
        self.argv = tuple(str(a) for a in argv)
        self._interrupt_returns = interrupt_returns
        self.timeout = timeout
        self.started = time.perf_counter()
        self._ours, self._grace = ours, kill_grace
        self._result: Completed | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pumps: list[_Pump] = []
        try:
            self._proc = spawn(self.argv, merge_stderr=merge_stderr, env=env, cwd=cwd, ours=ours)
        except OSError as exc:
            self._result = Completed(self.argv, None, "", "", 0.0, error=exc)
            return
        if on_start is not None:
            on_start(self._proc.pid)
        assert self._proc.stdout is not None
        self._pumps.append(_Pump(self._proc.stdout, universal_newlines, keep_lines, on_line))
        if self._proc.stderr is not None:
            self._pumps.append(_Pump(self._proc.stderr, universal_newlines, keep_lines, None))

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _end(self, grace: float) -> None:
        assert self._proc is not None
        if self._ours:
            stop_child(self._proc, grace=grace)
        else:
            end_group(self._proc, grace=grace)

    def _drain(self, seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        for pump in self._pumps:
            pump.join(timeout=max(0.0, deadline - time.perf_counter()))

    def wait(self) -> Completed:
        """Wait for the child within what is left of its timeout. On KeyboardInterrupt (Ctrl-C; SIGTERM inside
        `sigterm_as_interrupt`) the child is ended first, then the interrupt goes on to the caller."""
        if self._result is not None:
            return self._result
        proc = self._proc
        assert proc is not None
        timed_out = False
        left = None if self.timeout is None else max(0.0, self.timeout - (time.perf_counter() - self.started))
        try:
            try:
                proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._end(self._grace)
        except KeyboardInterrupt:
            if not self._interrupt_returns:
                self._end(self._grace)
                self._drain(2.0)
                raise
            self._end(KILL_GRACE_SECONDS)
            proc.wait()
            self._drain(DRAIN_SECONDS)
            self._result = Completed(
                self.argv,
                proc.returncode,
                self._pumps[0].text(),
                self._pumps[1].text() if len(self._pumps) > 1 else "",
                time.perf_counter() - self.started,
                pid=proc.pid,
                interrupted=True,
            )
            return self._result
        self._drain(DRAIN_SECONDS)
        if not self._ours:
            end_group(proc, grace=0)  # the leader is gone; grandchildren left in its group would hold the GPU
            self._drain(DRAIN_SECONDS)
        stdout = self._pumps[0].text()
        stderr = self._pumps[1].text() if len(self._pumps) > 1 else ""
        self._result = Completed(
            self.argv,
            None if timed_out else proc.returncode,
            stdout,
            stderr,
            time.perf_counter() - self.started,
            timed_out=timed_out,
            pid=proc.pid,
        )
        return self._result

    def cancel(self) -> None:
        """Stop it now (its answer is no longer needed): SIGKILL to its group."""
        if self._proc is not None and self._proc.poll() is None:
            end_group(self._proc, grace=0)
            self._drain(DRAIN_SECONDS)


def collect(argv: Sequence[str], *, timeout: float | None, **options: Any) -> Completed:
    """Run argv to its end (or its timeout) and return its output and exit; the options are `Running`'s."""
    return Running(argv, timeout=timeout, **options).wait()
