"""Charts of peak memory against the swept variable, with the GPU's capacity and the estimator's prediction.

PNG through matplotlib when it is installed (imported lazily), else an SVG written here by hand; and a text
chart for the terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

from gpuready.trial.result import TrialResult
from gpuready.units import GIB

Predictor = Callable[[int], float | None]


def _series(
    result: TrialResult, predict: Predictor | None
) -> tuple[list[tuple[int, float, bool, str]], list[tuple[int, float]]]:
    var = result.variable or "run"
    measured = []
    for p in result.points:
        if var not in p.values or p.status == "skipped":
            continue
        peak = p.peak_device_bytes or p.peak_reserved_bytes
        measured.append((int(p.values[var]), float(peak) / GIB if peak else float("nan"), p.ok, p.status))
    measured.sort()
    predicted: list[tuple[int, float]] = []
    if predict is not None and measured:
        xs = sorted({x for x, *_ in measured} | ({result.max} if result.max else set()))
        lo, hi = xs[0], xs[-1]
        grid = sorted(set(xs) | {lo + (hi - lo) * i // 16 for i in range(17)})
        for x in grid:
            val = predict(x) if x > 0 else None
            if val:
                predicted.append((x, val / GIB))
    return measured, predicted


def write_chart(result: TrialResult, path: str | Path, predict: Predictor | None = None, title: str = "") -> Path:
    """Write a PNG (matplotlib) or an SVG (.svg, or matplotlib missing). Returns the path written."""
    out = Path(path)
    if out.suffix.lower() == ".png":
        try:
            _write_png(result, out, predict, title)
            return out
        except ImportError:
            out = out.with_suffix(".svg")
    out.write_text(svg_chart(result, predict, title), encoding="utf-8")
    return out


def _write_png(result: TrialResult, out: Path, predict: Predictor | None, title: str) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    measured, predicted = _series(result, predict)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ok = [(x, y) for x, y, good, _ in measured if good]
    bad = [(x, y) for x, y, good, _ in measured if not good]
    if ok:
        ax.plot([x for x, _ in ok], [y for _, y in ok], "o-", color="tab:blue", label="measured peak (device)")
    if bad:
        cap = (result.capacity_bytes or 0) / GIB
        ax.plot(
            [x for x, _ in bad],
            [y if y == y else cap for _, y in bad],
            "x",
            color="tab:red",
            markersize=10,
            label="out of memory / failed",
        )
    if predicted:
        ax.plot(
            [x for x, _ in predicted],
            [y for _, y in predicted],
            "--",
            color="tab:orange",
            label="estimator's prediction",
        )
    if result.capacity_bytes:
        ax.axhline(result.capacity_bytes / GIB, color="black", linewidth=1, label="GPU capacity")
    if result.max:
        ax.axvline(result.max, color="tab:green", linestyle=":", label=f"max {result.variable} = {result.max}")
    ax.set_xlabel(result.variable or "")
    ax.set_ylabel("peak GPU memory (GiB)")
    ax.set_title(title or result.target, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def svg_chart(result: TrialResult, predict: Predictor | None = None, title: str = "") -> str:
    measured, predicted = _series(result, predict)
    w, h, left, right, top, bottom = 640, 380, 60, 20, 30, 45
    xs = [x for x, *_ in measured] + [x for x, _ in predicted] or [0, 1]
    cap = (result.capacity_bytes or 0) / GIB
    ys = [y for _, y, *_ in measured if y == y] + [y for _, y in predicted] + [cap] + [0.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y1 = max(ys) * 1.08 or 1.0

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def py(y: float) -> float:
        return h - bottom - y / y1 * (h - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{escape(title or result.target)}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">{escape(result.variable or "")}</text>',
        f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
        "peak GPU memory (GiB)</text>",
    ]
    for i in range(5):
        val = y1 * i / 4
        parts.append(f'<text x="{left - 6}" y="{py(val) + 4:.1f}" text-anchor="end">{val:.0f}</text>')
    for x in sorted({x for x, *_ in measured}):
        parts.append(f'<text x="{px(x):.1f}" y="{h - bottom + 15}" text-anchor="middle">{x}</text>')
    if cap:
        parts.append(f'<line x1="{left}" y1="{py(cap):.1f}" x2="{w - right}" y2="{py(cap):.1f}" stroke="black"/>')
        parts.append(f'<text x="{w - right}" y="{py(cap) - 4:.1f}" text-anchor="end">GPU capacity {cap:.1f} GiB</text>')
    if len(predicted) > 1:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in predicted)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="darkorange" stroke-dasharray="6 4"/>')
    ok = [(x, y) for x, y, good, _ in measured if good and y == y]
    if len(ok) > 1:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in ok)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="steelblue"/>')
    for x, y, good, status in measured:
        yy = y if y == y else cap
        if good:
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(yy):.1f}" r="4" fill="steelblue">'
                f"<title>{x}: {y:.2f} GiB</title></circle>"
            )
        else:
            cx, cy = px(x), py(yy)
            parts.append(
                f'<path d="M{cx - 5:.1f},{cy - 5:.1f} L{cx + 5:.1f},{cy + 5:.1f} M{cx - 5:.1f},{cy + 5:.1f} '
                f'L{cx + 5:.1f},{cy - 5:.1f}" stroke="crimson" stroke-width="2">'
                f"<title>{x}: {escape(status)}</title></path>"
            )
    legend = [("steelblue", "measured peak (device)"), ("crimson", "out of memory / failed")]
    if predicted:
        legend.append(("darkorange", "estimator's prediction"))
    for i, (color, label) in enumerate(legend):
        yl = top + 8 + 15 * i
        parts.append(f'<rect x="{left + 10}" y="{yl - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{left + 25}" y="{yl + 1}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def text_chart(result: TrialResult, predict: Predictor | None = None, width: int = 40) -> list[str]:
    """One bar per point, scaled to the GPU's capacity (or the largest peak)."""
    measured, _ = _series(result, None)
    cap = (result.capacity_bytes or 0) / GIB
    scale = max([cap] + [y for _, y, *_ in measured if y == y] + [1e-9])
    lines = []
    var = result.variable or "run"
    for x, y, good, status in measured:
        filled = 0 if y != y else min(width, round(y / scale * width))
        bar = "█" * filled + "·" * (width - filled)
        shown = f"{y:7.1f} GiB" if y == y else "      ? GiB"
        pred = predict(x) if predict is not None else None
        extra = f"  (predicted {pred / GIB:.1f})" if pred else ""
        lines.append(f"{var}={x:<6} {bar} {shown}  {'ok' if good else status}{extra}")
    if cap:
        lines.append(f"{'':{len(var) + 8}}{'─' * width} capacity {cap:.1f} GiB")
    return lines
