"""How the doctor runs its subprocesses (the torch probe, `pip check`, `nvcc --version`), started by gpuready.process.

Every command is an argv list with a timeout, run in its own session so a hung child (a driver stuck in CUDA
init) is killed with its children; never `shell=True`. Results come back as data, never as exceptions.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

from gpuready.process import Running

PROBE_MARKER = "GPUREADY_PROBE "
DEFAULT_PROBE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    error: str | None = None  # could not start (not found, permission)


class RunningCommand:
    """A started command; `wait()` collects it within the time left of its timeout (gpuready.process.Running;
    text read with universal newlines, as a text-mode pipe gives it; SIGKILL to its group at the timeout)."""

    def __init__(self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> None:
        self.argv = tuple(argv)
        self.timeout = timeout
        self._running = Running(argv, timeout=timeout, env=env, kill_grace=0)

    @property
    def pid(self) -> int | None:
        return self._running.pid

    def wait(self) -> CommandResult:
        done = self._running.wait()
        error = f"{type(done.error).__name__}: {done.error}" if done.error is not None else None
        return CommandResult(
            self.argv, done.returncode, done.stdout, done.stderr, done.seconds, timed_out=done.timed_out, error=error
        )

    def cancel(self) -> None:
        """Stop it now (its answer is no longer needed)."""
        self._running.cancel()


def run_command(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> CommandResult:
    return RunningCommand(argv, timeout, env).wait()


# ---- the torch probe ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeDevice:
    name: str
    capability: tuple[int, int]
    uuid: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    """What torch, imported in a child process, says about CUDA. `error` is set when the probe itself
    failed."""

    seconds: float = 0.0
    error: str | None = None  # probe did not report (timeout, crash)
    timed_out: bool = False
    import_error: str | None = None  # `import torch` raised
    torch_version: str | None = None
    torch_file: str | None = None
    cuda: str | None = None
    hip: str | None = None
    is_available: bool | None = None
    device_count: int | None = None
    arch_list: tuple[str, ...] = ()
    devices: tuple[ProbeDevice, ...] = ()
    init_error: str | None = None
    kernel_error: str | None = None
    cudnn_version: int | None = None
    cudnn_error: str | None = None
    driver_cuda_version: int | None = None
    warnings: tuple[str, ...] = ()
    loaded_libraries: tuple[str, ...] = field(default_factory=tuple)

    @property
    def messages(self) -> str:
        """All the error and warning text, for matching known failure messages."""
        parts = [self.import_error, self.init_error, self.kernel_error, self.cudnn_error, *self.warnings]
        return "\n".join(p for p in parts if p)


def parse_probe(result: CommandResult) -> ProbeResult:
    """Turn the child's output into a ProbeResult; a crash or timeout is a result too."""
    if result.timed_out:
        return ProbeResult(
            seconds=result.seconds,
            timed_out=True,
            error=f"the torch probe did not finish in {result.seconds:.0f} s (import torch / CUDA init hung)",
        )
    if result.error is not None:
        return ProbeResult(seconds=result.seconds, error=f"could not start the torch probe: {result.error}")
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(PROBE_MARKER)), None)
    if line is None:
        tail = " ".join(result.stderr.strip().splitlines()[-3:])[:600]
        return ProbeResult(
            seconds=result.seconds,
            error=f"the torch probe exited with code {result.returncode} without an answer: " + (tail or "no output"),
        )
    data: dict[str, Any] = json.loads(line[len(PROBE_MARKER) :])
    return ProbeResult(
        seconds=result.seconds,
        import_error=data.get("import_error"),
        torch_version=data.get("torch_version"),
        torch_file=data.get("torch_file"),
        cuda=data.get("cuda"),
        hip=data.get("hip"),
        is_available=data.get("is_available"),
        device_count=data.get("device_count"),
        arch_list=tuple(data.get("arch_list") or ()),
        devices=tuple(
            ProbeDevice(d["name"], (int(d["capability"][0]), int(d["capability"][1])), d.get("uuid"))
            for d in data.get("devices") or ()
        ),
        init_error=data.get("init_error"),
        kernel_error=data.get("kernel_error"),
        cudnn_version=data.get("cudnn_version"),
        cudnn_error=data.get("cudnn_error"),
        driver_cuda_version=data.get("driver_cuda_version"),
        warnings=tuple(data.get("warnings") or ()),
        loaded_libraries=tuple(data.get("loaded_libraries") or ()),
    )


class PendingProbe(Protocol):
    """A probe that has been started; `result()` waits for it, `cancel()` drops it."""

    def result(self) -> ProbeResult: ...

    def cancel(self) -> None: ...


class TorchProbe:
    """The live probe: `python -c <_probe_child.py>` in the project's interpreter, started at once."""

    def __init__(
        self,
        python: str | None = None,
        timeout: float = DEFAULT_PROBE_TIMEOUT_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        source = resources.files("gpuready.doctor").joinpath("_probe_child.py").read_text(encoding="utf-8")
        # -P: do not put the current folder first on sys.path (Python >= 3.11), so a stray ./torch or
        # ./typing.py does not change what is imported
        self._command = RunningCommand([python or sys.executable, "-P", "-c", source], timeout, env)

    @property
    def pid(self) -> int | None:
        """The child's pid: it holds GPU memory once CUDA is up, and is not "another process"."""
        return self._command.pid

    def result(self) -> ProbeResult:
        return parse_probe(self._command.wait())

    def cancel(self) -> None:
        self._command.cancel()


def pip_check(python: str | None = None, timeout: float = 30.0) -> RunningCommand:
    """Start `python -m pip check` (installed packages against their own declared dependencies)."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return RunningCommand([python or sys.executable, "-m", "pip", "check"], timeout, env)


def nvcc_version(nvcc: str, timeout: float = 5.0) -> str | None:
    """`nvcc --version` -> '12.4.131' (the system toolkit; info only, torch wheels bring their own CUDA)."""
    result = run_command([nvcc, "--version"], timeout)
    for line in result.stdout.splitlines():
        if "release" in line and ", V" in line:
            return line.rsplit(", V", 1)[1].strip()
    return None
