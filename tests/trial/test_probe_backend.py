"""The probe backend without a GPU: spec building, merging per-rank results, a child that dies."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuready.trial import runner
from gpuready.trial.backend import ProbeBackend, point_from_probe, probe_spec
from gpuready.workload import make_workload


def test_probe_spec_carries_the_preset_config_and_lora_targets() -> None:
    spec = probe_spec(make_workload(model="llama-3.2-1b", method="lora", batch=4))
    assert spec["config"]["model_type"] == "llama"
    assert spec["lora_targets"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert spec["workload"]["batch"] == 4
    assert probe_spec(make_workload(model="resnet50"))["kind"] == "vision"


def test_per_rank_results_merge_to_the_largest_peak() -> None:
    ranks = [
        {
            "ok": True,
            "rank": 0,
            "peak_allocated_bytes": 10,
            "peak_reserved_bytes": 12,
            "peak_device_bytes": 20,
            "step_seconds": 0.5,
            "gpu_total_bytes": 100,
        },
        {
            "ok": True,
            "rank": 1,
            "peak_allocated_bytes": 11,
            "peak_reserved_bytes": 13,
            "peak_device_bytes": 21,
            "step_seconds": 0.6,
        },
    ]
    point = point_from_probe({"batch": 2}, ranks, 3.0, per_rank=True)
    assert point.ok and point.peak_device_bytes == 21 and point.step_seconds == 0.6
    assert [r["rank"] for r in point.ranks] == [0, 1]
    oom = point_from_probe(
        {"batch": 2}, [ranks[0], {"ok": False, "error_kind": "oom", "error": "CUDA out of memory"}], 1
    )
    assert oom.status == "oom" and not oom.ok


def test_a_probe_child_that_dies_without_a_result_is_a_failed_point() -> None:
    def fake_run(argv: list[str], **kwargs: Any) -> runner.ProcessResult:
        return runner.ProcessResult(list(argv), -9, 2.0, output_tail=["Killed"])

    point = ProbeBackend(make_workload(model="gpt2"), run=fake_run).run_point({"batch": 1})
    assert not point.ok and point.status == "failed" and "signal 9" in (point.error or "")


def test_probe_reads_rank_files_when_launched_with_torchrun(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> runner.ProcessResult:
        seen["argv"] = argv
        out = Path(argv[-1])
        for rank in (0, 1):
            out.with_name(f"{out.name}.rank{rank}").write_text(
                json.dumps({"ok": True, "rank": rank, "peak_device_bytes": 100 + rank})
            )
        return runner.ProcessResult(list(argv), 0, 1.0)

    point = ProbeBackend(make_workload(model="gpt2"), nproc=2, run=fake_run).run_point({"batch": 1})
    assert "torch.distributed.run" in seen["argv"] and "--nproc_per_node=2" in seen["argv"]
    assert point.peak_device_bytes == 101 and len(point.ranks) == 2


def test_the_real_probe_reports_no_gpu_as_a_result_not_a_crash() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is for machines without a GPU")
    point = ProbeBackend(make_workload(model="gpt2", seq=64)).run_point({"batch": 1})
    assert point.status == "no_gpu" and not point.ok
    assert sys.executable  # ran in a child of this interpreter


def test_runner_ends_a_process_group_on_timeout(tmp_path: Path) -> None:
    # the child starts a grandchild that would outlive it; both must be gone after the timeout
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('started', flush=True)\ntime.sleep(600)\n"
    )
    result = runner.run([sys.executable, str(script)], timeout=1.0)
    assert result.timed_out and result.returncode is None
    import os
    import time

    import psutil

    assert result.pid is not None
    time.sleep(0.5)
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == result.pid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    assert alive == []


def test_emulating_a_smaller_card_caps_the_allocator_below_its_size() -> None:
    """`trial --gpu-memory 24GiB`: the probe's allocator may hold the card's size less the CUDA context that the
    estimator counts outside the allocator, so "fits" means the same thing in both."""
    import json as _json

    from gpuready.memory.estimate import device_overhead_bytes
    from gpuready.trial import api

    seen: list[dict[str, Any]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> runner.ProcessResult:
        spec_path = next(a for a in argv if a.endswith("spec.json"))
        seen.append(_json.loads(Path(spec_path).read_text(encoding="utf-8")))
        return runner.ProcessResult(list(argv), 1, 0.1, output_tail=["torch.OutOfMemoryError: CUDA out of memory"])

    w = make_workload(model="gpt2")
    result = api.trial_probe(w, emulate_gpu_bytes=24 * 2**30, predictor=None, run=fake_run)
    assert seen and seen[0]["memory_cap_bytes"] == 24 * 2**30 - device_overhead_bytes(w)
    assert result.points[0].status == "oom"


def test_memory_history_is_written_compactly_and_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's GPUREADY_PROBE_MEMORY_HISTORY output (with a fake torch.cuda.memory) is what
    gpuready.memory.history replays: actions, addresses, sizes, streams and interned frames."""
    from gpuready.memory.history import load_history, replay_history
    from gpuready.trial import probe_memory

    frame = {"filename": "/x/modeling_llama.py", "line": 64, "name": "forward"}
    trace = [
        {"action": "segment_alloc", "addr": 4096, "size": 20 * 2**20, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 4096, "size": 3 * 2**20, "stream": 0, "frames": [frame]},
        {"action": "free_requested", "addr": 4096, "size": 3 * 2**20, "stream": 0, "frames": [frame]},
        {"action": "free_completed", "addr": 4096, "size": 3 * 2**20, "stream": 0, "frames": [frame]},
    ]
    calls: list[object] = []

    class _Memory:
        @staticmethod
        def _snapshot() -> dict[str, object]:
            return {"device_traces": [trace], "segments": []}

        @staticmethod
        def _record_memory_history(**kwargs: object) -> None:
            calls.append(kwargs)

    class _Cuda:
        memory = _Memory()

        @staticmethod
        def current_device() -> int:
            return 0

    class _Torch:
        cuda = _Cuda()

    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "h.json"
    result = {"peak_reserved_bytes": 20 * 2**20, "peak_allocated_bytes": 3 * 2**20}
    probe_memory.write_history(_Torch(), result, str(out))
    assert calls == [{"enabled": None}]  # recording stopped once written
    assert result["memory_history"] == str(out)
    doc = load_history(out)
    assert doc["frames"][doc["events"][1][4]] == "forward@modeling_llama.py:64"
    replayed = replay_history(doc, "gpu")
    assert replayed.model_peak_reserved_bytes == 20 * 2**20
    assert replayed.trace_peak_allocated_bytes == 3 * 2**20


@pytest.mark.torch
@pytest.mark.parametrize("name", ["vit-base-patch16-224", "dinov2-base", "siglip-base-patch16-224-vision"])
def test_probe_builds_transformers_vision_models_and_trains_them_on_pixel_values(name: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from gpuready.trial import probe

    spec = probe_spec(make_workload(model=name, precision="bf16", batch=2, image_size=32))
    assert spec["kind"] == "vision" and spec["config"]["model_type"] in ("vit", "dinov2", "siglip_vision_model")
    # the probe builds on "cuda": a CPU stand-in for the device, the real torch otherwise
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    fake = SimpleNamespace(device=lambda _name: torch.device("cpu"), **dtypes)
    small = {**spec, "config": {**spec["config"], "num_hidden_layers": 1}}
    model = probe._build_vision(fake, small)
    assert next(model.parameters()).dtype == torch.bfloat16
    x = torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)  # not the config's size: positions interpolated
    loss = probe._vision_loss(torch, model, x, torch.tensor([0, 999]), small)
    loss.backward()
    unused = {"embeddings.mask_token", "dinov2.embeddings.mask_token"}  # DINOv2's, for masked pre-training only
    missing = [n for n, p in model.named_parameters() if p.grad is None and n not in unused]
    assert loss.ndim == 0 and not missing


def test_qlora_without_bitsandbytes_is_a_skip_that_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe builds QLoRA's 4-bit model with bitsandbytes (trial/qlora.py); where it is missing the point is
    # recorded as unsupported with the install command, not a crash
    torch = pytest.importorskip("torch")
    from gpuready.trial import probe

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    spec = probe_spec(make_workload(model="qwen2.5-0.5b", method="qlora", batch=1, seq=64))
    with pytest.raises(probe.ProbeSkip, match=r"pip install bitsandbytes"):
        probe._build_lm(torch, spec)


def test_the_probe_runs_autocast_as_the_workload_says() -> None:
    """mixed: bf16 autocast over fp32 weights; --autocast: autocast in the 16-bit weights' own dtype (the Trainer's
    bf16/fp16 switch); otherwise none."""
    import contextlib
    import types

    from gpuready.trial.probe import _autocast

    made: list[tuple[str, str]] = []

    def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager[None]:
        made.append((device, dtype))
        return contextlib.nullcontext()

    torch = types.SimpleNamespace(autocast=autocast, bfloat16="bf16", float16="fp16", float32="fp32")
    _autocast(torch, {"precision": "mixed"})
    _autocast(torch, {"precision": "fp16", "autocast": True})
    _autocast(torch, {"precision": "bf16", "autocast": True})
    assert isinstance(_autocast(torch, {"precision": "bf16", "autocast": False}), contextlib.nullcontext)
    assert made == [("cuda", "bf16"), ("cuda", "fp16"), ("cuda", "bf16")]


def test_the_probe_prepares_a_4bit_model_and_casts_adapters_as_the_workload_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--kbit-prep: peft's prepare_model_for_kbit_training before the adapters (checkpointing as the job says);
    --lora-dtype bf16: the trainable parameters cast to bf16 after get_peft_model (TRL's cast)."""
    import sys
    import types

    from gpuready.trial.probe import _apply_lora

    calls: list[str] = []

    class Param:
        def __init__(self, trains: bool) -> None:
            self.requires_grad, self.data = trains, types.SimpleNamespace(to=lambda dtype: f"cast:{dtype}")

    class Model:
        def __init__(self) -> None:
            self.params = [Param(True), Param(False)]

        def parameters(self) -> list[Param]:
            return self.params

    def prepare(model: Model, use_gradient_checkpointing: bool, gradient_checkpointing_kwargs: object) -> Model:
        calls.append(f"prepare ckpt={use_gradient_checkpointing}")
        return model

    def wrap(model: Model, cfg: object) -> Model:
        calls.append("get_peft_model")
        return model

    peft = types.SimpleNamespace(
        LoraConfig=lambda **kw: kw, get_peft_model=wrap, prepare_model_for_kbit_training=prepare
    )
    monkeypatch.setitem(sys.modules, "peft", peft)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(bfloat16="bf16"))
    job = {"lora_r": 16, "grad_ckpt": True, "kbit_prep": True, "lora_dtype": "bf16"}
    model = _apply_lora(Model(), {"workload": job})
    assert calls == ["prepare ckpt=True", "get_peft_model"]
    assert [p.data for p in model.params[:1]] == ["cast:bf16"] and not isinstance(model.params[1].data, str)
    calls.clear()
    _apply_lora(Model(), {"workload": {**job, "kbit_prep": False, "lora_dtype": "fp32"}})
    assert calls == ["get_peft_model"]


def test_a_model_without_an_sdpa_path_is_skipped_with_the_flag_to_use() -> None:
    # transformers refuses SDPA for a class with `_supports_sdpa = False` (Gemma 2 in 5.24: its attention
    # soft-caps the scores); the probe reports that as unsupported, naming --attn eager, not as a crash
    from gpuready.trial.probe import ProbeSkip, sdpa_or_skip

    def refuse() -> None:
        raise ValueError(
            "Gemma2ForCausalLM does not support an attention implementation through "
            "torch.nn.functional.scaled_dot_product_attention yet."
        )

    with pytest.raises(ProbeSkip, match="--attn eager"):
        sdpa_or_skip(refuse, "gemma2", "sdpa")
    with pytest.raises(ValueError):  # any other error, or eager asked for, is the job's fault as before
        sdpa_or_skip(refuse, "gemma2", "eager")
    assert sdpa_or_skip(lambda: 7, "llama", "sdpa") == 7


@pytest.mark.gpu
@pytest.mark.skipif(not Path("/dev/nvidia0").exists(), reason="needs an NVIDIA GPU")
def test_generation_is_timed_by_its_second_call_with_the_first_calls_peaks(tmp_path: Path) -> None:
    """The probe times a generation request by its second generate() call (warm: the first builds cuDNN's attention
    plans on Hopper) and the second call leaves the peaks as the first did (docs/calibration/gen_twice_h200.tsv)."""
    import subprocess

    spec, result = tmp_path / "spec.json", tmp_path / "result.json"
    job = make_workload(model="qwen2.5-0.5b", task="infer", batch=4, seq=128, new_tokens=16, precision="bf16")
    spec.write_text(json.dumps(probe_spec(job)), encoding="utf-8")
    cmd = [sys.executable, "-m", "gpuready.trial.probe", str(spec), str(result)]
    subprocess.run(cmd, check=True, timeout=600)
    r = json.loads(result.read_text(encoding="utf-8"))
    assert r["ok"] and r["generate_calls"] == 2 and len(r["step_times"]) == 2
    assert r["step_seconds"] == r["step_times"][1]
    assert r["first_step_peak_allocated_bytes"] == r["peak_allocated_bytes"]
    assert r["first_step_peak_reserved_bytes"] == r["peak_reserved_bytes"]
