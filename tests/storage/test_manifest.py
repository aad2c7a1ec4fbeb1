import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.storage.manifest import (
    create_manifest,
    format_line,
    parse_line,
    read_manifest,
    verify_manifest,
)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    (root / "ckpt" / "step_10").mkdir(parents=True)
    (root / "ckpt" / "step_10" / "model.safetensors").write_bytes(os.urandom(300_000))
    (root / "log.txt").write_text("loss 1.0\n")
    (root / "odd\\name").write_bytes(b"backslash")
    (root / "new\nline").write_bytes(b"newline")
    (root / "empty").write_bytes(b"")
    os.symlink("/etc/hostname", root / "outside_link")
    return root


def test_lines_round_trip_with_the_b3sum_escape_rule() -> None:
    assert format_line("ab" * 32, "a/b.txt") == f"{'ab' * 32}  a/b.txt\n"
    line = format_line("cd" * 32, "we\\ird\nname")
    assert line.startswith("\\cd") and "we\\\\ird\\nname" in line
    assert parse_line(line) == ("cd" * 32, "we\\ird\nname")
    assert parse_line(f"{'ef' * 32} *binary.bin") == ("ef" * 32, "binary.bin")
    assert parse_line("# a comment") is None


def test_create_then_verify_clean_tree(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.b3"
    made = create_manifest(data, out)
    assert made.complete and made.files == 5 and made.symlinks_skipped == 1
    meta = json.loads((tmp_path / "m.b3.json").read_text())
    assert meta["files"] == 5 and meta["total_bytes"] == 300_000 + 9 + 9 + 7 and meta["algorithm"] == "blake3"
    res = verify_manifest(out, data)
    assert res.ok and res.checked == 5 and res.bytes_read == meta["total_bytes"]


def test_verify_names_every_changed_missing_and_extra_file(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.b3"
    create_manifest(data, out)
    (data / "log.txt").write_text("loss 0.5\n")  # same size, different content
    (data / "ckpt" / "step_10" / "model.safetensors").unlink()
    (data / "extra.bin").write_bytes(b"new")
    (data / "empty").write_bytes(b"grown")  # size differs: found without hashing
    res = verify_manifest(out, data)
    assert not res.ok
    assert res.changed == ["empty", "log.txt"]
    assert res.missing == ["ckpt/step_10/model.safetensors"]
    assert res.extra == ["extra.bin"]


def test_a_manifest_cut_short_is_detected(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.b3"
    create_manifest(data, out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]))
    res = verify_manifest(out, data)
    assert res.incomplete_manifest and res.extra and not res.ok


def test_sha256_manifest_matches_hashlib_and_recorded_root_is_information_only(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.sha256"
    made = create_manifest(data, out)
    assert made.algorithm == "sha256"
    entries, bad = read_manifest(out)
    assert bad == 0
    assert entries["log.txt"] == hashlib.sha256(b"loss 1.0\n").hexdigest()
    res = verify_manifest(out)
    # the sidecar's root is information only; without DIR the manifest's own folder is checked (as b3sum -c)
    assert res.recorded_root == str(data.resolve()) and res.root == str(tmp_path) and not res.ok


def test_manifest_inside_the_tree_is_not_an_extra_file(data: Path) -> None:
    out = data / "MANIFEST.b3"
    create_manifest(data, out)
    assert "MANIFEST.b3" not in read_manifest(out)[0]
    assert verify_manifest(out).ok


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        create_manifest(tmp_path / "nope", tmp_path / "m.b3")
    assert info.value.field == "DIR"
    with pytest.raises(InputError) as info:
        verify_manifest(tmp_path / "missing.b3", tmp_path)
    assert info.value.field == "FILE"
    with pytest.raises(InputError) as info:
        create_manifest(tmp_path, tmp_path / "m.b3", algorithm="md5")
    assert info.value.field == "--algo"


@pytest.mark.parametrize(("tool", "name"), [("b3sum", "m.b3"), ("sha256sum", "m.sha256")])
def test_standard_tools_accept_our_manifest(data: Path, tmp_path: Path, tool: str, name: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (Debian package b3sum / coreutils)")
    out = tmp_path / name
    create_manifest(data, out)
    proc = subprocess.run([tool, "-c", str(out)], cwd=data, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": OK") == 5
