"""Running a job for the traced mode: the model built on the meta device and materialised as fake tensors, then
trained or generated as the calibration jobs ran it (../shared/calibration/README.md).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuready.errors import InputError
from gpuready.memory.trace_record import Trace, TraceUnavailable, as_on_cuda, import_torch, make_recorder
from gpuready.models import find_preset, resolve_model
from gpuready.models.spec import VISION_TYPES
from gpuready.models.vision import build_transformers_vision, is_transformers_vision
from gpuready.trial.probe import _vision_forward, _vision_loss
from gpuready.workload import Workload

TRAIN_STEPS = 3  # as the calibration jobs (README.md): optimizer states exist from the first step on
DECODE_STEPS_TRACED = 3


# -- building the model ------------------------------------------------------------------------------------
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "mixed": "float32"}


def _autocast(torch: Any, w: Workload) -> Any:
    """The job's autocast: bf16 over fp32 weights (mixed), or in the weights' own dtype (--autocast)."""
    if w.precision == "mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if w.autocast:
        return torch.autocast("cpu", dtype=torch.float16 if w.precision == "fp16" else torch.bfloat16)
    return nullcontext()


def _config_dict(model: str) -> dict[str, Any]:
    preset = find_preset(model)
    if preset is not None:
        return dict(preset.config)
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError("MODEL", f"{path}: not a readable config.json ({exc})") from None
        if isinstance(data, dict):
            return data
    raise InputError("MODEL", f"{model!r}: the traced mode takes a preset or a local config.json")


def _build_on_meta(torch: Any, transformers: Any, cfg: dict[str, Any], w: Workload) -> Any:
    dtype = getattr(torch, _DTYPES[w.precision])
    cfg = dict(cfg)
    if is_transformers_vision(cfg):
        # as the probe builds it: the job's weight dtype, SDPA, left in the mode from_config gives
        weights = dtype if w.precision in ("bf16", "fp16") else torch.float32
        with torch.device("meta"):
            return build_transformers_vision(transformers, cfg, weights)
    model_type = cfg.pop("model_type")
    if model_type in ("resnet", "vit"):
        return _build_vision(torch, {**cfg, "image_size": w.image_size}, model_type)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    # gpt-oss has no SDPA path (its attention sinks): transformers runs it eager
    attn = "eager" if (w.attn == "eager" or model_type == "gpt_oss") else "sdpa"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    if w.training:
        model.train()
        if w.grad_ckpt:
            from contextlib import nullcontext

            from gpuready.memory.trace_record import cuda_autocast_lists

            # the recomputation runs in backward, outside the trace's TorchFunctionModes: CUDA autocast's fp32 op lists
            # (trace_record.cuda_autocast_lists) are entered again for it, or a recomputed op differs from the forward's
            # (GPT-2's gelu_new pow under mixed precision: torch.utils.checkpoint's metadata check fails)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={
                    "use_reentrant": False,
                    "context_fn": lambda: (nullcontext(), cuda_autocast_lists(torch)),
                }
            )
        if w.method == "lora":
            from peft import LoraConfig, get_peft_model

            from gpuready.models.lora import default_lora_targets

            targets = list(w.lora_targets or default_lora_targets(resolve_model(w.model)))
            lora = LoraConfig(r=w.lora_r, lora_alpha=32, lora_dropout=0.0, target_modules=targets)
            with torch.device("meta"):
                model = get_peft_model(model, lora)
            if w.lora_dtype == "bf16":  # TRL's cast of the adapters (trial/probe.py does the same)
                for param in model.parameters():
                    if param.requires_grad:
                        param.data = param.data.to(torch.bfloat16)
    else:
        model.eval()
    return model


def _build_vision(torch: Any, cfg: dict[str, Any], model_type: str) -> Any:
    models = _torchvision_models()
    with torch.device("meta"):
        if model_type == "resnet":
            return models.resnet50() if cfg.get("layers") == [3, 4, 6, 3] else _resnet(models, cfg)
        return models.VisionTransformer(
            image_size=cfg["image_size"],
            patch_size=cfg["patch_size"],
            num_layers=cfg["num_layers"],
            num_heads=cfg["num_heads"],
            hidden_dim=cfg["hidden_dim"],
            mlp_dim=cfg["mlp_dim"],
            num_classes=cfg["num_classes"],
        )


def _resnet(models: Any, cfg: dict[str, Any]) -> Any:
    from torchvision.models import resnet

    block = resnet.Bottleneck if cfg["block"] == "bottleneck" else resnet.BasicBlock
    return resnet.ResNet(block, cfg["layers"], num_classes=cfg.get("num_classes", 1000))


def _torchvision_models() -> Any:
    """torchvision's model classes (its compiled ops do not register beside every torch build)."""
    try:
        from torchvision.models import resnet, vision_transformer  # noqa: F401
    except Exception as exc:
        raise TraceUnavailable(
            f"torchvision does not import here ({exc}); vision models cannot be traced: pip install "
            "'gpuready[vision]' (a torchvision built for the torch installed here)"
        ) from None
    import torchvision.models as models

    return models


def _materialize(torch: Any, model: Any, recorder: Any) -> None:
    """Replace every meta parameter and buffer by a fake tensor allocated in module order (ties kept)."""
    done: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device="cpu"), requires_grad=p.requires_grad
                )
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
            module._buffers[name] = done[id(b)]


# -- running the job -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    trace: Trace
    params: int
    trainable: int
    notes: list[str]


def run_trace(w: Workload, decode_steps: int = DECODE_STEPS_TRACED) -> _Job:
    """Trace one job: build, then train or generate, recording every allocation and free."""
    torch, transformers = import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = _config_dict(w.model)
    vision = cfg.get("model_type") in VISION_TYPES
    model = _build_on_meta(torch, transformers, cfg, w)
    seen: set[int] = set()
    params = trainable = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel()
            trainable += p.numel() if p.requires_grad else 0
    if w.method == "lora":
        params -= trainable  # report the base model's count, as the calibration rows do
    trace = Trace()
    notes: list[str] = []
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    recorder = make_recorder(torch, trace)
    try:
        with fake, recorder, as_on_cuda(torch, transformers):
            trace.mark("load", "weights")
            _materialize(torch, model, recorder)
            if w.training:
                _train(torch, model, w, trace, recorder, vision, cfg)
            elif vision:
                model = _infer_vision(torch, model, w, trace, cfg)
            else:
                _infer(torch, model, w, trace, recorder, decode_steps)
    finally:
        trace.recording = False
    return _Job(trace, params, trainable if w.training else 0, notes)


def _train(torch: Any, model: Any, w: Workload, trace: Trace, recorder: Any, vision: bool, cfg: dict[str, Any]) -> None:
    trace.mark("load", "other")
    trainable = [p for p in model.parameters() if p.requires_grad]
    if w.optim == "sgd":
        opt = torch.optim.SGD(trainable, lr=1e-5, momentum=0.9, foreach=True)
    elif w.optim == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    elif w.optim == "adafactor":
        # what --optim adafactor means (docs/cli.md): transformers' Adafactor as the HF Trainer builds it, as the
        # probe runs it (trial/probe.py)
        from transformers.optimization import Adafactor

        opt = Adafactor(trainable, lr=1e-5, scale_parameter=False, relative_step=False)  # type: ignore[no-untyped-call,unused-ignore]
    else:
        raise InputError("--optim", f"{w.optim} is not traced; allowed with --trace: adamw, sgd, adafactor")
    if vision:
        # the probe's images: in the weights' dtype for transformers' models built in bf16/fp16
        half = is_transformers_vision(cfg) and w.precision in ("bf16", "fp16")
        x = torch.empty(
            (w.batch, 3, w.image_size, w.image_size),
            dtype=getattr(torch, _DTYPES[w.precision]) if half else torch.float32,
        )
        y = torch.zeros((w.batch,), dtype=torch.long)
    else:
        ids = torch.empty((w.batch, w.seq), dtype=torch.long)
    autocast = _autocast(torch, w)
    for step in range(TRAIN_STEPS):
        # gradient accumulation: from the second micro-batch on, the first one's gradients are alive; two
        # micro-batches show every state the later ones repeat
        for _micro in range(min(w.grad_accum, 2)):
            trace.mark("forward", "activations")
            with autocast:
                if vision:
                    loss = _vision_loss(torch, model, x, y, {"config": cfg})
                else:
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            trace.mark("backward", "activations")
            loss.backward()
            del loss
        for p in trainable:
            if p.grad is not None and (gid := recorder.id_of(p.grad)) is not None:
                trace.relabel(gid, "gradients")
        trace.mark("optimizer", "other")
        opt.step()
        if step == 0:
            for state in opt.state.values():
                for t in state.values():
                    if isinstance(t, torch.Tensor) and (sid := recorder.id_of(t)) is not None:
                        trace.relabel(sid, "optimizer_states")
        opt.zero_grad(set_to_none=True)


def _convert(module: Any, dtype: Any) -> None:
    """`module.to(dtype)` in `Module._apply`'s order (children first, then the module's own floating-point
    parameters and buffers, each new tensor made before the old one goes), written out because fake parameters
    cannot be swapped in place."""
    import torch

    for child in module.children():
        _convert(child, dtype)
    for name in list(module._parameters):
        p = module._parameters[name]
        if p is not None and p.is_floating_point():
            module._parameters[name] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
        del p
    for name in list(module._buffers):
        b = module._buffers[name]
        if b is not None and b.is_floating_point():
            module._buffers[name] = b.to(dtype)
        del b


def _infer_vision(torch: Any, model: Any, w: Workload, trace: Trace, cfg: dict[str, Any]) -> Any:
    """A torchvision classifier as the trial's probe runs it: built in fp32 (left in train mode), converted with
    `model.to(dtype)` for bf16/fp16, then two forward passes under torch.no_grad()."""
    hf = is_transformers_vision(cfg)
    if w.precision in ("bf16", "fp16") and not hf:  # transformers' models are built in the dtype
        _convert(model, getattr(torch, _DTYPES[w.precision]))
    trace.mark("load", "other")
    dtype = getattr(torch, _DTYPES[w.precision]) if w.precision in ("bf16", "fp16") else torch.float32
    x = torch.empty((w.batch, 3, w.image_size, w.image_size), dtype=dtype)
    autocast = _autocast(torch, w)
    with torch.no_grad():
        for _ in range(2):
            trace.mark("forward", "activations")
            with autocast:
                out = _vision_forward(torch, model, x, {"config": cfg})
            del out
    return model


def _infer(torch: Any, model: Any, w: Workload, trace: Trace, recorder: Any, decode_steps: int) -> None:
    from transformers import DynamicCache

    trace.mark("load", "other")
    ids = torch.empty((w.batch, w.seq), dtype=torch.long)
    with torch.no_grad():
        if w.new_tokens == 0:
            # two plain forward passes producing all logits (calibration README)
            for _ in range(2):
                trace.mark("forward", "activations")
                out = model(input_ids=ids, use_cache=True)
                del out
            return
        cache = DynamicCache(config=model.config)
        trace.mark("prefill", "activations")
        # generate() passes one row of position ids per sequence (_prepare_position_ids_for_generation), so RoPE's
        # cos and sin are made per row (history gen_qwen3_4b_b64)
        positions = torch.empty((w.batch, w.seq), dtype=torch.long)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, position_ids=positions)
        _label_cache(cache, trace, recorder)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        del out
        tokens = logits.argmax(-1)
        del logits
        all_ids = torch.cat([ids, tokens[:, None]], dim=-1)
        steps = min(w.new_tokens - 1, decode_steps)
        for i in range(steps):
            trace.mark(f"decode{i}", "activations")
            position = torch.empty((w.batch, 1), dtype=torch.long)
            out = model(input_ids=all_ids[:, -1:], past_key_values=cache, use_cache=True, position_ids=position)
            _label_cache(cache, trace, recorder)
            logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
            del out
            tokens = logits.argmax(-1)
            del logits
            all_ids = torch.cat([all_ids, tokens[:, None]], dim=-1)
        trace.mark("end", "other")


def _label_cache(cache: Any, trace: Trace, recorder: Any) -> None:
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and (aid := recorder.id_of(t)) is not None:
                trace.relabel(aid, "kv_cache")
