import shutil
from pathlib import Path

import pytest

from gpuready.errors import GpureadyError, InputError
from gpuready.storage.runner import RunResult, SubprocessRunner
from gpuready.storage.sync import MANIFEST_NAME, rsync_argv, sync, target_kind


class FakeRunner:
    """Stands in for rsync/rclone: records argv; `copy` decides what lands in DEST."""

    def __init__(self, tools: tuple[str, ...] = ("rsync",), returncode: int = 0, corrupt: str | None = None):
        self.tools = tools
        self.returncode = returncode
        self.corrupt = corrupt
        self.calls: list[list[str]] = []
        self.outputs: dict[str, str] = {}

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.tools else None

    def run(self, argv: list[str], timeout: float, on_line=None, ours: bool = False) -> RunResult:  # type: ignore[no-untyped-def]
        self.calls.append(argv)
        assert timeout > 0
        if argv[0] == "rsync" and "--dry-run" not in argv and self.returncode == 0:
            src, dest = argv[-2].rstrip("/"), argv[-1].rstrip("/")
            shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)
            if self.corrupt:
                (Path(dest) / self.corrupt).write_bytes(b"bit rot")
            if on_line is not None:
                on_line("      1,024  50%    1.00MB/s    0:00:01 (xfr#1, to-chk=1/2)")
        out = self.outputs.get(argv[1], "")
        return RunResult(tuple(argv), self.returncode, out, "rsync error: interrupted")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    s = tmp_path / "src"
    (s / "ckpt").mkdir(parents=True)
    (s / "ckpt" / "a.bin").write_bytes(b"a" * 5000)
    (s / "log.txt").write_text("hello")
    return s


def test_local_sync_copies_then_verifies_against_a_manifest(src: Path, tmp_path: Path) -> None:
    runner = FakeRunner()
    seen: list[tuple[int, int]] = []
    res = sync(str(src), str(tmp_path / "dst"), runner=runner, copy_progress=lambda d, t: seen.append((d, t)))
    assert res.ok and res.verify is not None and res.verify.checked == 2
    assert seen == [(1024, 5005)]  # rsync --info=progress2 parsed into bytes done / total
    argv = runner.calls[0]
    assert argv[:3] == ["rsync", "-aHS", "--partial"] and argv[-2].endswith("/") and argv[-1].endswith("/")
    assert (tmp_path / "dst" / MANIFEST_NAME).is_file()


def test_corruption_after_copy_is_caught_and_named(src: Path, tmp_path: Path) -> None:
    res = sync(str(src), str(tmp_path / "dst"), runner=FakeRunner(corrupt="log.txt"))
    assert res.copied and not res.verified and not res.ok
    assert res.verify is not None and res.verify.changed == ["log.txt"]
    assert "--checksum" in res.message


def test_interrupted_copy_is_reported_resumable_and_not_verified(src: Path, tmp_path: Path) -> None:
    res = sync(str(src), str(tmp_path / "dst"), runner=FakeRunner(returncode=20))
    assert not res.copied and not res.ok and res.verify is None
    assert "again to resume" in res.fix and "exited 20" in res.message
    assert res.error_line == "rsync error: interrupted"  # the tool's own words are shown


def test_missing_tool_and_bad_source_are_errors_for_people(src: Path, tmp_path: Path) -> None:
    with pytest.raises(GpureadyError, match="apt-get install rsync"):
        sync(str(src), str(tmp_path / "d"), runner=FakeRunner(tools=()))
    with pytest.raises(InputError) as info:
        sync(str(tmp_path / "nope"), str(tmp_path / "d"), runner=FakeRunner())
    assert info.value.field == "SRC"


def test_rclone_remote_is_detected_and_checked_one_way(src: Path) -> None:
    runner = FakeRunner(tools=("rsync", "rclone"))
    runner.outputs = {"listremotes": "gdrive:\ns3:\n", "check": "= log.txt\n* ckpt/a.bin\n+ new.bin\n"}
    assert target_kind("gdrive:backup/run1", runner) == "rclone"
    assert target_kind("user@host:/data", runner) == "ssh"
    assert target_kind("/mnt/data", runner) == "local"
    res = sync(str(src), "gdrive:backup/run1", runner=runner)
    assert res.target == "rclone" and res.differences == ["ckpt/a.bin", "new.bin"] and not res.ok
    assert ["rclone", "check", str(src), "gdrive:backup/run1", "--one-way", "--combined", "-"] in runner.calls


def test_rsync_argv_keeps_partial_files_and_never_copies_our_manifest() -> None:
    argv = rsync_argv("/a/", "/b", checksum=True)
    assert "--partial" in argv and "--checksum" in argv
    assert f"--exclude=/{MANIFEST_NAME}" in argv and argv[-2:] == ["/a/", "/b/"]


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync not installed (Debian package rsync)")
def test_real_rsync_resumes_after_an_interrupted_copy(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    first = sync(str(src), str(dst), runner=SubprocessRunner(), timeout=60)
    assert first.ok
    # simulate the state an interrupted copy leaves: one file missing, one cut short
    (dst / "log.txt").unlink()
    (dst / "ckpt" / "a.bin").write_bytes(b"a" * 100)
    again = sync(str(src), str(dst), runner=SubprocessRunner(), timeout=60)
    assert again.ok and again.verify is not None and again.verify.checked == 2
    assert (dst / "log.txt").read_text() == "hello"


def test_subprocess_runner_times_out_and_streams_lines() -> None:
    runner = SubprocessRunner()
    lines: list[str] = []
    script = "print('a'); print('b\\rc', flush=True)"
    res = runner.run(["python3", "-c", script], timeout=30, on_line=lines.append)
    assert res.returncode == 0 and lines == ["a", "b", "c"]
    slow = runner.run(["python3", "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow.timed_out and slow.returncode != 0
    missing = runner.run(["/nonexistent/tool"], timeout=5)
    assert missing.returncode == 127
