"""gpuready.process's collection helper (`Running` / `collect`) with real children of this interpreter: output,
exit codes, timeouts that end the whole process group, Ctrl-C, programs that cannot start."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpuready import process
from gpuready.process import Running, collect

PY = sys.executable


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def _tree_script(tmp_path: Path, leader_sleeps: float) -> Path:
    """A leader that starts a grandchild holding our pipes, says so, then sleeps."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"print('started', flush=True)\ntime.sleep({leader_sleeps})\n"
    )
    return script


def test_collect_returns_stdout_stderr_and_exit_code_separately() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.stdout.write('a\\r\\nb'); sys.exit(3)"
    done = collect([PY, "-c", code], timeout=30)
    assert done.returncode == 3 and not done.timed_out and done.error is None
    assert done.stdout == "out\na\nb"  # universal newlines by default: '\r\n' reads as '\n', as text pipes give it
    assert done.stderr == "err\n" and done.stdout_lines == ["out", "a", "b"] and done.pid is not None


def test_merged_output_streams_every_line_and_keeps_only_the_last_lines() -> None:
    seen: list[str] = []
    code = "import sys\nfor i in range(50): print(i)\nprint('x\\ry', file=sys.stderr)"
    done = collect(
        [PY, "-c", code], timeout=30, merge_stderr=True, on_line=seen.append, keep_lines=3, universal_newlines=False
    )
    assert seen == [str(i) for i in range(50)] + ["x\ry"]  # '\r' stays inside its line when asked
    assert done.stdout_lines == ["48", "49", "x\ry"] and done.stderr == ""


def test_a_failing_line_callback_loses_no_output() -> None:
    def boom(line: str) -> None:
        raise RuntimeError(line)

    done = collect([PY, "-c", "print(1); print(2)"], timeout=30, on_line=boom)
    assert done.stdout_lines == ["1", "2"] and done.returncode == 0


def test_a_program_that_cannot_start_is_a_result_not_an_exception(tmp_path: Path) -> None:
    done = collect([str(tmp_path / "no-such-program")], timeout=5)
    assert isinstance(done.error, FileNotFoundError) and done.returncode is None and done.pid is None


def test_timeout_ends_the_whole_process_group_and_keeps_the_output_so_far(tmp_path: Path) -> None:
    started = time.perf_counter()
    done = collect([PY, str(_tree_script(tmp_path, 600))], timeout=1.0, kill_grace=0)
    assert done.timed_out and done.returncode is None and done.stdout == "started\n"
    assert time.perf_counter() - started < 10
    assert done.pid is not None
    time.sleep(0.3)
    assert _group_alive(done.pid) == []


def test_a_grandchild_holding_the_pipes_after_its_leader_exits_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader exits 0 but its grandchild keeps our pipes open: the answer comes after the drain wait, and the
    grandchild (which would hold the GPU) is ended."""
    monkeypatch.setattr(process, "DRAIN_SECONDS", 0.5)
    started = time.perf_counter()
    done = collect([PY, str(_tree_script(tmp_path, 0))], timeout=60)
    assert done.returncode == 0 and not done.timed_out and done.stdout == "started\n"
    assert time.perf_counter() - started < 10
    assert done.pid is not None
    time.sleep(0.3)
    assert _group_alive(done.pid) == []


def test_ctrl_c_ends_the_child_before_it_reaches_the_caller(tmp_path: Path) -> None:
    running = Running([PY, str(_tree_script(tmp_path, 600))], timeout=60, kill_grace=0.2)
    pid = running.pid
    assert pid is not None
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            running.wait()
    finally:
        timer.cancel()
    time.sleep(0.3)
    assert _group_alive(pid) == []


def test_ctrl_c_with_interrupt_returns_ends_the_child_and_reports_what_it_wrote(tmp_path: Path) -> None:
    """storage's rsync runner: an interrupted copy is a result (exit 130 with the files done), never lost output."""
    script = tmp_path / "copy.py"
    script.write_text("import time\nprint('file-1 done', flush=True)\ntime.sleep(600)\n")
    running = Running([PY, str(script)], timeout=60, interrupt_returns=True)
    pid = running.pid
    assert pid is not None
    time.sleep(0.5)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        done = running.wait()
    finally:
        timer.cancel()
    assert done.interrupted and not done.timed_out
    assert done.stdout_lines == ["file-1 done"]
    assert done.returncode is not None and done.returncode != 0
    time.sleep(0.3)
    assert _group_alive(pid) == []


def test_cancel_stops_a_running_child_at_once() -> None:
    running = Running([PY, "-c", "import time; time.sleep(600)"], timeout=600)
    pid = running.pid
    assert pid is not None
    started = time.perf_counter()
    running.cancel()
    assert time.perf_counter() - started < 5
    time.sleep(0.3)
    assert _group_alive(pid) == []
