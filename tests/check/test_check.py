"""`gpuready check` with the machine faked: no GPU, a ready GPU, a job that does not fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuready.check import check
from gpuready.doctor import Check, DoctorReport
from gpuready.trial.result import Point, TrialResult
from gpuready.workload import make_workload

GIB = 2**30


def report(ready: bool) -> DoctorReport:
    bad = Check("torch-build", "fail", "torch 2.5.1+cpu is a CPU-only build", "pip install torch --index-url ...")
    checks = (Check("nvidia-driver", "pass", "580.159"),) + (() if ready else (bad,))
    return DoctorReport(ready, checks, None if ready else bad, True, "ran", 0.1, 0.2)


def doctor_says(ready: bool) -> Any:
    return lambda requirements, fast: report(ready)


def trial_ran(peak: int) -> Any:
    def run(workload: Any, find_max: str | None, db: Any) -> TrialResult:
        point = Point(values={"batch": workload.batch}, ok=True, status="ok", peak_device_bytes=peak, step_seconds=0.2)
        return TrialResult("probe", workload.model, "batch", [point])

    return run


def installed(module: str) -> object:
    return object()  # every package the job imports is installed


def no_trial(*args: Any, **kwargs: Any) -> TrialResult:
    raise AssertionError("the trial must not run here")


def test_without_a_gpu_the_size_step_is_the_plan_and_the_trial_is_skipped(tmp_path: Path) -> None:
    w = make_workload(model="llama-3.2-1b", seq=1024)
    r = check(w, path=tmp_path, gpu_here=lambda: (None, None), run_doctor=doctor_says(False), run_trial=no_trial)
    steps = {s.name: s for s in r.steps}
    assert [s.name for s in r.steps] == ["task", "size", "image", "trial", "storage"]
    assert steps["size"].status == "warn" and steps["size"].data["cards"]
    assert any(c["gpu"] == "H100 SXM" and c["fits"] for c in steps["size"].data["cards"])
    assert steps["image"].status == "fail" and steps["trial"].status == "skip"
    assert r.ready is False
    assert "pip install torch --index-url ..." in r.fixes


def test_a_ready_gpu_that_holds_the_job_is_ready(tmp_path: Path) -> None:
    w = make_workload(model="llama-3.2-1b", seq=1024)
    r = check(
        w,
        path=tmp_path,
        gpu_here=lambda: (80 * GIB, "NVIDIA A100 80GB"),
        run_doctor=doctor_says(True),
        run_trial=trial_ran(9 * GIB),
        find_package=installed,
    )
    steps = {s.name: s for s in r.steps}
    assert steps["size"].status == "pass" and "NVIDIA A100 80GB" in steps["size"].summary
    assert steps["trial"].status == "pass" and "predicted" in steps["trial"].summary
    assert r.ready is True and r.fixes == []


def test_a_job_that_does_not_fit_fails_with_what_would(tmp_path: Path) -> None:
    w = make_workload(model="llama-3.1-8b", method="lora")
    r = check(
        w,
        path=tmp_path,
        gpu_here=lambda: (24 * GIB, "NVIDIA RTX 4090"),
        run_doctor=doctor_says(True),
        run_trial=trial_ran(20 * GIB),
        find_package=installed,
    )
    size = next(s for s in r.steps if s.name == "size")
    assert size.status == "fail" and r.ready is False
    assert any("--grad-ckpt" in f for f in r.fixes)


def test_cli_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuready.cli.app import main

    page = tmp_path / "report.html"
    code = main(["check", "gpt2", "--quick", "--json", "--html", str(page)])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["ready"] else 1)
    assert {"ready", "steps", "fixes"} <= set(data)
    assert all({"name", "status", "checks"} <= set(s) for s in data["steps"])
    assert "gpuready check" in page.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("fields", "missing", "fix"),
    [
        ({"method": "qlora"}, "bitsandbytes", "pip install bitsandbytes"),
        ({"optim": "adamw8bit"}, "bitsandbytes", "pip install bitsandbytes"),
        ({"attn": "flash"}, "flash_attn", "pip install flash-attn --no-build-isolation (or --attn sdpa)"),
        ({"method": "lora"}, "peft", "pip install peft"),
    ],
)
def test_a_package_the_job_imports_that_is_not_installed_fails_the_image(
    tmp_path: Path, fields: dict[str, Any], missing: str, fix: str
) -> None:
    # the doctor finds the image ready, but the job's own options import a package that is not there: the
    # image step fails with its install command and the trial does not run (it would stop on the ImportError)
    w = make_workload(model="llama-3.2-1b", seq=1024, **fields)
    r = check(
        w,
        path=tmp_path,
        gpu_here=lambda: (80 * GIB, "NVIDIA A100 80GB"),
        run_doctor=doctor_says(True),
        run_trial=no_trial,
        find_package=lambda module: None if module == missing else object(),
    )
    steps = {s.name: s for s in r.steps}
    assert steps["image"].status == "fail" and missing.replace("_", "-") in steps["image"].summary
    assert steps["trial"].status == "skip"
    assert fix in r.fixes and r.ready is False


def test_torchvision_models_need_torchvision_not_transformers(tmp_path: Path) -> None:
    looked: list[str] = []

    def find(module: str) -> object:
        looked.append(module)
        return object()

    check(
        make_workload(model="resnet50", batch=8),
        path=tmp_path,
        gpu_here=lambda: (80 * GIB, "NVIDIA A100 80GB"),
        run_doctor=doctor_says(True),
        run_trial=trial_ran(4 * GIB),
        find_package=find,
    )
    assert looked == ["torchvision"]


@pytest.mark.parametrize(
    ("framework", "fields", "wanted"),
    [
        # a torchtune recipe runs on torchtune, its QLoRA on torchao's NF4: not transformers, peft or bitsandbytes
        ("torchtune", {"method": "qlora"}, ["torchtune", "torchao"]),
        ("torchtune", {"optim": "adamw8bit"}, ["torchtune", "bitsandbytes"]),
        # an axolotl config runs on axolotl, itself on transformers and peft (and bitsandbytes for QLoRA)
        (
            "axolotl",
            {"method": "qlora", "attn": "flash"},
            ["axolotl", "transformers", "peft", "bitsandbytes", "flash_attn"],
        ),
        # a TrainingArguments JSON may be run by the Trainer alone: no tool of its own
        ("trl", {"method": "lora"}, ["transformers", "peft"]),
    ],
)
def test_the_workload_files_tool_decides_the_packages(
    tmp_path: Path, framework: str, fields: dict[str, Any], wanted: list[str]
) -> None:
    looked: list[str] = []

    def find(module: str) -> object:
        looked.append(module)
        return object()

    check(
        make_workload(model="llama-3.2-1b", seq=1024, **fields),
        path=tmp_path,
        gpu_here=lambda: (80 * GIB, "NVIDIA A100 80GB"),
        run_doctor=doctor_says(True),
        run_trial=trial_ran(9 * GIB),
        find_package=find,
        framework=framework,
    )
    assert looked == wanted


def test_a_fit_that_frees_the_cache_shows_the_peak_on_the_card_not_over_it() -> None:
    # qwen2.5-3b LoRA + ckpt at 4 x 2048 reserves more than a 24 GiB card with no limit and fits it by freeing
    # the allocator's cache (max-batch case: 4 ran on 24.1 GiB): the line shows the peak on the card, the unlimited
    # one beside it
    from gpuready.check.check import size_step
    from gpuready.memory import estimate

    w = make_workload(model="qwen2.5-3b", method="lora", grad_ckpt=True, seq=2048, batch=4)
    est = estimate(w, 24 << 30)
    assert est.fits and est.cache_releases and est.reserved_on_card_bytes is not None
    assert est.peak_device_bytes > 24 << 30  # the unlimited peak alone would read as "over the card"
    step = size_step(w, 24 << 30, "24.00 GiB")
    on_card = est.reserved_on_card_bytes + est.peak_device_bytes - est.peak_reserved_bytes
    assert on_card <= 24 << 30
    assert step.status == "pass"
    assert step.summary.startswith(f"{on_card / 2**30:.2f} GiB at the peak (backward) on 24.00 GiB, freeing its cache")
    assert f"({est.peak_device_bytes / 2**30:.2f} GiB with no limit): fits" in step.summary
