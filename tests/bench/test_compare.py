"""compare(): cost per unit of work by the stated formula, the verdict and its reasons; the CLI's bench and
compare commands (in a child process: no GPU and no torch in the CLI process)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuready.bench import compare, load_records
from gpuready.errors import InputError
from tests.bench import fakes

SRC = str(Path(__file__).resolve().parents[2] / "src")


_record = fakes.record_file


def test_the_dearer_but_faster_platform_wins_on_cost_per_unit_by_the_formula(tmp_path: Path) -> None:
    fast = _record(tmp_path, "fast", step_seconds=0.05, price=4.0)  # 81920 tokens/s
    slow = _record(tmp_path, "slow", step_seconds=0.2, price=1.5)  # 20480 tokens/s
    c = compare(load_records([fast, slow]))
    assert c.best == "fast" and c.unit == "tokens" and c.unit_label == "1M tokens"
    rows = {r.label: r for r in c.rows}
    w = c.work_units or 0
    assert w == pytest.approx(rows["fast"].effective_per_second * 3600)  # one hour on the fastest
    for r in rows.values():
        hours = (r.startup_seconds or 0) / 3600 + w / ((r.effective_per_second or 1) * 3600)
        assert r.hours_for_work == pytest.approx(hours)
        assert r.cost_per_unit == pytest.approx((r.price_per_hour or 0) * hours / w * 1e6)
    assert "fast: lowest cost per 1M tokens" in c.reasons[0]
    assert any("costs more per hour" in reason for reason in c.reasons)


def test_a_failed_run_makes_reruns_expected_and_a_platform_with_no_completed_run_is_out(tmp_path: Path) -> None:
    ok = _record(tmp_path, "a", step_seconds=0.1, price=2.0)
    oom = fakes.probe_run(steps=10, result={"ok": False, "error_kind": "oom", "error": "CUDA out of memory."})
    bad = _record(tmp_path, "b", step_seconds=0.1, price=1.0, run=oom)
    b_ok = _record(tmp_path, "b2", step_seconds=0.1, price=1.0)
    # b2's record relabelled as b: platform b has one ok and one failed record -> p = 1/2
    data = json.loads(b_ok.read_text())
    data["machine"]["label"] = "b"
    b_ok.write_text(json.dumps(data))
    c = compare(load_records([ok, bad, b_ok]))
    rows = c.rows
    assert [r.rerun_probability for r in rows] == [0.0, 0.5, 0.5]
    assert rows[1].completed is False and rows[0].completed and rows[2].completed
    # b at half the price but twice the attempts costs the same per unit as a, before start-up differences
    assert rows[2].cost_per_unit == pytest.approx(
        (rows[2].price_per_hour or 0) * (rows[2].hours_for_work or 0) / 0.5 / (c.work_units or 1) * 1e6
    )
    assert any("b: not a candidate: oom" in r for r in c.reasons)
    only_failed = compare(load_records([bad]))
    assert only_failed.best is None and "no platform completed" in only_failed.reasons[0]


def test_records_of_different_jobs_are_flagged(tmp_path: Path) -> None:
    a = _record(tmp_path, "a", step_seconds=0.1, price=2.0)
    data = json.loads(a.read_text())
    data["job"]["description"] = "gpt2 · train"
    data["job"]["workload"]["model"] = "gpt2"
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    assert any("different jobs" in w for w in compare(load_records([a, b])).warnings)
    # the same job on two GPUs is the same job on a bigger platform
    two = fakes.record_file(tmp_path, "two", step_seconds=0.1, price=4.0, nproc=2, gpus=2, run=fakes.probe_run(ranks=2))
    assert compare(load_records([a, two])).warnings == []


def test_unreadable_or_newer_records_name_the_file(tmp_path: Path) -> None:
    a = _record(tmp_path, "a", step_seconds=0.1, price=2.0)
    data = json.loads(a.read_text())
    data["schema_version"] = 99
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"newer\.json: schema_version 99"):
        load_records([newer])
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(InputError, match=r"junk\.json: not JSON"):
        load_records([junk])
    del data["throughput"]
    data["schema_version"] = 1
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"broken\.json: throughput"):
        load_records([broken])


def _cli(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n" + prelude + "from gpuready.cli.app import main\n"
        f"rc = main({list(args)!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported in the CLI process'\n"
        "sys.exit(rc)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    )


NO_GPU = (
    "import gpuready.bench.run as r, gpuready.doctor as d\n"
    "from gpuready.nvml import NvmlReport\n"
    "r.read_nvml = lambda lib=None: NvmlReport(error='NVML: Driver Not Loaded', error_kind='driver_not_loaded')\n"
    "class Rep:\n    ready = False\n    cause = None\n    checks = ()\n"
    "d.doctor = lambda *a, **k: Rep()\n"
)


def test_bench_on_a_machine_without_a_gpu_exits_1_saying_why(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    proc = _cli("bench", "--no-db", "-o", str(out), prelude=NO_GPU)
    assert proc.returncode == 1, proc.stderr
    assert "no GPU here: NVML: Driver Not Loaded" in proc.stdout
    assert json.loads(out.read_text())["status"] == "no_gpu"
    as_json = _cli("bench", "--no-db", "--json", prelude=NO_GPU)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["status"] == "no_gpu"


def test_bench_cli_rejects_bad_flags_with_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _cli("bench", "--no-db", "--minutes", "0", prelude=NO_GPU)
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == "gpuready: error: --minutes: a number of minutes > 0, e.g. 5 or 0.5"
    )
    proc = _cli("bench", "--no-db", "--disk-path", str(tmp_path / "nope"), prelude=NO_GPU)
    assert proc.returncode == 2 and "--disk-path" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("bench", "--no-db", "--ordered-at", "soon", prelude=NO_GPU)
    assert proc.returncode == 2 and "--ordered-at" in proc.stderr


def test_compare_cli_json_and_html_without_torch(tmp_path: Path) -> None:
    a = _record(tmp_path, "a", step_seconds=0.05, price=4.0)
    b = _record(tmp_path, "b", step_seconds=0.2, price=1.5)
    page = tmp_path / "page.html"
    proc = _cli("compare", str(a), str(b), "--json", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"]["best"] == "a" and len(data["platforms"]) == 2 and "formula" in data
    text = page.read_text()
    assert 'data-chart="throughput"' in text and 'data-chart="cost"' in text
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    human = _cli("compare", str(a), str(b))
    assert human.returncode == 0 and "verdict: a" in human.stdout


def test_compare_prices_file_overrides_the_records_prices(tmp_path: Path) -> None:
    a = _record(tmp_path, "a", step_seconds=0.05, price=4.0)
    b = _record(tmp_path, "b", step_seconds=0.2, price=1.5)
    prices = tmp_path / "p.csv"
    prices.write_text("label,price_per_hour\na,40\n")
    proc = _cli("compare", str(a), str(b), "--prices", str(prices), "--json")
    assert json.loads(proc.stdout)["verdict"]["best"] == "b"
    # plan's price file: per GPU-hour by card, times each record's GPUs
    prices.write_text("gpu,price_per_gpu_hour\nH200 SXM,10\n")
    by_gpu = json.loads(_cli("compare", str(a), str(b), "--prices", str(prices), "--json").stdout)
    assert [p["price_per_hour"] for p in by_gpu["platforms"]] == [10.0, 10.0]
    prices.write_text("gpu,price\n")
    bad = _cli("compare", str(a), "--prices", str(prices))
    assert bad.returncode == 2 and "--prices" in bad.stderr


def test_the_committed_h200_records_still_load_and_compare() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "bench"
    c = compare(load_records([docs / "bench_1xh200.json", docs / "bench_2xh200.json"]))
    # as measured on the H200 machine (docs/bench/README.md)
    assert [round(r.effective_per_second or 0) for r in c.rows] == [42785, 77800]
    assert c.best == "1xH200" and c.warnings == [] and len(c.jobs) == 1
    assert [r.gpu_count for r in c.rows] == [1, 2] and all(r.completed for r in c.rows)


def test_a_machine_up_for_hours_before_the_bench_is_flagged(tmp_path: Path) -> None:
    booted = time.time() - 5 * 3600
    old = fakes.record_file(
        tmp_path, "old", step_seconds=0.1, price=2.0, boot_time=lambda: booted, init_start=lambda: booted
    )
    c = compare(load_records([old]))
    assert any("old: the machine was up 5.0 h" in w and "--ordered-at" in w for w in c.warnings)
