"""Real trees for the adversarial storage tests (issue 9): Hugging Face caches, git clones, odd names, and the
invariant every action must keep: the set of distinct contents is unchanged and every link resolves."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

# Every name issue 9 lists, plus the classic shell traps. bytes, because one of them is not UTF-8.
ODD_NAMES: list[bytes] = [
    b"vt\x0bname",
    b"ff\x0cname",
    b"fs\x1cname",
    "nel\x85name".encode(),
    "ls\u2028name".encode(),
    b"cr\rname",
    b"ends with cr\r",
    b"nl\nname",
    b"back\\slash",
    b"bad\xffutf8",
    b" leading and trailing ",
    b"-starts-with-dash",
    b"star*and?glob[1]",
    "caf\u00e9 \u6a21\u578b".encode(),
]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@dataclass(frozen=True)
class TreeState:
    contents: frozenset[str]  # sha256 of every regular file's bytes
    resolving_links: frozenset[str]  # symlinks whose target exists


def state(*roots: Path) -> TreeState:
    contents: set[str] = set()
    links: set[str] = set()
    for root in roots:
        for folder, dirs, files in os.walk(os.fsencode(root)):
            for name in dirs + files:
                p = os.path.join(folder, name)
                if os.path.islink(p):
                    if os.path.exists(p):
                        links.add(os.fsdecode(p))
                elif name in files and os.path.isfile(p):
                    with open(p, "rb") as fh:
                        contents.add(hashlib.sha256(fh.read()).hexdigest())
    return TreeState(frozenset(contents), frozenset(links))


def assert_nothing_lost(before: TreeState, *roots: Path) -> None:
    after = state(*roots)
    assert after.contents == before.contents, "a distinct content was lost (or appeared)"
    dangling = before.resolving_links - after.resolving_links
    assert not dangling, f"links no longer resolve: {sorted(dangling)}"


def hf_repo(hub: Path, repo: str, files: dict[str, bytes], *, blob_name: dict[str, str] | None = None) -> Path:
    """A hub-cache repo the way huggingface_hub lays it out: blobs named by sha256 (LFS) and a snapshot of
    relative symlinks `snapshots/<rev>/<file> -> ../../blobs/<sha256>`; `blob_name` forces a file's blob name
    (a corrupt blob under a valid name)."""
    base = hub / f"models--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    for name, data in files.items():
        sha = (blob_name or {}).get(name) or hashlib.sha256(data).hexdigest()
        write(base / "blobs" / sha, data)
        link = base / "snapshots" / rev / name
        link.parent.mkdir(parents=True, exist_ok=True)
        depth = name.count("/")
        os.symlink("../" * (2 + depth) + f"blobs/{sha}", link)
    return base


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def two_clones(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    origin = tmp_path / "origin"
    origin.mkdir()
    assert git("init", "-q", cwd=origin).returncode == 0
    write(origin / "model.py", b"print('model')\n" * 200)
    write(origin / "weights.bin", os.urandom(40_000))
    assert git("add", ".", cwd=origin).returncode == 0
    assert git("commit", "-q", "-m", "one", cwd=origin).returncode == 0
    clones = []
    for name in ("clone_a", "clone_b"):
        # --no-local: real copies of the objects, as two clones from a server are
        res = git("clone", "-q", "--no-local", str(origin), str(tmp_path / name), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        clones.append(tmp_path / name)
    shutil.rmtree(origin)
    return clones[0], clones[1]
