"""The one place gpuready starts other programs (the doctor's torch probe and pip check, the trial's probe and
the user's command, rsync and rclone for storage).

Every child gets an argv list (never a shell string) and a closed stdin. By default it also gets its own
session, so that a timeout or Ctrl-C can end its whole process tree (a training script's data-loader workers,
torchrun's ranks) and not us. A child that must stop when we stop (rsync copying the user's files: a copy that
goes on after gpuready was interrupted or killed is a copy nobody verifies) is started with `ours=True`: it
stays in our process group, so the terminal's Ctrl-C reaches it directly, and on Linux it is sent SIGTERM
if gpuready dies without cleaning up (prctl PR_SET_PDEATHSIG, prctl(2)).
How each caller reads the output and waits (streamed, collected, in the background) stays with the caller.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
