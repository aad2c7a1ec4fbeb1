"""The user's-own-command wrapper on small fake scripts: OOM text, a CUDA error, a hang, a clean run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpuready.nvml import DeviceMemory
from gpuready.trial.api import trial_command
from gpuready.trial.backend import CommandBackend, classify_output, substitute_arg
from gpuready.trial.sampler import Sampler

OOM_SCRIPT = """
import sys
bs = int(sys.argv[sys.argv.index("--batch_size") + 1]) if "--batch_size" in sys.argv else 1
junk = bytearray(bs * 1024 * 1024)  # "allocates"
print(f"step 1 batch {bs}", flush=True)
if bs > 2:
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
          " of 79.19 GiB of which 1.06 GiB is free.", file=sys.stderr, flush=True)
    sys.exit(1)
"""


class FakeNvml:
    """One 80 GB GPU; the child's PID holds 1 GiB more with every sample (up to 5 GiB)."""

    def __init__(self) -> None:
        self.pid = -1
        self.reads = 0

    def device_count(self) -> int:
        return 1

    def memory(self, index: int) -> DeviceMemory | None:
        return DeviceMemory(index, "Fake GPU", 80 * 2**30, 2**30)

    def process_memory(self, index: int) -> dict[int, int]:
        self.reads += 1
        return {self.pid: min(self.reads, 5) * 2**30, 999_999: 70 * 2**30}  # another user's process

    def utilization(self, index: int) -> int | None:
        return 87


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def _sampler(fake: FakeNvml) -> Sampler:
    sampler = Sampler(nvml=fake, interval=0.01, tree=lambda pid: {pid})
    original = sampler.start

    def start(pid: int) -> None:
        fake.pid = pid
        original(pid)

    sampler.start = start  # type: ignore[method-assign]
    return sampler


def test_sweep_arg_substitutes_the_value_and_recognises_oom(tmp_path: Path) -> None:
    lines: list[str] = []
    argv = [sys.executable, _script(tmp_path, OOM_SCRIPT), "--batch_size", "1"]
    backend = CommandBackend(argv, flag="--batch_size", on_line=lines.append)
    result = trial_command(argv, sweep_arg=("--batch_size", [1, 2, 4]), backend=backend)
    assert [p.values for p in result.points] == [{"--batch_size": 1}, {"--batch_size": 2}, {"--batch_size": 4}]
    assert [p.status for p in result.points] == ["ok", "ok", "oom"]
    assert "CUDA out of memory" in (result.points[2].error or "")
    assert "step 1 batch 4" in lines  # output was streamed through


def test_a_hung_script_is_ended_by_the_timeout(tmp_path: Path) -> None:
    script = _script(tmp_path, "import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    t0 = time.perf_counter()
    result = trial_command([sys.executable, script], timeout=1.0)
    assert time.perf_counter() - t0 < 15
    point = result.points[0]
    assert point.status == "timeout" and not point.ok
    assert point.detail["exit_code"] is None


def test_the_sampler_records_the_process_trees_peak_not_other_processes(tmp_path: Path) -> None:
    fake = FakeNvml()
    script = _script(tmp_path, "import time\ntime.sleep(0.5)\n")
    backend = CommandBackend([sys.executable, script], sampler_factory=lambda: _sampler(fake))
    point = backend.run_point({})
    assert point.ok
    assert point.peak_device_bytes == 5 * 2**30  # its own PID only; the 70 GiB process is someone else's
    assert point.detail["memory_source"] == "process"
    assert point.detail["sample_hz"] > 10
    assert point.detail["peak_utilization_percent"] == 87


def test_classify_output() -> None:
    assert classify_output(["ok"], 0, False) == ("ok", None)
    assert classify_output(["RuntimeError: CUDA error: an illegal memory access was encountered"], 1, False)[0] == (
        "cuda_error"
    )
    assert classify_output(["x"], None, True)[0] == "timeout"
    status, error = classify_output(["Traceback", "ValueError: bad"], 1, False)
    assert status == "failed" and "exit status 1" in (error or "")
    assert classify_output([], -9, False)[1] == "killed by signal 9"


def test_substitute_arg_forms() -> None:
    assert substitute_arg(["p", "--bs", "1"], "--bs", "8") == ["p", "--bs", "8"]
    assert substitute_arg(["p", "--bs=1"], "--bs", "8") == ["p", "--bs=8"]
    assert substitute_arg(["p"], "--bs", "8") == ["p", "--bs=8"]
