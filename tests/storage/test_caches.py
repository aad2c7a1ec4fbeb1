import os
from pathlib import Path

from gpuready.storage.caches import (
    cache_reports,
    choose_data_folder,
    load_caches,
    project_folders,
    resolve_location,
    tree_usage,
)
from gpuready.storage.mounts import mount_map

HF = ("$HF_HUB_CACHE", "$HF_HOME/hub", "$XDG_CACHE_HOME/huggingface/hub", "~/.cache/huggingface/hub")


def test_every_cache_row_has_a_source_and_a_variable() -> None:
    for c in load_caches():
        assert c.source and c.env and c.paths, c.name


def test_location_precedence_follows_the_documented_order() -> None:
    assert resolve_location(HF, {}, "/root", "root") == "/root/.cache/huggingface/hub"
    assert resolve_location(HF, {"XDG_CACHE_HOME": "/x"}, "/root", "root") == "/x/huggingface/hub"
    env = {"XDG_CACHE_HOME": "/x", "HF_HOME": "/h"}
    assert resolve_location(HF, env, "/root", "root") == "/h/hub"
    assert resolve_location(HF, {**env, "HF_HUB_CACHE": "/c"}, "/root", "root") == "/c"
    assert resolve_location(HF, {"HF_HOME": ""}, "/r", "root") == "/r/.cache/huggingface/hub"  # empty = unset


def _machine(tmp_path: Path) -> tuple[Path, Path, str]:
    """A fake rental machine inside tmp_path: / is the system disk, <tmp>/data a data disk."""
    home = tmp_path / "root"
    data = tmp_path / "data"
    data.mkdir()
    mountinfo = f"1 0 0:40 / / rw - overlay overlay rw\n2 1 253:16 / {data} rw - xfs /dev/vdb rw\n"
    return home, data, mountinfo


def test_caches_on_the_system_disk_get_exact_move_commands(tmp_path: Path) -> None:
    home, data, mountinfo = _machine(tmp_path)
    blob = home / ".cache" / "huggingface" / "hub" / "models--a--b" / "blobs" / "x"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"w" * 10_000)
    (home / ".cache" / "pip").mkdir(parents=True)
    usage = {"/": (30 * 10**9, 10**9, 29 * 10**9), str(data): (10**11, 9 * 10**10, 10**10)}
    mm = mount_map(mountinfo, usage=usage.get, exists=lambda p: False, home=str(home), cwd=str(tmp_path))
    assert choose_data_folder(mm) == str(data)
    reports = {c.name: c for c in cache_reports(mm, env={}, home=str(home), user="root")}
    hub = reports["huggingface-hub"]
    assert hub.exists and hub.on_system_disk and hub.size_bytes is not None and hub.size_bytes >= 10_000
    assert hub.move_to == f"{data}/huggingface/hub"
    assert hub.commands[0] == f"mkdir -p {data}/huggingface && mv {hub.path} {data}/huggingface/hub"
    assert f"export HF_HOME={data}/huggingface" in hub.commands
    assert reports["conda-pkgs"].commands[-1] == f"conda config --add pkgs_dirs {data}/conda/pkgs"
    assert not reports["modelscope"].exists and reports["modelscope"].size_bytes == 0


def test_caches_already_on_the_data_disk_need_no_move(tmp_path: Path) -> None:
    home, data, mountinfo = _machine(tmp_path)
    (data / "hf" / "hub").mkdir(parents=True)
    mm = mount_map(mountinfo, usage=lambda p: None, exists=lambda p: False, home=str(home), cwd=str(home))
    reports = {c.name: c for c in cache_reports(mm, env={"HF_HOME": str(data / "hf")}, home=str(home))}
    hub = reports["huggingface-hub"]
    assert hub.on_system_disk is False and hub.commands == [] and hub.env_set == str(data / "hf")


def test_tree_usage_counts_hard_links_once_and_skips_symlinks(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 8192)
    os.link(tmp_path / "f", tmp_path / "g")
    os.symlink("/usr", tmp_path / "usr_link")
    u = tree_usage(str(tmp_path))
    assert u.files == 1 and u.bytes == os.stat(tmp_path / "f").st_blocks * 512


def test_project_folders_find_checkpoints_and_tensorboard_logs(tmp_path: Path) -> None:
    home, _data, mountinfo = _machine(tmp_path)
    proj = tmp_path / "proj"
    (proj / "out" / "checkpoint-500").mkdir(parents=True)
    (proj / "out" / "checkpoint-500" / "model.safetensors").write_bytes(b"m" * 4096)
    (proj / "logs" / "exp1").mkdir(parents=True)
    (proj / "logs" / "exp1" / "events.out.tfevents.123.host").write_bytes(b"e")
    (proj / "src").mkdir()
    mm = mount_map(mountinfo, usage=lambda p: None, exists=lambda p: False, home=str(home), cwd=str(proj))
    found = {Path(p.path).name: p for p in project_folders(mm, str(proj))}
    assert set(found) == {"checkpoint-500", "exp1"}
    assert found["checkpoint-500"].kind == "checkpoint-*" and found["checkpoint-500"].on_system_disk
    assert found["exp1"].kind == "tensorboard"
