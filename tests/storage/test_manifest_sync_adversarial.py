"""Manifests, sync and mounts on adversarial trees (issue 9): copied trees, odd names, interrupted and resumed
copies with the real rsync, nested folders, symlinked and in-memory mounts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.storage.manifest import create_manifest, read_manifest, verify_manifest
from gpuready.storage.mounts import mount_map
from gpuready.storage.runner import RunResult, SubprocessRunner
from gpuready.storage.sync import explain_error, sync

from .conftest import ODD_NAMES, assert_nothing_lost, state, write

SRC_DIR = str(Path(__file__).resolve().parents[2] / "src")
needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync not installed (apt-get install rsync)")


def _odd_tree(root: Path) -> Path:
    broot = os.fsencode(root)
    os.makedirs(broot, exist_ok=True)
    for i, name in enumerate(ODD_NAMES):
        os.mkdir(os.path.join(broot, name))
        with open(os.path.join(broot, name, name), "wb") as fh:
            fh.write(f"content {i}\n".encode())
    return root


# ------------------------------------------------------------------------------------------ manifests


def test_verify_of_a_copied_tree_reads_the_copy_not_the_original(tmp_path: Path) -> None:
    orig = write(tmp_path / "orig" / "model.bin", os.urandom(50_000)).parent
    create_manifest(orig, orig / "MANIFEST.b3")
    backup = tmp_path / "backup"
    shutil.copytree(orig, backup)
    with open(backup / "model.bin", "r+b") as fh:
        fh.seek(25_000)
        fh.write(b"\x00")  # bit rot in the backup only
    res = verify_manifest(backup / "MANIFEST.b3")  # the sidecar still names orig/ as the root
    assert res.root == str(backup) and res.changed == ["model.bin"] and not res.ok
    assert verify_manifest(orig / "MANIFEST.b3").ok
    if shutil.which("b3sum"):  # and the standard tool agrees
        proc = subprocess.run(["b3sum", "-c", "MANIFEST.b3"], cwd=backup, capture_output=True, text=True, check=False)
        assert proc.returncode != 0 and "model.bin: FAILED" in proc.stdout


def test_every_odd_name_round_trips_through_create_and_verify_with_no_tmp_left(tmp_path: Path) -> None:
    root = _odd_tree(tmp_path / "odd")
    made = create_manifest(root, tmp_path / "m.b3")
    assert made.complete and made.files == len(ODD_NAMES)
    assert not list(tmp_path.glob("*.tmp"))
    entries, bad = read_manifest(tmp_path / "m.b3")
    assert bad == 0 and len(entries) == len(ODD_NAMES)
    assert "bad\udcffutf8/bad\udcffutf8" in entries  # the raw byte, surrogate-escaped like os.scandir names
    res = verify_manifest(tmp_path / "m.b3", root)
    assert res.ok, res.to_json()


def test_a_manifest_that_cannot_be_written_leaves_no_tmp(tmp_path: Path) -> None:
    root = write(tmp_path / "d" / "f", b"x").parent
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.b3").mkdir()  # a folder where the manifest should go: replace() fails
    with pytest.raises(InputError):
        create_manifest(root, out / "m.b3" / ".." / "m.b3")
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize(("tool", "name"), [("b3sum", "m.b3"), ("sha256sum", "m.sha256")])
def test_standard_tools_check_every_odd_utf8_name(tmp_path: Path, tool: str, name: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (apt-get install b3sum / coreutils)")
    names = [n for n in ODD_NAMES if tool != "b3sum" or n != b"bad\xffutf8"]  # b3sum 1.2 refuses non-UTF-8
    root = tmp_path / "odd"
    broot = os.fsencode(root)
    os.makedirs(broot)
    for i, n in enumerate(names):
        with open(os.path.join(broot, n), "wb") as fh:
            fh.write(f"{i}".encode())
    create_manifest(root, tmp_path / name)
    proc = subprocess.run([tool, "-c", str(tmp_path / name)], cwd=root, capture_output=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(b": OK") == len(names)


# ------------------------------------------------------------------------------------------ sync: input


def test_sync_refuses_dest_inside_src_and_src_inside_dest_creating_nothing(tmp_path: Path) -> None:
    src = write(tmp_path / "src" / "f", b"x").parent
    os.symlink(src, tmp_path / "alias")
    for dest, field_text in (
        (src / "backup", "inside SRC"),
        (tmp_path / "alias" / "backup", "inside SRC"),  # hidden behind a symlink
        (src, "inside SRC"),
        (tmp_path, "SRC"),
    ):
        with pytest.raises(InputError) as info:
            sync(str(src), str(dest), runner=SubprocessRunner())
        assert info.value.field == "DEST" and field_text in str(info.value)
    assert sorted(p.name for p in src.iterdir()) == ["f"]


def test_rsync_error_line_and_a_fix_for_each_cause() -> None:
    cases = {
        "ssh: Could not resolve hostname gpu-box: Name or service not known": "does not resolve",
        'rsync: [receiver] mkstemp "/data/x" failed: Permission denied (13)': "permission",
        'rsync: [receiver] write failed on "/data/x": No space left on device (28)': "full",
    }
    for line, fix in cases.items():
        res = RunResult(("rsync",), 12, "", f"{line}\nrsync error: some files could not be transferred (code 23)\n")
        got_line, got_fix = explain_error(res)
        assert got_line == line and fix in got_fix


# ------------------------------------------------------------------------------------------ sync: real rsync


@needs_rsync
def test_second_hop_and_a_dest_with_files_of_its_own_verify(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "ckpt" / "w.bin", os.urandom(30_000)).parent.parent
    b, c = tmp_path / "b", tmp_path / "c"
    write(c / "mine.txt", b"already here")
    assert sync(str(a), str(b), runner=SubprocessRunner()).ok
    res = sync(str(b), str(c), runner=SubprocessRunner())  # b holds a's manifest: it is not part of the copy
    assert res.ok and res.verify is not None and res.verify.extra == ["mine.txt"], res.message
    assert (c / "mine.txt").read_bytes() == b"already here"
    listed = sync(str(b), str(c), runner=SubprocessRunner(), delete=True)  # --delete without --yes: a list
    assert not listed.copied and listed.to_delete == ["mine.txt"] and (c / "mine.txt").exists()
    done = sync(str(b), str(c), runner=SubprocessRunner(), delete=True, yes=True)
    assert done.ok and not (c / "mine.txt").exists()


@needs_rsync
def test_sync_keeps_hard_links_sparse_files_and_odd_names(tmp_path: Path) -> None:
    src = _odd_tree(tmp_path / "src")
    big = write(src / "big.bin", os.urandom(2_000_000))
    os.link(big, src / "big_link.bin")
    with open(src / "sparse.img", "wb") as fh:
        fh.truncate(100 << 20)
        fh.write(b"head")
    before = state(src)
    res = sync(str(src), str(tmp_path / "dst"), runner=SubprocessRunner())
    assert res.ok, res.message
    dst = tmp_path / "dst"
    assert os.stat(dst / "big.bin").st_ino == os.stat(dst / "big_link.bin").st_ino
    assert os.stat(dst / "sparse.img").st_blocks * 512 < 1 << 20  # 100 MiB apparent, holes kept
    assert_nothing_lost(before, src)
    assert state(dst).contents >= before.contents


def _rsync_pids(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"rsync") and any(marker.encode() in c for c in cmd):
            pids.append(int(p.name))
    return pids


@needs_rsync
@pytest.mark.parametrize("how", ["sigterm-to-gpuready", "ctrl-c-to-the-group"])
def test_stopping_gpuready_stops_rsync_reports_progress_and_a_rerun_resumes(tmp_path: Path, how: str) -> None:
    src = tmp_path / "src"
    for i in range(4):
        write(src / f"part{i}.bin", os.urandom(400_000))
    dest = tmp_path / "dst"
    argv = [sys.executable, "-m", "gpuready", "sync", str(src), str(dest), "--bwlimit", "300K", "--json"]
    env = {**os.environ, "PYTHONPATH": SRC_DIR}
    # a session of its own, like a terminal: Ctrl-C goes to the whole foreground group
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not _rsync_pids(str(dest)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _rsync_pids(str(dest)), "rsync never started"
    time.sleep(1.0)
    if how == "sigterm-to-gpuready":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    time.sleep(0.2)
    assert _rsync_pids(str(dest)) == [], "rsync kept copying after gpuready stopped"
    import json

    report = json.loads(out)
    assert report["interrupted"] and report["complete_files"] is not None and report["complete_files"] < 4
    assert "resume" in report["message"]
    res = sync(str(src), str(dest), runner=SubprocessRunner())
    assert res.ok and res.verify is not None and res.verify.checked == 4


# ------------------------------------------------------------------------------------------ mounts

_MOUNTS = """\
1 0 0:1 / / rw - overlay overlay rw
2 1 0:2 / /dev rw - tmpfs tmpfs rw
3 2 0:3 / /dev/shm rw - tmpfs shm rw
4 1 8:1 / {disk} rw - ext4 /dev/sdb1 rw
5 1 0:5 / {layer} rw - overlay overlay rw
"""


def test_a_path_through_a_symlink_or_on_dev_shm_is_shown_on_its_own_mount(tmp_path: Path) -> None:
    disk = tmp_path / "mnt" / "nvme"
    (disk / "data").mkdir(parents=True)
    layer = tmp_path / "layer"
    layer.mkdir()
    link = tmp_path / "data"
    os.symlink(disk / "data", link)
    sizes = {"/": (10, 1, 9), str(disk): (1000, 900, 100), "/dev/shm": (64, 60, 4), str(layer): (50, 40, 10)}
    m = mount_map(
        _MOUNTS.format(disk=disk, layer=layer),
        usage=lambda p: sizes.get(p),
        exists=lambda p: False,
        home="/root",
        cwd="/",
        extra_paths=[str(link), "/dev/shm/dataset"],
    )
    assert m.mount_for(str(link)).mount_point == str(disk)  # type: ignore[union-attr]
    by_mp = {i.mount_point: i for i in m.mounts}
    assert str(link) in by_mp[str(disk)].holds
    shm = by_mp["/dev/shm"]
    assert shm.kind == "memory" and shm.fstype == "tmpfs" and shm.free_bytes == 60 and "/dev/shm/dataset" in shm.holds
    assert by_mp[str(layer)].kind == "overlay" and by_mp[str(layer)].free_bytes == 40
    assert "/dev" not in by_mp  # plumbing stays hidden
