"""The built-in probe: one job measured in this (child) process. The only module that imports torch.

Run as `python -m gpuready.trial.probe SPEC.json RESULT.json` (or under torchrun, one process per GPU;
rank r writes RESULT.json.rank<r>). The parent (runner.py) builds SPEC.json from a Workload; this module
writes RESULT.json and exits 0 whenever it could record a result, an out-of-memory error included.

How a job is measured follows ../shared/calibration/README.md exactly, so the probe's peaks can be set beside
h200.jsonl: the model is built from its config directly on the GPU in the workload's dtype (random weights;
memory does not depend on the values), random token ids, `loss = model(input_ids=ids, labels=ids,
use_cache=False).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)`, 3 steps (4 for vision),
AdamW(lr=1e-5) with its defaults or SGD(momentum=0.9); `mixed` = fp32 model under bf16 autocast, `--autocast` = the
16-bit model under autocast in its dtype (the HF Trainer's bf16/fp16 switch). QLoRA's base
model is made 4-bit as from_pretrained with bitsandbytes makes it (trial/qlora.py).
`--lora-dtype bf16`: the trainable adapters cast to bf16 after peft wraps the model (TRL's SFTTrainer does this for a
4-bit model).
`--kbit-prep`: peft's prepare_model_for_kbit_training before the adapters (QLoRA scripts call it).
Peaks are torch.cuda.max_memory_allocated/reserved over the whole run; device overhead = NVML used − reserved
at the end of the run (CUDA context, cuBLAS/cuDNN workspaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuready.models.vision import build_transformers_vision, is_transformers_vision
from gpuready.trial.probe_memory import (
    MEMORY_HISTORY_ENV,
    history_length,
    record_memory,
    start_history,
    under_torchrun,
    write_history,
)
from gpuready.workload.spec import SAMPLING

# Steps per job as calibration/README.md measures them; GPUREADY_PROBE_STEPS overrides (timing studies).
LM_STEPS = int(os.environ.get("GPUREADY_PROBE_STEPS", "3"))
VISION_STEPS = int(os.environ.get("GPUREADY_PROBE_STEPS", "4"))
# generate() calls per generation job: two, and the request is timed by the second (step_seconds: warm, as `plan`
# times it; step_times has both). The first builds cuDNN's attention plans, one per new key length, on Hopper and
# Blackwell (docs/steptime.md: 1.2-8.9x the second on the H200). The second call leaves the peaks as the first left
# them (first_step_peak_* against the run's, byte for byte on 5 of 5 memory-set jobs: docs/calibration/
# gen_twice_h200.tsv), so the peaks are those of one call, as calibration/README.md measures them.
# GPUREADY_PROBE_GENERATE_CALLS=1 gives calibration's single timed call.
GENERATE_CALLS = int(os.environ.get("GPUREADY_PROBE_GENERATE_CALLS", "2"))
NEEDS_BNB = "needs bitsandbytes, which is not installed here (pip install bitsandbytes)"
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ProbeSkip(Exception):
    """The job cannot be measured here (a missing package, an unsupported option): recorded, not raised."""


def _dtype(torch: Any, precision: str) -> Any:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "mixed": torch.float32}[precision]


def _autocast(torch: Any, w: dict[str, Any]) -> Any:
    if w["precision"] == "mixed":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if w.get("autocast"):
        return torch.autocast("cuda", dtype=_dtype(torch, w["precision"]))
    return contextlib.nullcontext()


def _optimizer(torch: Any, optim: str, params: list[Any]) -> Any:
    if optim == "adamw":
        return torch.optim.AdamW(params, lr=1e-5)
    if optim == "sgd":
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9)
    if optim == "adafactor":
        # transformers' Adafactor as the HF Trainer builds it for optim="adafactor" (what --optim adafactor means,
        # workload/formats/): a fixed learning rate, no parameter scaling
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-5, scale_parameter=False, relative_step=False)  # type: ignore[no-untyped-call,unused-ignore]
    if optim == "adamw8bit":
        try:
            import bitsandbytes as bnb  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise ProbeSkip(f"--optim adamw8bit {NEEDS_BNB}") from exc
        return bnb.optim.AdamW8bit(params, lr=1e-5)
    raise ProbeSkip(f"unknown optimizer {optim!r}")


def sdpa_or_skip(build: Callable[[], Any], model_type: str, attn: str) -> Any:
    """`build()`, with transformers' refusal of SDPA for a model class that has none (Gemma 2 in transformers
    5.24: `_supports_sdpa = False`, softcapping) turned into a skip that names the flag to use."""
    try:
        return build()
    except ValueError as exc:
        if attn == "sdpa" and "scaled_dot_product_attention" in str(exc):
            raise ProbeSkip(
                f"--attn sdpa: this transformers has no SDPA path for {model_type} (it runs it with eager attention "
                "by default); rerun with --attn eager"
            ) from exc
        raise


def _build_lm(torch: Any, spec: dict[str, Any]) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    w = spec["workload"]
    attn = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}[w["attn"]]
    dtype = _dtype(torch, w["precision"])
    four_bit = w["method"] == "qlora"
    if four_bit:
        try:
            import bitsandbytes  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
        except ImportError as exc:
            raise ProbeSkip(f"--method qlora {NEEDS_BNB}") from exc
        from gpuready.trial import qlora
    if spec.get("weights_path"):
        extra = {"quantization_config": qlora.bnb_config(dtype)} if four_bit else {}
        return sdpa_or_skip(
            lambda: AutoModelForCausalLM.from_pretrained(
                spec["weights_path"],
                dtype=dtype,
                attn_implementation=attn,
                device_map={"": torch.cuda.current_device()},
                **extra,
            ),
            str(spec.get("config", {}).get("model_type", spec["weights_path"])),
            attn,
        )
    config = dict(spec["config"])
    model_type = config.pop("model_type")
    if model_type == "gpt_oss":
        attn = "eager"  # transformers has no SDPA path for gpt-oss's attention sinks
    cfg = AutoConfig.for_model(model_type, **config)
    if four_bit:
        return sdpa_or_skip(lambda: qlora.build_from_config(torch, cfg, dtype, attn), model_type, attn)
    with torch.device("cuda"):
        return sdpa_or_skip(
            lambda: AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn),  # type: ignore[no-untyped-call]
            model_type,
            attn,
        )


def _build_vision(torch: Any, spec: dict[str, Any]) -> Any:
    w = spec["workload"]
    cfg = spec["config"]
    if is_transformers_vision(cfg):
        import transformers

        # random weights from the config, made on the GPU in the job's weight dtype (as the language models)
        dtype = _dtype(torch, w["precision"]) if w["precision"] in ("bf16", "fp16") else torch.float32
        with torch.device("cuda"):
            return build_transformers_vision(transformers, cfg, dtype)
    from torchvision.models import resnet, vision_transformer

    with torch.device("cuda"):
        if cfg["model_type"] == "resnet":
            block = resnet.Bottleneck if cfg["block"] == "bottleneck" else resnet.BasicBlock
            model = resnet.ResNet(block, list(cfg["layers"]), num_classes=int(cfg.get("num_classes", 1000)))
        else:
            # ViT's position embedding depends on the resolution: pass image_size to the constructor
            model = vision_transformer.VisionTransformer(
                image_size=int(w["image_size"]),
                patch_size=int(cfg["patch_size"]),
                num_layers=int(cfg["num_layers"]),
                num_heads=int(cfg["num_heads"]),
                hidden_dim=int(cfg["hidden_dim"]),
                mlp_dim=int(cfg["mlp_dim"]),
                num_classes=int(cfg.get("num_classes", 1000)),
            )
    if w["precision"] in ("bf16", "fp16"):
        model = model.to(_dtype(torch, w["precision"]))
    return model


def _vision_forward(torch: Any, model: Any, x: Any, spec: dict[str, Any]) -> Any:
    """The model's output for the images x: logits (a classifier), or SigLIP's pooled embedding."""
    cfg = spec["config"]
    if not is_transformers_vision(cfg):
        return model(x)
    kwargs: dict[str, Any] = {}
    if cfg["model_type"] != "dinov2" and int(x.shape[-1]) != int(cfg.get("image_size", 224)):
        kwargs["interpolate_pos_encoding"] = True  # DINOv2 interpolates by itself
    out = model(pixel_values=x, **kwargs)
    return out.pooler_output if cfg["model_type"] == "siglip_vision_model" else out.logits


def _vision_loss(torch: Any, model: Any, x: Any, y: Any, spec: dict[str, Any]) -> Any:
    out = _vision_forward(torch, model, x, spec)
    if spec["config"]["model_type"] == "siglip_vision_model" and is_transformers_vision(spec["config"]):
        return out.float().square().mean()  # an embedding model: no classes to score
    return torch.nn.functional.cross_entropy(out, y)


def _apply_lora(model: Any, spec: dict[str, Any]) -> Any:
    w = spec["workload"]
    from peft import LoraConfig, get_peft_model

    targets = list(w.get("lora_targets") or spec.get("lora_targets") or DEFAULT_LORA_TARGETS)
    cfg = LoraConfig(r=int(w["lora_r"]), lora_alpha=32, lora_dropout=0.0, target_modules=targets)
    if w.get("kbit_prep"):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call,unused-ignore]
            model, use_gradient_checkpointing=w["grad_ckpt"], gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    model = get_peft_model(model, cfg)
    if w.get("lora_dtype") == "bf16":
        import torch

        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    return model


class _Clock:
    """Wall time of GPU work: synchronize before reading the clock."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def now(self) -> float:
        self.torch.cuda.synchronize()
        return time.perf_counter()


def _distributed_wrap(torch: Any, model: Any, shard: str, world: int) -> Any:
    if world <= 1 or shard == "none":
        return model
    if shard == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    if shard == "fsdp":
        from torch.distributed.fsdp import fully_shard

        layers = getattr(getattr(model, "model", model), "layers", None)
        for layer in layers or []:
            fully_shard(layer)
        fully_shard(model)
        return model
    raise ProbeSkip(f"--shard {shard} is not measured by the built-in probe (ddp and fsdp are)")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one job on the current CUDA device. Returns the result dict (also for OOM)."""
    import torch

    w = spec["workload"]
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    result: dict[str, Any] = {
        "ok": False,
        "error": None,
        "error_kind": None,
        "phase": "start",
        "rank": rank,
        "world_size": world,
        "torch_version": torch.__version__,
    }
    if not torch.cuda.is_available():
        result.update(error="no CUDA GPU is visible to the probe", error_kind="no_gpu")
        return result
    if under_torchrun():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl")
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    result.update(gpu=props.name, gpu_total_bytes=int(props.total_memory))
    if spec.get("bench"):
        uuid = str(getattr(props, "uuid", "") or "")
        _announce(DEVICE_MARK, {"rank": rank, "uuid": uuid, "name": props.name, "total": int(props.total_memory)})
    if spec.get("seed") is not None:
        # the same weights and tokens on every machine (bench): a fixed job
        torch.manual_seed(int(spec["seed"]))
    cap = spec.get("memory_cap_bytes")
    if cap:
        # emulate a smaller card: the caching allocator may hold at most `cap` bytes (it frees its cache and
        # retries before it raises out-of-memory, as it would on a card of that size)
        torch.cuda.set_per_process_memory_fraction(min(1.0, int(cap) / int(props.total_memory)), device)
        result["memory_cap_bytes"] = int(cap)
    try:
        import transformers

        result["transformers_version"] = transformers.__version__
    except ImportError:
        pass
    clock = _Clock(torch)
    is_vision = spec["kind"] == "vision"
    history = os.environ.get(MEMORY_HISTORY_ENV)
    if history:
        start_history(torch)
    try:
        torch.cuda.reset_peak_memory_stats()
        t_load = time.perf_counter()
        result["phase"] = "load"
        model = _build_vision(torch, spec) if is_vision else _build_lm(torch, spec)
        training = w["task"] == "train"
        # params as PyTorch counts the model (tied embeddings once), before any LoRA adapters are added
        result["params"] = sum(p.numel() for p in model.parameters())
        if training and not is_vision:
            if w["grad_ckpt"]:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if w["method"] in ("lora", "qlora"):
                model = _apply_lora(model, spec)
        result["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad) if training else None
        if world > 1 and training:
            model = _distributed_wrap(torch, model, w["shard"], world)
            # peaks count from here: the unsharded model built before sharding is not part of the job
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            if history:
                result["memory_history_reset_at"] = history_length(torch)
        torch.cuda.synchronize()
        result["load_seconds"] = time.perf_counter() - t_load
        result["load_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        result["load_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        batch, seq = int(w["batch"]), int(w["seq"])
        times: list[float] = []
        step: Any
        if is_vision:
            size = int(w["image_size"])
            in_dtype = _dtype(torch, w["precision"]) if w["precision"] in ("bf16", "fp16") else torch.float32
            x = torch.randn(batch, 3, size, size, device="cuda", dtype=in_dtype)
            classes = int(getattr(getattr(model, "config", None), "num_labels", 0) or 1000)
            y = torch.randint(0, classes, (batch,), device="cuda")
            unit, per_step = "images/s", batch
            if training:
                result["phase"] = "train"
                opt = _optimizer(torch, w["optim"], [p for p in model.parameters() if p.requires_grad])

                def step() -> None:
                    for _ in range(int(w["grad_accum"])):
                        with _autocast(torch, w):
                            loss = _vision_loss(torch, model, x, y, spec)
                        loss.backward()  # type: ignore[no-untyped-call,unused-ignore]
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                count = VISION_STEPS
                per_step *= int(w["grad_accum"])
            else:
                result["phase"] = "infer"

                def step() -> None:
                    with torch.no_grad(), _autocast(torch, w):
                        _vision_forward(torch, model, x, spec)

                count = 2
        else:
            vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or spec["config"]["vocab_size"])
            ids = torch.randint(0, vocab, (batch, seq), device="cuda")
            unit, per_step = "tokens/s", batch * seq
            if training:
                result["phase"] = "train"
                opt = _optimizer(torch, w["optim"], [p for p in model.parameters() if p.requires_grad])

                def step() -> None:
                    for _ in range(int(w["grad_accum"])):
                        with _autocast(torch, w):
                            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                        loss.backward()  # type: ignore[no-untyped-call,unused-ignore]
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                count = LM_STEPS
                per_step *= int(w["grad_accum"])
            elif int(w["new_tokens"]) > 0:
                result["phase"] = "generate"
                n = int(w["new_tokens"])
                decoding: dict[str, Any] = {"do_sample": False}
                if w.get("decoding", "greedy") == "sample":
                    decoding = {"do_sample": True, **SAMPLING}

                def step() -> None:
                    with torch.no_grad(), _autocast(torch, w):
                        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **decoding)

                count = max(1, GENERATE_CALLS)
                result["generate_calls"] = count
                per_step = batch * n
            else:
                result["phase"] = "prefill"

                def step() -> None:
                    with torch.no_grad(), _autocast(torch, w):
                        model(ids, use_cache=True)

                count = 2
        bench = spec.get("bench")
        if bench:
            _run_for(torch, clock, step, float(bench["duration_seconds"]), per_step, rank, world, result)
        else:
            for i in range(count):
                t0 = clock.now()
                step()
                times.append(clock.now() - t0)
                if i == 0 and count > 1:  # what the first step alone reached (the whole run's peaks come below)
                    result["first_step_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
                    result["first_step_peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        torch.cuda.synchronize()
        if not bench:
            result["step_times"] = times
            steady = times[1:] or times
            result["step_seconds"] = statistics.median(steady) if steady else None
        result["throughput"] = per_step / result["step_seconds"] if result.get("step_seconds") else None
        result["throughput_unit"] = unit
        result["ok"] = True
        result["phase"] = "done"
    except torch.OutOfMemoryError as exc:
        result.update(error=_first_line(exc), error_kind="oom")
    except ProbeSkip as exc:
        result.update(error=str(exc), error_kind="unsupported")
    except ImportError as exc:
        result.update(error=f"missing package: {exc}", error_kind="missing_dependency")
    except Exception as exc:  # a fault of the job is a result to report
        result.update(error=f"{type(exc).__name__}: {_first_line(exc)}", error_kind="error")
        result["traceback"] = traceback.format_exc(limit=6)
    record_memory(torch, result, device)
    if history:
        write_history(torch, result, history)
    return result


# Bench mode (spec["bench"] = {"duration_seconds": D}): each finished step is a line on stdout, so the parent
# keeps every step that ran even when the job later crashes or hangs and never writes its result file.
STEP_MARK = "GPUREADY_STEP"
DEVICE_MARK = "GPUREADY_DEVICE"


def _announce(mark: str, data: dict[str, Any]) -> None:
    sys.stdout.write(f"{mark} {json.dumps(data)}\n")
    sys.stdout.flush()


def _run_for(
    torch: Any,
    clock: _Clock,
    step: Any,
    duration: float,
    units: int,
    rank: int,
    world: int,
    result: dict[str, Any],
) -> None:
    """Run steps until `duration` seconds after the first one ended (the first carries the warm-up).

    Under torchrun the ranks agree after each step whether to stop (one all-reduce of a flag), so no rank
    waits in a collective for a rank that has already left the loop."""
    distributed = world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    flag = torch.zeros(1, device="cuda") if distributed else None
    times: list[float] = []
    end_at: float | None = None
    while True:
        t0 = clock.now()
        step()
        t1 = clock.now()
        times.append(t1 - t0)
        now = time.time()
        _announce(STEP_MARK, {"rank": rank, "step": len(times), "end": now, "seconds": t1 - t0, "units": units})
        if end_at is None:
            end_at = t1 + duration
            result["first_step_end"] = now
        stop = t1 >= end_at
        if flag is not None:
            flag.fill_(1.0 if stop else 0.0)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item() > 0)
        if stop:
            break
    result["steps"] = len(times)
    steady = times[1:] or times
    result["step_seconds"] = statistics.median(steady)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python -m gpuready.trial.probe SPEC.json RESULT.json\n")
        return 2
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    out = Path(args[1])
    rank = int(os.environ.get("RANK", "0"))
    if under_torchrun():
        out = out.with_name(f"{out.name}.rank{rank}")
    t0 = time.perf_counter()
    result = measure(spec)
    result["process_seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(result), encoding="utf-8")
    with contextlib.suppress(Exception):
        import torch

        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
