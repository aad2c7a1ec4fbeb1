"""`storage dupes` on adversarial trees (issue 9). Each test builds a real tree, acts, and checks that every
distinct content is still there and every link still resolves. The tests named after an issue 9 failure
fail on the code before the fix (blob names trusted, mtime read at plan time, kept copy checked by size)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuready.storage.dedupe import DedupePlan, PlanStep, apply_plan, make_plan
from gpuready.storage.dupes import find_duplicates

from .conftest import ODD_NAMES, assert_nothing_lost, git, hf_repo, state, write

MIB = 1 << 20


def _plan_and_apply(roots: list[Path], action: str, **kw: object) -> tuple[DedupePlan, object]:
    plan = make_plan(find_duplicates(roots), action)
    return plan, apply_plan(plan, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ HF caches


@pytest.mark.parametrize("action", ["hardlink", "remove"])
def test_corrupt_blob_under_a_valid_sha256_name_is_never_grouped(tmp_path: Path, action: str) -> None:
    good = os.urandom(300_000)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 1  # one byte in the middle: same size, same head and tail
    sha = hashlib.sha256(good).hexdigest()
    hub = tmp_path / "hub"
    hf_repo(hub, "org/a", {"model.safetensors": good})
    hf_repo(hub, "org/b", {"model.safetensors": bytes(bad)}, blob_name={"model.safetensors": sha})
    before = state(hub)
    report = find_duplicates([hub])
    assert report.groups == []  # the names agree, the bytes do not
    _plan_and_apply([hub], action)
    assert_nothing_lost(before, hub)
    assert (hub / "models--org--a" / "blobs" / sha).read_bytes() == good


def test_remove_on_a_hub_cache_links_shared_blobs_and_every_snapshot_still_resolves(tmp_path: Path) -> None:
    shared, own_a, own_b = os.urandom(200_000), os.urandom(5000), os.urandom(7000)
    hub = tmp_path / "hub"
    a = hf_repo(hub, "org/base", {"model.safetensors": shared, "config.json": own_a})
    b = hf_repo(hub, "org/finetune", {"model.safetensors": shared, "sub/tok.json": own_b})
    local = write(tmp_path / "local_dir" / "model.safetensors", shared)  # a `local_dir` download: plain file
    before = state(hub, tmp_path / "local_dir")
    plan = make_plan(find_duplicates([hub, tmp_path / "local_dir"]), "remove")
    by_path = {s.path: s for s in plan.steps}
    blob_b = str(b / "blobs" / hashlib.sha256(shared).hexdigest())
    blob_a = str(a / "blobs" / hashlib.sha256(shared).hexdigest())
    # the plain copy is the one removed; of the two blobs one is kept and the other hard-linked, never removed
    assert by_path[str(local)].action == "remove"
    linked = [s for s in plan.steps if s.path in (blob_a, blob_b)]
    assert len(linked) == 1 and linked[0].action == "hardlink" and "snapshot" in linked[0].note
    res = apply_plan(plan)
    assert sorted(res.done) == sorted([str(local), linked[0].path]) and not res.skipped
    assert os.stat(blob_a).st_ino == os.stat(blob_b).st_ino
    assert_nothing_lost(before, hub)
    for repo in (a, b):
        for snap in (repo / "snapshots").rglob("*"):
            if snap.is_symlink():
                assert snap.resolve(strict=True).is_file()
    assert (b / "snapshots").rglob("model.safetensors").__next__().read_bytes() == shared
    assert not (tmp_path / "local_dir" / "model.safetensors").exists()


def test_blobs_on_another_filesystem_are_protected_not_removed(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    data = os.urandom(100_000)
    hub1 = tmp_path / "hub"
    hub2 = Path(tempfile.mkdtemp(dir=shm))
    try:
        hf_repo(hub1, "org/x", {"w.bin": data})
        hf_repo(hub2, "org/x", {"w.bin": data})
        before = state(hub1, hub2)
        plan, _ = _plan_and_apply([hub1, hub2], "remove")
        assert plan.steps == [] and any("another filesystem" in p.reason for p in plan.protected)
        assert_nothing_lost(before, hub1, hub2)
    finally:
        import shutil

        shutil.rmtree(hub2)


# ------------------------------------------------------------------------------------------ git


def test_remove_on_two_git_clones_never_removes_objects_and_git_log_still_works(
    two_clones: tuple[Path, Path],
) -> None:
    a, b = two_clones
    before = state(a, b)
    plan = make_plan(find_duplicates([a, b]), "remove")
    packs = [s for s in plan.steps if "/.git/objects/" in s.path]
    assert packs and all(s.action == "hardlink" and "git clone --reference" in s.note for s in packs)
    assert not any("/.git/" in s.path and "/objects/" not in s.path for s in plan.steps)  # HEAD, index...
    assert any(p.reason.startswith("git metadata") for p in plan.protected)
    res = apply_plan(plan)
    assert not res.skipped
    assert_nothing_lost(before, a, b)
    for clone in (a, b):
        assert git("log", "--oneline", cwd=clone).returncode == 0
        fsck = git("fsck", "--full", cwd=clone)
        assert fsck.returncode == 0, fsck.stderr


# ------------------------------------------------------------------------------------------ races


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    body = os.urandom(MIB)
    return write(tmp_path / "a" / "keep.bin", body), write(tmp_path / "b" / "copy.bin", body)


def test_a_copy_edited_after_the_scan_is_skipped_even_when_planned_later(pair: tuple[Path, Path]) -> None:
    keep, copy = pair
    report = find_duplicates([keep.parent, copy.parent])
    copy.write_bytes(b"my edit, made after the scan".ljust(MIB, b"."))  # same size, new mtime
    before = state(keep.parent, copy.parent)
    plan = make_plan(report, "remove")  # planned after the edit: the old code read mtime here
    res = apply_plan(plan)
    assert res.done == [] and res.skipped == [(str(copy), "changed since the scan")]
    assert_nothing_lost(before, keep.parent, copy.parent)


def test_kept_copy_changed_in_place_with_its_mtime_restored_is_caught_by_the_re_hash(
    pair: tuple[Path, Path],
) -> None:
    keep, copy = pair
    plan = make_plan(find_duplicates([keep.parent, copy.parent]), "remove")
    st = keep.stat()

    def tamper(step: PlanStep) -> None:  # between scan and act: same size, same mtime, different bytes
        with open(keep, "r+b") as fh:
            fh.seek(MIB // 2)
            fh.write(b"X")
        os.utime(keep, ns=(st.st_atime_ns, st.st_mtime_ns))

    before_state = None

    def snap(step: PlanStep) -> None:
        nonlocal before_state
        tamper(step)
        before_state = state(keep.parent, copy.parent)

    res = apply_plan(plan, recheck_after=0.0, before_step=snap)
    assert res.done == [] and "no longer holds the scanned content" in res.skipped[0][1]
    assert before_state is not None
    assert_nothing_lost(before_state, keep.parent, copy.parent)


def test_kept_copy_rewritten_after_the_scan_is_caught_without_a_re_hash(pair: tuple[Path, Path]) -> None:
    keep, copy = pair
    plan = make_plan(find_duplicates([keep.parent, copy.parent]), "hardlink")
    keep.write_bytes(os.urandom(MIB))  # same size: the old code checked the kept copy's size only
    before = state(keep.parent, copy.parent)
    res = apply_plan(plan, recheck_after=3600)
    assert res.done == [] and "kept copy" in res.skipped[0][1]
    assert_nothing_lost(before, keep.parent, copy.parent)


@pytest.mark.parametrize("action", ["remove", "hardlink"])
def test_a_write_between_the_check_and_the_rename_is_caught(pair: tuple[Path, Path], action: str) -> None:
    keep, copy = pair
    plan = make_plan(find_duplicates([keep.parent, copy.parent]), action)
    snapshots = []

    def write_late(step: PlanStep) -> None:
        with open(copy, "r+b") as fh:
            fh.write(b"late write")
        os.utime(copy, ns=(0, copy.stat().st_mtime_ns + 10**9))
        snapshots.append(state(keep.parent, copy.parent))

    res = apply_plan(plan, before_commit=write_late)
    assert res.done == [] and "changed since the scan" in res.skipped[0][1]
    assert copy.read_bytes().startswith(b"late write")
    assert_nothing_lost(snapshots[0], keep.parent, copy.parent)
    assert not [p for p in copy.parent.iterdir() if ".gpuready-" in p.name]  # no temporary name left


def test_kept_copy_swapped_for_a_symlink_is_skipped(pair: tuple[Path, Path]) -> None:
    keep, copy = pair
    plan = make_plan(find_duplicates([keep.parent, copy.parent]), "remove")
    saved = keep.with_name("saved.bin")
    os.rename(keep, saved)
    os.symlink(copy, keep)  # removing copy now would leave the only bytes behind a dangling link
    before = state(keep.parent, copy.parent)
    res = apply_plan(plan)
    assert res.done == [] and copy.exists()
    assert_nothing_lost(before, keep.parent, copy.parent)


# ------------------------------------------------------------------------------------------ links, sparse


def test_hard_sym_and_loop_links_keep_resolving_after_remove(tmp_path: Path) -> None:
    t = tmp_path / "t"
    body = os.urandom(100_000)
    write(t / "a" / "x.bin", body)
    os.link(t / "a" / "x.bin", t / "a" / "x_hardlink.bin")  # one inode, two names: nothing to reclaim
    target = write(t / "b" / "y.bin", body)
    write(t / "c" / "z.bin", body)
    os.symlink("b/y.bin", t / "latest.bin")  # points at a duplicate
    os.symlink("loop2", t / "loop1")
    os.symlink("loop1", t / "loop2")
    os.symlink("nowhere", t / "dangling")
    os.symlink(".", t / "a" / "self")  # a folder loop
    before = state(t)
    plan = make_plan(find_duplicates([t]), "remove")
    # a symlink points at y.bin: it is the copy kept, and never a copy removed
    assert {s.keep for s in plan.steps} == {str(target)}
    res = apply_plan(plan)
    assert not res.skipped
    assert_nothing_lost(before, t)
    assert (t / "latest.bin").read_bytes() == body


def test_sparse_duplicates_are_grouped_and_linked(tmp_path: Path) -> None:
    a, b = tmp_path / "a.img", tmp_path / "b.img"
    for p in (a, b):
        with open(p, "wb") as fh:
            fh.truncate(64 * MIB)
            fh.seek(32 * MIB)
            fh.write(b"data in the middle")
    write(tmp_path / "c.img", b"")  # empty files are never grouped with anything (min size 1)
    before = state(tmp_path)
    (g,) = find_duplicates([tmp_path]).groups
    assert g.size == 64 * MIB
    _plan_and_apply([tmp_path], "hardlink")
    assert os.stat(a).st_ino == os.stat(b).st_ino
    assert_nothing_lost(before, tmp_path)


# ------------------------------------------------------------------------------------------ odd names


@pytest.mark.parametrize("action", ["remove", "hardlink"])
def test_every_odd_name_is_found_and_acted_on(tmp_path: Path, action: str) -> None:
    root = os.fsencode(tmp_path / "odd")
    os.mkdir(root)
    body = os.urandom(3000)
    for name in ODD_NAMES:
        os.mkdir(os.path.join(root, name))
        with open(os.path.join(root, name, name), "wb") as fh:
            fh.write(body)
    before = state(tmp_path / "odd")
    report = find_duplicates([tmp_path / "odd"])
    (g,) = report.groups
    assert sorted(os.fsencode(p) for p in g.paths) == sorted(os.path.join(root, n, n) for n in ODD_NAMES)
    json.dumps(report.to_json())  # names that are not UTF-8 still serialise
    plan, _ = _plan_and_apply([tmp_path / "odd"], action)
    assert len(plan.steps) == len(ODD_NAMES) - 1
    assert_nothing_lost(before, tmp_path / "odd")


# ------------------------------------------------------------------------------------------ unreadable


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gpuready.storage.dupes import find_duplicates
r = find_duplicates([sys.argv[2]])
print(json.dumps({"dirs": r.unreadable_dirs, "files": r.unreadable_files, "groups": [g.paths for g in r.groups]}))
"""


def test_unreadable_files_and_folders_as_an_unprivileged_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("builds the tree as root and scans it as nobody")
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop privileges")
    top = Path(tempfile.mkdtemp(prefix="gpuready-unreadable-"))  # pytest's tmp_path is 0700 root-only
    try:
        top.chmod(0o755)
        body = os.urandom(20_000)
        for p in ("ok/a.bin", "ok/b.bin", "locked/c.bin", "ok/secret.bin"):
            write(top / p, body)
        for d in (top / "ok", top / "locked"):
            d.chmod(0o755)
        for f in top.rglob("*.bin"):
            f.chmod(0o644)
        (top / "locked").chmod(0o000)
        (top / "ok" / "secret.bin").chmod(0o000)
        src = str(Path(__file__).resolve().parents[2] / "src")
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", _CHILD, src,
             str(top)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["dirs"] == [str(top / "locked")]
        assert out["files"] == [str(top / "ok" / "secret.bin")]
        assert out["groups"] == [[str(top / "ok" / "a.bin"), str(top / "ok" / "b.bin")]]
    finally:
        (top / "locked").chmod(0o755)
        import shutil

        shutil.rmtree(top)


# ------------------------------------------------------------------------------------------ content proof


def test_every_candidate_byte_is_read_small_and_large(tmp_path: Path) -> None:
    small = os.urandom(10_000)
    large = os.urandom(3 * MIB)
    for i in range(3):
        write(tmp_path / f"s{i}", small)
        write(tmp_path / f"l{i}", large)
    r = find_duplicates([tmp_path])
    assert r.bytes_read >= 3 * len(small) + 3 * len(large)
    assert sorted(len(g.copies) for g in r.groups) == [3, 3]


def test_a_root_given_as_a_link_to_a_folder_is_scanned_and_a_link_to_a_file_is_never_acted_on(
    tmp_path: Path,
) -> None:
    body = os.urandom(4000)
    write(tmp_path / "real" / "a.bin", body)
    write(tmp_path / "real" / "b.bin", body)
    os.symlink(tmp_path / "real", tmp_path / "data")
    os.symlink(tmp_path / "real" / "b.bin", tmp_path / "file_link")
    (g,) = find_duplicates([tmp_path / "data"]).groups
    assert g.paths == [str(tmp_path / "data" / "a.bin"), str(tmp_path / "data" / "b.bin")]
    before = state(tmp_path)
    plan, _ = _plan_and_apply([tmp_path / "file_link", tmp_path / "real"], "remove")
    assert all(s.path != str(tmp_path / "file_link") for s in plan.steps)
    assert {s.keep for s in plan.steps} == {str(tmp_path / "real" / "b.bin")}  # the link's target is kept
    assert_nothing_lost(before, tmp_path)
    assert (tmp_path / "file_link").read_bytes() == body
