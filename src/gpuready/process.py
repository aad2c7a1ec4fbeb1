"""The one place gpuready starts other programs (the doctor's torch probe and pip check, the trial's probe and
the user's command, rsync and rclone for storage).

Every child gets an argv list (never a shell string), a closed stdin and its own session, so that a timeout or
Ctrl-C can end its whole process tree (a training script's data-loader workers, torchrun's ranks) and not us.
How each caller reads the output and waits (streamed, collected, in the background) stays with the caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

KILL_GRACE_SECONDS = 3.0


def spawn(
    argv: Sequence[str],
    *,
    merge_stderr: bool = False,
    text: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[Any]:
    """Start argv with stdout (and stderr, separately or merged into stdout) piped. Raises OSError if the program
    cannot be started (not found, not executable); callers turn that into their own result."""
    return subprocess.Popen(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=text,
        errors="replace" if text else None,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,  # its own process group: signals reach the whole tree, not us
    )


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
