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


def test_step_flops_follow_the_6n_rule_and_lora_skips_weight_gradients() -> None:
    spec = resolve_model("llama-3.1-8b")
    full = step_flops(spec, make_workload(model="llama-3.1-8b", batch=1, seq=1024))
    lora = step_flops(spec, make_workload(model="llama-3.1-8b", method="lora", batch=1, seq=1024))
    attn = 12 * 32 * 4096 * 1024 * 1024
    assert full == 6 * spec.params * 1024 + attn
    assert lora == 4 * spec.params * 1024 + attn
    assert step_flops(spec, make_workload(model="llama-3.1-8b", task="infer")) is None


def test_options_are_ranked_fitting_and_cheapest_first() -> None:
    w = make_workload(model="llama-3.1-8b", method="lora", grad_ckpt=True)
    result = plan(w, default_prices(), tokens=10_000_000)
    fits = [o.fits for o in result.options]
    assert fits == sorted(fits, reverse=True)  # every fitting option before any that does not
    costs = [o.cost for o in result.options if o.fits and o.cost is not None]
    assert costs == sorted(costs)
    best = result.options[0]
    assert best.job_hours is not None and best.cost == pytest.approx(best.job_hours * best.price_per_gpu_hour)
    assert result.steps == -(-10_000_000 // 2048)


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
    assert not any(o.fits for o in result.options)
    assert result.mitigations and all("change" in m for m in result.mitigations)


def test_cli_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuready.cli.app import main

    code = main(["plan", "llama-3.2-1b", "--steps", "100", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    keys = {"gpu", "count", "fits", "headroom_bytes", "max_batch", "step_seconds", "job_hours", "cost"}
    assert keys <= set(data["options"][0])
    assert main(["plan", "llama-3.2-1b", "--steps", "1", "--hours", "2"]) == 2
