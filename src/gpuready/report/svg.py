"""Small SVG charts as strings: a line chart (several series over one x axis) and a horizontal bar chart.

Plain SVG 1.1 with inline styles, so a page that holds them needs no script, font or file from anywhere.
Every mark carries a <title> (the browser's tooltip) with its exact value.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Okabe & Ito's colour-blind-safe palette (https://jfly.uni-koeln.de/color/), black last
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MAX_DOTS = 40
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None  # None: drawn as "unknown"
    text: str  # the value as shown at the bar's end


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 10))
    return ticks


def short_number(v: float) -> str:
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            x = v / div
            return f"{x:.0f}{suffix}" if x == int(x) else f"{x:.1f}{suffix}"
    return f"{v:.0f}" if v == int(v) else f"{v:.2g}"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def line_chart(
    series: Sequence[Series],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 760,
    height: int = 320,
    y_format: Callable[[float], str] = short_number,
    y_from_zero: bool = True,
) -> str:
    """Lines over a shared x axis. `y_from_zero=False` fits the y axis to the data (for values that move
    within a narrow band, such as clocks)."""
    left, right, top, bottom = 64, 16, 40, 72
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x_ticks = nice_ticks(0.0, max(xs) if xs else 1.0)
    y_lo = 0.0 if y_from_zero or not ys else min(ys) - 0.1 * (max(ys) - min(ys) or max(ys))
    y_ticks = nice_ticks(y_lo, max(ys) * 1.05 if ys else 1.0)
    x_max, y_min, y_max = x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + pw * x / x_max

    def sy(y: float) -> float:
        return top + ph * (1 - (y - y_min) / (y_max - y_min))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{_esc(chart_id)}" role="img"'
        f' width="{width}" height="{height}" viewBox="0 0 {width} {height}" aria-label="{_esc(title)}">',
        f'<text x="{left}" y="22" style="{FONT};font-size:15px;font-weight:600;fill:#222">{_esc(title)}</text>',
    ]
    for t in y_ticks:
        y = sy(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        out.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end" style="{FONT};font-size:11px;fill:#555">'
            f"{_esc(y_format(t))}</text>"
        )
    for t in x_ticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(
            f'<text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle" style="{FONT};font-size:11px;fill:#555">'
            f"{_esc(short_number(t))}</text>"
        )
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#888"/>')
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{top + ph + 36}" text-anchor="middle"'
        f' style="{FONT};font-size:12px;fill:#333">{_esc(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(14,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle"'
        f' style="{FONT};font-size:12px;fill:#333">{_esc(y_label)}</text>'
    )
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(s.points)
        if pts:
            d = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for j, (x, y) in enumerate(pts))
            out.append(
                f'<path class="series" data-label="{_esc(s.label)}" d="{d}" fill="none" stroke="{color}"'
                f' stroke-width="2.2" stroke-linejoin="round"/>'
            )
            # a dot per point while they are few enough to read; the line alone beyond that (hover: the path)
            for x, y in pts if len(pts) <= MAX_DOTS else []:
                out.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                    f"<title>{_esc(s.label)}: {_esc(y_format(y))} at {x:.0f} s</title></circle>"
                )
        # legend under the axis label, left to right
        lx = left + 170 * i
        ly = height - 12
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="14" height="4" fill="{color}"/>')
        out.append(f'<text x="{lx + 20}" y="{ly - 3}" style="{FONT};font-size:12px;fill:#333">{_esc(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(
    bars: Sequence[Bar],
    *,
    chart_id: str,
    title: str,
    value_label: str,
    width: int = 760,
    highlight: str | None = None,
) -> str:
    left, right, top = 170, 110, 40
    row = 34
    height = top + row * max(1, len(bars)) + 40
    pw = width - left - right
    known = [b.value for b in bars if b.value is not None]
    ticks = nice_ticks(0.0, max(known) if known else 1.0, 4)
    v_max = ticks[-1]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{_esc(chart_id)}" role="img"'
        f' width="{width}" height="{height}" viewBox="0 0 {width} {height}" aria-label="{_esc(title)}">',
        f'<text x="12" y="22" style="{FONT};font-size:15px;font-weight:600;fill:#222">{_esc(title)}</text>',
    ]
    base = top + row * max(1, len(bars))
    for t in ticks:
        x = left + pw * t / v_max
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{base}" stroke="#e5e7eb"/>')
        out.append(
            f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle" style="{FONT};font-size:11px;fill:#555">'
            f"{_esc(f'{t:g}')}</text>"
        )
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{base + 32}" text-anchor="middle" style="{FONT};font-size:12px;fill:#333">'
        f"{_esc(value_label)}</text>"
    )
    for i, b in enumerate(bars):
        y = top + row * i
        color = PALETTE[i % len(PALETTE)]
        weight = "700" if b.label == highlight else "400"
        out.append(
            f'<text x="{left - 10}" y="{y + row / 2 + 4:.1f}" text-anchor="end"'
            f' style="{FONT};font-size:12px;font-weight:{weight};fill:#222">{_esc(b.label)}</text>'
        )
        if b.value is None:
            out.append(
                f'<text x="{left + 6}" y="{y + row / 2 + 4:.1f}" style="{FONT};font-size:12px;fill:#b91c1c">'
                f"{_esc(b.text)}</text>"
            )
            continue
        w = max(1.0, pw * b.value / v_max)
        out.append(
            f'<rect class="bar" data-label="{_esc(b.label)}" x="{left}" y="{y + 6}" width="{w:.1f}"'
            f' height="{row - 12}" rx="3" fill="{color}"><title>{_esc(b.label)}: {_esc(b.text)}</title></rect>'
        )
        out.append(
            f'<text x="{left + w + 6:.1f}" y="{y + row / 2 + 4:.1f}" style="{FONT};font-size:12px;'
            f'font-weight:{weight};fill:#222">{_esc(b.text)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)
