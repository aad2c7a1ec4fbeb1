"""How gpuready's trial code runs processes (started by gpuready.process).

Argument lists only (never a shell), a wall-clock timeout, each child in its own process group so that a
timeout or Ctrl-C ends the whole tree (a training script's data-loader workers, torchrun's ranks), and the
child's output streamed line by line to a callback while the last lines are kept for error detection.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuready.process import end_group, spawn

TAIL_LINES = 200
KILL_GRACE_SECONDS = 5.0


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
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    started = time.perf_counter()
    try:
        proc = spawn(args, merge_stderr=True, env=full_env, cwd=cwd)
    except OSError as exc:
        return ProcessResult(args, 127, 0.0, output_tail=[f"cannot start {args[0]!r}: {exc}"])
    if on_start is not None:
        on_start(proc.pid)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            tail.append(line)
            if on_line is not None:
                with contextlib.suppress(Exception):
                    on_line(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            end_group(proc)
    except KeyboardInterrupt:
        end_group(proc)
        reader.join(timeout=2)
        raise Interrupted() from None
    reader.join(timeout=5)
    if proc.returncode is not None and not timed_out:
        end_group(proc, grace=0)  # the leader exited; grandchildren left in its group would hold the GPU
    return ProcessResult(
        args,
        None if timed_out else proc.returncode,
        time.perf_counter() - started,
        timed_out=timed_out,
        output_tail=list(tail),
        pid=proc.pid,
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
