"""Step-time model (gpuready.plan.steptime) against the H200 training rows that recorded step_seconds.

    python benchmarks/steptime.py                 # table + summary (fit rows, held-out rows, new rows)
    python benchmarks/steptime.py --fit           # refit the constants, write plan/data/steptime_fit.json
    python benchmarks/steptime.py --fit-decode    # refit decode_host_s alone on the generation rows
    python benchmarks/steptime.py --predict JOBS  # predictions for a job list (calibrate.py's format)
    torchrun --standalone --nproc_per_node=2 benchmarks/steptime.py --nccl OUT.json   # NCCL bus bandwidth (GPU)

Rows: ../shared/calibration/h200.jsonl and docs/calibration/h200_gpuready*.jsonl (training rows with
step_seconds; 1 and 2 GPUs). A row is held out of the fit when the first byte of blake2b(args + gpus) is
divisible by 4 (a fixed rule, about one row in four). Rows of docs/calibration/steptime_h200_new*.jsonl were
measured after their predictions were committed (docs/calibration/steptime_heldout_predicted.txt); they are
never fitted on.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuready.catalog import find_gpu
from gpuready.models import resolve_model
from gpuready.plan.ops import Op, training_ops
from gpuready.plan.steptime import PARAM_NAMES, Efficiency, fitted, step_time, training_breakdown
from gpuready.workload import Workload, workload_from_args

ROOT = Path(__file__).resolve().parent.parent
CAL = ROOT / "docs" / "calibration"
FIT_FILE = ROOT / "src" / "gpuready" / "plan" / "data" / "steptime_fit.json"
GPU = "H200 SXM"
# measured with the allocator's history recording on (benchmarks/gpu_multi_gpu_2.sh sets
# GPUREADY_PROBE_MEMORY_HISTORY): every allocation records a Python stack trace, which slows the host, so these
# step times are not the job's; shown in the table, left out of the fit and of the statistics
HISTORY_FILES = {"h200_gpuready_multi_gpu.jsonl"}


@dataclass
class Row:
    id: str
    args: str
    gpus: int
    measured: float
    w: Workload
    ops: list[Op]
    group: str  # fit, held-out, new, inference, history, re-measured, memory sets
    committed: float | None = None  # the prediction committed before measuring (new rows)


PREDICTED = CAL / "steptime_heldout_predicted.txt"


def committed_predictions() -> dict[str, float]:
    out = {}
    if PREDICTED.is_file():
        for line in PREDICTED.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#"):
                seconds, args = line.split("\t", 1)
                out[args.strip()] = float(seconds)
    return out


def held_out(args: str, gpus: int) -> bool:
    return hashlib.blake2b(f"{args}|{gpus}".encode()).digest()[0] % 4 == 0


def load_rows() -> list[Row]:
    files = [ROOT.parent / "shared" / "calibration" / "h200.jsonl", *sorted(CAL.glob("h200_gpuready*.jsonl"))]
    new_files = sorted(CAL.glob("steptime_h200_new*.jsonl"))
    # the memory held-out sets (QLoRA, 8-bit AdamW, Adafactor...): their step times were recorded, never fitted on
    memory_files = sorted(CAL.glob("h200_heldout*.jsonl"))
    committed = committed_predictions()
    rows: list[Row] = []
    seen: set[tuple[str, int]] = set()
    for f in files + new_files + memory_files:
        if not f.is_file():
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            seconds = r.get("step_seconds") or (r.get("request_seconds") if f in new_files else None)
            if not seconds:
                continue
            w = workload_from_args(r["args"])
            key = (r["args"], w.gpus)
            if key in seen and f not in new_files:  # the same job measured twice before: keep the first
                continue
            seen.add(key)
            if f.name in HISTORY_FILES:
                group = "history"
            elif f in memory_files:
                if not w.training or w.gpus > 1:
                    continue
                group = "memory sets"
            elif f in new_files:
                group = "new" if w.training else "inference"
                for old in rows:  # an older measurement of a job re-measured here is superseded
                    if (old.args, old.gpus) == key:
                        old.group = "re-measured"
            else:
                group = "held-out" if held_out(r["args"], w.gpus) else "fit"
            spec = resolve_model(w.model)
            ops = training_ops(spec, w) if w.training else []
            rows.append(Row(r["id"], r["args"], w.gpus, float(seconds), w, ops, group, committed.get(r["args"])))
    return rows


def predict(row: Row, eff: Efficiency) -> float:
    if not row.w.training:
        return step_time(row.w, find_gpu(GPU), eff=eff).seconds
    return sum(training_breakdown(row.ops, row.w, find_gpu(GPU), eff).values())


def loss(rows: list[Row], eff: Efficiency) -> float:
    errs = [math.log(predict(r, eff) / r.measured) for r in rows]
    # mean squared log error, plus the worst row's (the target bounds the worst case too)
    return sum(e * e for e in errs) / len(errs) + 0.2 * max(e * e for e in errs)


def nelder_mead(f: Any, x0: list[float], steps: list[float], iters: int = 600) -> list[float]:
    """Plain Nelder-Mead (reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (steps[i] if j == i else 0.0) for j in range(n)] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [centroid[j] + (centroid[j] - worst[j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [centroid[j] + 2 * (centroid[j] - worst[j]) for j in range(n)]
            fe = f(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [centroid[j] + 0.5 * (worst[j] - centroid[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[best[j] + 0.5 * (p[j] - best[j]) for j in range(n)] for p in simplex[1:]]
                vals = [vals[0]] + [f(p) for p in simplex[1:]]
        if max(vals) - min(vals) < 1e-9:
            break
    return simplex[min(range(n + 1), key=lambda i: vals[i])]


# physical bounds of each constant (shares of peak below 1, d0 and the launch cost positive)
BOUNDS = {
    # stas00's best-shape bf16 matmul on the H100 SXM reached 80.3% of 989 TFLOP/s ("H200 is the same"):
    # https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md
    "mm_eff": (0.2, 0.803),
    "fp32_eff": (0.2, 0.98),
    "d0": (1.0, 2048.0),
    "attn_eff": (0.05, 0.9),
    "bw_eff": (0.3, 0.95),
    "launch_s": (1e-6, 1e-4),
    "conv_eff": (0.02, 0.9),
    "conv_tf32_eff": (0.02, 0.9),
    "host_s": (1e-6, 3e-4),
    "attn_s0": (1.0, 16384.0),
    "decode_host_s": (1e-6, 3e-4),
}


def to_eff(x: list[float]) -> Efficiency:
    vals = {}
    for name, v in zip(PARAM_NAMES, x, strict=True):
        lo, hi = BOUNDS[name]
        vals[name] = lo + (hi - lo) / (1 + math.exp(-v))  # logistic map keeps each inside its bounds
    return Efficiency(**vals)


def from_eff(eff: Efficiency) -> list[float]:
    out = []
    for name in PARAM_NAMES:
        lo, hi = BOUNDS[name]
        p = (getattr(eff, name) - lo) / (hi - lo)
        p = min(max(p, 1e-6), 1 - 1e-6)
        out.append(math.log(p / (1 - p)))
    return out


def fit(rows: list[Row], command: str, decode_only: bool = False) -> Efficiency:
    # the training constants on the fit rows; then decode_host_s alone on the generation rows (HF generate's decode
    # steps are host-bound: the only rows that measure it, so those are fitted and are no held-out check)
    fit_rows = [r for r in rows if r.group == "fit"]
    generation = [r for r in rows if r.group == "inference"]
    x = from_eff(fitted())
    for _ in range(0 if decode_only else 3):  # restarts from the best point so far
        x = nelder_mead(lambda v: loss(fit_rows, to_eff(v)), x, [0.5] * len(x))
    k = PARAM_NAMES.index("decode_host_s")

    def with_decode(v: list[float]) -> list[float]:
        return [*x[:k], v[0], *x[k + 1 :]]

    x = with_decode(nelder_mead(lambda v: loss(generation, to_eff(with_decode(v))), [x[k]], [0.5]))
    train = fit_rows + generation
    eff = to_eff(x)
    nccl = json.loads((CAL / "nccl_h200x2.json").read_text(encoding="utf-8"))
    data = {
        "params": eff.to_json(),
        "link_eff": {k: round(nccl[k]["bus_gbs"] / 450, 4) for k in ("all_reduce", "all_gather", "reduce_scatter")},
        "link_eff_source": "docs/calibration/nccl_h200x2.json: NCCL bus bandwidth on 2 x H200 (NVLink4, 450 GB/s "
        "one way), 256 MiB of bf16, benchmarks/steptime.py --nccl",
        "fitted_on": sorted(r.id + (f" ({r.gpus} GPUs)" if r.gpus > 1 else "") for r in train),
        "rows": len(train),
        "gpu": "NVIDIA H200 (torch 2.11, transformers 5.17, eager PyTorch)",
        "date": datetime.date.today().isoformat(),
        "command": command,
    }
    FIT_FILE.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return eff


SUBSETS = {
    "all training rows (fit + held-out + new)": lambda r: r.group in ("fit", "held-out", "new"),
    "2-GPU rows (DDP/FSDP2; fit + held-out + new)": lambda r: r.gpus > 1 and r.group in ("fit", "held-out", "new"),
    "vision rows (fit + held-out + new)": lambda r: (
        r.w.model.startswith(("resnet", "vit")) and r.group in ("fit", "held-out", "new")
    ),
}


def summary(rows: list[Row], eff: Efficiency, group: str, committed: bool = False) -> str:
    if group in SUBSETS:
        sel = [r for r in rows if SUBSETS[group](r)]
    else:
        sel = [r for r in rows if r.group == group and (r.committed is not None or not committed)]
    if not sel:
        return f"{group}: no rows"
    ratios = [(r.committed if committed and r.committed else predict(r, eff)) / r.measured for r in sel]
    within = sum(1 for q in ratios if 0.75 <= q <= 1.25)
    worst = max(max(q, 1 / q) for q in ratios)
    med = statistics.median(abs(q - 1) for q in ratios)
    label = f"{group} (predictions committed before measuring)" if committed else group
    return (
        f"{label}: {len(sel)} rows, {within} within ±25% ({within / len(sel):.0%}), "
        f"median |error| {med:.1%}, worst ×{worst:.2f}"
    )


def table(rows: list[Row], eff: Efficiency) -> str:
    lines = [
        "| row | GPUs | set | measured s | predicted s | predicted/measured | committed before measuring |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = predict(r, eff)
        before = f"{r.committed:.4f} ({r.committed / r.measured:.2f})" if r.committed is not None else ""
        lines.append(
            f"| {r.args} | {r.gpus} | {r.group} | {r.measured:.4f} | {p:.4f} | {p / r.measured:.2f} | {before} |"
        )
    return "\n".join(lines)


def previous_model(row: Row) -> float | None:
    """The step time `plan` used before this model: 6N (full) or 4N (LoRA) FLOPs per token, +2N with
    checkpointing, + 12·layers·hidden·seq, at 30% of the bf16/fp16 peak or 55% of the fp32 peak (LM only)."""
    w = row.w
    spec = resolve_model(w.model)
    if spec.kind != "lm":
        return None
    n = spec.params
    per_token = (6 if w.method == "full" else 4) * n + (2 * n if w.grad_ckpt else 0)
    per_token += 12 * spec.layers * spec.hidden * w.seq
    flops = per_token * w.batch * w.seq * w.grad_accum
    return flops / (67e12 * 0.55 if w.precision == "fp32" else 989e12 * 0.30)


def previous_summary(rows: list[Row]) -> str:
    sel = [r for r in rows if r.group in ("fit", "held-out")]
    ratios = [q / r.measured for r in sel if (q := previous_model(r)) is not None]
    within = sum(1 for q in ratios if 0.75 <= q <= 1.25)
    worst = max(max(q, 1 / q) for q in ratios)
    return (
        f"previous model (FLOPs at 30% of peak), same rows: {within} of {len(sel)} within ±25% "
        f"({len(sel) - len(ratios)} vision rows had no step time), worst ×{worst:.2f}"
    )


def nccl_bench(out: Path) -> int:
    """NCCL bus bandwidth of all_reduce, all_gather and reduce_scatter on 256 MiB of bf16 across the ranks
    (bus bandwidth as nccl-tests defines it, doc/PERFORMANCE.md: all_reduce size/t x 2(n-1)/n, all_gather and
    reduce_scatter total size/t x (n-1)/n). Rank 0 writes OUT."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    elems = 128 * 2**20  # 256 MiB of bf16
    x = torch.ones(elems, dtype=torch.bfloat16, device="cuda")
    shard = torch.empty(elems // n, dtype=torch.bfloat16, device="cuda")
    gathered = torch.empty(elems, dtype=torch.bfloat16, device="cuda")
    ops = {
        "all_reduce": (lambda: dist.all_reduce(x), 2 * (n - 1) / n),
        "all_gather": (lambda: dist.all_gather_into_tensor(gathered, shard), (n - 1) / n),
        "reduce_scatter": (lambda: dist.reduce_scatter_tensor(shard, x), (n - 1) / n),
    }
    result: dict[str, Any] = {"ranks": n, "bytes": elems * 2, "gpu": torch.cuda.get_device_name()}
    for name, (fn, factor) in ops.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) / 20
        result[name] = {"seconds": t, "bus_gbs": elems * 2 / t * factor / 1e9}
    if rank == 0:
        out.write_text(json.dumps(result) + "\n", encoding="utf-8")
        print(json.dumps(result))
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the constants and write plan/data/steptime_fit.json")
    ap.add_argument(
        "--fit-decode", action="store_true", help="refit decode_host_s alone (on the generation rows), the rest kept"
    )
    ap.add_argument("--predict", type=Path, help="a job list (calibrate.py format): print predicted step seconds")
    ap.add_argument("--nccl", type=Path, help="under torchrun: measure NCCL bus bandwidth, write this JSON")
    ap.add_argument(
        "--measured", type=Path, help="a calibration JSONL: measured against predicted for its rows with step_seconds"
    )
    opts = ap.parse_args()
    if opts.measured:
        gpu = find_gpu(GPU)
        print("| job | measured s | predicted s | predicted / measured |")
        print("|---|---|---|---|")
        for line in opts.measured.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if not r.get("step_seconds"):
                continue
            p = step_time(workload_from_args(r["args"]), gpu).seconds
            print(f"| {r['args']} | {r['step_seconds']:.4f} | {p:.4f} | {p / r['step_seconds']:.2f} |")
        return 0
    if opts.nccl:
        return nccl_bench(opts.nccl)
    if opts.predict:
        gpu = find_gpu(GPU)
        for line in opts.predict.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            args = line.split(" ", 1)[1] if line.startswith("id=") else line
            st = step_time(workload_from_args(args), gpu)
            print(f"{st.seconds:.4f}\t{args}")
        return 0
    rows = load_rows()
    eff = fitted()
    if opts.fit or opts.fit_decode:
        flag = "--fit" if opts.fit else "--fit-decode"
        eff = fit(rows, f"python benchmarks/steptime.py {flag}", decode_only=not opts.fit)
    print("constants: " + ", ".join(f"{k}={v:.4g}" for k, v in eff.to_json().items()))
    print(table(rows, eff))
    for group in ("fit", "held-out", "new", "inference", "history", "re-measured", "memory sets"):
        print(summary(rows, eff, group))
    for group in ("new", "inference"):
        print(summary(rows, eff, group, committed=True))
    for group in SUBSETS:
        print(summary(rows, eff, group))
    print(previous_summary(rows))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
