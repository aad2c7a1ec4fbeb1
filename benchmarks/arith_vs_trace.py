"""The arithmetic estimator against the traced mode over a grid of jobs, on CPU (no GPU needed).

The traced mode runs the real transformers/peft code on fake tensors, so where the two disagree one of them
misses a mechanism. Small models keep each trace under a few seconds; the grid spans four architectures,
full fine-tuning, LoRA and inference, bf16/fp32/mixed, checkpointing, two batch x sequence shapes.

    python benchmarks/arith_vs_trace.py [--quick] [--families | --vision]     # prints a Markdown report
    (--families: the families of issue 13, shrunk, instead of the four base architectures; --vision: transformers'
    ViT, DINOv2 and SigLIP vision presets at 2 layers, native image size, training bf16/mixed and inference;
    --vision --full: five of those presets at full depth)
"""

from __future__ import annotations

import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuready.memory import estimate
from gpuready.memory.trace import trace_estimate
from gpuready.workload import make_workload

BASE = {
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}
CONFIGS = {
    "llama": {**BASE, "model_type": "llama", "num_key_value_heads": 2},
    "qwen2": {**BASE, "model_type": "qwen2", "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen3": {**BASE, "model_type": "qwen3", "num_key_value_heads": 4, "head_dim": 64},
    "gpt2": {"model_type": "gpt2", "vocab_size": 32000, "n_embd": 512, "n_layer": 4, "n_head": 8, "n_positions": 4096},
}
# the families added in issue 13, shrunk (each keeps its features: gemma-3's 5:1 sliding window under the
# sequence, the MoE routers and shared experts, gpt-oss's sinks, MLA with q_lora, GPT-NeoX's layout)
FAMILIES = {
    "gemma3_text": {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "num_attention_heads": 4,
                    "num_key_value_heads": 1, "head_dim": 128, "sliding_window": 256, "tie_word_embeddings": True},
    "qwen3_moe": {**BASE, "model_type": "qwen3_moe", "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 256},
    "qwen2_moe": {**BASE, "model_type": "qwen2_moe", "num_key_value_heads": 8, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 1024},
    "gpt_oss": {**BASE, "model_type": "gpt_oss", "intermediate_size": 512, "num_key_value_heads": 2, "head_dim": 64,
                "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128},
    "llama4_text": {**BASE, "model_type": "llama4_text", "intermediate_size": 256, "intermediate_size_mlp": 1024,
                    "num_key_value_heads": 2, "head_dim": 64, "num_local_experts": 4, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1},
    "deepseek_v3": {**BASE, "model_type": "deepseek_v3", "num_key_value_heads": 8, "moe_intermediate_size": 256,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "kv_lora_rank": 128, "q_lora_rank": 192, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64,
                    "v_head_dim": 64, "n_group": 1, "topk_group": 1},
    "gpt_neox": {"model_type": "gpt_neox", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 2048,
                 "num_hidden_layers": 4, "num_attention_heads": 8, "rotary_pct": 0.25, "max_position_embeddings": 4096},
}  # fmt: skip


def jobs(folder: Path, quick: bool, families: bool = False) -> list[tuple[str, dict[str, object]]]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    modes = ["train-full", "train-lora", "infer"]
    precisions = ["bf16"] if quick else ["bf16", "fp32", "mixed"]
    shapes = [(2, 512)] if quick else [(2, 512), (4, 1024)]
    configs = FAMILIES if families else CONFIGS
    for arch, mode, prec, ckpt, (b, s) in itertools.product(configs, modes, precisions, [False, True], shapes):
        if mode == "infer" and (ckpt or prec == "mixed"):
            continue
        path = folder / f"{arch}.json"
        if not path.exists():
            path.write_text(json.dumps(configs[arch]), encoding="utf-8")
        fields: dict[str, object] = {
            "model": str(path),
            "task": "infer" if mode == "infer" else "train",
            "method": "lora" if mode == "train-lora" else "full",
            "precision": prec,
            "grad_ckpt": ckpt,
            "batch": b,
            "seq": s,
            "new_tokens": 16 if mode == "infer" else 0,
        }
        out.append((f"{arch} {mode} {prec}{' ckpt' if ckpt else ''} b{b} s{s}", fields))
    return out


# transformers' vision presets cut to 2 layers (models/data/presets.json), and the batch of each
VISION = {"vit-base-patch16-224": 32, "dinov2-base": 8, "siglip-base-patch16-224-vision": 32}


VISION_FULL = [
    ("vit-base-patch16-224", "train", "bf16", 128),
    ("dinov2-base", "infer", "bf16", 64),
    ("siglip-base-patch16-224-vision", "train", "bf16", 64),
    ("vit-large-patch16-224", "train", "mixed", 16),
    ("siglip-so400m-patch14-384-vision", "infer", "bf16", 64),
]


def vision_jobs(folder: Path, quick: bool, full: bool = False) -> list[tuple[str, dict[str, object]]]:
    from gpuready.models import find_preset

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    if full:
        for name, task, prec, b in VISION_FULL:
            preset = find_preset(name)
            assert preset is not None
            size = int(preset.config["image_size"])
            job = {"model": name, "task": task, "precision": prec, "batch": b, "image_size": size}
            out.append((f"{name} {task} {prec} b{b}", job))
        return out
    for name, batch in VISION.items():
        preset = find_preset(name)
        assert preset is not None
        cfg = {**preset.config, "num_hidden_layers": 2}
        path = folder / f"{name}.json"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        for task, prec in [("train", "bf16"), ("train", "mixed"), ("infer", "bf16")][: 2 if quick else 3]:
            b = batch if task == "train" else 2 * batch
            fields: dict[str, object] = {
                "model": str(path),
                "task": task,
                "precision": prec,
                "batch": b,
                "image_size": int(cfg["image_size"]),
            }
            out.append((f"{name} (2 layers) {task} {prec} b{b}", fields))
    return out


def compare(fields: dict[str, object]) -> tuple[float, float]:
    w = make_workload(**fields)
    a, t = estimate(w), trace_estimate(w)
    return (a.peak_allocated_bytes / t.peak_allocated_bytes - 1, a.peak_reserved_bytes / t.peak_reserved_bytes - 1)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    families = "--families" in argv
    vision = "--vision" in argv
    print("# Arithmetic estimate vs traced mode (CPU)\n")
    print(f"Date: {time.strftime('%Y-%m-%d')}. Machine: {platform.platform()}, Python {platform.python_version()}.")
    print(f"Command: `python benchmarks/arith_vs_trace.py {' '.join(argv)}`. Difference = arithmetic / traced - 1.\n")
    print("| job | allocated | reserved |\n|---|---:|---:|")
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        full = "--full" in argv
        grid = vision_jobs(Path(tmp), quick, full) if vision else jobs(Path(tmp), quick, families)
        failed = 0
        for name, fields in grid:
            try:
                da, dr = compare(fields)
            except Exception as exc:  # a job either mode cannot size is a result of the comparison, not its end
                failed += 1
                print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:80]} | |", flush=True)
                continue
            rows.append((name, da, dr))
            print(f"| {name} | {da * 100:+.1f}% | {dr * 100:+.1f}% |", flush=True)
    print(f"\n{len(rows)} jobs in {time.perf_counter() - t0:.0f} s" + (f"; {failed} failed." if failed else "."))
    for label, idx in (("allocated", 1), ("reserved", 2)):
        vals = sorted(abs(r[idx]) for r in rows)
        print(
            f"- {label}: median |difference| {statistics.median(vals) * 100:.1f}%, "
            f"p90 {vals[int(0.9 * (len(vals) - 1))] * 100:.1f}%, largest {vals[-1] * 100:.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
