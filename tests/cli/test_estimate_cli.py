from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuready.cli.app import main

# docs/cli.md: the keys `estimate --json` always has
CONTRACT_KEYS = {
    "params",
    "trainable_params",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "phase",
    "breakdown",
    "assumptions",
}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--method", "lora", "--json")
    data = json.loads(out)
    assert code == 0
    assert set(data) >= CONTRACT_KEYS
    assert "fits" not in data
    assert sum(data["breakdown"].values()) == data["peak_allocated_bytes"]


def test_gpu_memory_adds_fit_headroom_and_max_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--method", "lora", "--gpu-memory", "24GiB", "--json")
    data = json.loads(out)
    assert code == 1  # "no, it does not fit" is exit 1
    assert data["fits"] is False and data["max_batch"] == 0 and data["headroom_bytes"] < 0
    assert data["gpu_memory_bytes"] == 24 * 2**30
    # docs/cli.md: with a card, the fit by replay under its limit, and the CLI's mitigations
    card_keys = {"allocator_limit_bytes", "reserved_on_card_bytes", "cache_releases", "fit_rule", "mitigations"}
    assert set(data) >= card_keys and data["mitigations"]
    code, out, _ = run(capsys, "estimate", "llama-3.2-1b", "--gpu", "H100 SXM", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] is True and data["max_batch"] >= 1 and data["gpu"] == "H100 SXM"


def test_readable_view_shows_breakdown_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "qwen2.5-7b", "--method", "lora", "--grad-ckpt", "--gpu-memory", "80GB")
    assert code == 0
    for text in ("weights", "activations", "peak on the device", "fits", "assumptions"):
        assert text in out


def test_workload_file_is_read_and_flags_override_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('model = "llama-3.2-1b"\nbatch = 4\nseq = 512\n', encoding="utf-8")
    _, out, _ = run(capsys, "estimate", "--workload", str(f), "--json")
    base = json.loads(out)
    _, out, _ = run(capsys, "estimate", "--workload", str(f), "--batch", "8", "--json")
    assert json.loads(out)["peak_allocated_bytes"] > base["peak_allocated_bytes"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["estimate", "llama-3.1-8b", "--task", "serve"], "--task"),
        (["estimate", "llama-3.1-8b", "--batch", "0"], "--batch"),
        (["estimate", "llama-3.1-8b", "--batch", "many"], "--batch"),
        (["estimate", "llama-3.1-8b", "--gpu-memory", "lots"], "--gpu-memory"),
        (["estimate", "llama-3.1-8b", "--gpu", "tpu-v9"], "--gpu"),
        (["estimate", "not-a-model"], "MODEL"),
        (["estimate"], "MODEL"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


def test_the_cli_never_imports_torch_for_an_estimate() -> None:
    code = (
        "import sys; from gpuready.cli.app import main; "
        "rc = main(['estimate', 'llama-3.1-8b', '--method', 'lora', '--gpu-memory', '24GiB', '--json']); "
        "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
        "print(heavy, file=sys.stderr); sys.exit(0 if not heavy else 3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_python_dash_m_is_the_same_program() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuready", "estimate", "gpt2", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["params"] == 124_439_808


def test_sweep_json_gives_each_value_its_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuready.memory import estimate
    from gpuready.workload import make_workload

    code, out, _ = run(
        capsys, "estimate", "qwen2.5-0.5b", "--method", "lora", "--gpu-memory", "24GiB", "--sweep", "seq=512,4096",
        "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0
    assert data["variable"] == "seq" and data["gpu_memory_bytes"] == 24 << 30
    assert [p["values"] for p in data["points"]] == [{"seq": 512}, {"seq": 4096}]
    for point in data["points"]:
        alone = estimate(make_workload(model="qwen2.5-0.5b", method="lora", seq=point["values"]["seq"]), 24 << 30)
        assert point["peak_device_bytes"] == alone.peak_device_bytes
        assert point["fits"] is alone.fits and point["max_batch"] == alone.max_batch
        assert sum(point["breakdown"].values()) == point["peak_allocated_bytes"]
    assert data["points"][0]["max_batch"] > data["points"][1]["max_batch"]
    assert data["assumptions"]


def test_sweep_exits_1_when_a_value_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "estimate", "llama-3.1-8b", "--method", "lora", "--grad-ckpt", "--gpu-memory", "40GiB", "--sweep",
        "batch=1,16", "--json",
    )  # fmt: skip
    points = json.loads(out)["points"]
    assert code == 1
    assert [p["fits"] for p in points] == [True, False]
    assert points[0]["max_batch"] == points[1]["max_batch"] >= 1
    code, out, _ = run(capsys, "estimate", "gpt2", "--sweep", "batch=1,2", "--json")
    assert code == 0 and "fits" not in json.loads(out)["points"][0]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--sweep", "depth=1,2"], "--sweep"),
        (["--sweep", "batch=1,x"], "--sweep"),
        (["--sweep", "batch=1,2", "--batch", "4"], "--sweep"),
        (["--sweep", "batch=1,2", "--trace"], "--sweep"),
        (["--sweep", "seq=0,512"], "--seq"),
        (["--sweep", "batch=0,2"], "batch"),
    ],
)
def test_sweep_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], field: str) -> None:
    code, out, err = run(capsys, "estimate", "gpt2", *args)
    assert code == 2 and out == ""
    assert err.startswith(f"gpuready: error: {field}:") and err.count("\n") == 1
