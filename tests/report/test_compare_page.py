"""The compare page in a real browser: headless Chromium loads it offline, the charts are in the rendered DOM,
and the console stays silent. Skipped only where chromium is absent (.ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuready.bench import compare, load_records
from gpuready.report.compare_html import render_compare
from tests.bench import fakes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0", "--no-first-run"]
# Chromium logs each console message (console.error, uncaught exceptions, failed loads) as ":CONSOLE:"
CONSOLE = re.compile(r":CONSOLE[:(]")


def _chromium(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    home = page.parent / "chromium-home"  # a private profile: nothing shared with other runs
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={home}", *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_console_check_catches_a_page_with_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); notDefined();</script></body></html>")
    proc = _chromium(bad, "--dump-dom")
    assert CONSOLE.search(proc.stderr), proc.stderr[-2000:]


def test_the_compare_page_renders_its_charts_offline_without_console_errors(tmp_path: Path) -> None:
    a = fakes.record_file(tmp_path, "one-gpu", step_seconds=0.05, price=3.59, slow={20: 0.2})
    b = fakes.record_file(tmp_path, "two-gpus", step_seconds=0.026, price=7.18)
    page = tmp_path / "page.html"
    page.write_text(render_compare(compare(load_records([a, b]))), encoding="utf-8")
    proc = _chromium(page, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert not CONSOLE.search(proc.stderr), [ln for ln in proc.stderr.splitlines() if CONSOLE.search(ln)]
    # the rendered document holds the four charts: one throughput line per platform, one cost bar each
    for chart in ("throughput", "cost", "clock", "startup"):
        assert f'data-chart="{chart}"' in dom
    throughput = dom.split('data-chart="throughput"', 1)[1].split("</svg>", 1)[0]
    assert sorted(re.findall(r'class="series" data-label="([^"]+)"', throughput)) == ["one-gpu", "two-gpus"]
    cost = dom.split('data-chart="cost"', 1)[1].split("</svg>", 1)[0]
    assert len(re.findall(r'<rect class="bar"', cost)) == 2
    assert 'id="verdict"' in dom and "Best for this job" in dom
    shot = tmp_path / "shot.png"
    shot_proc = _chromium(page, f"--screenshot={shot}", "--window-size=900,1800", "--hide-scrollbars")
    assert shot_proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a blank page is a few KB
