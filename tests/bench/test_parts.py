"""The parts of bench on their own: intervals and stability, GPU health, the monitor, the disk test, the
time-to-ready reference, the catalog match, the probe's bench loop, the database row."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuready.bench import stats
from gpuready.bench.disk import disk_speed
from gpuready.bench.monitor import GpuMonitor
from gpuready.bench.price import bench_price, catalog_name
from gpuready.bench.ready import parse_ordered_at, reference
from gpuready.errors import InputError
from gpuready.nvml import GpuReading, XidEvent
from tests.bench import fakes

T = 1_800_000_000.0


def _steps(seconds: list[float], units: float = 1000.0, rank: int = 0) -> list[stats.Step]:
    out, t = [], T
    for n, s in enumerate(seconds, start=1):
        t += s
        out.append(stats.Step(rank, n, t, s, units))
    return out


def test_a_slow_patch_widens_the_spread_and_is_not_stable_time() -> None:
    # warm-up 5 s, then 1 s steps for 30 s with 10 s in the middle at half speed (2 s steps)
    secs = [5.0] + [1.0] * 10 + [2.0] * 5 + [1.0] * 10
    tp, t0 = stats.throughput(_steps(secs), unit="tokens", interval_seconds=5.0)
    assert t0 == T + 5.0 and tp.first_step_seconds == 5.0
    rates = [iv.per_second for iv in tp.intervals]
    assert rates[0] == pytest.approx(1000) and min(r or 0 for r in rates) == pytest.approx(500)
    assert tp.spread == pytest.approx(0.5) and tp.median_per_second == pytest.approx(1000)
    # the two half-speed intervals are outside ±10% of the median
    assert tp.ran_seconds == pytest.approx(30) and tp.stable_seconds == pytest.approx(20)
    assert tp.effective_per_second == pytest.approx(25 * 1000 / 30)


def test_a_hardware_fault_makes_its_interval_unstable() -> None:
    tp, _ = stats.throughput(_steps([1.0] * 21), unit="tokens", interval_seconds=5.0, fault_times=[T + 8.0])
    assert tp.ran_seconds == pytest.approx(20) and tp.stable_seconds == pytest.approx(15)


def test_a_short_tail_joins_the_last_interval_and_nothing_ran_is_empty() -> None:
    tp, _ = stats.throughput(_steps([1.0] * 12), unit="tokens", interval_seconds=5.0)
    assert [iv.seconds for iv in tp.intervals] == [5.0, 6.0]
    empty, t0 = stats.throughput([], unit="tokens", interval_seconds=5.0)
    assert t0 is None and empty.steps == 0 and empty.median_per_second is None


def test_intervals_span_at_least_four_median_steps() -> None:
    assert stats.interval_seconds_for(300, _steps([1.0] * 5), None) == 10.0
    assert stats.interval_seconds_for(60, _steps([1.0, 3.0, 3.0]), None) == 12.0
    assert stats.interval_seconds_for(60, [], 2.0) == 2.0


def _reading(index: int, reasons: int = 0, clock: int = 1980) -> GpuReading:
    return GpuReading(index, clock, 1980, 600.0, 700.0, 70, 99, 10 * 2**30, reasons)


def test_health_counts_throttle_seconds_only_on_the_jobs_gpus() -> None:
    samples = [stats.Sample(T + i, _reading(0, 0x80 if i < 3 else 0)) for i in range(10)]
    samples += [stats.Sample(T + i, _reading(1, 0x40)) for i in range(10)]  # not the job's GPU
    h = stats.health(samples, indices=[0], window=None, sample_seconds=1.0, xid_events=[XidEvent(1, 79, T + 2)], t0=T)
    assert h.samples == 10 and h.bad_throttle_seconds == 3.0
    assert h.throttle_seconds == {"hardware power brake slowdown": 3.0}
    assert h.xid_events == []  # GPU 1's Xid is not this job's
    assert h.power_limit_watts == 700.0 and len(h.series) == 10 and h.series[0]["t"] == 0.0
    assert stats.fault_times(samples, [0], []) == [T, T + 1, T + 2]


def test_the_monitor_samples_every_gpu_and_reads_ecc_before_and_after() -> None:
    health = fakes.FakeHealth(gpus=2, ecc=[fakes.EccCounts(1, 0), fakes.EccCounts(4, 0)])
    mon = GpuMonitor(health, interval=60.0)
    mon.start()
    mon.sample_once()
    data = mon.stop()
    assert {s.reading.index for s in data.samples} == {0, 1}
    assert data.uuids == {0: "GPU-0000", 1: "GPU-0001"} and data.xid_supported
    assert data.ecc_new([0, 1]) == (6, 0)


def test_disk_speed_measures_and_removes_only_its_own_file(tmp_path: Path) -> None:
    (tmp_path / "keep.bin").write_bytes(b"user data")
    d = disk_speed(tmp_path, size_bytes=4 * 2**20, max_seconds=2.0, random_seconds=0.1)
    assert d.error is None and d.bytes == 4 * 2**20
    assert (d.write_bytes_per_second or 0) > 0 and (d.read_bytes_per_second or 0) > 0 and (d.random_read_iops or 0) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]
    assert (tmp_path / "keep.bin").read_bytes() == b"user data"


def test_disk_speed_on_a_missing_or_unwritable_folder_is_an_error_not_a_crash(tmp_path: Path) -> None:
    assert "not a folder" in (disk_speed(tmp_path / "nope").error or "")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert disk_speed(ro, size_bytes=2**20).error
        finally:
            ro.chmod(0o700)


def test_time_to_ready_counts_from_the_container_start_when_pid1_started_after_boot() -> None:
    r = reference(None, T, boot_time=lambda: T - 86400, init_start=lambda: T - 60)
    assert r.kind == "container_start" and r.at == T - 60
    assert reference(None, T, boot_time=lambda: T - 90, init_start=lambda: T - 90).kind == "boot"
    assert reference(None, T, boot_time=lambda: None, init_start=lambda: None).kind == "bench_start"
    assert reference(T - 5, T).kind == "ordered_at"


def test_ordered_at_accepts_iso_and_epoch_and_names_the_flag_otherwise() -> None:
    assert parse_ordered_at("2026-11-30T21:00:00Z") == parse_ordered_at("2026-11-30 22:00:00+01:00")
    assert parse_ordered_at("2026-11-30T21:00:00") == parse_ordered_at("2026-11-30T21:00:00Z")
    assert parse_ordered_at("1796071774") == 1796071774.0
    with pytest.raises(InputError, match="--ordered-at"):
        parse_ordered_at("yesterday")


@pytest.mark.parametrize(
    ("nvml_name", "row"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("Tesla T4", "T4"),
        ("Some New GPU 9000X", None),
    ],
)
def test_nvml_names_find_their_catalog_row(nvml_name: str, row: str | None) -> None:
    assert catalog_name(nvml_name) == row


def test_a_card_without_a_catalog_price_asks_for_price_per_hour() -> None:
    p = bench_price(None, "Some New GPU 9000X", 1)
    assert p.per_hour is None and "--price-per-hour" in (p.source or "")


class _FakeCuda:
    def synchronize(self) -> None:
        pass


class _FakeTorch:
    cuda = _FakeCuda()

    class distributed:
        @staticmethod
        def is_available() -> bool:
            return False


def test_the_probes_bench_loop_runs_for_the_duration_and_announces_each_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuready.trial import probe

    now = [0.0]

    class Clock:
        def now(self) -> float:
            return now[0]

    def step() -> None:
        now[0] += 0.5

    result: dict[str, Any] = {}
    probe._run_for(_FakeTorch(), Clock(), step, 3.0, 2048, 0, 1, result)  # type: ignore[arg-type]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(probe.STEP_MARK)]
    steps = [json.loads(ln.split(" ", 1)[1]) for ln in lines]
    # the first step, then 3 s more of 0.5 s steps
    assert result["steps"] == 7 == len(steps) and result["step_seconds"] == 0.5
    assert [s["step"] for s in steps] == list(range(1, 8)) and all(s["units"] == 2048 for s in steps)
    assert "first_step_end" in result


def test_a_bench_record_is_a_database_row_after_the_migration(tmp_path: Path) -> None:
    from gpuready.store import SCHEMA_VERSION, ResultsDB

    with ResultsDB(tmp_path / "r.db") as db:
        assert db.version == SCHEMA_VERSION >= 3
        rid = db.add_bench(
            {"schema_version": 1, "status": "ok", "machine": {"host": "h", "label": "x", "gpus": [{"name": "G"}]}}
        )
        assert db.benches(gpu="g") == [(rid, db.benches()[0][1])] and db.benches(gpu="nothing") == []
        row = db.conn.execute("SELECT label, gpu, gpu_count, status FROM benches").fetchone()
        assert tuple(row) == ("x", "G", 1, "ok")
