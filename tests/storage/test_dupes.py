import os
from pathlib import Path

import pytest

from gpuready.storage.dedupe import apply_plan, make_plan
from gpuready.storage.dupes import find_duplicates
from gpuready.storage.hashing import FileChangedError, hash_file

MIB = 1 << 20


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    body = os.urandom(MIB)
    _write(tmp_path / "a" / "model.bin", body)
    _write(tmp_path / "b" / "copy.bin", body)
    _write(tmp_path / "b" / "deep" / "copy2.bin", body)
    # same size, same head and tail, different middle: only the full hash can tell
    middle = bytearray(body)
    middle[MIB // 2] ^= 0xFF
    _write(tmp_path / "c" / "decoy_middle.bin", bytes(middle))
    # same size, different head: eliminated after reading 8 KiB
    head = bytearray(body)
    head[0] ^= 0xFF
    _write(tmp_path / "c" / "decoy_head.bin", bytes(head))
    _write(tmp_path / "small1.txt", b"hello")
    _write(tmp_path / "small2.txt", b"hello")
    _write(tmp_path / "unique.txt", b"something else entirely")
    return tmp_path


def test_groups_duplicates_and_rejects_same_size_decoys(tree: Path) -> None:
    r = find_duplicates([tree])
    groups = {tuple(Path(p).name for p in g.paths): g for g in r.groups}
    big = groups[("model.bin", "copy.bin", "copy2.bin")]
    assert big.size == MIB and big.reclaimable_bytes == 2 * MIB
    assert big.digest.startswith("blake3:")
    assert groups[("small1.txt", "small2.txt")].reclaimable_bytes == 5
    assert len(r.groups) == 2
    assert r.reclaimable_bytes == 2 * MIB + 5
    assert r.candidates_after_size == 7  # five 1 MiB files + two 5-byte files
    assert r.candidates_after_head_tail == 4  # the head decoy is gone; the middle decoy needs a full read
    # full reads: 4 MiB for the four survivors; partial: 8 KiB each for five 1 MiB files; 5 B each small file
    assert r.bytes_read == 4 * MIB + 5 * 8192 + 10


def test_hard_links_are_one_file_and_symlinks_are_not_followed(tmp_path: Path) -> None:
    body = os.urandom(100_000)
    _write(tmp_path / "t" / "x", body)
    os.link(tmp_path / "t" / "x", tmp_path / "t" / "x_link")
    outside = _write(tmp_path / "outside" / "same", body)
    os.symlink(outside, tmp_path / "t" / "to_outside")
    r = find_duplicates([tmp_path / "t"])
    assert r.groups == []  # two names of one inode reclaim nothing; the symlink leads out of the tree
    assert r.symlinks_skipped == 1
    _write(tmp_path / "t" / "y", body)
    r = find_duplicates([tmp_path / "t"])
    (g,) = r.groups
    assert len(g.paths) == 3 and len(g.inodes) == 2 and g.reclaimable_bytes == 100_000


def test_unreadable_folders_are_skipped_and_counted(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads folders with mode 000; this test needs an unprivileged user")
    _write(tmp_path / "ok" / "f", b"x")
    locked = tmp_path / "locked"
    _write(locked / "g", b"x")
    locked.chmod(0)
    try:
        r = find_duplicates([tmp_path])
    finally:
        locked.chmod(0o755)
    assert r.unreadable_dirs == [str(locked)]


def test_a_file_changing_while_hashed_is_reported_not_mis_hashed(tmp_path: Path) -> None:
    f = _write(tmp_path / "growing.bin", os.urandom(3 * MIB))

    def append(_n: int) -> None:
        with open(f, "ab") as fh:
            fh.write(b"more")

    with pytest.raises(FileChangedError):
        hash_file(str(f), on_bytes=append)
    assert hash_file(str(f)).bytes_read == f.stat().st_size


def test_plan_needs_apply_and_apply_rechecks_each_file(tree: Path) -> None:
    r = find_duplicates([tree])
    plan = make_plan(r, "hardlink")
    assert plan.reclaimable_bytes == 2 * MIB + 5
    assert all(Path(s.path).exists() for s in plan.steps)  # planning changes nothing
    # a copy modified after the scan is skipped, never acted on
    changed = next(s for s in plan.steps if s.path.endswith("copy2.bin"))
    os.utime(changed.path, ns=(0, changed.mtime_ns + 10**9))
    result = apply_plan(plan)
    assert (changed.path, "changed since the scan") in result.skipped
    keep = Path(tree / "a" / "model.bin")
    assert os.stat(tree / "b" / "copy.bin").st_ino == keep.stat().st_ino
    assert result.freed_bytes == MIB + 5
    rm = apply_plan(make_plan(find_duplicates([tree]), "remove"))
    assert not (tree / "b" / "deep" / "copy2.bin").exists() and keep.exists()
    assert rm.freed_bytes == MIB


def test_walk_counts_a_folder_it_cannot_list_and_goes_on(tmp_path: Path) -> None:
    from gpuready.storage.walk import WalkStats, walk_files

    _write(tmp_path / "ok" / "f", b"x")
    _write(tmp_path / "locked" / "g", b"y")

    def scandir(path: str) -> object:
        if path.endswith("locked"):
            raise PermissionError(13, "Permission denied", path)
        return os.scandir(path)

    stats = WalkStats()
    files = [e.rel for e in walk_files([tmp_path], stats, scandir=scandir)]
    assert files == ["ok/f"]
    assert stats.unreadable_dirs == [str(tmp_path / "locked")]


def test_small_files_sharing_their_first_bytes_are_told_apart_by_every_byte(tmp_path: Path) -> None:
    # small files are first keyed by their head; same size and same head must still compare the whole content
    base = bytearray(os.urandom(5000))
    last, middle = bytearray(base), bytearray(base)
    last[-1] ^= 1
    middle[2500] ^= 1
    for name, data in (("a", base), ("b", last), ("c", base), ("d", middle), ("e", last), ("f", base)):
        _write(tmp_path / name, bytes(data))
    _write(tmp_path / "g", bytes(middle[:100]) + b"x" * 4900)  # same size, same first 100 bytes, unique
    r = find_duplicates([tmp_path])
    assert sorted([Path(p).name for p in g.paths] for g in r.groups) == [["a", "c", "f"], ["b", "e"]]
    assert r.bytes_read == 7 * 5000 and not r.changed_files


def _small_race_tree(tmp_path: Path) -> tuple[Path, bytes]:
    body = os.urandom(3000)
    for name in ("a", "b", "c", "d"):
        _write(tmp_path / name, body)
    return tmp_path, body


@pytest.mark.parametrize("how", ["rewritten in place", "replaced by another file", "removed"])
def test_a_small_file_changed_between_listing_and_reading_is_reported_never_grouped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # the bytes compared must be those of the file the scan listed (size, mtime_ns, inode): checked per file
    from gpuready.storage import dupes

    root, body = _small_race_tree(tmp_path)
    listed = dupes._scan

    def scan_then_change(*args: object, **kwargs: object) -> object:
        sc = listed(*args, **kwargs)  # type: ignore[arg-type]
        victim = root / "b"
        if how == "rewritten in place":
            st = victim.stat()
            victim.write_bytes(body)  # the same bytes: only its mtime tells, and that is enough
            os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        elif how == "replaced by another file":
            _write(root / "b.new", body)
            os.replace(root / "b.new", victim)
        else:
            victim.unlink()
        return sc

    monkeypatch.setattr(dupes, "_scan", scan_then_change)
    r = find_duplicates([root])
    assert [sorted(Path(p).name for p in g.paths) for g in r.groups] == [["a", "c", "d"]]
    bad = r.unreadable_files if how == "removed" else r.changed_files
    assert bad == [str(root / "b")]
    assert r.bytes_read == 3 * 3000


def test_a_size_group_too_big_to_hold_is_keyed_by_digests_with_the_same_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a size group with more content than _HOLD is not held in memory: each file is keyed by its BLAKE3-256
    from gpuready.storage import dupes_read

    base = bytearray(os.urandom(5000))
    last, middle = bytearray(base), bytearray(base)
    last[-1] ^= 1
    middle[2500] ^= 1
    for name, data in (("a", base), ("b", last), ("c", base), ("d", middle), ("e", last), ("f", base)):
        _write(tmp_path / name, bytes(data))
    held = find_duplicates([tmp_path])
    monkeypatch.setattr(dupes_read, "_HOLD", 0)
    by_digest = find_duplicates([tmp_path])
    for r in (held, by_digest):
        assert sorted([Path(p).name for p in g.paths] for g in r.groups) == [["a", "c", "f"], ["b", "e"]]
        assert r.bytes_read == 6 * 5000 and not r.changed_files
    assert sorted(g.digest for g in held.groups) == sorted(g.digest for g in by_digest.groups)


def _many_sizes_tree(root: Path) -> list[list[str]]:
    """Size groups of small files: duplicates, same-size decoys (one byte changed), uniques; the expected groups."""
    expected = []
    for i in range(40):
        body = bytearray(os.urandom(1000 + i))
        names = [f"s{i}/copy{c}" for c in range(2 + i % 3)]
        for name in names:
            _write(root / name, bytes(body))
        body[len(body) // 2] ^= 1
        _write(root / f"s{i}/decoy", bytes(body))
        expected.append(sorted(str(root / n) for n in names))
    return sorted(expected)


def _same_report(a: object, b: object) -> None:
    from gpuready.storage.dupes import DupesReport

    assert isinstance(a, DupesReport) and isinstance(b, DupesReport)
    assert [(g.size, g.digest, g.paths) for g in a.groups] == [(g.size, g.digest, g.paths) for g in b.groups]
    assert (a.bytes_read, a.changed_files, a.unreadable_files) == (b.bytes_read, b.changed_files, b.unreadable_files)


def test_small_files_read_by_forked_children_give_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuready.storage import dupes_read

    expected = _many_sizes_tree(tmp_path)
    one = find_duplicates([tmp_path], workers=1)
    monkeypatch.setattr(dupes_read, "_FORK_MIN", 0)
    forks: list[int] = []
    real_fork = os.fork

    def counted_fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted_fork)
    three = find_duplicates([tmp_path], workers=3)
    assert len(forks) == 2
    assert sorted(sorted(g.paths) for g in one.groups) == expected
    _same_report(one, three)
    for pid in forks:  # every child was waited for: none is left as a zombie
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_child_that_dies_leaves_its_share_to_the_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuready.storage import dupes_read

    _many_sizes_tree(tmp_path)
    one = find_duplicates([tmp_path], workers=1)
    parent = os.getpid()
    real = dupes_read._small_groups

    def dies_in_a_child(*args: object) -> object:
        if os.getpid() != parent:
            os._exit(9)  # killed, out of memory, a crash: the same to the parent
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dupes_read, "_FORK_MIN", 0)
    monkeypatch.setattr(dupes_read, "_small_groups", dies_in_a_child)
    _same_report(one, find_duplicates([tmp_path], workers=2))


def test_no_fork_while_another_thread_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from gpuready.storage import dupes_read

    expected = _many_sizes_tree(tmp_path)

    def no_fork() -> int:
        raise AssertionError("forked while another thread ran")

    monkeypatch.setattr(dupes_read, "_FORK_MIN", 0)
    monkeypatch.setattr(os, "fork", no_fork)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        r = find_duplicates([tmp_path], workers=2)
    finally:
        stop.set()
        other.join()
    assert sorted(sorted(g.paths) for g in r.groups) == expected


def test_a_file_changed_after_listing_is_reported_by_a_forked_child_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuready.storage import dupes, dupes_read

    listed = dupes._scan
    monkeypatch.setattr(dupes_read, "_FORK_MIN", 0)

    def run(root: Path, workers: int) -> tuple[object, ...]:
        _many_sizes_tree(root)

        def scan_then_change(*args: object, **kwargs: object) -> object:
            sc = listed(*args, **kwargs)  # type: ignore[arg-type]
            for i in range(0, 40, 3):
                os.utime(root / f"s{i}/copy0", ns=(0, 10**18 + i))
            (root / "s1/copy1").unlink()
            return sc

        monkeypatch.setattr(dupes, "_scan", scan_then_change)
        r = find_duplicates([root], workers=workers)

        def rel(paths: list[str]) -> list[str]:
            return [os.path.relpath(p, root) for p in paths]

        return (sorted(rel(g.paths) for g in r.groups), rel(r.changed_files), rel(r.unreadable_files), r.bytes_read)

    one, two = run(tmp_path / "one", 1), run(tmp_path / "two", 2)
    assert len(one[1]) == 14 and one[2] == ["s1/copy1"]  # type: ignore[arg-type]
    assert one == two


@pytest.mark.parametrize("answer", [b"\x00" * 3, b"\x05\x00\x00\x00\x00\x00\x00\x00garbage", b"\xff" * 16])
def test_a_child_whose_answer_does_not_parse_leaves_its_share_to_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: bytes
) -> None:
    from gpuready.storage import dupes_read

    _many_sizes_tree(tmp_path)
    one = find_duplicates([tmp_path], workers=1)

    def garbled(fd: int, _found: object) -> None:
        os.write(fd, answer)

    monkeypatch.setattr(dupes_read, "_FORK_MIN", 0)
    monkeypatch.setattr(dupes_read, "_send", garbled)
    _same_report(one, find_duplicates([tmp_path], workers=2))
