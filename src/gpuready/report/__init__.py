"""Rendering of results as self-contained pages: inline SVG charts made in Python, no scripts, no network."""

from gpuready.report.svg import Bar, Series, bar_chart, line_chart

__all__ = ["Bar", "Series", "bar_chart", "line_chart"]
