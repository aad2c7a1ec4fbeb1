"""Exactness check for the estimator's fast paths: the same answers as the plain path, job by job.

python benchmarks/speed_check.py replays              # allocator.replay against replay_reference (one call per
                                                      # event through CachingAllocator), every sweep job's program,
                                                      # unlimited and under 8 limits around its peak reserve
python benchmarks/speed_check.py templates            # every sweep job's batch template (memory/template.py)
                                                      # written out at 9 batches against the built program
python benchmarks/speed_check.py against REF [--quick]  # the whole sweep with this tree and with git REF (exported by
                                                      # `git archive` to a temporary folder, run in a subprocess):
                                                      # every job's peaks, phase, breakdown, and on each card fits,
                                                      # headroom, reserve there, releases, max batch and mitigations
python benchmarks/speed_check.py record OUT.jsonl     # the sweep's answers with the gpuready on sys.path
python benchmarks/speed_check.py compare A.jsonl B.jsonl

Exit status 1 when any job differs. The sweep: 18 presets (GPT-2, Llama, Qwen, Gemma 2/3, Phi-3, Pythia, MoE,
MLA, gpt-oss, ResNet, ViT) by full / LoRA / QLoRA training, checkpointing, mixed precision and fp32, eager
attention, DDP and FSDP on 2 GPUs (events on several streams), prefill and generation, at several batches and
sequence lengths, each on 16, 24, 40 and 80 GiB cards.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 2**30
CARDS = (16 * GIB, 24 * GIB, 40 * GIB, 80 * GIB)

LM = (
    "gpt2",
    "smollm2-135m",
    "qwen2.5-0.5b",
    "qwen3-0.6b",
    "llama-3.2-1b",
    "gemma-3-1b",
    "gemma-2-2b",
    "pythia-410m",
    "phi-3-mini",
    "qwen1.5-moe-a2.7b",
    "deepseek-v2-lite",
    "mistral-7b",
    "llama-3.1-8b",
    "gpt-oss-20b",
)
VISION = ("resnet50", "resnet18", "vit_b_16", "vit_l_16")

LM_SHAPES: tuple[dict[str, Any], ...] = (
    {"method": "full"},
    {"method": "full", "grad_ckpt": True},
    {"method": "full", "precision": "mixed"},
    {"method": "full", "precision": "mixed", "grad_ckpt": True},
    {"method": "full", "precision": "fp32"},
    {"method": "full", "optim": "adamw8bit", "grad_accum": 2},
    {"method": "lora"},
    {"method": "lora", "grad_ckpt": True},
    {"method": "qlora", "grad_ckpt": True},
    {"method": "lora", "attn": "eager"},
    {"method": "full", "gpus": 2, "shard": "ddp"},
    {"method": "full", "gpus": 2, "shard": "fsdp"},
    {"task": "infer"},
    {"task": "infer", "new_tokens": 32},
    {"task": "infer", "new_tokens": 32, "decoding": "sample"},
    {"task": "infer", "precision": "fp32"},
)
VISION_SHAPES: tuple[dict[str, Any], ...] = (
    {"method": "full"},
    {"method": "full", "precision": "mixed"},
    {"method": "full", "precision": "fp32"},
    {"task": "infer"},
)


def sweep(quick: bool = False) -> list[dict[str, Any]]:
    """The jobs, each a dict of workload fields (deterministic)."""
    jobs: list[dict[str, Any]] = []
    for i, (model, shape) in enumerate(itertools.product(LM, LM_SHAPES)):
        if quick and i % 5:
            continue
        big = model in ("mistral-7b", "llama-3.1-8b", "gpt-oss-20b", "deepseek-v2-lite", "qwen1.5-moe-a2.7b")
        batches = (1, 2) if big else (1, 3, 8)
        seqs = (1024,) if big else (512, 2048)
        for batch, seq in itertools.product(batches, seqs):
            jobs.append({"model": model, "batch": batch, "seq": seq, **shape})
    for i, (model, shape) in enumerate(itertools.product(VISION, VISION_SHAPES)):
        if quick and i % 3:
            continue
        for batch in (8, 64):
            jobs.append({"model": model, "batch": batch, **shape})
    return jobs


def _cards_for(index: int) -> tuple[int, ...]:
    """Two of the four cards per job, rotating, so every card meets every kind of job."""
    return (CARDS[index % 4], CARDS[(index + 1) % 4])


def record(path: Path, quick: bool) -> int:
    from gpuready.errors import InputError
    from gpuready.memory import estimate
    from gpuready.memory.mitigations import suggest
    from gpuready.workload import make_workload

    jobs = sweep(quick)
    t0 = time.perf_counter()
    with path.open("w") as out:
        for index, fields in enumerate(jobs):
            row: dict[str, Any] = {"job": fields}
            try:
                w = make_workload(**fields)
                est = estimate(w)
                row["estimate"] = {
                    "peak_allocated": est.peak_allocated_bytes,
                    "peak_reserved": est.peak_reserved_bytes,
                    "phase": est.phase,
                    "breakdown": est.breakdown,
                    "phases": est.phases,
                }
                cards = {}
                for card in _cards_for(index):
                    on = estimate(w, card)
                    cards[str(card)] = {
                        "fits": on.fits,
                        "max_batch": on.max_batch,
                        "headroom": on.headroom_bytes,
                        "reserved_on_card": on.reserved_on_card_bytes,
                        "releases": on.cache_releases,
                        "limit": on.allocator_limit_bytes,
                    }
                    if not on.fits and index % 3 == 0:
                        cards[str(card)]["mitigations"] = [m.to_json() for m in suggest(w, card)]
                row["cards"] = cards
            except InputError as exc:
                row["error"] = str(exc)
            out.write(json.dumps(row, sort_keys=True) + "\n")
    print(f"{len(jobs)} jobs recorded in {time.perf_counter() - t0:.1f} s -> {path}", file=sys.stderr)
    return 0


def compare(a: Path, b: Path) -> int:
    rows_a = [json.loads(line) for line in a.read_text().splitlines()]
    rows_b = [json.loads(line) for line in b.read_text().splitlines()]
    if [r["job"] for r in rows_a] != [r["job"] for r in rows_b]:
        print("the two files hold different job lists")
        return 1
    verdicts = sum(len(r.get("cards", {})) for r in rows_a)
    errors = sum("error" in r for r in rows_a)
    differ = [(ra, rb) for ra, rb in zip(rows_a, rows_b, strict=True) if ra != rb]
    for ra, rb in differ[:10]:
        print("DIFFERS:", json.dumps(ra["job"]))
        for key in sorted(set(ra) | set(rb)):
            if ra.get(key) != rb.get(key):
                print(f"  {key}: {ra.get(key)}\n  {'':{len(key)}}  {rb.get(key)}")
    print(
        f"{len(rows_a)} jobs ({errors} refused as input errors by both), {verdicts} card verdicts with max batch: "
        f"{len(rows_a) - len(differ)} identical, {len(differ)} differ"
    )
    return 1 if differ else 0


def against(ref: str, quick: bool) -> int:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(root), "archive", ref, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        new_out, old_out = Path(tmp) / "new.jsonl", Path(tmp) / "old.jsonl"
        args = [sys.executable, __file__, "record"] + (["--quick"] if quick else [])
        for src, out in ((root / "src", new_out), (old / "src", old_out)):
            t0 = time.perf_counter()
            env = {**os.environ, "PYTHONPATH": str(src)}
            subprocess.run([*args, str(out)], check=True, env=env)
            label = "this tree" if src == root / "src" else ref
            print(f"{label}: {time.perf_counter() - t0:.1f} s")
        return compare(old_out, new_out)


def replays(quick: bool) -> int:
    from gpuready.errors import InputError
    from gpuready.memory.allocator import replay, replay_reference
    from gpuready.memory.estimate import _program, fsdp_meta_init
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    compared = same = hinted = 0
    t_fast = t_ref = 0.0
    seen: set[tuple[int, ...]] = set()
    for fields in sweep(quick):
        try:
            w = make_workload(**fields)
            spec = resolve_model(w.model)
            prog = _program(spec, w, fsdp_meta_init(spec, w, None))
        except InputError:
            continue
        key = tuple(prog.events)  # the whole program (its first events and length do not tell batches apart)
        if key in seen:
            continue
        seen.add(key)
        streams = prog.handle_streams()
        repeat = None if streams else prog.repeat_span()  # (the hint estimate gives the compiled replay)
        hinted += repeat is not None
        peak = replay_reference(prog.events, None, streams).peak_reserved_bytes
        for share in (None, 0.3, 0.6, 0.8, 0.9, 0.95, 0.98, 0.995, 1.0):
            cap = None if share is None else int(peak * share)
            t0 = time.perf_counter()
            fast = replay(prog.events, cap, streams, repeat)
            t1 = time.perf_counter()
            ref = replay_reference(prog.events, cap, streams)
            t_ref += time.perf_counter() - t1
            t_fast += t1 - t0
            compared += 1
            if fast == ref:
                same += 1
            else:
                print("DIFFERS:", json.dumps(fields), cap, fast, ref)
    print(
        f"{len(seen)} programs x 9 limits ({hinted} programs with a repeated last step as the hint): {compared} "
        f"replays compared, {same} identical (every field of AllocatorStats); replay {t_fast:.2f} s, "
        f"replay_reference {t_ref:.2f} s"
    )
    return 0 if same == compared else 1


TEMPLATE_BATCHES = (1, 2, 3, 5, 8, 13, 64, 127, 128, 257, 4099)


def templates(quick: bool) -> int:
    """Each sweep job's batch template (memory/template.py) written out at 9 batches against the program the
    builders make for that batch: every field of Program must be equal (events, sizes, categories, phase peaks and
    where they are, largest request, streams, cached outside bytes)."""
    from gpuready.errors import InputError
    from gpuready.memory.estimate import _build, fsdp_meta_init
    from gpuready.memory.template import build_template
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    structures = with_template = with_lower = compared = same = 0
    t_build = t_inst = 0.0
    seen: set[str] = set()
    for fields in sweep(quick):
        structure = json.dumps({k: v for k, v in fields.items() if k != "batch"}, sort_keys=True)
        if structure in seen:
            continue
        seen.add(structure)
        try:
            w = make_workload(**fields)
            spec = resolve_model(w.model)
            meta = fsdp_meta_init(spec, w, None)
            _build(spec, w, meta)
        except InputError:
            continue
        structures += 1
        template = build_template(lambda x, spec=spec, meta=meta: _build(spec, x, meta), w)  # type: ignore[misc]
        if template is None:
            continue
        with_template += 1
        lower = (
            build_template(lambda x, spec=spec, meta=meta: _build(spec, x, meta), w, below=template.min_batch)  # type: ignore[misc]
            if template.min_batch > 1
            else None
        )
        with_lower += lower is not None
        for batch in TEMPLATE_BATCHES if not quick else TEMPLATE_BATCHES[:5]:
            writer = template if batch >= template.min_batch else lower
            if writer is None or batch < writer.min_batch:  # (estimate builds these)
                continue
            wb = w.model_copy(update={"batch": batch})
            t0 = time.perf_counter()
            built = _build(spec, wb, meta)
            t1 = time.perf_counter()
            written = writer.instantiate(batch)
            t_inst += time.perf_counter() - t1
            t_build += t1 - t0
            compared += 1
            if built == written:
                same += 1
            else:
                print("DIFFERS:", json.dumps(fields), batch)
    print(
        f"{structures} job structures, {with_template} with a batch template (the rest are built per batch), "
        f"{with_lower} of them with a template of the batches below its first; "
        f"{compared} programs compared, {same} identical; built in {t_build:.2f} s, written out in {t_inst:.2f} s"
    )
    return 0 if same == compared else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("replays")
    rp.add_argument("--quick", action="store_true")
    tp = sub.add_parser("templates")
    tp.add_argument("--quick", action="store_true")
    ag = sub.add_parser("against")
    ag.add_argument("ref")
    ag.add_argument("--quick", action="store_true")
    rc = sub.add_parser("record")
    rc.add_argument("out", type=Path)
    rc.add_argument("--quick", action="store_true")
    cp = sub.add_parser("compare")
    cp.add_argument("a", type=Path)
    cp.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "replays":
        return replays(args.quick)
    if args.cmd == "templates":
        return templates(args.quick)
    if args.cmd == "against":
        return against(args.ref, args.quick)
    if args.cmd == "record":
        return record(args.out, args.quick)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
