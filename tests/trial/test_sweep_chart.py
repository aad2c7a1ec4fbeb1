"""Sweeps over a simulated device, parsing, charts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.store import ResultsDB
from gpuready.trial.api import run_backend
from gpuready.trial.chart import svg_chart, text_chart, write_chart
from gpuready.trial.result import Point
from gpuready.trial.runner import Interrupted
from gpuready.trial.simulate import SimulatedDevice
from gpuready.trial.sweep import parse_sweep, parse_sweep_arg, run_sweep
from gpuready.units import GIB


def test_parse_sweep() -> None:
    assert parse_sweep("batch=1,2,4,8") == ("batch", [1, 2, 4, 8])
    assert parse_sweep("new-tokens=0,128") == ("new_tokens", [0, 128])
    assert parse_sweep_arg("--batch_size=1,2") == ("--batch_size", [1, 2])
    for bad in ("batch", "colour=1,2", "batch=a,b"):
        with pytest.raises(InputError):
            parse_sweep(bad)


def test_sweep_skips_larger_values_after_oom_and_records_in_the_db(tmp_path: Path) -> None:
    dev = SimulatedDevice("batch", 10 * GIB, 10 * GIB, 45 * GIB)
    db = ResultsDB(tmp_path / "r.db")
    result = run_backend(dev, kind="probe", target="sim", variable="batch", values=[8, 1, 2, 4], db=db)
    assert [p.status for p in result.points] == ["ok", "ok", "oom", "skipped"]
    assert dev.calls == [1, 2, 4]  # 8 was not run
    assert result.fit is not None and result.fit.per_unit_bytes == pytest.approx(10 * GIB, rel=0.05)
    runs = db.runs()
    assert len(runs) == 1 and len(runs[0].points) == 4 and runs[0].status == "partial"


def test_ctrl_c_keeps_the_finished_points() -> None:
    class Stops:
        def run_point(self, values: dict[str, int]) -> Point:
            if values["batch"] == 4:
                raise Interrupted()
            return Point(values=values, ok=True, status="ok", peak_device_bytes=values["batch"])

    outcome = run_sweep(Stops(), "batch", [1, 2, 4, 8])
    assert outcome.interrupted and [p.values["batch"] for p in outcome.points] == [1, 2]


def test_charts_show_capacity_prediction_and_failures(tmp_path: Path) -> None:
    dev = SimulatedDevice("batch", 10 * GIB, 10 * GIB, 45 * GIB)
    result = run_backend(dev, kind="probe", target="sim", variable="batch", values=[1, 2, 4, 8])
    predict = dev.estimator(0.1)
    svg = svg_chart(result, predict)
    assert svg.startswith("<svg") and "GPU capacity 45.0 GiB" in svg and "stroke-dasharray" in svg
    assert "oom" in svg
    lines = text_chart(result, predict)
    assert lines[0].startswith("batch=1") and "predicted" in lines[0] and "capacity 45.0 GiB" in lines[-1]
    written = write_chart(result, tmp_path / "c.svg", predict)
    assert written.read_text().startswith("<svg")
