"""Measure a list of jobs with the built-in probe (one fresh process per job) and write calibration rows.

Each input line is a job written as `gpuready estimate` arguments (`#` starts a comment; an optional
`id=NAME ` prefix names the row; with `--history-dir DIR`, a `history=NAME ` prefix records that job's caching
allocator history into DIR/NAME.json through the probe's GPUREADY_PROBE_MEMORY_HISTORY). Output: JSON lines
with exactly the keys of
../shared/calibration/h200.jsonl (id, args, gpu, gpus, peak_allocated_bytes, peak_reserved_bytes,
device_overhead_bytes, params, trainable, step_seconds); inference rows add request_seconds (the probe's
second timed generate() call, warm, since session 20, or its second prefill forward); a job that fails keeps null
peaks and adds `error`.

    python benchmarks/calibrate.py JOBS.txt OUT.jsonl [--timeout 300] [--nproc 2] [--history-dir DIR]
    python benchmarks/calibrate.py JOBS.txt PREDICTED.txt --predict   # no GPU: the estimator's predictions

`--predict` appends, per job, gpuready's predicted peak reserved and allocated bytes and the job, under a header
with the date and commit (the held-out sets commit these before the GPU measures them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuready.trial.backend import ProbeBackend
from gpuready.trial.probe import MEMORY_HISTORY_ENV
from gpuready.workload import Workload, workload_from_args

PREFIXES = ("id=", "history=")


def job_id(w: Workload) -> str:
    if w.task == "infer":
        prefix = "inf_gen" if w.new_tokens else "inf_prefill"
    else:
        prefix = {"full": "ft", "lora": "lora", "qlora": "qlora"}[w.method]
    parts = [prefix, w.model, w.precision + ("_autocast" if w.autocast else ""), f"b{w.batch}"]
    parts.append(f"img{w.image_size}" if w.model.startswith(("resnet", "vit")) else f"s{w.seq}")
    if w.new_tokens:
        parts.append(f"n{w.new_tokens}" + ("_sample" if w.decoding == "sample" else ""))
    if w.method != "full":
        parts.append(
            f"r{w.lora_r}" + ("_bf16lora" if w.lora_dtype == "bf16" else "") + ("_kbitprep" if w.kbit_prep else "")
        )
    if w.lora_targets:
        parts.append("t-" + "-".join(t.removesuffix("_proj") for t in w.lora_targets))
    if w.optim != "adamw":
        parts.append(w.optim)
    if w.attn != "sdpa":
        parts.append(w.attn)
    if w.grad_ckpt:
        parts.append("ckpt")
    return "_".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--nproc", type=int, default=None, help="run each job under torchrun with N processes")
    ap.add_argument("--history-dir", type=Path, default=None, help="where `history=NAME` jobs write their history")
    ap.add_argument("--predict", action="store_true", help="write the estimator's predictions instead of measuring")
    opts = ap.parse_args()
    lines = [ln.strip() for ln in opts.jobs.read_text().splitlines()]
    jobs = [ln for ln in lines if ln and not ln.startswith("#")]
    if opts.predict:
        return predict(jobs, opts.out)
    with opts.out.open("a", encoding="utf-8") as out:
        for args in jobs:
            given_id = history = None
            while args.startswith(PREFIXES):
                word, _, args = args.partition(" ")
                key, _, value = word.partition("=")
                given_id, history = (value, history) if key == "id" else (given_id, value)
            os.environ.pop(MEMORY_HISTORY_ENV, None)
            if history and opts.history_dir:
                opts.history_dir.mkdir(parents=True, exist_ok=True)
                os.environ[MEMORY_HISTORY_ENV] = str(opts.history_dir / f"{history}.json")
            workload = workload_from_args(args)
            t0 = time.perf_counter()
            point = ProbeBackend(workload, timeout=opts.timeout, nproc=opts.nproc).run_point({})
            row: dict[str, Any] = {
                "id": given_id or job_id(workload),
                "args": args,
                "gpu": point.gpu,
                "gpus": workload.gpus,
                "peak_allocated_bytes": point.peak_allocated_bytes if point.ok else None,
                "peak_reserved_bytes": point.peak_reserved_bytes if point.ok else None,
                "device_overhead_bytes": point.device_overhead_bytes if point.ok else None,
                "params": point.params,
                "trainable": point.trainable,
                "step_seconds": point.step_seconds if (point.ok and workload.task == "train") else None,
            }
            if point.ok and workload.task == "infer":
                # one request: the generate() call (new tokens), or the median prefill forward
                row["request_seconds"] = point.step_seconds
            if not point.ok:
                row["error"] = f"{point.status}: {point.error}"
            out.write(json.dumps(row) + "\n")
            out.flush()
            shown = f"{point.peak_reserved_bytes / 2**30:.2f} GiB reserved" if point.peak_reserved_bytes else "-"
            sys.stderr.write(f"{row['id']}: {point.status} {shown} ({time.perf_counter() - t0:.1f} s)\n")
    return 0


def _strip_prefixes(args: str) -> str:
    while args.startswith(PREFIXES):
        args = args.partition(" ")[2]
    return args


def predict(jobs: list[str], out: Path) -> int:
    from gpuready.memory import estimate

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, check=False
    ).stdout.strip()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with out.open("a", encoding="utf-8") as f:
        f.write(f"# gpuready estimate predictions (peak reserved / allocated, bytes), {stamp}, commit {commit}\n")
        for line in jobs:
            args = _strip_prefixes(line)
            est = estimate(workload_from_args(args))
            f.write(f"{est.peak_reserved_bytes} {est.peak_allocated_bytes} {args}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
