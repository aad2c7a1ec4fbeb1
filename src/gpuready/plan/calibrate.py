"""Measured records sharpen the plan: a GPU model's step-time factor = the median of measured / predicted step
seconds over the records of that card in the results database (store/db.py).

A record is any run whose workload is stored (`runs.workload`, the Workload fields) and whose points carry
`step_seconds` for one optimizer step (training) or one request (inference), on a GPU whose name (NVML's, e.g.
"NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla T4") maps to a catalog card. `trial` writes such runs; `bench`
may too (same columns). Each point's `values` (the swept variable, e.g. {"batch": 8}) override the workload.

`refresh_factors(db)` fits and stores the factors (table gpu_efficiency); `stored_factors()` reads them for
`plan` without creating a database; `card_for(nvml_name)` maps a device name to the catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuready.catalog import Gpu, card_for_device
from gpuready.store.db import ResultsDB, default_db_path

# records that disagree with the model by more than this factor are faults (a throttled or shared GPU, a
# failed job), not calibration
_SANE = (1 / 5, 5.0)


def card_for(device_name: str) -> Gpu | None:
    """The catalog card an NVML device name means (gpuready.catalog.card_for_device)."""
    return card_for_device(device_name)


def _records(db: ResultsDB) -> list[tuple[Gpu, Any, float]]:
    from gpuready.workload import make_workload

    out = []
    for run in db.runs(limit=None):
        if not run.workload or not run.gpu:
            continue
        card = card_for(run.gpu)
        if card is None:
            continue
        for point in run.points:
            seconds = point.get("step_seconds")
            if not point.get("ok") or not seconds:
                continue
            fields = {k: v for k, v in run.workload.items() if v is not None} | dict(point.get("values") or {})
            try:
                w = make_workload(**fields)
            except Exception:  # a record of another gpuready version's workload: skip it, it says nothing here
                continue
            out.append((card, w, float(seconds)))
    return out


def fit_factors(db: ResultsDB) -> dict[str, tuple[float, int, dict[str, Any]]]:
    """Catalog name -> (median measured/predicted, records used, detail) from the records in `db`."""
    from gpuready.plan.steptime import step_time

    ratios: dict[str, list[float]] = {}
    for card, w, seconds in _records(db):
        try:
            predicted = step_time(w, card).seconds
        except Exception:  # a model that cannot be resolved here (a local folder gone): skip the record
            continue
        if predicted <= 0:
            continue
        ratio = seconds / predicted
        if _SANE[0] <= ratio <= _SANE[1]:
            ratios.setdefault(card.name, []).append(ratio)
    import statistics  # (here: its import pulls in fractions and decimal, which plan's start-up need not pay)

    return {
        name: (statistics.median(vals), len(vals), {"min": min(vals), "max": max(vals)})
        for name, vals in ratios.items()
    }


def refresh_factors(db: ResultsDB) -> dict[str, float]:
    """Fit the factors from the records and store them in the database; returns name -> factor."""
    factors = fit_factors(db)
    db.set_gpu_efficiency(factors)
    return {name: f for name, (f, _, _) in factors.items()}


def stored_factors(path: str | Path | None = None) -> dict[str, float]:
    """Factors for `plan`, refreshed from the records, when a results database exists (none is created);
    an unreadable database gives no factors (plan then uses the fitted model alone)."""
    p = Path(path).expanduser() if path is not None else default_db_path()
    if not p.is_file():
        return {}
    try:
        with ResultsDB(p) as db:
            return refresh_factors(db)
    except Exception:  # the database is the user's; plan must answer without it
        return {}
