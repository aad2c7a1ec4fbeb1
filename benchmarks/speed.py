"""Speed of the arithmetic estimator: the CLI end to end and library estimates per second, this tree and another
commit side by side in the same run (timings on a shared machine only compare within one run).

python benchmarks/speed.py --against REF [--against REF2] [--runs 5]   # Markdown report, each REF exported by
                                                                        # `git archive`
python benchmarks/speed.py                             # this tree only
python benchmarks/speed.py --plan                      # `gpuready plan` end to end only (docs/steptime.md)
python benchmarks/speed.py --threads [--runs 3]        # estimate_batches' sweeps at 1, 2, 4, 8 threads
python benchmarks/speed.py --where [--runs 3] ARGS...   # where one `gpuready ARGS...` run's CPU time goes

Every CLI run is a fresh `python -m gpuready` process with its modules' bytecode already compiled (one untimed run
first, PYTHONDONTWRITEBYTECODE unset), as after `pip install`. Wall seconds and CPU seconds (user + system of the
child, less disturbed by other load) are both shown, median of the runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CLI_JOBS: dict[str, list[str]] = {
    "`estimate llama-3.1-8b --method lora --gpu-memory 24GiB --json` (fits, max batch, 4 mitigations)": [
        "estimate",
        "llama-3.1-8b",
        "--method",
        "lora",
        "--gpu-memory",
        "24GiB",
        "--json",
    ],
    "`plan llama-3.1-8b --method lora --json`": ["plan", "llama-3.1-8b", "--method", "lora", "--json"],
    "`--help`": ["--help"],
}
SWEEPS = (("gpt2", 256, 128), ("llama-3.2-1b", 2048, 64), ("llama-3.1-8b", 2048, 16))


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the tree's src first, then whatever path was given (a machine whose dependencies sit in a folder of their own)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
    return env


def cli_times(src: Path, argv: list[str], runs: int) -> tuple[float, float]:
    """(median wall s, median CPU s) of `python -m gpuready ARGV` with `src` first on the path."""
    cmd = [sys.executable, "-m", "gpuready", *argv]
    subprocess.run(cmd, capture_output=True, check=False, env=_env(src))  # compiles the bytecode
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False, env=_env(src))
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def heavy_imports(src: Path) -> list[str]:
    argv = CLI_JOBS[next(iter(CLI_JOBS))]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuready", *argv], capture_output=True, text=True, env=_env(src)
    )
    mods = [line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line]
    return sorted({m for m in mods if m in ("torch", "transformers", "numpy", "pandas", "pydantic")})


REPEATS = 3  # each library measure is the best of this many runs (a shared machine's other load only adds time)


def _best(measure: Any) -> float:
    """The least of REPEATS runs of `measure()` (each returns its seconds)."""
    return min(measure() for _ in range(REPEATS))


def library() -> dict[str, Any]:
    """Library measures in this process (run with the tree to measure first on the path): CPU seconds, each the
    best of REPEATS runs with every cache cleared before it."""
    from gpuready.memory import estimate
    from gpuready.memory.estimate import clear_caches
    from gpuready.workload import make_workload

    def timed(jobs: list[Any], card_bytes: list[int | None]) -> float:
        clear_caches()
        t0 = time.process_time()
        for w in jobs:
            for card in card_bytes:
                estimate(w, card, find_max_batch=card is not None)
        return time.process_time() - t0

    out: dict[str, Any] = {}
    for model, seq, top in SWEEPS:
        jobs = [make_workload(model=model, method="lora", seq=seq, batch=b) for b in range(1, top + 1)]
        out[f"batch sweep: {model} LoRA seq {seq}, batches 1-{top}, no card"] = (
            len(jobs),
            _best(lambda jobs=jobs: timed(jobs, [None])),
        )
        runs = [sweep_wall(model, seq, top, None) for _ in range(REPEATS)]
        swept = min((r for r in runs if r is not None), key=lambda r: r[1], default=None)
        if swept is not None:
            key = f"the same through estimate_batches, {swept[2]} threads (wall s)"
            out[f"batch sweep: {model} LoRA seq {seq}, batches 1-{top}: {key}"] = swept[:2]
    for models in (["gpt2", "qwen2.5-0.5b"], ["llama-3.2-1b", "llama-3.1-8b"]):
        jobs = [
            make_workload(model=m, batch=b, seq=s, method=meth, grad_ckpt=ck)
            for m, b, s, meth, ck in itertools.product(models, (1, 2, 4), (512, 2048), ("full", "lora"), (False, True))
        ]
        out[f"distinct jobs: {', '.join(models)}"] = (len(jobs), _best(lambda jobs=jobs: timed(jobs, [None])))
    from gpuready.catalog.gpus import load_gpus

    cards = [card.usable_bytes for card in load_gpus()]
    for models in (["qwen2.5-0.5b", "llama-3.2-1b"], ["llama-3.1-8b", "qwen2.5-7b"]):
        jobs = [make_workload(model=m, seq=2048, method=meth) for m in models for meth in ("full", "lora")]
        out[f"catalog sweep (fits + max batch on every card): {', '.join(models)}"] = (
            len(jobs) * len(cards),
            _best(lambda jobs=jobs: timed(jobs, list(cards))),
        )
    return out


def sweep_wall(model: str, seq: int, top: int, workers: int | None) -> tuple[int, float, int] | None:
    """(batches, wall s, threads) of one estimate_batches call over batches 1..top (None where the tree has none)."""
    try:
        from gpuready.memory.sweep import default_workers, estimate_batches
    except ImportError:
        return None
    from gpuready.memory.estimate import clear_caches
    from gpuready.workload import make_workload

    clear_caches()
    w = make_workload(model=model, method="lora", seq=seq)
    t0 = time.perf_counter()
    estimate_batches(w, range(1, top + 1), workers=workers)
    return top, time.perf_counter() - t0, workers or default_workers()


def threads_report(runs: int) -> None:
    """estimate_batches' batch sweeps at 1, 2, 4, 8 threads in this tree: wall estimates/s, best of `runs`."""
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, machine: {platform.platform()}, "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"command: python benchmarks/speed.py --threads --runs {runs}\n")
    counts = (1, 2, 4, 8)
    print("| batch sweep (estimate_batches, wall) | n | " + " | ".join(f"{k} threads" for k in counts) + " |")
    print("|---|---:|" + "---:|" * len(counts))
    for model, seq, top in SWEEPS:
        cells = []
        for k in counts:
            best = min((sweep_wall(model, seq, top, k) or (top, float("nan"), k))[1] for _ in range(runs))
            cells.append(f"{best:.3f} s; {top / best:.0f}/s")
        print(f"| {model} LoRA seq {seq}, batches 1-{top}, no card | {top} | {' | '.join(cells)} |")


def library_in(src: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--library-json"], capture_output=True, text=True, check=True, env=_env(src)
    )
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(trees: list[tuple[str, Path]], runs: int, against: list[str]) -> None:
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, machine: {platform.platform()}, "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"command: python benchmarks/speed.py{''.join(f' --against {ref}' for ref in against)} --runs {runs}")
    print(f"load average before: {load()}\n")
    head = " | ".join(name for name, _ in trees)
    print(f"## CLI end to end (median of {runs}; wall s / CPU s)\n| command | {head} |\n|---|" + "---:|" * len(trees))
    for label, argv in CLI_JOBS.items():
        cells = []
        for _, src in trees:
            wall, cpu = cli_times(src, argv, runs)
            cells.append(f"{wall:.3f} / {cpu:.3f}")
        print(f"| {label} | {' | '.join(cells)} |")
    heavy = {name: heavy_imports(src) for name, src in trees}
    print(f"\nheavy modules imported by `estimate` (python -X importtime): {heavy}")
    print(f"\n## Library (CPU s, best of {REPEATS}; estimates/s)")
    print(f"| measure | n | {head} |\n|---|---:|" + "---:|" * len(trees))
    results = [library_in(src) for _, src in trees]
    for key in results[-1]:
        n = results[-1][key][0]
        cells = [f"{r[key][1]:.2f} s; {n / r[key][1]:.0f}/s" if key in r else "-" for r in results]
        print(f"| {key} | {n} | {' | '.join(cells)} |")
    print(f"\nload average after: {load()}")


PLAN_JOBS = (
    ["llama-3.2-3b", "--batch", "4", "--seq", "2048"],
    ["qwen2.5-7b", "--method", "lora", "--seq", "4096", "--grad-ckpt", "--tokens", "50000000"],
    ["resnet50", "--batch", "128"],
    ["llama-3.1-70b", "--method", "qlora", "--grad-ckpt"],  # 80 layers, 4-bit: 175,655 events a replay
)


def plan_report(runs: int = 3) -> None:
    """`gpuready plan` end to end: estimates on every catalog card (cached per memory size), same-work changes
    for the cards that need one, the step time of each. Run as the CLI rows are (this tree's src first on the path,
    the bytecode compiled by one untimed run)."""
    print(f"date: {time.strftime('%Y-%m-%d')}, machine: {platform.platform()}, python {platform.python_version()}")
    print(f"command: python benchmarks/speed.py --plan --runs {runs}\n")
    print("| plan job | median s | min s | max s |\n|---|---:|---:|---:|")
    src = Path(__file__).resolve().parent.parent / "src"
    for job in PLAN_JOBS:
        argv = [sys.executable, "-m", "gpuready", "plan", *job, "--json"]
        subprocess.run(argv, capture_output=True, check=False, env=_env(src))  # compiles the bytecode (see above)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=False, env=_env(src))
            times.append(time.perf_counter() - t0)
        print(f"| {' '.join(job)} | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} |")


WHERE_CODE = """
import contextlib, io, json, sys, time
t0 = time.process_time()
import gpuready.memory
from gpuready.memory import allocator, program
est = sys.modules["gpuready.memory.estimate"]
spent = {"builds": 0.0, "replays": 0.0, "breakdowns": 0.0}
count = {"builds": 0, "replays": 0}
def timed(key, fn):
    def run(*args, **kwargs):
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.process_time() - t
            count[key] = count.get(key, 0) + 1
    return run
allocator._replay_one_stream = timed("replays", allocator._replay_one_stream)
allocator._replay_native = timed("replays", allocator._replay_native)
est._build = timed("builds", est._build)
program.Program.breakdown = timed("breakdowns", program.Program.breakdown)
from gpuready.cli.app import main
t1 = time.process_time()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    main(sys.argv[1:])
t2 = time.process_time()
print(json.dumps({"imports": t1 - t0, "run": t2 - t1, **spent, "n": count}))
"""


def where(argv: list[str], runs: int) -> None:
    """CPU seconds of one `gpuready ARGV` run in this tree, split: importing the estimator and the CLI, then the run
    (argument parsing, the program builds, the replays, the breakdowns, the rest); the median of `runs` runs."""
    src = Path(__file__).resolve().parent.parent / "src"
    rows = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", WHERE_CODE, *argv], capture_output=True, text=True, check=True, env=_env(src)
        )
        rows.append(json.loads(proc.stdout))
    keys = ("imports", "run", "builds", "replays", "breakdowns")
    med = {k: statistics.median(r[k] for r in rows) for k in keys}
    print(f"`gpuready {' '.join(argv)}`, median of {runs} (CPU s), load average {load()}:")
    print(
        f"imports {med['imports']:.3f}; run {med['run']:.3f}: {rows[0]['n'].get('builds', 0)} program builds "
        f"{med['builds']:.3f}, {rows[0]['n'].get('replays', 0)} replays {med['replays']:.3f}, breakdowns "
        f"{med['breakdowns']:.3f}, the rest {med['run'] - med['builds'] - med['replays'] - med['breakdowns']:.3f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--against", action="append", default=[], help="a git commit to measure side by side with this tree"
    )
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--threads", action="store_true", help="estimate_batches' sweeps at 1-8 threads, this tree")
    ap.add_argument("--library-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--where", nargs=argparse.REMAINDER, help="gpuready arguments: where that run's CPU time goes")
    args = ap.parse_args()
    if args.where:
        where(args.where, args.runs)
        return 0
    if args.library_json:
        print(json.dumps(library()))
        return 0
    if args.plan:
        plan_report(args.runs)
        return 0
    if args.threads:
        threads_report(args.runs)
        return 0
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        trees = []
        for ref in args.against:
            archive = subprocess.run(["git", "-C", str(root), "archive", ref, "src"], check=True, capture_output=True)
            (Path(tmp) / ref).mkdir()
            subprocess.run(["tar", "-x", "-C", str(Path(tmp) / ref)], input=archive.stdout, check=True)
            trees.append((ref, Path(tmp) / ref / "src"))
        trees.append(("this tree", root / "src"))
        report(trees, args.runs, args.against)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
