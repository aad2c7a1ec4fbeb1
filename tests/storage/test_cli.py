import json
import os
import sys
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


def test_dupes_text_prints_one_line_per_odd_name_and_a_plan_with_protected_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .conftest import ODD_NAMES, hf_repo

    root = os.fsencode(tmp_path / "odd")
    os.mkdir(root)
    body = os.urandom(2000)
    for name in ODD_NAMES:
        with open(os.path.join(root, name), "wb") as fh:
            fh.write(body)
    assert main(["storage", "dupes", str(tmp_path / "odd")]) == 0
    out = capsys.readouterr().out
    listed = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert len(listed) == len(ODD_NAMES)  # a newline or \x85 in a name never splits its line
    assert "bad\\xffutf8" in out and "\r" not in out and "\x0b" not in out
    weights = os.urandom(50_000)
    hf_repo(tmp_path / "hub", "org/a", {"w.bin": weights})
    hf_repo(tmp_path / "hub", "org/b", {"w.bin": weights})
    assert main(["storage", "dupes", str(tmp_path / "hub"), "--remove"]) == 0
    out = capsys.readouterr().out
    assert "hardlink" in out and "never removed" in out and "add --yes" in out


def test_shown_escapes_a_backslash_the_same_way_whatever_else_the_name_holds() -> None:
    from gpuready.cli.storage import shown

    # before: a backslash was doubled only when the name also held a control character ("a\\b" vs "a\b")
    assert shown("a\\b") == "a\\\\b"
    assert shown("a\\b\n") == "a\\\\b\\x0a"
    assert shown("plain name") == "plain name"


def test_shown_never_prints_two_different_names_alike() -> None:
    from gpuready.cli.storage import shown

    from .conftest import ODD_NAMES

    names = [os.fsdecode(n) for n in ODD_NAMES]
    names += [
        "x\\x0ay",  # a literal backslash, x, 0, a: before, printed like "x\ny"
        "x\ny",
        "nel\udc85",  # the byte 0x85, not UTF-8
        "nel\x85",  # the character U+0085 (bytes c2 85): before, printed like the byte
        "tab\\u0009",
        "tab\t",
        "hi\U000e0001",  # a non-printable character above U+FFFF
    ]
    printed = [shown(n) for n in names]
    assert len(set(printed)) == len(names)
    assert all(p.isprintable() for p in printed)
    assert shown("nel\udc85") == "nel\\x85" and shown("nel\x85") == "nel\\u0085"
    assert shown("hi\U000e0001") == "hi\\U000e0001"


def test_dupes_text_shows_a_backslash_name_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = os.urandom(3000)
    for name in ("back\\slash", "plain"):
        (tmp_path / name).write_bytes(body)
    assert main(["storage", "dupes", str(tmp_path)]) == 0
    listed = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ")]
    assert listed == [str(tmp_path / "back\\\\slash"), str(tmp_path / "plain")]


def test_manifest_verify_takes_dir_as_an_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    out = tmp_path / "m.b3"
    assert main(["manifest", "create", str(root), "-o", str(out)]) == 0
    assert main(["manifest", "verify", str(out)]) == 1  # tmp_path is not the tree: checked where it lies
    # the failure says where the manifest was made and the command that checks that folder
    text = " ".join(capsys.readouterr().out.split())
    assert f"made under {root.resolve()}" in text and f"manifest verify {out} {root.resolve()}" in text
    assert main(["manifest", "verify", str(out), str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["root"] == str(root) and data["recorded_root"] == str(root.resolve())
    assert main(["manifest", "verify", str(out), str(root), "--root", str(tmp_path)]) == 2


@pytest.mark.parametrize("n_groups", [0, 1, 3])
def test_dupes_json_is_written_group_by_group_as_the_same_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n_groups: int
) -> None:
    from gpuready.cli.storage import write_json_streaming
    from gpuready.storage.dedupe import make_plan
    from gpuready.storage.dupes import find_duplicates

    from .conftest import ODD_NAMES

    root = tmp_path / 'x"groups": null'  # the key's own text inside a path never splits the document
    root.mkdir()
    for g in range(n_groups):
        body = os.urandom(100 + g)
        for name in ODD_NAMES[: 2 + g]:
            with open(os.path.join(os.fsencode(root), name + str(g).encode()), "wb") as fh:
                fh.write(body)
    report = find_duplicates([root])
    assert len(report.groups) == n_groups
    data = report.to_json(groups=False)
    data["plan"] = make_plan(report, "hardlink").to_json()
    write_json_streaming(sys.stdout, data, "groups", (g.to_json() for g in report.groups))
    whole = {**report.to_json(), "plan": data["plan"]}
    assert capsys.readouterr().out == json.dumps(whole, indent=2) + "\n"


def test_the_progress_bar_draws_without_a_thread_so_dupes_may_fork_its_readers() -> None:
    import threading

    from gpuready.cli.storage import progress_bars

    with progress_bars(True) as update:
        for done in range(0, 10_000, 2048):
            update("hashing small files", done, 10_000)
            assert threading.active_count() == 1
