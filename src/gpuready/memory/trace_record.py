"""Recording a job's allocations: the event list (Trace), the TorchDispatchMode that fills it on fake tensors,
and what CUDA does that the CPU does not (its attention kernels, transformers' mask decisions).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuready.errors import GpureadyError
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES, reduce_buffer_bytes


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
def import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TraceUnavailable(
            f"the traced mode needs torch and transformers ({exc.name} missing): pip install gpuready[trace]"
        ) from None
    return torch, transformers


# -- the recorder ------------------------------------------------------------------------------------
def make_recorder(torch: Any, trace: Trace) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    sum_dims = torch.ops.aten.sum.dim_IntList
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
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
            if func in matmuls:
                # one cuBLAS handle (and workspace) per thread: forward/optimizer and autograd's device thread; the
                # workspace is asked for inside the first cuBLAS call, after the op has made its output (history
                # ac_gpt2_full_b8: Conv1D's output, then the 32 MiB workspace; the lm_head's weight gradient, then it)
                thread = "backward" if trace.phase == "backward" else "main"
                if thread not in self.workspaces:
                    self.workspaces.add(thread)
                    saved = trace.component
                    trace.component = "other"
                    trace.alloc(CUBLAS_WORKSPACE_BYTES)  # never freed
                    trace.component = saved
            if func is sum_dims:  # CUDA's reduction kernel stages a global buffer for sums over many rows
                self.reduction_buffer(args[0], args[1], out)
            return out

        def reduction_buffer(self, x: Any, dims: Any, out: Any) -> None:
            """CUDA's sum over the leading dimensions into contiguous outputs (a bias's or a norm weight's gradient)
            stages fp32 partials in a global buffer from the caching allocator, made after the output and freed when
            the kernel returns (memory/lm/ops.py reduce_buffer_bytes, from the recorded histories); the CPU kernel
            has none."""
            if not dims or out.numel() == 0:
                return
            reduced = sorted(d % x.dim() for d in dims)
            if reduced != list(range(len(reduced))):
                return
            nbytes = reduce_buffer_bytes(out.numel(), x.numel() // out.numel())
            if nbytes:
                trace.free(trace.alloc(nbytes))

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
        """Allocates what the fused CUDA kernels allocate: forward output + fp32 log-sum-exp (saved); backward dq, dk,
        dv and the kernel's scratch. Flash's backward takes its scratch as one block after dq/dk/dv and frees it on
        return: the fp32 dq accumulator and softmax row sums (sequence rounded up to 128), and under GQA dk and dv at
        the query's head count before they are summed back (history ft_llama1b_mixed_ckpt_b8: 516 MiB, one
        allocation, at 8 x 4096 with 32 query / 8 K/V heads of 64). The memory-efficient kernel: dk, dv at the
        query's head count under GQA, then summed, and the fp32 dq accumulator."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, lse_len: int, flash: bool) -> Any:
            b, h, length, _ = q.shape
            # the kernels write (batch, seq, heads, dim) and return it transposed: the caller's
            # transpose(1, 2).contiguous() is then free, and o_proj saves this very storage
            out = q.new_empty((b, length, h, v.shape[-1])).transpose(1, 2)
            lse = q.new_empty((b, h, lse_len), dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.flash = flash
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v = ctx.saved_tensors[:3]
            b, h, length, d = q.shape
            rounded = math.ceil(length / 128) * 128
            hk = k.shape[1]
            if ctx.flash:
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                scratch = b * h * rounded * (d + 1) * 4
                if hk != h:
                    scratch += b * h * (k.shape[2] * k.shape[3] + v.shape[2] * v.shape[3]) * k.element_size()
                workspace = q.new_empty((scratch,), dtype=torch.uint8)
                del workspace
                return dq, dk, dv, None, None
            accum = q.new_empty((b, h, rounded, d), dtype=torch.float32)
            softmax_d = q.new_empty((b, h, rounded), dtype=torch.float32)
            dq = torch.empty_like(q)
            if hk != h:
                dk_full = k.new_empty((b, h, k.shape[2], k.shape[3]))
                dv_full = v.new_empty((b, h, v.shape[2], v.shape[3]))
                dk = dk_full.view(b, hk, h // hk, k.shape[2], k.shape[3]).sum(2)
                dv = dv_full.view(b, hk, h // hk, v.shape[2], v.shape[3]).sum(2)
                del dk_full, dv_full
            else:
                dk, dv = torch.empty_like(k), torch.empty_like(v)
            del accum, softmax_d
            return dq, dk, dv, None, None

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

    def _math_autograd(
        query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool, scale: Any, gqa: bool
    ) -> Any:
        """CUDA's `_scaled_dot_product_attention_math` with autograd, op for op as aten composes it (attention.cpp):
        q scaled by sqrt(scale), the causal mask made as a float (L, S) tensor, K and V repeated to every head under
        GQA, kᵀ scaled, the scores with the mask added in place, `_safe_softmax`, then probabilities @ v; the
        locals (scaled q, repeated K, the mask) live until it returns. Fake tensors take the composite's
        out-of-place add and a `_safe_softmax` without its temporaries, which the GPU does not (history
        `ft_qwen05_fp32`)."""
        length, kv_length, head_dim = query.shape[-2], key.shape[-2], query.shape[-1]
        factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(head_dim))
        q = query * factor
        mask = attn_mask
        if is_causal:
            allowed = torch.ones((length, kv_length), dtype=torch.bool).tril()
            mask = _bool_mask_to_float(allowed, q.dtype)
            del allowed
        elif mask is not None and mask.dtype == torch.bool:
            mask = _bool_mask_to_float(mask, q.dtype)
        k, v = key, value
        if gqa:
            repeats = query.shape[-3] // key.shape[-3]
            k = key.repeat_interleave(repeats, dim=-3)
            v = value.repeat_interleave(repeats, dim=-3)
        scores = torch.matmul(q, k.transpose(-2, -1) * factor)
        if mask is not None:
            scores.add_(mask)
        probs = torch._safe_softmax(scores, -1)
        # _safe_softmax's temporaries on CUDA: the -inf comparison (one byte per score), its all-masked rows, a
        # scalar zero (aten/src/ATen/native/SoftMax.cpp)
        masked = torch.empty(scores.shape, dtype=torch.bool)
        rows = torch.empty((*scores.shape[:-1], 1), dtype=torch.bool)
        zero = torch.empty((), dtype=scores.dtype)
        del zero, rows, masked, scores
        if dropout_p > 0:
            probs = torch.native_dropout(probs, dropout_p, True)[0]
        return torch.matmul(probs, v)

    def _bool_mask_to_float(allowed: Any, dtype: Any) -> Any:
        """attention.cpp's convert_boolean_attn_mask: 0 where allowed, -inf elsewhere, from two scalar tensors."""
        zero = torch.scalar_tensor(0.0, dtype=dtype)
        neg = torch.scalar_tensor(-math.inf, dtype=dtype)
        return torch.where(allowed, zero, neg)

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
        if kernel == "math" and query.dim() == 4:
            return _math_autograd(query, key, value, attn_mask, dropout_p, is_causal, scale, gqa)
        if query.dim() != 4:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.MATH]):
                return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        length = query.shape[-2]
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))):
            # without autograd the fused kernels make no log-sum-exp: the recorded no-grad histories (gen_qwen3_4b_b64,
            # gen_phi3_b16, gen_llama8b_b8, gen_qwen05_b64, gen_llama1b_fp16) show the output alone, beside two
            # 8-byte RNG words and a 256-byte block
            return query.new_empty((query.shape[0], length, query.shape[1], value.shape[-1])).transpose(1, 2)
        lse_len = length if kernel == "flash" else math.ceil(length / 32) * 32
        return FusedAttention.apply(query, key, value, lse_len, kernel == "flash")

    return sdpa


@contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _cuda_dropout(torch: Any) -> Callable[..., Any]:
    """`F.dropout` as it runs on CUDA: aten's `dropout` takes the fused `native_dropout` there (a one-byte mask, which
    backward keeps, and the output), where the CPU runs `_dropout_impl` (a noise tensor of the input's dtype, kept for
    backward, and the product). Rule from aten/src/ATen/native/Dropout.cpp (`is_fused_kernel_acceptable`: a CUDA
    input, 0 < p < 1, not empty); in-place dropout takes the unfused path on both. CUDA's kernel makes the mask
    before the output (history ac_gpt2_full_b8: 6 MiB, then 12 MiB, at every dropout), the CPU's the other way
    round, so the fused op is written out here in CUDA's order; its backward is aten's native_dropout_backward, one
    gradient-sized output, as on CUDA."""
    functional = torch.nn.functional
    original = functional.dropout

    class FusedDropout(torch.autograd.Function):  # type: ignore[misc]
        @staticmethod
        def forward(ctx: Any, input: Any, p: float) -> Any:
            mask = torch.empty_like(input, dtype=torch.bool)
            out = torch.empty_like(input)
            ctx.save_for_backward(mask)
            ctx.scale = 1.0 / (1.0 - p)
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (mask,) = ctx.saved_tensors
            return torch.ops.aten.native_dropout_backward(grad, mask, ctx.scale), None

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if inplace or not training or not 0 < p < 1 or input.numel() == 0:
            return original(input, p, training, inplace)
        return FusedDropout.apply(input, p)

    return dropout


def cuda_autocast_lists(torch: Any) -> Any:
    """A TorchFunctionMode that gives CPU autocast CUDA's op lists where they differ and the traced jobs meet them
    (aten/src/ATen/autocast_mode.cpp, the AutocastCUDA registrations): under CUDA autocast pow, exp, log, rsqrt,
    layer_norm, group_norm, softplus and friends run in fp32 (16-bit inputs cast to fp32 first); softmax,
    log_softmax, sum, cumsum and prod run with dtype=float32 (fp32_set_opt_dtype). CPU autocast leaves them in the
    16-bit dtype, e.g. GPT-2's gelu_new (history ft_gpt2l_mixed: the fp32 pow and what follows it). Acts only while
    CPU autocast is on, which the traced mode uses to stand for CUDA's."""
    from torch.overrides import TorchFunctionMode

    functional = torch.nn.functional
    fp32_names = (
        "pow",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "acos",
        "asin",
        "cosh",
        "sinh",
        "tan",
        "erfinv",
        "__pow__",
        "__rpow__",
    )
    fp32: set[Any] = set()
    for name in fp32_names:
        for owner in (torch, torch.Tensor):
            if hasattr(owner, name):
                fp32.add(getattr(owner, name))
    fp32 |= {functional.layer_norm, functional.group_norm, functional.softplus, torch.layer_norm, torch.group_norm}
    opt_dtype: set[Any] = set()
    for name in ("softmax", "log_softmax", "sum", "cumsum", "prod"):
        for owner in (torch, torch.Tensor, functional):
            if hasattr(owner, name):
                opt_dtype.add(getattr(owner, name))
    low = (torch.float16, torch.bfloat16)

    def to_fp32(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.dtype in low:
            return a.to(torch.float32)
        return a

    class CudaAutocastLists(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if (func in fp32 or func in opt_dtype) and torch.is_autocast_enabled("cpu"):
                if func in fp32:
                    # cast right to left, as CUDA's autocast wrapper does (its casts are the arguments of one C++ call,
                    # which GCC evaluates last to first: history ac_gpt2_full_b8, LayerNorm's weight and bias cast
                    # before its input)
                    kwargs = {k: to_fp32(v) for k, v in reversed(kwargs.items())}
                    kwargs = dict(reversed(kwargs.items()))
                    args = tuple(reversed([to_fp32(a) for a in reversed(args)]))
                elif (
                    args and isinstance(args[0], torch.Tensor) and args[0].dtype in low and kwargs.get("dtype") is None
                ):
                    kwargs = {**kwargs, "dtype": torch.float32}
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return CudaAutocastLists()


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
def as_on_cuda(torch: Any, transformers: Any) -> Iterator[None]:
    """Swap in CUDA's attention kernels and mask decisions for the duration of the trace. A patch of the
    functions (not a TorchFunctionMode) so that it also holds in autograd's recomputation of checkpoints."""
    import transformers.masking_utils as masking

    with (
        _patched(torch.nn.functional, "scaled_dot_product_attention", _cuda_sdpa(torch)),
        _patched(torch.nn.functional, "dropout", _cuda_dropout(torch)),
        _patched(masking, "_ignore_causal_mask_sdpa", _no_padding),
        # training passes position_ids without a mask: transformers looks for packed sequences by reading their
        # values, which fake tensors cannot give, and would build an explicit mask (then SDPA repeats K/V and
        # leaves flash). The job has one sequence per row, as on the GPU: no packing.
        _patched(masking, "find_packed_sequence_indices", _no_packing),
        cuda_autocast_lists(torch),
    ):
        yield
