"""Peak memory of QLoRA jobs with peft's `prepare_model_for_kbit_training` applied before the adapters, as most
QLoRA scripts do (it casts every parameter that is not 4-bit — embeddings, norms, lm_head, biases — to fp32, and
turns on gradient checkpointing by default), measured with the built-in probe (trial/probe.py) whose LoRA step is
wrapped to call it first. The estimator does not model this preparation; these rows are the measurement behind the
figure its QLoRA assumption line gives (docs/calibration/kbit_prep/h200.jsonl).

One job per process (peaks are per process); on the GPU machine, from the repository root:

    for j in "llama-3.1-8b --method qlora --grad-ckpt --batch 1 --seq 2048 --autocast" ...; do
        GPUREADY_PROBE_MEMORY_HISTORY=$OUT/h.json python3 benchmarks/kbit_prep_measure.py $OUT/kbit_prep.jsonl "$j"
    done
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import gpuready.trial.probe as probe
from gpuready.trial.backend import probe_spec
from gpuready.workload import workload_from_args

_apply_lora = probe._apply_lora


def _prepared(model: Any, spec: dict[str, Any]) -> Any:
    from peft import prepare_model_for_kbit_training

    w = spec["workload"]
    model = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=w["grad_ckpt"], gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    return _apply_lora(model, spec)


def main(out: str, args: str) -> int:
    probe._apply_lora = _prepared
    r = probe.measure(probe_spec(workload_from_args(args)))
    row = {
        "args": args,
        "prepare_model_for_kbit_training": True,
        "peak_reserved_bytes": r.get("peak_reserved_bytes"),
        "peak_allocated_bytes": r.get("peak_allocated_bytes"),
        "error": r.get("error"),
    }
    print(json.dumps(row), flush=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
