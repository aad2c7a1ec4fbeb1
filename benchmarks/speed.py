"""Speed of the arithmetic estimator: the CLI end to end, its imports, and library estimates per second.

python benchmarks/speed.py            # prints a Markdown report
python benchmarks/speed.py --plan     # `gpuready plan` end to end only (docs/steptime.md)
"""

from __future__ import annotations

import itertools
import platform
import statistics
import subprocess
import sys
import time

from gpuready.memory import estimate
from gpuready.memory.estimate import clear_caches
from gpuready.workload import make_workload

CLI = [
    sys.executable,
    "-m",
    "gpuready",
    "estimate",
    "llama-3.1-8b",
    "--method",
    "lora",
    "--gpu-memory",
    "24GiB",
    "--json",
]


def cli_seconds(runs: int = 7) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(CLI, capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return times


def heavy_imports() -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", *CLI[1:]], capture_output=True, text=True)
    mods = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    return [m for m in mods if m.split(".")[0] in ("torch", "transformers", "numpy", "pandas")]


def library_rate(models: list[str]) -> tuple[int, float]:
    jobs = [
        make_workload(model=m, batch=b, seq=s, method=meth, grad_ckpt=ck)
        for m, b, s, meth, ck in itertools.product(models, (1, 2, 4), (512, 2048), ("full", "lora"), (False, True))
    ]
    clear_caches()
    t0 = time.perf_counter()
    for w in jobs:
        estimate(w)
    return len(jobs), time.perf_counter() - t0


def catalog_rate(models: list[str]) -> tuple[int, float]:
    """`plan`'s question: for each job, fits and largest batch on every card of the catalog. Distinct jobs, cache
    cleared first; the batch sizes the searches share are estimated once."""
    from gpuready.catalog.gpus import load_gpus

    cards = load_gpus()
    jobs = [make_workload(model=m, seq=2048, method=meth) for m in models for meth in ("full", "lora")]
    clear_caches()
    t0 = time.perf_counter()
    verdicts = 0
    for w in jobs:
        for card in cards:
            estimate(w, card.usable_bytes, find_max_batch=True)
            verdicts += 1
    return verdicts, time.perf_counter() - t0


PLAN_JOBS = (
    ["llama-3.2-3b", "--batch", "4", "--seq", "2048"],
    ["qwen2.5-7b", "--method", "lora", "--seq", "4096", "--grad-ckpt", "--tokens", "50000000"],
    ["resnet50", "--batch", "128"],
)


def plan_report(runs: int = 3) -> None:
    """`gpuready plan` end to end: estimates on every catalog card (cached per memory size), same-work changes
    for the cards that need one, the step time of each."""
    print(f"date: {time.strftime('%Y-%m-%d')}, machine: {platform.platform()}, python {platform.python_version()}")
    print("command: python benchmarks/speed.py --plan\n")
    print("| plan job | median s | min s | max s |\n|---|---:|---:|---:|")
    for job in PLAN_JOBS:
        argv = [sys.executable, "-m", "gpuready", "plan", *job, "--json"]
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=False)
            times.append(time.perf_counter() - t0)
        print(f"| {' '.join(job)} | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} |")


def main() -> int:
    if "--plan" in sys.argv[1:]:
        plan_report()
        return 0
    times = cli_seconds()
    heavy = heavy_imports()
    print(
        f"date: {time.strftime('%Y-%m-%d')}, machine: {platform.platform()}, {platform.processor() or '?'}, "
        f"python {platform.python_version()}"
    )
    print(
        f"command: python benchmarks/speed.py\n\n## CLI end to end\n`{' '.join(CLI[2:])}`: median "
        f"{statistics.median(times):.3f} s, min {min(times):.3f} s, max {max(times):.3f} s over {len(times)} runs "
        "(includes the max-batch search and the re-estimated mitigations)"
    )
    print(f"\nheavy modules imported by the CLI (python -X importtime): {heavy or 'none'}")
    print(
        "\n## Library, distinct jobs (cache cleared)\n| models | jobs | seconds | estimates/s |\n|---|---:|---:|---:|"
    )
    for models in (["gpt2", "qwen2.5-0.5b"], ["llama-3.2-1b", "llama-3.1-8b"], ["llama-3.1-70b"]):
        n, sec = library_rate(models)
        print(f"| {', '.join(models)} | {n} | {sec:.2f} | {n / sec:.0f} |")
    print(
        "\n## Library, the catalog sweep `plan` makes (fits + max batch on every catalog card; repeated batch sizes "
        "cached)\n| models | card verdicts | seconds | verdicts/s |\n|---|---:|---:|---:|"
    )
    for models in (["qwen2.5-0.5b", "llama-3.2-1b"], ["llama-3.1-8b", "qwen2.5-7b"]):
        n, sec = catalog_rate(models)
        print(f"| {', '.join(models)} | {n} | {sec:.2f} | {n / sec:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
