from __future__ import annotations

from pathlib import Path

import pytest

from gpuready.catalog import find_gpu
from gpuready.plan import refresh_factors, step_time, stored_factors
from gpuready.store import ResultsDB
from gpuready.workload import make_workload


def _record(db: ResultsDB, gpu: str, ratio: float, batch: int = 4) -> None:
    w = make_workload(model="llama-3.2-1b", batch=1, seq=1024)
    run = db.start_run("probe", "llama-3.2-1b", "batch", w.model_dump(mode="json"), gpu)
    measured = w.model_copy(update={"batch": batch})
    card = find_gpu("H200 SXM") if "H200" in gpu else find_gpu("A100 SXM 80GB")
    seconds = ratio * step_time(measured, card).seconds
    db.add_point(run, {"values": {"batch": batch}, "ok": True, "status": "ok", "step_seconds": seconds})


def test_records_give_each_card_the_median_measured_over_predicted(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "r.db") as db:
        _record(db, "NVIDIA H200", 1.2, batch=4)
        _record(db, "NVIDIA H200", 1.4, batch=2)
        _record(db, "NVIDIA H200", 1.3, batch=8)
        _record(db, "NVIDIA A100-SXM4-80GB", 0.9)
        _record(db, "NVIDIA H200", 40.0)  # a broken measurement: left out
        factors = refresh_factors(db)
        assert factors["H200 SXM"] == pytest.approx(1.3)
        assert factors["A100 SXM 80GB"] == pytest.approx(0.9)
        stored = db.gpu_efficiency()
        assert stored["H200 SXM"] == (pytest.approx(1.3), 3)
    assert stored_factors(tmp_path / "r.db") == pytest.approx({"H200 SXM": 1.3, "A100 SXM 80GB": 0.9})


def test_no_database_means_no_factors_and_none_is_created(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    assert stored_factors(path) == {}
    assert not path.exists()
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    assert stored_factors(bad) == {}  # plan answers without it
