"""`bench()` end to end with injected fakes: NVML, the doctor, the probe child, the disk test."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuready.bench import bench, load_record
from gpuready.bench.record import Disk
from gpuready.nvml import XidEvent
from gpuready.store import ResultsDB
from tests.bench import fakes

BOOT = time.time() - 300.0


def _disk(path: Path, **kwargs: Any) -> Disk:
    return Disk(path=str(path), bytes=2**20, write_bytes_per_second=1e9, read_bytes_per_second=2e9, direct=True)


def _bench(tmp_path: Path, **kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "minutes": 0.1,
        "interval_seconds": 1.0,
        "nvml_report": fakes.report,
        "health": fakes.FakeHealth(),
        "run": fakes.probe_run(),
        "run_doctor": fakes.FakeDoctor,
        "disk_test": _disk,
        "disk_path": tmp_path,
        "boot_time": lambda: BOOT,
        "init_start": lambda: BOOT,
        "sample_seconds": 0.02,
    }
    args.update(kwargs)
    if args["run"] is None:  # the real runner: a real child process
        del args["run"]
    return bench(**args)


def test_bench_records_throughput_health_memory_price_and_a_database_row(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    with ResultsDB(tmp_path / "r.db") as db:
        record = _bench(tmp_path, run=fakes.probe_run(seen=seen), db=db)
        rows = db.benches()
    assert record.status == "ok" and record.error is None
    # the default job: llama-3.2-1b full fine-tune, seeded, for --minutes after the first step
    assert seen["spec"]["workload"]["model"] == "llama-3.2-1b" and seen["spec"]["seed"] == 0
    assert seen["spec"]["bench"] == {"duration_seconds": 6.0}
    assert "torch.distributed.run" not in seen["argv"]
    tp = record.throughput
    # 60 steps after the warm-up, 0.1 s each, 4096 tokens: 40960 tokens/s in every 1 s interval
    assert tp.unit == "tokens" and tp.steps == 61
    assert tp.median_per_second == pytest.approx(40960, rel=1e-4)
    assert tp.effective_per_second == pytest.approx(40960, rel=1e-4)
    assert tp.spread == pytest.approx(0, abs=1e-3) and tp.stable_seconds == pytest.approx(tp.ran_seconds)
    assert len(tp.intervals) == 6
    assert record.memory.peak_device_bytes == 23 * 2**30
    assert record.machine.gpus[0].uuid == "GPU-0000" and record.machine.gpus[0].name == "NVIDIA H200"
    # catalog price of the H200 SXM row times one GPU
    assert record.price.per_hour == pytest.approx(3.59) and "catalog: H200 SXM" in (record.price.source or "")
    assert record.ready.reference == "boot" and record.ready.seconds is not None
    assert record.ready.seconds == pytest.approx(record.ready.first_step_at - BOOT)
    assert record.doctor.ready is True
    assert record.health.samples > 0 and record.health.power_limit_watts == 700.0
    assert record.disk is not None and record.disk.write_bytes_per_second == 1e9
    # one row in the database, and the JSON round-trips through the versioned model
    assert len(rows) == 1 and rows[0][1]["throughput"]["median_per_second"] == tp.median_per_second
    assert load_record(json.loads(json.dumps(record.to_json()))) == record


def test_no_gpu_is_a_record_that_says_why(tmp_path: Path) -> None:
    doctor = fakes.FakeDoctor(
        ready=False,
        cause=fakes.FakeCheck("nvidia-driver", "fail", "no NVIDIA driver is loaded"),
        checks=(fakes.FakeCheck("nvidia-driver", "fail", "no NVIDIA driver is loaded"),),
    )

    def must_not_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("the job must not start without a GPU")

    record = _bench(tmp_path, nvml_report=fakes.no_gpu_report, run=must_not_run, run_doctor=lambda: doctor)
    assert record.status == "no_gpu" and not record.ok
    assert "Driver Not Loaded" in (record.error or "") and "no NVIDIA driver is loaded" in (record.error or "")
    assert record.doctor.ready is False and record.throughput.steps == 0


def test_out_of_memory_mid_run_keeps_the_steps_before_it(tmp_path: Path) -> None:
    run = fakes.probe_run(steps=20, result={"ok": False, "error_kind": "oom", "error": "CUDA out of memory."})
    record = _bench(tmp_path, run=run)
    assert record.status == "oom" and "out of memory" in (record.error or "")
    assert record.throughput.steps == 20 and record.throughput.median_per_second == pytest.approx(40960, rel=1e-4)
    assert record.errors[0] == record.error


def test_a_child_that_dies_without_a_result_is_a_failed_record(tmp_path: Path) -> None:
    run = fakes.probe_run(steps=5, write_result=False, returncode=-11, tail=["Segmentation fault"])
    record = _bench(tmp_path, run=run)
    assert record.status == "failed" and "signal 11" in (record.error or "")
    assert record.throughput.steps == 5
    # the job's last words are kept for the reader, without gpuready's own step lines
    assert record.output_tail == ["Segmentation fault"]


def test_ctrl_c_during_the_disk_test_keeps_the_jobs_figures(tmp_path: Path) -> None:
    def interrupted_disk(path: Path, **kwargs: Any) -> Disk:
        raise KeyboardInterrupt

    record = _bench(tmp_path, disk_test=interrupted_disk)
    assert record.status == "ok" and record.throughput.median_per_second is not None
    assert record.disk is not None and record.disk.error == "interrupted (Ctrl-C)"


def test_a_cuda_error_in_the_output_is_classified(tmp_path: Path) -> None:
    run = fakes.probe_run(
        steps=3, write_result=False, returncode=1, tail=["RuntimeError: CUDA error: an illegal memory access"]
    )
    assert _bench(tmp_path, run=run).status == "cuda_error"


def test_two_gpus_run_ddp_under_torchrun_and_sum_their_throughput(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    record = _bench(
        tmp_path,
        nproc=2,
        run=fakes.probe_run(ranks=2, seen=seen),
        health=fakes.FakeHealth(gpus=2),
        nvml_report=lambda: fakes.report(2),
    )
    assert "torch.distributed.run" in seen["argv"] and "--nproc_per_node=2" in seen["argv"]
    assert seen["spec"]["workload"]["shard"] == "ddp" and seen["spec"]["workload"]["gpus"] == 2
    assert record.status == "ok" and record.job.nproc == 2
    assert [g.index for g in record.machine.gpus] == [0, 1]
    assert record.throughput.median_per_second == pytest.approx(2 * 40960, rel=1e-4)
    assert record.price.per_hour == pytest.approx(2 * 3.59)


def test_price_per_hour_and_ordered_at_override_the_defaults(tmp_path: Path) -> None:
    ordered = time.time() - 1000
    record = _bench(tmp_path, price_per_hour=2.5, ordered_at=ordered)
    assert record.price.per_hour == 2.5 and record.price.source == "--price-per-hour"
    assert record.ready.reference == "ordered_at" and record.ready.seconds == pytest.approx(
        (record.ready.first_step_at or 0) - ordered
    )


def test_an_xid_and_new_ecc_errors_become_errors_in_the_record(tmp_path: Path) -> None:
    health = fakes.FakeHealth(ecc=[fakes.EccCounts(0, 0), fakes.EccCounts(3, 1)], xids=[XidEvent(0, 79, time.time())])
    record = _bench(tmp_path, health=health)
    assert record.health.xid_events and record.health.xid_events[0]["xid"] == 79
    assert record.health.ecc_corrected_new == 3 and record.health.ecc_uncorrected_new == 1
    assert any("Xid 79" in e for e in record.errors) and any("uncorrectable ECC" in e for e in record.errors)


def test_a_doctor_that_crashes_is_recorded_not_raised(tmp_path: Path) -> None:
    def broken() -> Any:
        raise RuntimeError("boom")

    record = _bench(tmp_path, run_doctor=broken)
    assert record.status == "ok" and record.doctor.ready is None and "boom" in (record.doctor.error or "")


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "job.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_a_hung_job_is_ended_and_recorded_as_hung(tmp_path: Path) -> None:
    cmd = _script(
        tmp_path,
        "import json, sys, time\n"
        "for n in range(1, 4):\n"
        "    time.sleep(0.05)\n"
        "    print('GPUREADY_STEP ' + json.dumps({'step': n, 'end': time.time(), 'seconds': 0.05, 'units': 10}),"
        " flush=True)\n"
        "time.sleep(60)\n",
    )
    t0 = time.perf_counter()
    record = _bench(tmp_path, command=cmd, run=None, minutes=None, hang_seconds=1.0)
    assert time.perf_counter() - t0 < 20
    assert record.status == "hung" and "hung" in (record.error or "")
    assert record.throughput.steps == 3


def test_a_command_without_step_lines_counts_one_run(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "print('training...')\n")
    lines: list[str] = []
    record = _bench(tmp_path, command=cmd, run=None, minutes=None, on_line=lines.append)
    assert record.status == "ok" and record.job.kind == "command" and record.job.unit == "runs"
    assert record.throughput.units_total == 1 and lines == ["training..."]


def test_bad_arguments_name_the_flag(tmp_path: Path) -> None:
    from gpuready.errors import InputError

    with pytest.raises(InputError, match="--minutes"):
        _bench(tmp_path, minutes=0)
    with pytest.raises(InputError, match="--nproc"):
        _bench(tmp_path, nproc=0)
    with pytest.raises(InputError, match="--ordered-at"):
        _bench(tmp_path, ordered_at=time.time() + 3600)


def test_a_command_is_stopped_at_minutes_and_that_is_not_a_fault(tmp_path: Path) -> None:
    cmd = _script(
        tmp_path,
        "import json, time\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    time.sleep(0.02)\n"
        "    print('GPUREADY_STEP ' + json.dumps({'step': n, 'end': time.time(), 'seconds': 0.02, 'units': 8}),"
        " flush=True)\n",
    )
    record = _bench(tmp_path, command=cmd, run=None, minutes=0.02, interval_seconds=0.2)
    assert record.status == "ok" and record.error is None
    assert record.throughput.steps > 10 and record.throughput.median_per_second is not None
    assert record.job.unit is None and record.job.minutes == 0.02


def test_the_progress_bar_follows_the_phases() -> None:
    from gpuready.bench.run import Progress
    from gpuready.cli.bench import _BenchProgress

    bar = _BenchProgress()
    for p in (
        Progress("checking"),
        Progress("loading", total_seconds=60),
        Progress("running", elapsed_seconds=30, total_seconds=60, steps=300, per_second=45000.0, unit="tokens"),
    ):
        bar.update(p)
    task = bar.bar.tasks[0]
    assert task.total == 60 and task.completed == 30 and "45,000 tokens/s" in task.description
    bar.update(Progress("disk"))
    assert bar.bar.tasks[0].description == "bench: testing the disk"
