"""Benchmark: `gpuready storage dupes` against jdupes and rdfind on one generated tree, plus hashing speed.

    python benchmarks/storage_dupes.py [--dir /tmp/gpuready-dupes-bench] [--scale 1.0] [--out FILE.md]

The tree (seeded, so every run builds the same bytes) mixes what a GPU box holds:
- many small unique files (configs, logs, tokenizer pieces), 4 KiB-256 KiB;
- medium files (1-8 MiB), a third of them copied once or twice elsewhere in the tree;
- large files (32-64 MiB, "shards"), some copied;
- same-size decoys: copies with one byte changed in the middle (head and tail agree: only a full read
  can tell) and with the first byte changed (a 4 KiB head read tells).
All tools run on page-cache-warm data (the tree was just written; caches are not dropped because the machine
is shared), so the numbers compare CPU and syscall work, not disk speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import subprocess
import sys
import time
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


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv[0]} failed: {proc.stderr[-500:]}")
    return elapsed, proc.stdout


def run_ours(root: Path) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gpuready.storage.dupes import find_duplicates

    start = time.perf_counter()
    r = find_duplicates([root])
    elapsed = time.perf_counter() - start
    dupes = sum(len(g.inodes) - 1 for g in r.groups)
    return {
        "seconds": elapsed,
        "groups": len(r.groups),
        "dupe_files": dupes,
        "reclaimable": r.reclaimable_bytes,
        "bytes_read": r.bytes_read,
    }


def run_jdupes(root: Path) -> dict[str, float]:
    elapsed, out = timed(["jdupes", "-r", "-q", str(root)])
    groups = [g for g in out.strip().split("\n\n") if g.strip()]
    dupes = sum(len(g.strip().splitlines()) - 1 for g in groups)
    return {"seconds": elapsed, "groups": len(groups), "dupe_files": dupes}


def run_rdfind(root: Path, work: Path) -> dict[str, float]:
    results = work / "rdfind_results.txt"
    elapsed, _ = timed(["rdfind", "-dryrun", "true", "-outputname", str(results), str(root)])
    lines = [ln for ln in results.read_text().splitlines() if ln and not ln.startswith("#")]
    firsts = sum(1 for ln in lines if ln.startswith("DUPTYPE_FIRST_OCCURRENCE"))
    dupes = sum(1 for ln in lines if ln.startswith("DUPTYPE_WITHIN_SAME_TREE"))
    return {"seconds": elapsed, "groups": firsts, "dupe_files": dupes}


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/gpuready-dupes-bench")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args()
    work = Path(args.dir)
    tree = work / "tree"
    t0 = time.perf_counter()
    counts = build_tree(tree, args.scale)
    gen_s = time.perf_counter() - t0
    rows: list[tuple[str, dict[str, float]]] = []
    # one untimed listing so every tool starts with the same warm inode and page cache
    run_ours(tree)
    rows.append(("gpuready storage dupes", run_ours(tree)))
    if shutil.which("jdupes"):
        rows.append(("jdupes -r -q", run_jdupes(tree)))
    if shutil.which("rdfind"):
        rows.append(("rdfind -dryrun true", run_rdfind(tree, work)))
    speeds = hash_throughput(work)
    shutil.rmtree(work)

    uname = " ".join(os.uname())
    lines = [
        "# Storage benchmark: duplicate scan and hashing speed",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: `{uname}`, {os.cpu_count()} CPUs (`nproc`), CPU model `{cpu_model()}`, "
        f"Python {platform.python_version()}",
        f"- command: `python benchmarks/storage_dupes.py --scale {args.scale:g}`",
        f"- tree: {counts['files']} files, {counts['bytes'] / 1e9:.2f} GB; {counts['dupe_files']} duplicate "
        f"copies, {counts['decoys']} same-size decoys (one byte changed in the middle or at the start); "
        f"generated in {gen_s:.0f} s",
        "- page cache warm for every tool (tree just written; caches not dropped on this shared machine)",
        "",
        "| tool | wall s | groups | duplicate files | reclaimable | bytes read |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        recl = f"{r['reclaimable'] / 1e9:.3f} GB" if "reclaimable" in r else "-"
        read = f"{r['bytes_read'] / 1e9:.3f} GB" if "bytes_read" in r else "-"
        lines.append(f"| {name} | {r['seconds']:.2f} | {r['groups']:.0f} | {r['dupe_files']:.0f} | {recl} | {read} |")
    lines += ["", "| hashing, one core | GB/s |", "|---|---:|"]
    lines += [f"| {name} | {gbs:.2f} |" for name, gbs in speeds]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
