import json
import os
from pathlib import Path

import pytest

from gpuready.cli.app import main


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    (root / "x").mkdir(parents=True)
    body = os.urandom(20_000)
    (root / "a.bin").write_bytes(body)
    (root / "x" / "b.bin").write_bytes(body)
    return root


def test_dupes_json_follows_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    assert main(["storage", "dupes", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (group,) = data["groups"]
    assert {"size", "paths", "reclaimable_bytes"} <= set(group)
    assert group["size"] == 20_000 and group["reclaimable_bytes"] == 20_000 and len(group["paths"]) == 2


def test_dupes_remove_needs_yes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    assert main(["storage", "dupes", str(root), "--remove"]) == 0
    assert "add --yes" in capsys.readouterr().out and (root / "x" / "b.bin").exists()
    assert main(["storage", "dupes", str(root), "--remove", "--yes", "--dry-run"]) == 0
    assert (root / "x" / "b.bin").exists()
    capsys.readouterr()
    assert main(["storage", "dupes", str(root), "--remove", "--yes", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["action"] == "remove" and data["applied"]["freed_bytes"] == 20_000
    assert not (root / "x" / "b.bin").exists() and (root / "a.bin").exists()


def test_manifest_create_and_verify_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    out = tmp_path / "m.b3"
    assert main(["manifest", "create", str(root), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 2
    assert main(["manifest", "verify", str(out), str(root)]) == 0
    (root / "a.bin").write_bytes(b"changed")
    (root / "c.bin").write_bytes(b"new")
    assert main(["manifest", "verify", str(out), "--root", str(root)]) == 1
    text = capsys.readouterr().out
    assert "changed: a.bin" in text and "extra: c.bin" in text


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["storage", "dupes", str(tmp_path), "--min-size", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--min-size" in err
    assert main(["storage", "dupes", str(tmp_path / "nope")]) == 2
    assert main(["manifest", "verify", str(tmp_path / "nope.b3")]) == 2


def test_storage_json_has_mounts_caches_and_advice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["storage", "--fast", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"mounts", "caches", "advice", "layout", "projection"} <= set(data)
    assert any(m["mount_point"] == "/" and m["kind"] == "system" for m in data["mounts"])
