"""`gpuready compare --html`: one self-contained page (inline CSS and SVG, no script, nothing fetched) with the
verdict, the platforms side by side, and charts of throughput over time, cost per unit of work and start-up."""

from __future__ import annotations

import html

from gpuready.bench.compare import Comparison, Row
from gpuready.report.svg import Bar, Series, bar_chart, line_chart
from gpuready.units import MB, format_gib, format_rate

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1f2937;margin:0;background:#f8fafc}
main{max-width:860px;margin:0 auto;padding:28px 24px 48px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:16px;margin:28px 0 10px}
.sub{color:#6b7280;font-size:13px;margin:0 0 18px}
.verdict{background:#fff;border:1px solid #e5e7eb;border-left:5px solid #059669;border-radius:8px;padding:14px 18px}
.verdict.none{border-left-color:#b91c1c}
.verdict b{font-size:17px}
.verdict ul{margin:8px 0 0;padding-left:20px}
.verdict li{margin:3px 0;font-size:14px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #e5e7eb;border-radius:8px;font-size:13px}
th,td{padding:7px 10px;border-bottom:1px solid #f1f5f9;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left;color:#4b5563;font-weight:500}
thead th{background:#f1f5f9;font-weight:600}
td.bad{color:#b91c1c}
td.warn{color:#92400e}
td.best,th.best{background:#ecfdf5}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 10px 4px;margin:12px 0;overflow-x:auto}
.note{font-size:12.5px;color:#4b5563;line-height:1.5}
code{background:#f1f5f9;padding:1px 4px;border-radius:4px;font-size:12px}
.warn{color:#92400e}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


REFERENCE = {"ordered_at": "order", "boot": "boot", "container_start": "container start", "bench_start": "bench start"}


def _seconds(v: float | None) -> str:
    if v is None:
        return "unknown"
    return f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min" if v < 7200 else f"{v / 3600:.1f} h"


def _rate(v: float | None, unit: str | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} {unit or ''}/s" if v >= 100 else f"{v:,.2f} {unit or ''}/s"


def _money(v: float | None, digits: int = 4) -> str:
    return "unknown" if v is None else f"${v:,.{digits}f}"


def _disk(r: Row) -> str:
    if r.disk_write_bytes_per_second is None:
        return "-"
    return f"{r.disk_write_bytes_per_second / MB:,.0f} / {format_rate(r.disk_read_bytes_per_second or 0)}"


def _cell_class(name: str, text: str, bad: bool, r: Row, best: str | None) -> str:
    if name == "environment problems" and r.env_problems:
        # doctor warnings are worth reading, failures and faults are worth fearing
        return "bad" if any(not p.startswith("doctor warns") for p in r.env_problems) else "warn"
    if bad:
        return "bad"
    return "best" if r.label == best else ""


def _table(c: Comparison) -> str:
    rows = c.rows

    def cls(r: Row) -> str:
        return ' class="best"' if r.label == c.best else ""

    head = "".join(f"<th{cls(r)}>{_e(r.label)}</th>" for r in rows)
    lines: list[tuple[str, list[tuple[str, bool]]]] = [
        ("GPU", [(f"{r.gpu_count} × {r.gpu}" if r.gpu else "none", False) for r in rows]),
        ("status", [(r.status if r.completed else f"{r.status}: {r.error or 'fault'}", not r.completed) for r in rows]),
        (
            "start-up (time to ready)",
            [
                (f"{_seconds(r.startup_seconds)} from {REFERENCE.get(r.startup_reference, r.startup_reference)}", False)
                for r in rows
            ],
        ),
        ("environment problems", [("; ".join(r.env_problems) if r.env_problems else "none", False) for r in rows]),
        ("stable duration", [(f"{_seconds(r.stable_seconds)} of {_seconds(r.ran_seconds)}", False) for r in rows]),
        ("effective throughput", [(_rate(r.effective_per_second, r.unit), False) for r in rows]),
        ("median interval", [(_rate(r.median_per_second, r.unit), False) for r in rows]),
        ("interval spread", [("-" if r.spread is None else f"{r.spread:.1%}", False) for r in rows]),
        (
            "at the power cap",
            [(_seconds(r.power_limited_seconds) if r.power_limited_seconds else "never", False) for r in rows],
        ),
        ("price per hour", [(_money(r.price_per_hour, 2), r.price_per_hour is None) for r in rows]),
        ("rerun probability p", [(f"{r.rerun_probability:.0%}", r.rerun_probability > 0) for r in rows]),
        (
            f"hours for W ({c.work_units or 0:,.0f} {c.unit or ''})",
            [("-" if r.hours_for_work is None else f"{r.hours_for_work:.3f} h", False) for r in rows],
        ),
        (f"cost per {c.unit_label}", [(_money(r.cost_per_unit), r.cost_per_unit is None) for r in rows]),
        ("disk write / read", [(_disk(r), False) for r in rows]),
        (
            "peak device memory",
            [("-" if r.peak_device_bytes is None else format_gib(r.peak_device_bytes), False) for r in rows],
        ),
    ]
    body = []
    for name, cells in lines:
        tds = "".join(
            f'<td class="{_cell_class(name, text, bad, r, c.best)}">{_e(text)}</td>'
            for (text, bad), r in zip(cells, rows, strict=True)
        )
        body.append(f"<tr><td>{_e(name)}</td>{tds}</tr>")
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_compare(c: Comparison) -> str:
    unit = c.unit or "units"
    throughput = line_chart(
        [Series(r.label, r.series) for r in c.rows],
        chart_id="throughput",
        title=f"Throughput over time ({unit}/s per interval)",
        x_label="seconds since the first step",
        y_label=f"{unit}/s",
    )
    clocks = line_chart(
        [Series(r.label, r.clock_series) for r in c.rows],
        chart_id="clock",
        title="SM clock over time (MHz, mean of the job's GPUs; NVML each second)",
        x_label="seconds since the first step",
        y_label="MHz",
        y_from_zero=False,
        y_format=lambda v: f"{v:,.0f}",
    )
    cost = bar_chart(
        [
            Bar(r.label, r.cost_per_unit, _money(r.cost_per_unit) if r.cost_per_unit is not None else "unknown")
            for r in c.rows
        ],
        chart_id="cost",
        title=f"Cost per {c.unit_label} (start-up and expected reruns included)",
        value_label=f"US$ per {c.unit_label}",
        highlight=c.best,
    )
    startup = bar_chart(
        [Bar(r.label, r.startup_seconds, _seconds(r.startup_seconds)) for r in c.rows],
        chart_id="startup",
        title="Time to ready: from "
        + " / ".join(sorted({REFERENCE.get(r.startup_reference, "?") for r in c.rows}))
        + " to the first GPU step",
        value_label="seconds",
    )
    verdict_cls = "verdict" if c.best else "verdict none"
    best = (
        f"Best for this job: <b>{_e(c.best)}</b>"
        if c.best
        else "<b>No platform completed the job with a known cost</b>"
    )
    reasons = "".join(f"<li>{_e(r)}</li>" for r in c.reasons)
    warnings = "".join(f'<p class="note warn">warning: {_e(w)}</p>' for w in c.warnings)
    origins = "".join(f"<li><code>{_e(r.origin)}</code> ({_e(r.label)})</li>" for r in c.rows)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuready compare: {_e(", ".join(r.label for r in c.rows))}</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>Which platform does this job cheapest?</h1>
<p class="sub">gpuready compare · job (per GPU): {_e(" | ".join(c.jobs))}</p>
<div class="{verdict_cls}" id="verdict">{best}<ul>{reasons}</ul></div>
{warnings}
<h2>Side by side</h2>
{_table(c)}
<h2>Charts</h2>
<div class="card">{throughput}</div>
<div class="card">{cost}</div>
<div class="card">{clocks}</div>
<div class="card">{startup}</div>
<h2>How the cost is computed</h2>
<p class="note"><code>{_e(c.formula)}</code></p>
<p class="note">W = {c.work_units or 0:,.0f} {_e(unit)} ({_e(c.work_basis)}). Effective throughput is all the work of
the bench over its wall time, stalls included; start-up is the record's time to ready; p is the share of the
platform's bench records that ended in a fault (not <code>ok</code>, an Xid, new uncorrectable ECC errors), and
1 / (1 − p) the expected number of attempts.</p>
<h2>Records</h2>
<ul class="note">{origins}</ul>
</main>
</body>
</html>
"""
