from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuready.catalog.prices import default_prices, load_prices
from gpuready.errors import InputError
from gpuready.models import resolve_model
from gpuready.plan import plan, step_flops
from gpuready.workload import make_workload


def test_every_default_price_has_a_source_and_a_catalog_gpu() -> None:
    from gpuready.catalog import load_gpus

    names = {g.name for g in load_gpus()}
    for price in default_prices().values():
        assert price.gpu in names and price.source.startswith("https://") and price.per_gpu_hour > 0


def test_step_flops_count_every_matmul_three_times_and_lora_skips_the_base_weight_gradients() -> None:
    spec = resolve_model("llama-3.1-8b")
    full = step_flops(spec, make_workload(model="llama-3.1-8b", batch=1, seq=1024))
    lora = step_flops(spec, make_workload(model="llama-3.1-8b", method="lora", batch=1, seq=1024))
    block = sum(lin.in_features * lin.out_features for lin in spec.block_linears) * spec.layers
    matmul_params = block + spec.vocab * spec.hidden  # the embedding is a lookup, lm_head a GEMM
    # flash attention: QK^T and PV over the causal half, backward 2.5x the forward
    attn = 4 * spec.heads * 1024 * 1024 * spec.head_dim * 0.5 * spec.layers * 3.5
    assert full == pytest.approx(6 * matmul_params * 1024 + attn, rel=1e-9)
    assert lora is not None and full is not None
    # LoRA: no weight gradient for the frozen base (2 x params x tokens fewer), plus the adapters' small GEMMs
    adapters = lora - (full - 2 * matmul_params * 1024)
    assert 0 < adapters < 0.02 * full
    assert step_flops(spec, make_workload(model="llama-3.1-8b", task="infer")) is None


def test_options_are_ranked_runnable_and_cheapest_job_first() -> None:
    w = make_workload(model="llama-3.1-8b", method="lora", grad_ckpt=True)
    result = plan(w, default_prices(), tokens=10_000_000)
    runs = [o.runs for o in result.options]
    assert runs == sorted(runs, reverse=True)  # every runnable option before any that is not
    costs = [o.cost for o in result.options if o.runs and o.cost is not None]
    assert costs == sorted(costs) and result.ranked_by == "job cost"
    best = result.options[0]
    assert best.job_hours is not None and best.cost == pytest.approx(best.job_hours * best.price_per_gpu_hour)
    assert result.steps == -(-10_000_000 // 2048)
    assert best.step_seconds is not None
    assert best.job_hours == pytest.approx(result.steps * best.step_seconds / 3600)


def test_without_a_length_the_ranking_is_by_cost_per_million_tokens_not_by_hourly_price() -> None:
    result = plan(make_workload(model="llama-3.2-1b", batch=4, seq=2048), default_prices())
    priced = [o for o in result.options if o.runs and o.cost_per_unit is not None]
    per_unit = [o.cost_per_unit for o in priced]
    assert per_unit == sorted(per_unit) and result.ranked_by == "cost per unit"
    for o in priced:
        assert o.throughput is not None and o.price_per_gpu_hour is not None
        assert o.cost_per_unit == pytest.approx(o.price_per_gpu_hour / 3600 / o.throughput * 1e6)
    # the cheapest card per hour is not the cheapest per token: the order differs from the hourly one
    by_price = sorted(priced, key=lambda o: o.price_per_gpu_hour or 0)
    assert [o.gpu for o in by_price] != [o.gpu for o in priced]
    h200 = next(o for o in priced if o.gpu == "H200 SXM")
    rtx3090 = next(o for o in priced if o.gpu == "RTX 3090")
    assert h200.throughput is not None and rtx3090.throughput is not None
    assert h200.throughput > 5 * rtx3090.throughput


def test_a_card_that_needs_checkpointing_is_timed_with_its_recompute() -> None:
    from gpuready.catalog import find_gpu
    from gpuready.plan import step_time

    w = make_workload(model="llama-3.1-8b", batch=4, seq=2048)
    result = plan(w, default_prices())
    h100 = next(o for o in result.options if o.gpu == "H100 SXM")
    assert not h100.fits and h100.mitigation is not None and h100.runs
    changed = w
    if "--grad-ckpt" in h100.mitigation:
        changed = changed.model_copy(update={"grad_ckpt": True})
    if "--optim adamw8bit" in h100.mitigation:
        changed = changed.model_copy(update={"optim": "adamw8bit"})
    if "--batch 1" in h100.mitigation:
        changed = changed.model_copy(update={"batch": 1, "grad_accum": 4})
    assert h100.step_seconds == pytest.approx(step_time(changed, find_gpu("H100 SXM")).seconds)
    # the same tokens per step: cost per token compares like with like
    assert h100.throughput == pytest.approx(8192 / h100.step_seconds)


def test_vision_jobs_are_costed_per_thousand_images_and_refuse_tokens() -> None:
    result = plan(make_workload(model="resnet50", batch=128), default_prices())
    assert result.unit == "images" and result.units_per_step == 128
    best = result.options[0]
    assert best.cost_per_unit is not None and best.throughput is not None and best.price_per_gpu_hour is not None
    assert best.cost_per_unit == pytest.approx(best.price_per_gpu_hour / 3600 / best.throughput * 1000)
    with pytest.raises(InputError, match="images"):
        plan(make_workload(model="resnet50"), default_prices(), tokens=1000)


def test_measured_factors_scale_a_cards_step_time() -> None:
    w = make_workload(model="llama-3.2-1b", batch=4, seq=2048)
    plain = {o.gpu: o for o in plan(w, default_prices()).options}
    slowed = {o.gpu: o for o in plan(w, default_prices(), calibration={"H200 SXM": 2.0}).options}
    assert slowed["H200 SXM"].step_seconds == pytest.approx(2 * (plain["H200 SXM"].step_seconds or 0))
    assert slowed["H200 SXM"].calibration == 2.0
    assert slowed["H100 SXM"].step_seconds == plain["H100 SXM"].step_seconds


def test_a_price_file_overrides_the_defaults(tmp_path: Path) -> None:
    f = tmp_path / "p.csv"
    f.write_text("gpu,price_per_gpu_hour\nH100 SXM,0.01\n", encoding="utf-8")
    result = plan(make_workload(model="llama-3.2-1b"), load_prices(f), hours=2)
    assert result.options[0].gpu == "H100 SXM" and result.options[0].cost == pytest.approx(0.02)
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,price_per_gpu_hour\nH100 SXM,cheap\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a number"):
        load_prices(bad)


def test_nothing_fits_gives_mitigations() -> None:
    result = plan(make_workload(model="llama-3.1-405b"), default_prices())
    assert not any(o.runs for o in result.options)
    assert result.mitigations and result.mitigations_gpu
    assert all("change" in m and m["gpu"] == result.mitigations_gpu for m in result.to_json()["mitigations"])


def test_cli_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuready.cli.app import main

    code = main(["plan", "llama-3.2-1b", "--steps", "100", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    keys = {"gpu", "count", "fits", "headroom_bytes", "max_batch", "step_seconds", "job_hours", "cost"}
    keys |= {"throughput", "unit", "cost_per_unit", "mitigation", "runs", "calibration"}
    assert keys <= set(data["options"][0])
    assert main(["plan", "llama-3.2-1b", "--steps", "1", "--hours", "2"]) == 2


def test_the_plan_cli_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from gpuready.cli.app import main; "
        "rc = main(['plan', 'llama-3.2-1b', '--json']); "
        "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
        "print(heavy, file=sys.stderr); sys.exit(0 if not heavy else 3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_table_shows_throughput_and_how_the_cost_was_computed(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuready.cli.app import main

    assert main(["plan", "llama-3.2-1b", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "$/1M tok" in out and "ranked by cost per unit" in out
    assert "cost per 1M tokens = $/GPU-h x GPUs x step s / tokens per step x 1e6 / 3600" in out
    assert all(len(line) <= 80 for line in out.splitlines())
