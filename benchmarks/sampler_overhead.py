"""Sampler overhead: the same probe job run plainly and wrapped as a user command sampled by NVML at 20 Hz.

Both runs are `python -m gpuready.trial.probe SPEC RESULT` with GPUREADY_PROBE_STEPS steps; the probe
reports its own median step time, so the wrapped run's step time includes whatever the sampler (in the
parent process, polling NVML and psutil) costs the job. Also reported: the sampler's achieved rate, its
mean cost per sample, and its peak (NVML per-process) against the probe's own peak_device_bytes.

    python benchmarks/sampler_overhead.py MODEL [--batch 4] [--seq 2048] [--steps 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from gpuready.trial import runner
from gpuready.trial.backend import CommandBackend, _child_env, probe_spec
from gpuready.workload import make_workload


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    opts = ap.parse_args()
    workload = make_workload(model=opts.model, batch=opts.batch, seq=opts.seq)
    env = _child_env() | {"GPUREADY_PROBE_STEPS": str(opts.steps)}
    os.environ.update(env)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(probe_spec(workload)))
        for rep in range(opts.repeats):
            for mode in ("plain", "sampled"):
                out = Path(tmp) / f"r{rep}-{mode}.json"
                argv = runner.python_module_argv("gpuready.trial.probe", str(spec_path), str(out))
                summary = None
                if mode == "plain":
                    proc = runner.run(argv, env=env)
                    wall = proc.duration_seconds
                else:
                    backend = CommandBackend(argv)
                    point = backend.run_point({})
                    summary = backend.last_summary
                    wall = point.wall_seconds
                res = json.loads(out.read_text())
                steady = res["step_times"][1:]
                row = {
                    "repeat": rep,
                    "mode": mode,
                    "median_step_seconds": statistics.median(steady),
                    "steps": len(steady),
                    "probe_peak_device_bytes": res.get("peak_device_bytes"),
                    "wall_seconds": wall,
                }
                if summary is not None:
                    row |= {
                        "sampler_hz": summary.rate_hz,
                        "sampler_samples": summary.samples,
                        "sample_cost_seconds": summary.sample_cost_seconds,
                        "sampler_peak_bytes": summary.peak_bytes,
                        "sampler_source": summary.source,
                        "sampler_peak_utilization": summary.peak_utilization,
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)
    plain = statistics.median(r["median_step_seconds"] for r in rows if r["mode"] == "plain")
    sampled = statistics.median(r["median_step_seconds"] for r in rows if r["mode"] == "sampled")
    costs = [r for r in rows if r["mode"] == "sampled"]
    cpu_fraction = statistics.fmean((r["sample_cost_seconds"] or 0) * (r["sampler_hz"] or 0) for r in costs)
    print(
        json.dumps(
            {
                "summary": True,
                "plain_step_seconds": plain,
                "sampled_step_seconds": sampled,
                "step_time_overhead_fraction": (sampled - plain) / plain,
                "sampler_busy_fraction_of_one_core": cpu_fraction,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
