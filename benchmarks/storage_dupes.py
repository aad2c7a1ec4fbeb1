"""Benchmark: `gpuready storage dupes` against jdupes, rdfind and fdupes on one generated tree.

    python benchmarks/storage_dupes.py --tree small [--files 200000] [--repeat 3] [--out FILE.md]
    python benchmarks/storage_dupes.py --tree mixed [--scale 1.0] [--repeat 3] [--out FILE.md]
    ... [--baseline-src OLD/src]   # also run another checkout's gpuready (text output) in the same rounds

Trees are seeded (every run builds the same bytes) and written under --dir (default /tmp/...), deleted after.
- small: N files of 1-8 KB in folders of 1000, every tenth a copy of an earlier file (issue 9's case).
- mixed: what a GPU box holds: many small unique files, medium files (1-8 MiB) a third of them copied, large
  "shards" (32-64 MiB) some copied, and same-size decoys (one byte changed in the middle or at the start).
Every tool runs as its own process (gpuready through its CLI, text and --json) in rounds, tools interleaved,
so a busy shared machine slows all of them alike; wall time, CPU time (user+sys) and peak RSS come from
os.wait4. All runs are page-cache warm (the tree was just written and read once by every tool). gpuready's
bytecode is compiled first (compileall), as pip does on install.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MIB = 1 << 20


def build_tree(root: Path, scale: float, seed: int = 7) -> dict[str, int]:
    rng = random.Random(seed)
    if root.exists():
        shutil.rmtree(root)
    counts = {"files": 0, "bytes": 0, "dupe_files": 0, "decoys": 0}

    def write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        counts["files"] += 1
        counts["bytes"] += len(data)

    for i in range(int(3000 * scale)):
        write(root / "small" / f"d{i % 50}" / f"f{i}.txt", rng.randbytes(rng.randint(4096, 256 * 1024)))
    for i in range(int(240 * scale)):
        data = rng.randbytes(rng.randint(1, 8) * MIB + rng.randint(0, 4095))
        write(root / "medium" / f"m{i}.bin", data)
        if i % 3 == 0:
            for c in range(1 + i % 2):
                write(root / "copies" / f"c{c}" / f"m{i}.bin", data)
                counts["dupe_files"] += 1
        elif i % 3 == 1:
            decoy = bytearray(data)
            if i % 2:
                decoy[len(decoy) // 2] ^= 1
            else:
                decoy[0] ^= 1
            write(root / "decoys" / f"m{i}.bin", bytes(decoy))
            counts["decoys"] += 1
    for i in range(int(16 * scale)):
        data = rng.randbytes(rng.choice((32, 48, 64)) * MIB)
        write(root / "shards" / f"model-{i:05d}.safetensors", data)
        if i % 4 == 0:
            write(root / "backup" / f"model-{i:05d}.safetensors", data)
            counts["dupe_files"] += 1
        if i % 4 == 1:
            decoy = bytearray(data)
            decoy[len(decoy) // 2] ^= 1
            write(root / "decoys" / f"model-{i:05d}.safetensors", bytes(decoy))
            counts["decoys"] += 1
    return counts


def build_small(root: Path, files: int, seed: int = 11) -> dict[str, int]:
    rng = random.Random(seed)
    if root.exists():
        shutil.rmtree(root)
    counts = {"files": 0, "bytes": 0, "dupe_files": 0, "decoys": 0}
    uniques: list[bytes] = []
    for i in range(files):
        folder = root / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        if i % 10 == 9:
            data = uniques[rng.randrange(len(uniques))]
            counts["dupe_files"] += 1
        else:
            data = rng.randbytes(rng.randint(1024, 8192))
            uniques.append(data)
        (folder / f"f{i:07d}.dat").write_bytes(data)
        counts["files"] += 1
        counts["bytes"] += len(data)
    return counts


def measured(argv: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall seconds, CPU seconds (user+sys) and peak RSS (MB) of one run of argv; stdout kept for counting.
    Linux carries the RSS high-water mark across fork+exec, so this process must stay small (it does: the
    tree is built in a child process) or every tool would report at least our own peak."""
    gnu_time = Path("/usr/bin/time")
    rss_file = Path(f"/tmp/gpuready-bench-rss-{os.getpid()}")
    if gnu_time.exists():  # a small C parent: its child's high-water mark starts near zero
        argv = [str(gnu_time), "-f", "%M", "-o", str(rss_file), *argv]
    with open(os.devnull, "wb") as null, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=null, env=env) as proc:
        start = time.perf_counter()
        out = proc.stdout.read() if proc.stdout else b""
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}")
    rss_kb = usage.ru_maxrss
    if rss_file.exists():
        rss_kb = int(rss_file.read_text().split()[-1])
        rss_file.unlink()
    return {
        "seconds": elapsed,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_mb": rss_kb / 1024,
        "out": out,  # type: ignore[dict-item]
    }


def count_blank_separated(out: bytes) -> tuple[int, int]:
    groups = [g for g in out.strip().split(b"\n\n") if g.strip()]
    return len(groups), sum(len(g.strip().splitlines()) - 1 for g in groups)


def tools(
    root: Path, work: Path, baseline_src: str | None = None
) -> list[tuple[str, list[str], Callable[[bytes], tuple[int, int]]]]:
    repo = Path(__file__).resolve().parents[1]
    gr = [sys.executable, "-m", "gpuready", "storage", "dupes", str(root)]

    def from_json(out: bytes) -> tuple[int, int]:
        data = json.loads(out)
        return len(data["groups"]), sum(len(g["inodes"]) - 1 for g in data["groups"])

    def from_text(out: bytes) -> tuple[int, int]:
        heads = [ln for ln in out.splitlines() if b" copies (blake3:" in ln]
        return len(heads), sum(int(ln.split(b" x ")[1].split()[0]) - 1 for ln in heads)

    def from_rdfind(_out: bytes) -> tuple[int, int]:
        lines = (work / "rdfind_results.txt").read_text().splitlines()
        firsts = sum(1 for ln in lines if ln.startswith("DUPTYPE_FIRST_OCCURRENCE"))
        return firsts, sum(1 for ln in lines if ln.startswith("DUPTYPE_WITHIN_SAME_TREE"))

    out: list[tuple[str, list[str], Callable[[bytes], tuple[int, int]]]] = [
        ("gpuready storage dupes (text)", gr, from_text),
        ("gpuready storage dupes --json", [*gr, "--json"], from_json),
    ]
    if baseline_src:  # the same command from another checkout (before/after a change), same rounds
        out.append(("gpuready (baseline) storage dupes (text)", ["env", f"PYTHONPATH={baseline_src}", *gr], from_text))
    if shutil.which("jdupes"):
        out.append(("jdupes -r -q", ["jdupes", "-r", "-q", str(root)], count_blank_separated))
    if shutil.which("rdfind"):
        argv = ["rdfind", "-dryrun", "true", "-outputname", str(work / "rdfind_results.txt"), str(root)]
        out.append(("rdfind -dryrun true", argv, from_rdfind))
    if shutil.which("fdupes"):
        out.append(("fdupes -r -q", ["fdupes", "-r", "-q", str(root)], count_blank_separated))
    del repo
    return out


def hash_throughput(work: Path) -> list[tuple[str, float]]:
    """GB/s on one core: in-memory 1 MiB updates, and hash_file on a cached 1 GiB file."""
    import hashlib

    from blake3 import blake3

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gpuready.storage.hashing import hash_file

    buf = os.urandom(256 * MIB)
    view = memoryview(buf)
    out: list[tuple[str, float]] = []
    for name, make in (
        ("blake3 (1 thread), memory", lambda: blake3(max_threads=1)),
        ("sha256, memory", hashlib.sha256),
    ):
        best = 0.0
        for _ in range(3):
            h = make()
            start = time.perf_counter()
            for off in range(0, len(buf), MIB):
                h.update(view[off : off + MIB])
            h.hexdigest()
            best = max(best, len(buf) / (time.perf_counter() - start) / 1e9)
        out.append((name, best))
    f = work / "hash_1gib.bin"
    with f.open("wb") as fh:
        for _ in range(4):
            fh.write(buf)
    for algo in ("blake3", "sha256"):
        best = 0.0
        for _ in range(3):
            start = time.perf_counter()
            d = hash_file(str(f), algo)
            best = max(best, d.bytes_read / (time.perf_counter() - start) / 1e9)
        out.append((f"hash_file {algo}, 1 GiB cached file", best))
    f.unlink()
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def tool_version(name: str) -> str:
    for flag in ("-v", "--version"):
        try:
            proc = subprocess.run([name, flag], capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return "not installed"
        text = (proc.stdout or proc.stderr).strip().splitlines()
        if proc.returncode == 0 and text:
            return text[0]
    return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tree", choices=("small", "mixed"), default="small")
    ap.add_argument("--files", type=int, default=200_000, help="small tree: number of files")
    ap.add_argument("--scale", type=float, default=1.0, help="mixed tree: size factor")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/gpuready-dupes-bench")
    ap.add_argument("--out", default=None, help="write the markdown section here")
    ap.add_argument("--baseline-src", default=None, help="also time gpuready from this src/ folder (text output)")
    ap.add_argument("--hashing", action="store_true", help="also measure hashing throughput (needs 1 GiB)")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.dir)
    tree = work / "tree"
    if args.build_only:  # in a child process: its memory never inflates the tools' peak RSS (see measured)
        counts = build_small(tree, args.files) if args.tree == "small" else build_tree(tree, args.scale)
        print(json.dumps(counts))
        return 0
    t0 = time.perf_counter()
    child = [sys.executable, __file__, "--build-only", "--tree", args.tree, "--files", str(args.files)]
    child += ["--scale", str(args.scale), "--dir", str(work)]
    counts = json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
    gen_s = time.perf_counter() - t0
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    # as installed: pip compiles a package's bytecode when it installs it; with PYTHONDONTWRITEBYTECODE set
    # (as on the development machine) every run would compile gpuready's modules again (~0.1 s of CPU)
    for folder in (src, args.baseline_src):
        if folder:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder)], check=True)
    runs: dict[str, list[dict[str, float]]] = {}
    found: dict[str, tuple[int, int]] = {}
    load = [os.getloadavg()[0]]
    try:
        candidates = tools(tree, work, args.baseline_src and str(Path(args.baseline_src).resolve()))
        for _name, argv, _count in candidates:  # one untimed run each: every tool starts warm
            measured(argv, env)
        for _ in range(args.repeat):
            for name, argv, count in candidates:
                r = measured(argv, env)
                found[name] = count(r.pop("out"))  # type: ignore[arg-type]
                runs.setdefault(name, []).append(r)
            load.append(os.getloadavg()[0])
        speeds = hash_throughput(work) if args.hashing else []
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise

    uname = " ".join(os.uname())
    cmd = f"python benchmarks/storage_dupes.py --tree {args.tree} "
    cmd += f"--files {args.files}" if args.tree == "small" else f"--scale {args.scale:g}"
    cmd += f" --repeat {args.repeat}"
    if args.baseline_src:
        cmd += " --baseline-src OLD/src"
    lines = [
        f"## Tree `{args.tree}`",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: `{uname}`, {os.cpu_count()} CPUs (`nproc`), CPU model `{cpu_model()}`, "
        f"Python {platform.python_version()}; 1-minute load average {min(load):.1f}-{max(load):.1f} during the runs "
        "(a machine shared with other jobs)",
        f"- command: `{cmd}`",
        f"- tree: {counts['files']} files, {counts['bytes'] / 1e9:.2f} GB; {counts['dupe_files']} duplicate "
        f"copies, {counts['decoys']} same-size decoys; generated in {gen_s:.0f} s",
        f"- tools: {tool_version('jdupes')}; {tool_version('rdfind')}; {tool_version('fdupes')}",
        "",
        f"Median of {args.repeat} interleaved runs (min in brackets).",
        "",
        "| tool | wall s | CPU s (user+sys) | peak RSS MB | groups | duplicate files |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        w = sorted(r["seconds"] for r in rs)
        c = sorted(r["cpu"] for r in rs)
        m = sorted(r["rss_mb"] for r in rs)
        g, d = found[name]
        lines.append(
            f"| {name} | {statistics.median(w):.2f} ({w[0]:.2f}) | {statistics.median(c):.2f} ({c[0]:.2f}) | "
            f"{statistics.median(m):.0f} | {g} | {d} |"
        )
    if speeds:
        lines += ["", "| hashing, one core | GB/s |", "|---|---:|"]
        lines += [f"| {name} | {gbs:.2f} |" for name, gbs in speeds]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)
    shutil.rmtree(work, ignore_errors=True)  # after the table: 200k files take minutes to delete on a busy disk
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
