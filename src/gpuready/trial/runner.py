"""How gpuready's trial code runs processes (started by gpuready.process).

Argument lists only (never a shell), a wall-clock timeout, each child in its own process group so that a
timeout or Ctrl-C ends the whole tree (a training script's data-loader workers, torchrun's ranks), and the
child's output streamed line by line to a callback while the last lines are kept for error detection.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuready.process import Running

TAIL_LINES = 200


class Interrupted(Exception):
    """Ctrl-C arrived while a child ran; the child's process group has been ended."""


@dataclass(frozen=True)
class ProcessResult:
    argv: list[str]
    returncode: int | None  # None when it had to be killed
    duration_seconds: float
    timed_out: bool = False
    output_tail: list[str] = field(default_factory=list)
    pid: int | None = None


def run(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> ProcessResult:
    """Run argv to the end or to `timeout` seconds; stream its merged stdout/stderr lines to `on_line`.

    Raises Interrupted (after ending the child's process group) on KeyboardInterrupt.
    """
    args = [str(a) for a in argv]
    full_env = dict(os.environ if env is None else env)
    running = Running(
        args,
        timeout=timeout,
        merge_stderr=True,
        env=full_env,
        cwd=cwd,
        on_line=on_line,
        on_start=on_start,
        keep_lines=TAIL_LINES,
        universal_newlines=False,  # a progress bar's '\r' redraws stay one line of the tail
    )
    try:
        done = running.wait()
    except KeyboardInterrupt:  # the child's group has been ended
        raise Interrupted() from None
    if done.error is not None:
        return ProcessResult(args, 127, 0.0, output_tail=[f"cannot start {args[0]!r}: {done.error}"])
    return ProcessResult(
        args, done.returncode, done.seconds, timed_out=done.timed_out, output_tail=done.stdout_lines, pid=done.pid
    )


RunFn = Callable[..., ProcessResult]


def python_module_argv(module: str, *args: str, nproc: int | None = None) -> list[str]:
    """argv for `python -m module args`, or under torchrun with nproc processes on this host (nproc given)."""
    if nproc is None:
        return [sys.executable, "-m", module, *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *args,
    ]
