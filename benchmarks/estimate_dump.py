"""Dump every field of the arithmetic estimator's answer for a grid of jobs, as sorted JSON lines.

For refactoring memory/: run it before and after a change and compare the files byte for byte (a restructuring
must not move any number):

    PYTHONPATH=$PWD/src python benchmarks/estimate_dump.py --out /tmp/before.jsonl [--quick]
    ... change the code ...
    PYTHONPATH=$PWD/src python benchmarks/estimate_dump.py --out /tmp/after.jsonl [--quick]
    cmp /tmp/before.jsonl /tmp/after.jsonl

The grid: every preset model (gpuready.models presets; --quick: every fifth) x the workloads below (training full,
LoRA, QLoRA, checkpointing, mixed precision, fp32, SGD, eager attention, 2-GPU DDP and FSDP; inference prefill,
generation with short and long --new-tokens, eager; vision training and inference) x a few batch/sequence
values, each without a card, and some also on cards of 24 and 80 GiB (fits, headroom, max_batch and the rest of
the card fields; --quick: 24 GiB only). A job the estimator refuses is dumped with its error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpuready.errors import InputError
from gpuready.memory.estimate import estimate
from gpuready.models import load_presets, resolve_model
from gpuready.workload import Workload

GIB = 1024**3
CARDS = (24 * GIB, 80 * GIB)
CARDS_QUICK = (24 * GIB,)

LM_TRAIN: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"method": "lora"},
    "qlora": {"method": "qlora"},
    "ckpt": {"grad_ckpt": True},
    "lora_ckpt": {"method": "lora", "grad_ckpt": True},
    "mixed": {"precision": "mixed"},
    "mixed_ckpt": {"precision": "mixed", "grad_ckpt": True},
    "fp32": {"precision": "fp32"},
    "sgd": {"optim": "sgd"},
    "eager": {"attn": "eager"},
    "ddp2": {"gpus": 2, "shard": "ddp"},
    "ddp2_ckpt": {"gpus": 2, "shard": "ddp", "grad_ckpt": True},
    "fsdp2": {"gpus": 2, "shard": "fsdp"},
    "fsdp8_lora": {"gpus": 8, "shard": "fsdp", "method": "lora"},
}
LM_INFER: dict[str, dict[str, Any]] = {
    "prefill": {},
    "prefill_eager": {"attn": "eager"},
    "prefill_fp32": {"precision": "fp32"},
    "gen64": {"new_tokens": 64},
    "gen_long": {"new_tokens": 1500},
    "gen_eager": {"new_tokens": 32, "attn": "eager"},
}
VISION_TRAIN: dict[str, dict[str, Any]] = {
    "full": {},
    "mixed": {"precision": "mixed"},
    "fp32": {"precision": "fp32"},
    "sgd": {"optim": "sgd"},
    "ddp2": {"gpus": 2, "shard": "ddp"},
}
VISION_INFER: dict[str, dict[str, Any]] = {"infer": {}, "infer_fp32": {"precision": "fp32"}}
LM_SHAPES = ((1, 512), (4, 2048))
LM_SHAPES_QUICK = ((2, 1024),)
VISION_SHAPES = ((8, 224), (64, 224))
VISION_SHAPES_QUICK = ((32, 224),)
# the jobs also judged on the cards (a max-batch search is the costly part): these workloads at the first shape
ON_CARDS = {"full", "lora", "ckpt", "mixed_ckpt", "fsdp2", "prefill", "gen64", "infer"}
ON_CARDS_QUICK = {"lora", "ckpt", "gen64", "infer"}


def jobs(quick: bool) -> list[tuple[str, Workload, bool]]:
    """(label, workload, judged on the cards) for every job of the grid."""
    presets = load_presets()
    if quick:
        presets = presets[::5]
    out: list[tuple[str, Workload, bool]] = []
    for preset in presets:
        spec = resolve_model(preset.name)
        vision = spec.kind == "vision"
        if vision:
            grids = (("train", VISION_TRAIN), ("infer", VISION_INFER))
            shapes = VISION_SHAPES_QUICK if quick else VISION_SHAPES
        else:
            grids = (("train", LM_TRAIN), ("infer", LM_INFER))
            shapes = LM_SHAPES_QUICK if quick else LM_SHAPES
        for task, grid in grids:
            for name, fields in grid.items():
                for i, (batch, size) in enumerate(shapes):
                    shape = {"image_size": size} if vision else {"seq": size}
                    w = Workload(model=preset.name, task=task, batch=batch, **shape, **fields)  # type: ignore[arg-type]
                    out.append((f"{task}:{name}", w, i == 0 and name in (ON_CARDS_QUICK if quick else ON_CARDS)))
    return out


def dump(quick: bool) -> list[str]:
    lines: list[str] = []
    for label, w, judged in jobs(quick):
        for card in (None, *(CARDS_QUICK if quick else CARDS)) if judged else (None,):
            row: dict[str, Any] = {"job": label, "workload": w.model_dump(mode="json"), "card": card}
            try:
                row["estimate"] = estimate(w, card).to_json()
            except InputError as exc:
                row["error"] = str(exc)
            lines.append(json.dumps(row, sort_keys=True))
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", required=True, type=Path, help="the JSON-lines file to write")
    parser.add_argument("--quick", action="store_true", help="every fifth preset, one shape, one card")
    args = parser.parse_args(argv)
    start = time.monotonic()
    lines = dump(args.quick)
    args.out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"{len(lines)} estimates -> {args.out} in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
