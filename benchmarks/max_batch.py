"""Largest batch that runs on emulated cards, against `gpuready estimate`'s max_batch (docs/max_batch.md).

A job list (benchmarks/jobs_max_batch_*.txt) has one case a line: `GPU LANE NAME CARD MODEL [workload flags]`.
Cases of one (GPU, lane) run one after another; the lanes run at the same time, so the cards of the lanes that
share a GPU must add up to less than its memory (the cap `trial --gpu-memory` sets is per process:
torch.cuda.set_per_process_memory_fraction). Each point is a fresh process:
`python3 -m gpuready trial MODEL FLAGS --batch B --gpu-memory CARD --no-db --json`.

    python benchmarks/max_batch.py predict JOBS > PREDICTED.tsv           # with the committed code, before the GPU
    python benchmarks/max_batch.py predict JOBS --lm-margin 0 > P.tsv     # the same with the language-model margin
    python benchmarks/max_batch.py predict JOBS --release-margin 0 > P.tsv  # ... with the release margin at 0
    python3 benchmarks/max_batch.py measure JOBS PREDICTED.tsv OUT [--deadline 460]   # on the GPU machine
    python benchmarks/max_batch.py table docs/max_batch/cases.tsv          # every measured case against today's code
    python benchmarks/max_batch.py margins docs/max_batch/cases.tsv        # what release margin the cases allow

`measure` starts each case at its committed prediction and searches with gpuready/search.py (step up by 1, 2, 4,
... while batches run; down likewise from a failure; then bisect), so a right prediction costs two points (P runs,
P + 1 does not). It writes OUT/points.jsonl (every point), OUT/measured.tsv and prints the summary table.

`margins` is the measurement behind the language-model release margin (memory/fit.py): for every language-model
case whose `ran` or `failed` batch needs a cache release under the card's limit (its reserve with no limit is over
it), whether the program's replay under the limit completes, and if so the largest share of the job's largest
allocation that could be kept free with the replay still completing, with the replay's outcome on a grid of limits
1 GiB below to 1 GiB above the card's ('+' completes, '.' fails; the middle one is the card's). A release margin
separates the cases only if it is above what every failed batch tolerates and below what every batch that ran does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # runnable from a checkout without installing the package

from gpuready.search import largest_passing  # noqa: E402


def read_jobs(path: Path) -> list[dict[str, Any]]:
    jobs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        gpu, lane, name, card, *workload = shlex.split(line)
        jobs.append({"gpu": gpu, "lane": lane, "name": name, "card": card, "args": workload})
    return jobs


def predict(jobs: list[dict[str, Any]], lm_margin: float | None = None, release_margin: float | None = None) -> None:
    """`gpuready estimate ... --batch 1 --gpu-memory CARD --json`'s max_batch for each case, as a user gets it.
    lm_margin: the share of the largest allocation kept free for language models (memory/fit.py "lm" and
    "generate") set to this instead, in this process (to compare the committed rule with another); release_margin:
    the same for the language models' release margin (RELEASE_MARGIN_SHARE_OF_LARGEST["lm"])."""
    print("name\tcard\tpredicted_max_batch\tseconds\tjob")
    if lm_margin is not None or release_margin is not None:
        predict_in_process(jobs, lm_margin, release_margin)
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for job in jobs:
        cmd = [sys.executable, "-m", "gpuready", "estimate", *job["args"], "--batch", "1"]
        cmd += ["--gpu-memory", job["card"], "--json"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        took = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{job['name']}: {proc.stderr.strip()}")
        pred = json.loads(proc.stdout)["max_batch"]
        print(f"{job['name']}\t{job['card']}\t{pred}\t{took:.2f}\t{' '.join(job['args'])}", flush=True)


def predict_in_process(jobs: list[dict[str, Any]], lm_margin: float | None, release_margin: float | None) -> None:
    from gpuready.memory import fit
    from gpuready.memory.estimate import estimate
    from gpuready.units import parse_size
    from gpuready.workload import workload_from_args

    if lm_margin is not None:
        for kind in ("lm", "generate"):
            fit.MARGIN_SHARE_OF_LARGEST[kind] = lm_margin
    if release_margin is not None:
        fit.RELEASE_MARGIN_SHARE_OF_LARGEST["lm"] = release_margin
    for job in jobs:
        start = time.perf_counter()
        w = workload_from_args(" ".join(shlex.quote(a) for a in job["args"]) + " --batch 1")
        pred = estimate(w, parse_size(job["card"], "card")).max_batch
        took = time.perf_counter() - start
        print(f"{job['name']}\t{job['card']}\t{pred}\t{took:.2f}\t{' '.join(job['args'])}", flush=True)


class Lane(threading.Thread):
    def __init__(self, jobs: list[dict[str, Any]], starts: dict[str, int], out: Path, deadline: float) -> None:
        super().__init__(daemon=True)
        self.jobs, self.starts, self.out, self.deadline = jobs, starts, out, deadline
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def point(self, job: dict[str, Any], batch: int) -> bool:
        left = self.deadline - time.monotonic()
        if left < MIN_POINT_SECONDS:
            raise TimeoutError
        limit = int(min(POINT_TIMEOUT, left - 10))  # a point never runs past the deadline
        cmd = [sys.executable, "-m", "gpuready", "trial", *job["args"], "--batch", str(batch)]
        cmd += ["--gpu-memory", job["card"], "--no-db", "--json", "--timeout", str(limit)]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=job["gpu"])
        started = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False, timeout=limit + 8
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{job['name']} batch {batch}: no answer in {limit + 8} s") from exc
        row: dict[str, Any] = {"name": job["name"], "batch": batch, "exit": proc.returncode}
        try:
            point = json.loads(proc.stdout)["points"][0]
            row.update(
                status=point.get("status"),
                peak_allocated_bytes=point.get("peak_allocated_bytes"),
                peak_reserved_bytes=point.get("peak_reserved_bytes"),
                memory_cap_bytes=point.get("memory_cap_bytes"),
                error=(point.get("error") or "")[:400],
            )
        except (ValueError, KeyError, IndexError):
            row.update(status="no_result", error=(proc.stderr or proc.stdout)[-400:])
        row["wall_seconds"] = round(time.monotonic() - started, 1)
        with (self.out / "points.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[gpu {job['gpu']}] {job['name']} batch {batch}: {row['status']} ({row['wall_seconds']} s)", flush=True)
        if row["status"] not in ("ok", "oom", "cuda_error"):
            raise RuntimeError(f"{job['name']} batch {batch}: {row['status']}: {row.get('error')}")
        return bool(row["status"] == "ok")

    def run(self) -> None:
        for job in self.jobs:
            start = max(1, self.starts.get(job["name"], 1))
            tried: dict[int, bool] = {}
            result: dict[str, Any] = {"name": job["name"], "card": job["card"], "start": start}
            try:
                bounded_search(lambda b, job=job: self.point(job, b), start, tried, POINTS_PER_CASE)
                why = None
            except (TimeoutError, RuntimeError) as exc:
                why = str(exc) or "deadline"
            ran = [b for b, ok in tried.items() if ok]
            failed = [b for b, ok in tried.items() if not ok]
            lo, hi = max(ran, default=0), min(failed, default=None)
            result.update(measured=lo, failed_at=hi, complete=hi == lo + 1 or (lo == 0 and hi == 1), why=why)
            result["points"] = dict(sorted(tried.items()))
            self.results.append(result)


POINTS_PER_CASE = 7
MIN_POINT_SECONDS = 40  # no point starts with less time than this left before the deadline
POINT_TIMEOUT = 180


class _Budget(Exception):
    pass


def bounded_search(test: Any, start: int, tried: dict[int, bool], budget: int) -> None:
    """The points that decide a prediction first, then as exact a maximum as `budget` points allow.

    start (the prediction) and start + 1: right when the first runs and the second does not. When start + 1 runs
    too, the first batch that would make the prediction fall below 80% of the truth, ceil(start / 0.8) + 1: if it
    fails the prediction is within 80%. Then gpuready/search.py's search on what is left of the budget (it reuses
    the points already run)."""

    def run(batch: int) -> bool:
        if batch not in tried:
            if len(tried) >= budget:
                raise _Budget
            tried[batch] = bool(test(batch))
        return tried[batch]

    try:
        if run(start) and run(start + 1):
            far = math.ceil(start / 0.8) + 1
            if far > start + 1:
                run(far)
        ran = max((b for b, ok in tried.items() if ok), default=start)
        largest_passing(run, 1, 1 << 14, start=ran, step=max(1, ran // 8))
    except _Budget:
        pass


def measure(jobs: list[dict[str, Any]], predicted: Path, out: Path, deadline_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    starts = {}
    for line in predicted.read_text(encoding="utf-8").splitlines()[1:]:
        name, _card, pred, *_ = line.split("\t")
        starts[name] = int(pred)
    lanes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job in jobs:
        lanes.setdefault((job["gpu"], job["lane"]), []).append(job)
    deadline = time.monotonic() + deadline_s
    threads = [Lane(js, starts, out, deadline) for js in lanes.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_name = {r["name"]: r for t in threads for r in t.results}
    lines = ["name\tcard\tpredicted\tmeasured\tcomplete\tverdict\tpoints (+ ran, - failed)"]
    for job in jobs:
        r = by_name.get(job["name"])
        if r is None:
            lines.append(f"{job['name']}\t{job['card']}\t{starts.get(job['name'])}\t\tFalse\tnot run\t")
            continue
        pred, meas = starts.get(job["name"], 0), r["measured"]
        if not r["points"]:  # no batch ran or failed: the case says nothing (e.g. a job the trial cannot run)
            lines.append(f"{job['name']}\t{job['card']}\t{pred}\t\tFalse\tnot measured ({r['why']})\t")
            continue
        verdict = "over" if pred > meas else "ok" if pred >= math.ceil(0.8 * meas) else "low"
        if not r["complete"]:
            why = f"; {r['why'][:60]}" if r["why"] else ""
            verdict += f" (bracket: ran {meas}, failed {r.get('failed_at')}{why})"
        pts = ",".join(f"{b}{'+' if ok else '-'}" for b, ok in r["points"].items())
        lines.append(f"{job['name']}\t{job['card']}\t{pred}\t{meas}\t{r['complete']}\t{verdict}\t{pts}")
    (out / "measured.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def read_cases(path: Path) -> list[dict[str, Any]]:
    """docs/max_batch/cases.tsv: every measured case, `ran` the largest batch that ran, `failed` the smallest that
    did not (empty when none did within the points run)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, line.split("\t"), strict=True)) for line in lines[1:] if line.strip()]


def verdict(predicted: int, ran: int, failed: int | None) -> str:
    """never above what ran (safe only up to `ran`: the truth is known to lie in [ran, failed - 1]), and at least 80%
    of the truth, rounded up (sure when it is of failed - 1, the largest the truth can be)."""
    if failed is not None and predicted >= failed:
        return "over"
    if predicted > ran:
        return "unknown (above what ran)"
    top = failed - 1 if failed is not None else None
    if top is not None and predicted >= math.ceil(0.8 * top):
        return "ok"
    return "low" if predicted < math.ceil(0.8 * ran) else "unknown (truth not bracketed)"


def table(cases: list[dict[str, Any]]) -> None:
    """Predicted now (this checkout's `estimate`) against every measured case, as docs/max_batch.md shows them."""
    from gpuready.memory import estimate
    from gpuready.units import parse_size
    from gpuready.workload import workload_from_args

    print("| job | card | ran | failed | predicted | verdict |")
    print("|---|---|---:|---:|---:|---|")
    counts: dict[str, int] = {}
    for case in cases:
        w = workload_from_args(f"{case['job']} --batch 1")
        predicted = estimate(w, parse_size(case["card"], "card")).max_batch or 0
        failed = int(case["failed"]) if case["failed"] else None
        v = verdict(predicted, int(case["ran"]), failed)
        counts[v] = counts.get(v, 0) + 1
        known = f" (known: {case['known_miss']})" if case.get("known_miss") else ""
        shown_failed = case["failed"] or "none"
        print(f"| `{case['job']}` | {case['card']} | {case['ran']} | {shown_failed} | {predicted} | {v}{known} |")
    print()
    print(", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) + f" of {len(cases)}")


def margins(cases: list[dict[str, Any]]) -> None:
    """The release margins the language-model cases allow (see the module's docstring)."""
    import importlib

    from gpuready.memory.allocator import replay
    from gpuready.memory.fit import allocator_limit
    from gpuready.models import resolve_model
    from gpuready.units import GIB, parse_size
    from gpuready.workload import workload_from_args

    est = importlib.import_module("gpuready.memory.estimate")  # the module (the package exports the function)
    print("| job | card | batch | GPU | replay under the card's limit | completes with up to | limits -1 .. +1 GiB |")
    print("|---|---|---:|---|---|---:|---|")
    worst_failed: float | None = None
    least_ran: float | None = None
    for case in cases:
        for which in ("ran", "failed"):
            if not case[which] or int(case[which]) == 0:  # (none failed, or not even batch 1 ran)
                continue
            w = workload_from_args(f"{case['job']} --batch {case[which]}")
            spec = resolve_model(w.model, w.as_family)
            if est.margin_kind(spec, w) != "lm":
                continue
            run = est._core(spec, w)
            limit = allocator_limit(parse_size(case["card"], "card"), est.device_overhead_bytes(w))
            if run.replay_reserved <= limit or run.peak_allocated > limit:
                continue  # decided without a release: fits as it is, or its live tensors alone are over
            events = est._program(spec, w).events
            grid = "".join("+" if replay(events, limit + k * GIB // 8).oom_event is None else "." for k in range(-8, 9))
            tolerated: float | None = None
            if replay(events, limit).oom_event is None:
                lo, hi = 0.0, 1.5  # shares of the largest allocation
                for _ in range(12):
                    mid = (lo + hi) / 2
                    if replay(events, int(limit - mid * run.largest_request)).oom_event is None:
                        lo = mid
                    else:
                        hi = mid
                tolerated = lo
                if which == "failed":
                    worst_failed = max(worst_failed or 0.0, lo)
                else:
                    least_ran = lo if least_ran is None else min(least_ran, lo)
            outcome = "completes" if tolerated is not None else "fails"
            share = (
                f"{tolerated:.0%} ({tolerated * run.largest_request / GIB:.2f} GiB)" if tolerated is not None else "—"
            )
            print(f"| `{case['job']}` | {case['card']} | {case[which]} | {which} | {outcome} | {share} | `{grid}` |")
    print()
    failed = "none completes" if worst_failed is None else f"the most tolerant completes with {worst_failed:.0%}"
    ran = "none needs a release" if least_ran is None else f"the least tolerant completes with {least_ran:.0%}"
    print(f"batches that failed on the GPU: {failed}; batches that ran: {ran} (shares of the largest allocation)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("predict", "measure", "table", "margins"))
    ap.add_argument("jobs", type=Path)
    ap.add_argument("predicted", type=Path, nargs="?")
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--deadline", type=float, default=460.0, help="seconds after which nothing runs any more")
    ap.add_argument(
        "--lm-margin", type=float, help="predict: the share of the largest allocation always kept for language models"
    )
    ap.add_argument(
        "--release-margin", type=float, help="predict: the language models' release margin (share of the largest)"
    )
    opts = ap.parse_args()
    if opts.mode == "table":
        table(read_cases(opts.jobs))
        return 0
    if opts.mode == "margins":
        margins(read_cases(opts.jobs))
        return 0
    jobs = read_jobs(opts.jobs)
    if opts.mode == "predict":
        predict(jobs, opts.lm_margin, opts.release_margin)
        return 0
    if opts.predicted is None or opts.out is None:
        ap.error("measure needs PREDICTED.tsv and OUT")
    measure(jobs, opts.predicted, opts.out, opts.deadline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
