"""Traced mode: run the job's real code on fake tensors (no memory, no GPU) and replay its allocations
through the caching-allocator simulation (allocator.py).

How (../shared/calibration/README.md says how each measured job was run; this mirrors it):
- the model is built on the meta device (no initialisation, which reads values), LoRA adapters are added
  there by peft, and then every parameter and buffer is materialised as a fake CPU tensor, in module order;
- training runs `loss = model(input_ids, labels, use_cache=False).loss; loss.backward(); opt.step();
  opt.zero_grad(set_to_none=True)` for 3 steps with AdamW(foreach=True) or SGD(momentum=0.9, foreach=True)
  (CUDA takes the foreach path by default, the CPU does not: NOTES.md);
- inference runs prefill and decode steps with the model's forward and a DynamicCache, as `generate()`
  does (logits_to_keep=1, an fp32 copy of the last logits), without its data-dependent reads (NOTES.md);
  a few decode steps are traced and the rest extrapolated: every step repeats the same allocations, those
  that hold the cache growing by one token;
- a TorchDispatchMode records each new storage when an op returns it, and a weakref finalizer on the
  storage records its free; storages of 0 bytes are not allocations;
- what differs between CPU and CUDA kernels is modelled: scaled_dot_product_attention is replaced by what
  CUDA's flash or memory-efficient kernel keeps (output and log-sum-exp; the backward's fp32 accumulator),
  chosen by CUDA's rules, or the math path where CUDA would fall back to it; cuBLAS allocates one
  workspace through the caching allocator per handle (the forward thread and autograd's device thread).
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuready.errors import GpureadyError, InputError
from gpuready.memory.allocator import CachingAllocator, round_size
from gpuready.memory.fit import Fit, judge
from gpuready.memory.result import MemoryEstimate
from gpuready.models import find_preset, resolve_model
from gpuready.search import largest_passing
from gpuready.units import MIB
from gpuready.workload import Workload

# cuBLAS workspace per handle on Hopper (sm90): 4096 * 8 KiB = 32 MiB (default CUBLAS_WORKSPACE_CONFIG,
# aten/src/ATen/cuda/CublasHandlePool.cpp), taken from the caching allocator, never freed.
CUBLAS_WORKSPACE_BYTES = 32 * MIB

TRAIN_STEPS = 3  # as the calibration jobs (README.md): optimizer states exist from the first step on
DECODE_STEPS_TRACED = 3

COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "other")


class TraceUnavailable(GpureadyError):
    """The traced mode needs torch and transformers (pip install 'gpuready[trace]')."""


@dataclass
class Trace:
    """A job's allocations and frees in order, in the format `allocator.replay` takes, with labels."""

    events: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=lambda: [""])  # allocation id -> component (id 0 unused)
    sizes: list[int] = field(default_factory=lambda: [0])  # allocation id -> requested bytes
    marks: list[tuple[int, str]] = field(default_factory=list)  # (first event index, phase)
    phase: str = "load"
    component: str = "weights"
    recording: bool = True

    def alloc(self, nbytes: int) -> int:
        self.events.append(nbytes)
        self.labels.append(self.component)
        self.sizes.append(nbytes)
        return len(self.labels) - 1

    def free(self, alloc_id: int) -> None:
        if self.recording:
            self.events.append(-alloc_id)

    def mark(self, phase: str, component: str) -> None:
        self.phase, self.component = phase, component
        self.marks.append((len(self.events), phase))

    def relabel(self, alloc_id: int, component: str) -> None:
        self.labels[alloc_id] = component


# -- heavy imports -------------------------------------------------------------------------------------
def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TraceUnavailable(
            f"the traced mode needs torch and transformers ({exc.name} missing): pip install gpuready[trace]"
        ) from None
    return torch, transformers


# -- the recorder ------------------------------------------------------------------------------------
def _recorder(torch: Any, trace: Trace) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    matmuls = {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
    }

    class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ids: dict[int, int] = {}  # StorageImpl address -> allocation id
            self.workspaces: set[str] = set()

        def track(self, t: Any) -> None:
            st = t.untyped_storage()
            key = st._cdata
            if key in self.ids:
                return
            nbytes = st.nbytes()
            if nbytes == 0:
                return
            alloc_id = trace.alloc(nbytes)
            self.ids[key] = alloc_id
            fin = weakref.finalize(st, self._freed, key, alloc_id)
            fin.atexit = False

        def _freed(self, key: int, alloc_id: int) -> None:
            if self.ids.get(key) == alloc_id:
                del self.ids[key]
            trace.free(alloc_id)

        def id_of(self, t: Any) -> int | None:
            return self.ids.get(t.untyped_storage()._cdata)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in matmuls:
                # one cuBLAS handle (and workspace) per thread: forward/optimizer and autograd's device thread
                thread = "backward" if trace.phase == "backward" else "main"
                if thread not in self.workspaces:
                    self.workspaces.add(thread)
                    saved = trace.component
                    trace.component = "other"
                    trace.alloc(CUBLAS_WORKSPACE_BYTES)  # never freed
                    trace.component = saved
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
            return out

    return Recorder()


# -- attention as CUDA would run it ----------------------------------------------------------------------
def cuda_sdpa_kernel(dtype_is_half: bool, head_dim: int, has_mask: bool, gqa: bool, fp32: bool = False) -> str:
    """Which SDPA backend CUDA picks on sm90 with torch's default priority (flash, efficient, math).

    Rules from aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash needs fp16/bf16, no explicit
    mask, head_dim a multiple of 8 and at most 256 (GQA supported); memory-efficient takes fp32 too and a
    mask, head_dim a multiple of 8 (4 for fp32), but not enable_gqa; anything else falls back to math.
    """
    if dtype_is_half and not has_mask and head_dim % 8 == 0 and head_dim <= 256:
        return "flash"
    if not gqa and head_dim % (4 if fp32 else 8) == 0:
        return "efficient"
    return "math"


def _cuda_sdpa(torch: Any) -> Callable[..., Any]:
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    class FusedAttention(torch.autograd.Function):  # type: ignore[misc]
        """Allocates what the fused CUDA kernels allocate: forward output + fp32 log-sum-exp (saved);
        backward dq/dk/dv (dk, dv at the query's head count under GQA, then summed), fp32 dq accumulator."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, lse_len: int) -> Any:
            b, h, length, _ = q.shape
            # the kernels write (batch, seq, heads, dim) and return it transposed: the caller's
            # transpose(1, 2).contiguous() is then free, and o_proj saves this very storage
            out = q.new_empty((b, length, h, v.shape[-1])).transpose(1, 2)
            lse = q.new_empty((b, h, lse_len), dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v = ctx.saved_tensors[:3]
            b, h, length, d = q.shape
            accum = q.new_empty((b, h, math.ceil(length / 128) * 128, d), dtype=torch.float32)
            softmax_d = q.new_empty((b, h, math.ceil(length / 128) * 128), dtype=torch.float32)
            dq = torch.empty_like(q)
            hk = k.shape[1]
            if hk != h:
                dk_full = k.new_empty((b, h, k.shape[2], k.shape[3]))
                dv_full = v.new_empty((b, h, v.shape[2], v.shape[3]))
                dk = dk_full.view(b, hk, h // hk, k.shape[2], k.shape[3]).sum(2)
                dv = dv_full.view(b, hk, h // hk, v.shape[2], v.shape[3]).sum(2)
                del dk_full, dv_full
            else:
                dk, dv = torch.empty_like(k), torch.empty_like(v)
            del accum, softmax_d
            return dq, dk, dv, None

    def _math_nograd(query: Any, key: Any, value: Any) -> Any:
        """CUDA's _scaled_dot_product_attention_math without autograd, as aten runs it (attention.cpp): q scaled, K
        and V repeated to every head, kᵀ scaled, the scores (the causal mask added in place), _safe_softmax's
        output and its one-byte mask, then probabilities @ v. The CPU decomposition allocates differently."""
        b, h, length, _ = query.shape
        hk = key.shape[-3]
        q = torch.empty_like(query)
        kx = key.new_empty((b, h, key.shape[-2], key.shape[-1])) if hk != h else key
        vx = value.new_empty((b, h, value.shape[-2], value.shape[-1])) if hk != h else value
        kt = kx.new_empty(kx.shape)
        scores = q.new_empty((b, h, length, key.shape[-2]))
        del kt
        probs = torch.empty_like(scores)
        mask = torch.empty(scores.shape, dtype=torch.bool)
        del mask, scores
        out = q.new_empty((b, h, length, value.shape[-1]))
        del probs, q, kx, vx
        return out

    def sdpa(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Any = None,
        enable_gqa: bool = False,
    ) -> Any:
        if torch.is_autocast_enabled("cpu"):
            # CUDA autocast runs SDPA in the lower precision (autocast_mode.cpp lower_precision_fp list):
            # its inputs are cast there, e.g. llama's q and k, which RoPE turns fp32 under mixed precision
            low = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(low)
        half = query.dtype in (torch.float16, torch.bfloat16)
        gqa = enable_gqa and key.shape[-3] != query.shape[-3]
        kernel = cuda_sdpa_kernel(half, query.shape[-1], attn_mask is not None, gqa, fp32=query.dtype == torch.float32)
        if kernel == "math" and query.dim() == 4 and not torch.is_grad_enabled():
            return _math_nograd(query, key, value)
        if kernel == "math" or query.dim() != 4:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.MATH]):
                return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        length = query.shape[-2]
        lse_len = length if kernel == "flash" else math.ceil(length / 32) * 32
        return FusedAttention.apply(query, key, value, lse_len)

    return sdpa


@contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _no_padding(
    padding_mask: Any,
    q_length: int,
    kv_length: int,
    q_offset: Any,
    kv_offset: int,
    local_attention_size: int | None = None,
) -> bool:
    """transformers' `_ignore_causal_mask_sdpa` answered from the job's definition (no padding), as it
    answers on the GPU: it reads the mask's values there, and refuses to on fake tensors."""
    if local_attention_size is not None and kv_length >= local_attention_size:
        return False
    return q_length == 1 or kv_length == q_length


def _no_packing(position_ids: Any) -> None:
    """transformers' `find_packed_sequence_indices` answered from the job's definition: nothing is packed."""
    return None


@contextmanager
def _as_on_cuda(torch: Any, transformers: Any) -> Iterator[None]:
    """Swap in CUDA's attention kernels and mask decisions for the duration of the trace. A patch of the
    functions (not a TorchFunctionMode) so that it also holds in autograd's recomputation of checkpoints."""
    import transformers.masking_utils as masking

    with (
        _patched(torch.nn.functional, "scaled_dot_product_attention", _cuda_sdpa(torch)),
        _patched(masking, "_ignore_causal_mask_sdpa", _no_padding),
        # training passes position_ids without a mask: transformers looks for packed sequences by reading their
        # values, which fake tensors cannot give, and would build an explicit mask (then SDPA repeats K/V and
        # leaves flash). The job has one sequence per row, as on the GPU: no packing.
        _patched(masking, "find_packed_sequence_indices", _no_packing),
    ):
        yield


# -- building the model ------------------------------------------------------------------------------------
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "mixed": "float32"}


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
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if w.method == "lora":
            from peft import LoraConfig, get_peft_model

            from gpuready.models.lora import default_lora_targets

            targets = list(w.lora_targets or default_lora_targets(resolve_model(w.model)))
            lora = LoraConfig(r=w.lora_r, lora_alpha=32, lora_dropout=0.0, target_modules=targets)
            with torch.device("meta"):
                model = get_peft_model(model, lora)
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
    torch, transformers = _import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = _config_dict(w.model)
    vision = cfg.get("model_type") in ("resnet", "vit")
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
    recorder = _recorder(torch, trace)
    try:
        with fake, recorder, _as_on_cuda(torch, transformers):
            trace.mark("load", "weights")
            _materialize(torch, model, recorder)
            if w.training:
                _train(torch, model, w, trace, recorder, vision, cfg)
            elif vision:
                model = _infer_vision(torch, model, w, trace)
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
        opt = torch.optim.Adafactor(trainable, lr=1e-2, foreach=True)
    else:
        raise InputError("--optim", f"{w.optim} is not traced; allowed with --trace: adamw, sgd, adafactor")
    if vision:
        x = torch.empty((w.batch, 3, w.image_size, w.image_size))
        y = torch.empty((w.batch,), dtype=torch.long)
    else:
        ids = torch.empty((w.batch, w.seq), dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if w.precision == "mixed" else nullcontext()
    for step in range(TRAIN_STEPS):
        # gradient accumulation: from the second micro-batch on, the first one's gradients are alive; two
        # micro-batches show every state the later ones repeat
        for _micro in range(min(w.grad_accum, 2)):
            trace.mark("forward", "activations")
            with autocast:
                if vision:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
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


def _infer_vision(torch: Any, model: Any, w: Workload, trace: Trace) -> Any:
    """A torchvision classifier as the trial's probe runs it: built in fp32 (left in train mode), converted with
    `model.to(dtype)` for bf16/fp16, then two forward passes under torch.no_grad()."""
    if w.precision in ("bf16", "fp16"):
        _convert(model, getattr(torch, _DTYPES[w.precision]))
    trace.mark("load", "other")
    dtype = getattr(torch, _DTYPES[w.precision]) if w.precision in ("bf16", "fp16") else torch.float32
    x = torch.empty((w.batch, 3, w.image_size, w.image_size), dtype=dtype)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if w.precision == "mixed" else nullcontext()
    with torch.no_grad():
        for _ in range(2):
            trace.mark("forward", "activations")
            with autocast:
                out = model(x)
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
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
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


def _extrapolate_decode(trace: Trace, total_steps: int) -> bool:
    """Extend a trace of prefill + k decode steps to `total_steps` decode steps, if the last two traced
    steps repeat the same allocations (sizes growing linearly with the cache). Returns False otherwise."""
    starts = {name: i for i, name in trace.marks}
    names = [name for _, name in trace.marks if name.startswith("decode")]
    if len(names) < 2 or total_steps <= len(names):
        return len(names) >= total_steps
    a0, a1 = starts[names[-2]], starts[names[-1]]
    end = starts.get("end", len(trace.events))
    prev, last = trace.events[a0:a1], trace.events[a1:end]
    if len(prev) != len(last):
        return False
    first_id_last = 1 + sum(1 for e in trace.events[:a1] if e > 0)
    first_id_prev = 1 + sum(1 for e in trace.events[:a0] if e > 0)
    n_alloc = sum(1 for e in last if e > 0)
    if n_alloc != sum(1 for e in prev if e > 0):
        return False
    # describe the last step relative to itself and the step before; check the step before matches
    template: list[tuple[str, int, int]] = []  # (kind, a, b)
    alloc_index = 0
    last_ids: list[int] = []
    for e_prev, e_last in zip(prev, last, strict=True):
        if (e_prev > 0) != (e_last > 0):
            return False
        if e_last > 0:
            template.append(("alloc", e_last, e_last - e_prev))
            last_ids.append(first_id_last + alloc_index)
            alloc_index += 1
        else:
            fid, pid = -e_last, -e_prev
            if fid >= first_id_last and pid >= first_id_prev and fid - first_id_last == pid - first_id_prev:
                template.append(("free_this", fid - first_id_last, 0))
            elif first_id_prev <= fid < first_id_last and pid < first_id_prev:
                template.append(("free_prev", fid - first_id_prev, 0))
            else:
                return False
    tail = trace.events[end:]
    del trace.events[end:]
    labels_last = [trace.labels[i] for i in last_ids]
    prev_ids = last_ids
    next_id = len(trace.labels)
    for step in range(len(names), total_steps):
        grow = step - len(names) + 1
        trace.marks.append((len(trace.events), f"decode{step}"))
        ids: list[int] = []
        for kind, a, b in template:
            if kind == "alloc":
                trace.events.append(a + grow * b)
                trace.labels.append(labels_last[len(ids)])
                trace.sizes.append(a + grow * b)
                ids.append(next_id)
                next_id += 1
            elif kind == "free_this":
                trace.events.append(-ids[a])
            else:
                trace.events.append(-prev_ids[a])
        prev_ids = ids
    # the frees at the end of the trace (after the loop) refer to the last traced step: point them at the last
    remap = dict(zip(last_ids, prev_ids, strict=True))
    trace.marks = [(i, n) for i, n in trace.marks if n != "end"] + [(len(trace.events), "end")]
    trace.events.extend(-remap.get(-e, -e) if e < 0 else e for e in tail)
    return True


# -- replay and result ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Replay:
    peak_allocated: int
    peak_reserved: int
    peak_event: int
    phases: dict[str, int]


def _replay(trace: Trace) -> _Replay:
    alloc = CachingAllocator()
    handles: list[Any] = [None]
    marks = sorted(trace.marks)
    mark_i = 0
    phase = "load"
    phases: dict[str, int] = {}
    peak_a, peak_event = 0, -1
    for i, ev in enumerate(trace.events):
        while mark_i < len(marks) and marks[mark_i][0] <= i:
            phase = _phase_name(marks[mark_i][1])
            mark_i += 1
        if ev > 0:
            handles.append(alloc.malloc(ev))
            if alloc.allocated > peak_a:
                peak_a, peak_event = alloc.allocated, i
            if alloc.allocated > phases.get(phase, 0):
                phases[phase] = alloc.allocated
        elif ev < 0:
            alloc.free(handles[-ev])
            handles[-ev] = None
    return _Replay(alloc.peak_allocated, alloc.peak_reserved, peak_event, phases)


def _phase_name(mark: str) -> str:
    return "decode" if mark.startswith("decode") or mark == "end" else mark


def _breakdown(trace: Trace, peak_event: int, peak_allocated: int) -> dict[str, int]:
    live: dict[int, int] = {}
    next_id = 1
    for ev in trace.events[: peak_event + 1]:
        if ev > 0:
            live[next_id] = ev
            next_id += 1
        elif ev < 0:
            live.pop(-ev, None)
    out = dict.fromkeys(COMPONENTS, 0)
    for aid, nbytes in live.items():
        out[trace.labels[aid] or "other"] += round_size(nbytes)
    out["other"] += peak_allocated - sum(out.values())  # whole blocks handed out unsplit
    return {k: v for k, v in out.items() if v}


def _phase_at(trace: Trace, index: int) -> str:
    phase = "load"
    for start, name in sorted(trace.marks):
        if start > index:
            break
        phase = _phase_name(name)
    return phase


@dataclass
class _Traced:
    job: Any
    rep: _Replay
    reserved: int
    notes: list[str]
    seconds: float
    largest_request: int  # the largest single allocation after loading


def _largest_request(trace: Trace) -> int:
    start = min((i for i, name in trace.marks if _phase_name(name) != "load"), default=0)
    return max((ev for ev in trace.events[start:] if ev > 0), default=0)


def _traced(workload: Workload) -> _Traced:
    start = time.perf_counter()
    job = run_trace(workload)
    trace = job.trace
    notes = list(job.notes)
    if not workload.training and workload.new_tokens > 1:
        if _extrapolate_decode(trace, workload.new_tokens - 1):
            notes.append(
                f"decode: {DECODE_STEPS_TRACED} steps traced, the other "
                f"{workload.new_tokens - 1 - DECODE_STEPS_TRACED}"
                " extrapolated (each step repeats its allocations, the cache one token longer)"
            )
        else:
            notes.append(f"decode: only {DECODE_STEPS_TRACED} steps traced; later steps not modelled")
    rep = _replay(trace)
    reserved = rep.peak_reserved
    spec = resolve_model(workload.model)
    if spec.model_type == "resnet":
        # cuDNN's workspaces come from the caching allocator on the GPU, not on CPU: the same cached-workspace
        # term as the arithmetic mode (memory/vision.py)
        from gpuready.memory.vision import cudnn_workspace_bytes

        reserved = max(reserved, rep.peak_allocated + cudnn_workspace_bytes(spec, workload))
        notes.append("cuDNN convolution workspace: one cached segment of a few feature maps (measured)")
    return _Traced(job, rep, reserved, notes, time.perf_counter() - start, _largest_request(trace))


def _traced_fit(workload: Workload, traced: _Traced, gpu_memory_bytes: int) -> Fit:
    """The traced job on a card, by the fit rule of both modes (memory/fit.py)."""
    from gpuready.memory.estimate import device_overhead_bytes, margin_kind

    events = traced.job.trace.events
    return judge(
        gpu_memory_bytes,
        device_overhead_bytes(workload),
        margin_kind(resolve_model(workload.model), workload),
        largest_request=traced.largest_request,
        unlimited_reserved=traced.rep.peak_reserved,
        peak_allocated=traced.rep.peak_allocated,
        extra_reserved=traced.reserved - traced.rep.peak_reserved,
        events=lambda: (events, None),
    )


def traced_largest_batch(
    workload: Workload, gpu_memory_bytes: int, guess: int, known: dict[int, Fit] | None = None
) -> tuple[int, int]:
    """Largest batch whose trace fits the card by the fit rule of both modes, searched from the arithmetic mode's
    answer `guess` (gpuready/search.py): usually two traces (the guess and the batch above it). Returns (batch,
    how many batch sizes were traced)."""
    from gpuready.memory.estimate import MAX_BATCH, MAX_BATCH_CHECKED

    fits = dict(known or {})

    def test(batch: int) -> bool:
        if batch not in fits:
            w = workload.model_copy(update={"batch": batch})
            fits[batch] = _traced_fit(w, _traced(w), gpu_memory_bytes)
        return fits[batch].fits

    found = largest_passing(test, 1, MAX_BATCH, start=max(guess, 1), check_below=MAX_BATCH_CHECKED)
    return max(found.value, 0), len(fits)


def trace_estimate(
    workload: Workload, gpu_memory_bytes: int | None = None, *, find_max_batch: bool = True
) -> MemoryEstimate:
    """Peak GPU memory of one job on one GPU: its traced allocations replayed through the allocator model.
    With `gpu_memory_bytes`: `fits` and headroom by the fit rule of both modes (memory/fit.py: the traced events
    replayed under the card's limit) and `max_batch` found by tracing around the arithmetic mode's answer."""
    if workload.gpus > 1 or workload.shard != "none":
        raise InputError("--gpus", "the traced mode covers one GPU; use --gpus 1 --shard none")
    if workload.method == "qlora":
        raise InputError("--method", "qlora is not traced (bitsandbytes needs CUDA); allowed: full, lora")
    if workload.training and workload.precision in ("bf16", "fp16") and workload.model.startswith("resnet"):
        # CPU convolution kernels keep fp32 copies of 16-bit activations that cuDNN does not: resnet50 bf16 batch
        # 128 traced at 12.65 GiB against 6.83 measured (docs/accuracy_trace.md)
        raise InputError(
            "--precision",
            f"{workload.precision} convolution training is not traced (CPU kernels keep fp32 copies cuDNN does not); "
            "allowed here: fp32, mixed, or drop --trace",
        )
    from gpuready.memory.estimate import device_overhead_bytes, largest_batch, margin_kind, with_fit

    traced = _traced(workload)
    job, rep, reserved, notes = traced.job, traced.rep, traced.reserved, traced.notes
    trace = job.trace
    overhead = device_overhead_bytes(workload)
    peak_device = reserved + overhead
    fit = max_batch = None
    if gpu_memory_bytes is not None:
        fit = _traced_fit(workload, traced, gpu_memory_bytes)
        if find_max_batch:
            spec = resolve_model(workload.model)
            guess = largest_batch(spec, workload, gpu_memory_bytes)
            max_batch, traced_sizes = traced_largest_batch(workload, gpu_memory_bytes, guess, {workload.batch: fit})
            notes.append(f"max batch: {traced_sizes} batch sizes traced, starting from the arithmetic answer {guess}")
    assumptions = [
        "traced: the job's real code run on fake tensors (torch FakeTensorMode), allocations replayed "
        "through a model of PyTorch's CUDA caching allocator (default settings)",
        f"attention: CUDA's flash/memory-efficient SDPA kernels modelled (output + log-sum-exp kept); "
        f"cuBLAS workspace {CUBLAS_WORKSPACE_BYTES // MIB} MiB per handle (sm90 default)",
        f"device overhead (CUDA context, libraries) {overhead} B, measured on an H200 with torch 2.11",
        f"traced in {traced.seconds:.1f} s, {len(trace.events)} allocation events",
        *notes,
    ]
    if workload.training:
        assumptions.insert(1, f"{TRAIN_STEPS} optimizer steps, {workload.optim} foreach, zero_grad(set_to_none)")
    result = MemoryEstimate(
        model=workload.model,
        params=job.params,
        trainable_params=job.trainable,
        peak_allocated_bytes=rep.peak_allocated,
        peak_reserved_bytes=reserved,
        peak_device_bytes=peak_device,
        phase=_phase_at(trace, rep.peak_event),
        breakdown=_breakdown(trace, rep.peak_event, rep.peak_allocated),
        assumptions=assumptions,
        mode="trace",
        phases=rep.phases,
        largest_request_bytes=traced.largest_request,
    )
    if fit is None:
        return result
    return with_fit(result, fit, max_batch, margin_kind(resolve_model(workload.model), workload))
