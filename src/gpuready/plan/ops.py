"""The GPU operations of one optimizer step (training) or one request (inference), enumerated from the model's
shapes and the workload, for the step-time model (plan/steptime.py).

Each `Op` is one class of kernel with its FLOPs, the bytes it moves through HBM and the number of kernel launches,
per GPU. Matmuls keep their GEMM shape (M, N, K) because small and skinny GEMMs run far below peak. What runs
follows the code that the calibration probe runs (trial/probe.py): Hugging Face transformers' eager modules
under PyTorch autograd, torchvision's ResNet/ViT, torch.optim's foreach AdamW/SGD.

- Linear layers: forward (M=tokens, N=out, K=in), the input gradient (M=tokens, N=in, K=out) and, where the
  weight trains, the weight gradient (M=out, N=in, K=tokens). LoRA keeps the frozen base's forward and input
  gradient but no weight gradient, and adds the adapter's two skinny GEMMs (rank r) each way.
- Activation checkpointing (HF gradient_checkpointing: each decoder layer re-runs its forward in backward).
- Mixture-of-experts layers as transformers 5 runs them by default (`experts_implementation="grouped_mm"`,
  integrations/moe.py `grouped_mm_experts_forward`): the router's linear and top-k, the tokens sorted by
  expert and gathered, one grouped GEMM per expert projection over the experts that received tokens, the
  routing weights, the rows put back in order and summed per token. The FLOPs follow the active parameters
  (each token through experts_per_token experts); the weights read are those of the experts hit
  (`expert_spread`: all of them at training sizes, experts_per_token of them in a batch-1 decode step).
- Attention by the kernel SDPA picks (memory/lm/context.py's `attention_backend`, read-only): flash and memory-efficient
  kernels are fused (causal: half the S² FLOPs; backward 2.5x the forward, FlashAttention-2 paper §3.1:
  five GEMMs against two); the math path and eager attention are batched GEMMs over the full S² plus
  element-wise passes over the B·heads·S² scores (scale, mask, fp32 softmax, cast back).
- Element-wise ops (norms, activations, RoPE, residual adds, dropout, the fp32 upcast of the logits and the
  cross-entropy) as bytes read + written; their backward as about twice those bytes.
- The optimizer step as the bytes its foreach kernels read and write (torch/optim/adamw.py `_multi_tensor_adamw`:
  lerp, mul, addcmul, sqrt, div, add, addcdiv over params/grads/states: 20 tensor passes; SGD with momentum 8).
- Vision: ResNet convolutions as implicit GEMMs (M = batch·H·W, N = C_out, K = C_in·k²), batch norm and ReLU
  as element-wise passes; ViT as a transformer encoder (nn.MultiheadAttention through SDPA).
- Several GPUs: DDP's gradient all-reduce, FSDP2's parameter all-gathers (forward and backward) and gradient
  reduce-scatter, as bytes on the link (`comm` ops; plan/steptime.py overlaps them with compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.lm import nf4
from gpuready.memory.lm.context import attention_backend, lora_targets
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import resnet_convs
from gpuready.units import MIB
from gpuready.workload import Workload

Kind = Literal["matmul", "attention", "memory", "comm"]
# matmul/attention arithmetic: "half" = bf16/fp16 tensor cores, "tf32" = fp32 convolutions (cuDNN allows TF32 by
# default, torch.backends.cudnn.allow_tf32 = True), "fp32" = fp32 matmuls (torch.backends.cuda.matmul.allow_tf32
# is False by default, so cuBLAS runs them on the fp32 pipes)
Math = Literal["half", "tf32", "fp32"]

# foreach optimizer passes over each trainable element (see module docstring)
OPTIMIZER_PASSES = {"adamw": 20, "sgd": 8, "adamw8bit": 6}
OPTIMIZER_KERNELS = {"adamw": 10, "sgd": 4}
# bitsandbytes' 8-bit optimizers update one parameter tensor per launch (optimizer_update_8bit_blockwise, or the
# 32-bit update for tensors under 4,096 elements): reads the parameter, gradient and both 8-bit states, writes them
PER_TENSOR_KERNELS = {"adamw8bit": 1}
# transformers' Adafactor.step (transformers/optimization.py), parameter by parameter, counted for a matrix from its
# code: grad.float(), p.float(), the RMS (norm, divide), grad ** 2, + eps, the two means and the row and column
# statistics' mul_/add_, _approx_sq_grad (mean, divide, rsqrt_, rsqrt, the outer product), update * grad, the
# update's RMS, clip and clamp, div_, * lr, -update, add_ into the fp32 parameter, copy_ back: 28 kernels, and
# bytes per element: 102 for a 16-bit parameter (its fp32 copies made and written back), 84 for an fp32 one
ADAFACTOR_KERNELS = 28
ADAFACTOR_BYTES = {2: 102, 4: 84}
# multi_tensor_apply launches one kernel per this many tensors (ATen/native/cuda/MultiTensorApply.cuh depth
# 4 lists: 36 tensors per launch)
FOREACH_TENSORS_PER_LAUNCH = 36


@dataclass(frozen=True)
class Op:
    """One kind of kernel in the step. flops and bytes are totals over `kernels` launches."""

    name: str  # op class for the breakdown: projections, lora, attention, elementwise, logits_loss, optimizer, ...
    kind: Kind
    flops: float = 0.0
    bytes: float = 0.0
    kernels: float = 1.0
    m: int = 0  # GEMM shape (matmul ops; per launch)
    n: int = 0
    k: int = 0
    math: Math = "half"
    collective: str = ""  # comm ops: all_reduce, all_gather or reduce_scatter
    # issued by the model's forward and backward, at eager PyTorch's host cost per op (steptime.py `host_s`); a
    # loop of bare tensor ops outside any module (an optimizer's per-parameter step) costs its launches only
    module_ops: bool = True


def _gemm(
    name: str, m: int, n: int, k: int, e: int, math: Math, count: float = 1.0, kernels: float | None = None
) -> Op:
    """`count` GEMMs of [m, k] x [k, n] in elements of e bytes, in `kernels` launches (default: one each;
    a batched GEMM runs many in one)."""
    m, n, k = max(m, 1), max(n, 1), max(k, 1)
    launches = count if kernels is None else kernels
    return Op(
        name, "matmul", 2.0 * m * n * k * count, float(m * k + k * n + m * n) * e * count, launches, m, n, k, math
    )


def expert_spread(spec: ModelSpec, tokens: int) -> tuple[float, float]:
    """How `tokens` tokens spread over one MoE layer's experts: (experts that receive any, rows each of those
    gets). Each token is routed to experts_per_token = k distinct experts of E; taking the router's choices as
    uniform and independent across tokens, one token misses an expert with probability 1 - k/E, so
    E·(1 - (1 - k/E)^tokens) experts are hit (k for a single token, all E for a training batch), and they share
    tokens·k rows."""
    experts = spec.experts
    k = min(spec.experts_per_token, experts)
    hit = experts * (1.0 - (1.0 - k / experts) ** tokens)
    return hit, tokens * k / hit


def _experts(
    s: _Steps,
    spec: ModelSpec,
    t: int,
    k_in: int,
    n_out: int,
    e: int,
    math: Math,
    *,
    layers: int,
    fwd: float,
    dgrad: bool,
    wgrad: bool,
    bias: bool = False,
) -> None:
    """One expert projection over `layers` MoE layers: a grouped GEMM per layer (one launch) over the experts hit,
    each with its share of the t·k routed rows. Forward, input gradient and weight gradient move the same bytes
    (the routed rows in and out, the hit experts' weights) and do the same FLOPs: 2·t·k·in·out per layer."""
    hit, rows = expert_spread(spec, t)
    routed = t * min(spec.experts_per_token, spec.experts)
    flops = 2.0 * routed * k_in * n_out * layers
    nbytes = float(routed * (k_in + n_out) + hit * k_in * n_out) * e * layers
    m = max(1, round(rows))
    s.add(Op("projections", "matmul", flops, nbytes, layers, m, n_out, k_in, math), fwd)
    if dgrad:
        s.add(Op("projections", "matmul", flops, nbytes, layers, m, k_in, n_out, math))
    if wgrad:
        s.add(Op("projections", "matmul", flops, nbytes, layers, k_in, n_out, m, math))
    if bias:
        # the grouped GEMM takes no bias: each routed row's expert bias is gathered and added in place
        # (integrations/moe.py _grouped_linear `out.add_(bias)`); backward scatters the rows' gradients back
        rows_bytes = float(routed * n_out * e) * layers
        s.add(_mem("elementwise", 4 * rows_bytes, 2 * layers), fwd)
        if dgrad:
            s.add(_mem("elementwise", 3 * rows_bytes, 2 * layers))


# Kernels of one MoE layer's routing outside the GEMMs, counted in transformers' Qwen3MoeTopKRouter.forward (fp32
# softmax, top-k, renormalise, cast) and integrations/moe.py grouped_mm_experts_forward (sort, index, gather,
# histc, cumsum, routing-weight multiply, inverse permutation, gather back, sum over k, cast).
MOE_ROUTING_KERNELS = 18


def _moe_routing(
    s: _Steps, spec: ModelSpec, t: int, e: int, math: Math, *, fwd: float, training: bool, full: bool
) -> None:
    """The router's linear (hidden -> experts) and the element-wise traffic of dispatching t tokens to their
    k experts and combining them: the fp32 router softmax, gathering the t·k routed rows, weighting them,
    putting them back in order and summing the k rows of each token (backward: about twice)."""
    layers, h, experts = spec.layers, spec.hidden, spec.experts
    _linear(s, "moe routing", t, h, experts, e, math, fwd=fwd, dgrad=training, wgrad=full, count=float(layers))
    routed = t * min(spec.experts_per_token, experts)
    nbytes = float(t * experts * (e + 8) + 7 * routed * h * e + t * h * e) * layers
    s.add(_mem("moe routing", nbytes, MOE_ROUTING_KERNELS * layers), fwd)
    if training:
        s.add(_mem("moe routing", 2 * nbytes, 2 * MOE_ROUTING_KERNELS * layers))


def _mem(name: str, nbytes: float, kernels: float) -> Op:
    return Op(name, "memory", 0.0, float(nbytes), kernels)


@dataclass
class _Steps:
    """Builds the op list; `passes` repeats forward ops (checkpointing's recompute)."""

    ops: list[Op]

    def add(self, op: Op, times: float = 1.0) -> None:
        if times <= 0:
            return
        if times == 1.0:
            self.ops.append(op)
        else:
            self.ops.append(
                Op(op.name, op.kind, op.flops * times, op.bytes * times, op.kernels * times, op.m, op.n, op.k, op.math)
            )


def _matmul_math(w: Workload) -> Math:
    return "fp32" if w.precision == "fp32" else "half"


def _linear(
    s: _Steps,
    name: str,
    m: int,
    k: int,
    n: int,
    e: int,
    math: Math,
    *,
    fwd: float,
    dgrad: bool,
    wgrad: bool,
    count: float = 1.0,
) -> None:
    """A linear layer x[m,k] @ W[k,n]: `fwd` forward passes (2 with checkpointing), input and weight gradients."""
    s.add(_gemm(name, m, n, k, e, math, count), fwd)
    if dgrad:
        s.add(_gemm(name, m, k, n, e, math, count))
    if wgrad:
        s.add(_gemm(name, k, n, m, e, math, count))


def _attention(
    s: _Steps,
    backend: str,
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    e: int,
    math: Math,
    *,
    causal: bool,
    window: int | None,
    fwd: float,
    backward: bool,
    layers: int,
) -> None:
    """Scaled dot-product attention over `layers` layers."""
    span = kv_len if window is None else min(kv_len, window)
    bh = batch * heads * layers
    if backend in ("flash", "efficient"):
        # fused kernels skip the masked half of a causal S x S square
        pairs = q_len * span * (0.5 if causal and q_len == kv_len and window is None else 1.0)
        f = 4.0 * bh * pairs * head_dim
        io = 4.0 * bh * q_len * head_dim * e  # q, k, v in, out
        s.add(Op("attention", "attention", f, io, layers, q_len, span, head_dim, math=math), fwd)
        if backward:
            s.add(Op("attention", "attention", 2.5 * f, 2.5 * io, layers, q_len, span, head_dim, math=math))
        return
    # math / eager: two batched GEMMs over the whole square, then element-wise passes over the scores
    scores = float(bh) * q_len * kv_len
    sc = 4 if backend == "math" else e  # sdpa's math path runs in the query dtype; eager's softmax upcasts
    # scale (eager folds it into the first matmul), mask add (read scores + mask, write), softmax to fp32
    # (read, write 4 B), cast back (read 4, write e), PV reads the probabilities
    fwd_bytes = scores * (2 * sc + 2 * sc + (sc + 4) + (4 + e))
    s.add(_gemm("attention", q_len, kv_len, head_dim, e, math, bh, layers), fwd)
    s.add(_gemm("attention", q_len, head_dim, kv_len, e, math, bh, layers), fwd)
    s.add(_mem("attention", fwd_bytes, 4 * layers), fwd)
    if backward:
        s.add(_gemm("attention", q_len, kv_len, head_dim, e, math, 2 * bh, 2 * layers))  # dP and dV
        s.add(_gemm("attention", q_len, head_dim, kv_len, e, math, 2 * bh, 2 * layers))  # dQ and dK
        # softmax backward, the casts' and scale's backward: about 1.5x the forward passes
        s.add(_mem("attention", 1.5 * fwd_bytes, 6 * layers))


def _lm_layer_elementwise(spec: ModelSpec, w: Workload, tokens: int, r: int) -> tuple[float, float]:
    """Forward bytes and kernels of one decoder layer's element-wise ops (norms, activation, RoPE, residuals)."""
    h, t = spec.hidden, tokens
    e = dtypes_for(w).act
    if spec.norm == "rms":
        # HF RMSNorm in eager: to fp32, pow, mean, add+rsqrt, mul, cast back, mul by the weight (r = resid bytes)
        norm_b = t * h * ((r + 4) + 8 + 4 + 8 + (4 + r) + 2 * r)
        norm_k = 7
    else:
        norm_b = t * h * (2 * r)  # fused layer_norm kernel
        norm_k = 1
    inter = spec.intermediate
    if spec.experts:
        inter = spec.moe_intermediate * spec.experts_per_token + spec.shared_intermediate
    if spec.model_type == "gpt_oss":
        # transformers' GptOssExperts._apply_gate: clamp(gate), clamp(up), gate * alpha, sigmoid, gate * sig,
        # up + 1, product: 13 element passes in 7 kernels
        act_b = t * inter * 13 * e
        act_k = 7
    elif spec.gated_mlp:
        act_b = t * inter * (2 * e + 3 * e)  # act(gate), act * up
        act_k = 2
    else:
        # gpt2's gelu_new is written out in Python: pow, mul, add, mul, tanh, add, mul, mul (8 kernels)
        act_b = t * inter * 8 * 2 * e
        act_k = 8
    resid_b = 2 * t * h * 3 * r  # two residual adds: read two, write one
    rope_b = 0.0
    rope_k = 0
    if spec.model_type != "gpt2":
        qk = t * (spec.heads + spec.kv_heads) * spec.head_dim
        rope_b = qk * e * 10  # rotate_half (two slices, neg, cat) then q*cos + rot*sin
        rope_k = 12
    drop_b = 0.0
    drop_k = 0
    if spec.model_type == "gpt2" and w.training:
        drop_b = 2 * t * h * (2 * e + 1)  # two residual dropouts (p=0.1 in the config): read, write, mask
        drop_k = 2
    qk_norm_b = 0.0
    if spec.qk_norm:
        qk_norm_b = t * (spec.heads + spec.kv_heads) * spec.head_dim * 36
    n_norms = spec.norms_per_layer
    total = n_norms * norm_b + act_b + resid_b + rope_b + drop_b + qk_norm_b
    kernels = n_norms * norm_k + act_k + 2 + rope_k + drop_k + (2 * 7 if spec.qk_norm else 0)
    return float(total), float(kernels)


def _lora(s: _Steps, w: Workload, m: int, k_in: int, n_out: int, e: int, count: float, fwd: float) -> None:
    """One adapted linear's LoRA path, as peft 0.21 runs it (peft/tuners/lora/layer.py Linear.forward):
    get_peft_model(autocast_adapter_dtype=True) keeps A and B in fp32, so x is cast to fp32, both skinny GEMMs
    run in fp32 (on the fp32 pipes: TF32 is off for matmuls), the bf16 base output plus the fp32 update is
    promoted to fp32 and cast back (`result.to(torch_result_dtype)`). Under --precision mixed/fp32 the input
    is already fp32 (or autocast runs the GEMMs in bf16) and there are no casts."""
    rank = w.lora_r
    half_model = w.precision in ("bf16", "fp16")
    if half_model and (w.autocast or w.lora_dtype == "bf16"):
        # under autocast (or with 16-bit adapters) both GEMMs run in 16 bits and the update is added in 16 bits
        # (blocks_recorded.project_autocast / project_16); autocast adds x's cast to fp32 and back (peft's, then
        # its own) and the gradient's, 16-bit adapters none
        _linear(s, "lora", m, k_in, rank, e, "half", fwd=fwd, dgrad=True, wgrad=True, count=count)
        _linear(s, "lora", m, rank, n_out, e, "half", fwd=fwd, dgrad=True, wgrad=True, count=count)
        casts = m * k_in * (e + 4) * 2 if w.lora_dtype != "bf16" else 0
        s.add(_mem("lora", count * (casts + m * n_out * 3 * e * 2), count * (4 if casts else 2)), fwd)
        s.add(_mem("lora", count * (casts + m * n_out * 2 * e + m * k_in * 3 * e), count * (5 if casts else 3)))
        return
    math: Math = "fp32" if w.precision != "mixed" else "half"
    ge = 4 if w.precision != "mixed" else 2
    _linear(s, "lora", m, k_in, rank, ge, math, fwd=fwd, dgrad=True, wgrad=True, count=count)
    _linear(s, "lora", m, rank, n_out, ge, math, fwd=fwd, dgrad=True, wgrad=True, count=count)
    cast_in = m * k_in * (e + 4) if half_model else 0
    # forward: cast x, multiply by scaling, add to the base output (promoted to fp32), cast back
    out_f = m * n_out * (8 + (e + 4 + 4) + ((4 + e) if half_model else 0))
    s.add(_mem("lora", count * (cast_in + out_f), count * (4 if half_model else 2)), fwd)
    # backward: the cast and add pass the gradient to both branches, the scaling's backward, x's cast back and
    # the sum of the base's and the adapter's input gradients
    out_b = m * n_out * ((e + 4) + (4 + e) + 8) + m * k_in * (3 * e)
    s.add(_mem("lora", count * (out_b + cast_in), count * 5))


def lm_ops(spec: ModelSpec, w: Workload, *, tokens: int | None = None, training: bool | None = None) -> list[Op]:
    """Ops of one micro-batch forward (+ backward when training) of a decoder-only LM on one GPU."""
    training = w.training if training is None else training
    dt = dtypes_for(w)
    e, r = dt.act, dt.resid
    math = _matmul_math(w)
    t = tokens if tokens is not None else w.batch * w.seq
    s = _Steps([])
    full = w.method == "full" and training
    adapted = lora_targets(spec, w) if training else frozenset()
    fwd = 2.0 if (training and w.grad_ckpt) else 1.0
    layers = spec.layers
    if spec.experts:
        _moe_routing(s, spec, t, e, math, fwd=fwd, training=training, full=full)
    for lin in spec.block_linears:
        m = t
        count = float(layers)
        if lin.count > 1:  # MoE experts
            _experts(
                s,
                spec,
                t,
                lin.in_features,
                lin.out_features,
                e,
                math,
                layers=layers,
                fwd=fwd,
                dgrad=training,
                wgrad=full,
                bias=lin.bias,
            )
            if lin.name in adapted:
                hit, rows = expert_spread(spec, t)
                _lora(s, w, max(1, round(rows)), lin.in_features, lin.out_features, e, layers * hit, fwd)
            continue
        _linear(
            s,
            "projections",
            m,
            lin.in_features,
            lin.out_features,
            e,
            math,
            fwd=fwd,
            dgrad=training,
            wgrad=full,
            count=count,
        )
        if lin.name in adapted:
            _lora(s, w, m, lin.in_features, lin.out_features, e, count, fwd)
    if w.method == "qlora":
        _dequantize(s, spec, e, fwd, training)
    # autocast's per-forward cast of fp32 weights to bf16 (read 4, write 2 bytes per weight)
    if dt.autocast:  # (an expert no token reached is not multiplied, so not cast)
        hit = expert_spread(spec, t)[0] if spec.experts else 0.0
        block = sum(lin.in_features * lin.out_features * (hit if lin.count > 1 else 1) for lin in spec.block_linears)
        block *= layers
        head = spec.vocab * spec.hidden
        s.add(_mem("elementwise", (block + head) * 6.0, len(spec.block_linears) * layers + 1), fwd)
        if full:  # the bf16 weight gradients are cast to fp32 before accumulating into .grad
            s.add(_mem("elementwise", (block + head) * 6.0, len(spec.block_linears) * layers + 1))
    seq = t // max(1, w.batch) if tokens is None else w.seq
    batch = max(1, t // max(1, seq))
    backend, _mask = attention_backend(spec, w, dt, seq)
    head_dim = spec.head_dim if not spec.mla else spec.qk_nope_dim + spec.qk_rope_dim
    sliding = spec.sliding_layers
    dense_attn_layers = layers - sliding
    for n_layers, window in ((dense_attn_layers, None), (sliding, spec.sliding_window)):
        if n_layers:
            _attention(
                s,
                backend,
                batch,
                spec.heads,
                seq,
                seq,
                head_dim,
                e,
                math,
                causal=True,
                window=window,
                fwd=fwd,
                backward=training,
                layers=n_layers,
            )
    el_b, el_k = _lm_layer_elementwise(spec, w, t, r)
    s.add(_mem("elementwise", el_b * layers, el_k * layers), fwd)
    if training:
        s.add(_mem("elementwise", 2 * el_b * layers, 2 * el_k * layers))
    # logits: lm_head GEMM (trains when full, tied or not), HF's loss upcasts them to fp32 then cross-entropy
    v, h = spec.vocab, spec.hidden
    _linear(s, "logits_loss", t, h, v, e, math, fwd=1.0, dgrad=training, wgrad=full)
    if training:
        soft = 3 * t * v * 2 * e if spec.logit_softcap else 0.0
        loss_fwd = t * v * ((e + 4) + (4 + 4) + 4)  # .float(), log_softmax, nll reads
        loss_bwd = t * v * (4 + 12 + (4 + e))  # zero + scatter, log_softmax backward, cast back
        s.add(_mem("logits_loss", loss_fwd + loss_bwd + 2 * soft, 8))
        if full:  # embedding backward: zeroed fp32 table, then index_add of the token grads
            s.add(_mem("elementwise", v * h * (4 + dt.param) + t * h * 2 * e, 3))
    return s.ops


def _side(image: int, scale: int) -> int:
    side, f = image, 1
    while f < scale:
        side = (side + 1) // 2
        f *= 2
    return side


def vision_ops(spec: ModelSpec, w: Workload, *, training: bool | None = None) -> list[Op]:
    """Ops of one micro-batch forward (+ backward) of a torchvision ResNet or ViT on one GPU."""
    training = w.training if training is None else training
    dt = dtypes_for(w)
    e = dt.act
    B, img = w.batch, w.image_size
    s = _Steps([])
    cfg = spec.vision
    if spec.model_type == "resnet":
        conv_math: Math = "tf32" if w.precision == "fp32" else "half"
        first = True
        for conv, scale in resnet_convs(cfg["block"], list(cfg["layers"])):
            side = _side(img, scale)
            m, n, k = B * side * side, conv.cout, conv.cin * conv.kernel**2
            in_side = _side(img, scale // conv.stride) if scale > 2 else img
            op = Op(
                "conv",
                "matmul",
                2.0 * m * n * k,
                float(B * conv.cin * in_side**2 + conv.cout * k + m * n) * e,
                1,
                m,
                n,
                k,
                conv_math,
            )
            s.add(op)
            if training:
                if not first:
                    s.add(Op("conv", "matmul", op.flops, op.bytes, 1, m, k, n, conv_math))
                s.add(Op("conv", "matmul", op.flops, op.bytes, 1, n, k, m, conv_math))
            if conv_math == "half":
                # 16-bit cuDNN kernels run channels-last: PyTorch's default NCHW tensors are transposed in and
                # out of each convolution (read + write of its input and output; backward: the gradients too)
                io = float(B * conv.cin * in_side**2 + m * n) * 2 * e
                s.add(_mem("conv layout", io * (3 if training else 1), 2 * (3 if training else 1)))
            first = False
            out = float(m * n)
            # batch norm (statistics pass + normalise: read twice, write once), ReLU in place, residual add
            s.add(_mem("elementwise", out * e * (3 + (2 if conv.relu else 0)), 2 + (1 if conv.relu else 0)))
            if training:
                s.add(_mem("elementwise", out * e * (5 + (3 if conv.relu else 0)), 2 + (1 if conv.relu else 0)))
        features = 512 * (4 if cfg["block"] == "bottleneck" else 1)
        classes = int(cfg.get("num_classes", 1000))
        _linear(s, "head", B, features, classes, e, _matmul_math(w), fwd=1, dgrad=training, wgrad=training)
        if dt.autocast:  # fp32 weights cast to bf16 each forward
            s.add(_mem("elementwise", spec.params * 6.0, 60))
        return s.ops
    # ViT (torchvision vision_transformer.py): patch conv, then an encoder of pre-norm blocks
    h, mlp, p, L, heads = (int(cfg[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_layers", "num_heads"))
    math = _matmul_math(w)
    tokens_per_image = (img // p) ** 2 + 1
    t = B * tokens_per_image
    patch_math: Math = "tf32" if w.precision == "fp32" else "half"
    _linear(s, "conv", B * (img // p) ** 2, 3 * p * p, h, e, patch_math, fwd=1, dgrad=False, wgrad=training)
    for name, k_in, n_out in (("in_proj", h, 3 * h), ("out_proj", h, h), ("fc1", h, mlp), ("fc2", mlp, h)):
        _linear(s, "projections", t, k_in, n_out, e, math, fwd=1, dgrad=training, wgrad=training, count=float(L))
        del name
    # SDPA inside nn.MultiheadAttention: bf16 under autocast (flash), fp32 otherwise (memory-efficient)
    backend = "flash" if e == 2 else "efficient"
    _attention(
        s,
        backend,
        B,
        heads,
        tokens_per_image,
        tokens_per_image,
        h // heads,
        e,
        math,
        causal=False,
        window=None,
        fwd=1,
        backward=training,
        layers=L,
    )
    r = dt.resid
    # two LayerNorms, exact GELU, two residual adds, contiguous copies of q/k/v and of the attention output
    per_layer = t * (2 * h * 2 * r + mlp * 2 * e + 2 * h * 3 * r + 3 * h * 2 * e + h * 2 * e)
    s.add(_mem("elementwise", float(per_layer * L), 9 * L))
    if training:
        s.add(_mem("elementwise", float(2 * per_layer * L), 18 * L))
    classes = int(cfg.get("num_classes", 1000))
    _linear(s, "head", B, h, classes, e, math, fwd=1, dgrad=training, wgrad=training)
    if dt.autocast:
        s.add(_mem("elementwise", spec.params * 6.0, 4 * L + 4))
    return s.ops


def _dequantize(s: _Steps, spec: ModelSpec, e: int, fwd: float, backward: bool) -> None:
    """QLoRA: every 4-bit linear's weight dequantized for each matmul that reads it (bitsandbytes 0.50's
    `_dequant_linear_fallback` in forward: the 8-bit absmax to fp32, plus its offset, then the NF4 codes to the
    compute dtype, 3 kernels; MatMul4Bit.backward for the input gradient: the absmax and the codes, 2 kernels; the
    recorded histories memory/lm/nf4.py follows). Bytes per weight element: forward reads the 8-bit absmax (1/64),
    writes and reads the fp32 absmax twice (4/64 each way), reads the packed codes (1/2) and writes the weight (e);
    backward the same less the offset pass. An MoE layer's fused experts are not 4-bit (memory/lm/weights.py)."""
    dense = [lin for lin in spec.block_linears if lin.count == 1]
    n = float(sum(lin.in_features * lin.out_features for lin in dense) * spec.layers)
    count = len(dense) * spec.layers
    codes, absmax = 1 / nf4.BLOCK, 4 / nf4.BLOCK  # per weight element: the 8-bit absmax, the fp32 one
    s.add(_mem("dequantize", n * (codes + 4 * absmax + 0.5 + e), 3 * count), fwd)
    if backward:
        s.add(_mem("dequantize", n * (codes + 2 * absmax + 0.5 + e), 2 * count))


def param_tensors(spec: ModelSpec, w: Workload) -> int:
    """Trainable parameter tensors (the foreach optimizer launches kernels per group of them)."""
    if spec.kind == "vision":
        if spec.model_type == "resnet":
            return 3 * len(resnet_convs(spec.vision["block"], list(spec.vision["layers"]))) + 2
        return 12 * int(spec.vision["num_layers"]) + 6
    if w.method != "full":
        return 2 * len(lora_targets(spec, w)) * spec.layers
    per_layer = sum(1 + (1 if lin.bias else 0) for lin in spec.block_linears) + spec.norms_per_layer * (
        2 if spec.norm == "layer" else 1
    )
    return per_layer * spec.layers + 2 + (0 if spec.tied else 1)


def trainable_params(spec: ModelSpec, w: Workload) -> int:
    if w.method == "full" or spec.kind == "vision":
        return spec.params
    total = 0
    for lin in spec.block_linears:
        if lin.name in lora_targets(spec, w):
            total += w.lora_r * (lin.in_features + lin.out_features) * spec.layers
    return total


def optimizer_ops(spec: ModelSpec, w: Workload, shards: int = 1) -> list[Op]:
    """The optimizer step and zero_grad, once per optimizer step, on this GPU's share (FSDP) of the parameters."""
    n = trainable_params(spec, w) / shards
    pb = dtypes_for(w).param
    tensors = param_tensors(spec, w)
    if w.optim == "adafactor":
        # one parameter at a time; LoRA adapters and the fp32 master weights of mixed precision are fp32
        eb = pb if w.method == "full" else 4
        nbytes = n * ADAFACTOR_BYTES.get(eb, ADAFACTOR_BYTES[2])
        ops = [Op("optimizer", "memory", 0.0, nbytes, ADAFACTOR_KERNELS * tensors, module_ops=False)]
    elif w.optim in PER_TENSOR_KERNELS:
        nbytes = n * pb * OPTIMIZER_PASSES[w.optim]
        ops = [Op("optimizer", "memory", 0.0, nbytes, PER_TENSOR_KERNELS[w.optim] * tensors, module_ops=False)]
    else:
        launches = OPTIMIZER_KERNELS[w.optim] * max(1.0, tensors / FOREACH_TENSORS_PER_LAUNCH)
        ops = [_mem("optimizer", n * pb * OPTIMIZER_PASSES[w.optim], launches)]
    if w.grad_accum > 1:  # each later micro-batch adds into .grad: read both, write one
        ops.append(_mem("optimizer", n * pb * 3 * (w.grad_accum - 1), tensors * (w.grad_accum - 1)))
    return ops


def comm_ops(spec: ModelSpec, w: Workload) -> list[Op]:
    """Bytes each GPU sends per optimizer step. Ring all-reduce: 2(n-1)/n of the buffer; all-gather and
    reduce-scatter: (n-1)/n each (NCCL's bus-bandwidth definitions, nccl-tests doc/PERFORMANCE.md)."""
    n = w.gpus
    if n < 2 or w.shard == "none":
        return []
    pb = dtypes_for(w).param
    grads = trainable_params(spec, w) * pb
    frac = (n - 1) / n
    if w.shard == "fsdp" or w.shard == "zero3":
        params = spec.params * pb
        fwd = 2 if w.grad_ckpt else 1
        # FSDP2 gathers each layer's parameters for forward (again for checkpointing's recompute) and backward,
        # and reduce-scatters the gradients
        # FSDP2 copies the local shards into the all-gather buffer and the gathered buffer out into the
        # parameters (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather /
        # foreach_all_gather_copy_out), and the gradients into the reduce-scatter buffer
        # reshard_after_forward: gathered for forward and again for backward; checkpointing's recompute runs
        # inside the backward hook's gather, so it adds none
        del fwd
        gathers = 2 * w.grad_accum
        copies = params * gathers * (1 / n + 2) + grads * w.grad_accum * (2 + 2 / n)
        return [
            Op("comm", "comm", 0.0, frac * params * gathers, 2 * spec.layers, collective="all_gather"),
            Op("comm", "comm", 0.0, frac * grads * w.grad_accum, spec.layers, collective="reduce_scatter"),
            _mem("comm copies", copies, 4 * spec.layers * (gathers + w.grad_accum)),
        ]
    buckets = max(1, grads // (25 * MIB))  # DDP's 25 MiB buckets (bucket_cap_mb)
    # the reducer copies gradients into the buckets and the averaged buckets back (gradient_as_bucket_view=False)
    return [
        Op("comm", "comm", 0.0, 2 * frac * grads, buckets, collective="all_reduce"),
        _mem("comm copies", 4.0 * grads, 4 * buckets),
    ]


def training_ops(spec: ModelSpec, w: Workload) -> list[Op]:
    """Every op of one optimizer step on one GPU: grad_accum micro-batches, the optimizer, communication."""
    micro = lm_ops(spec, w) if spec.kind == "lm" else vision_ops(spec, w)
    ops = [
        Op(
            o.name,
            o.kind,
            o.flops * w.grad_accum,
            o.bytes * w.grad_accum,
            o.kernels * w.grad_accum,
            o.m,
            o.n,
            o.k,
            o.math,
        )
        for o in micro
    ]
    shards = w.gpus if w.shard in ("fsdp", "zero3") else 1
    return ops + optimizer_ops(spec, w, shards) + comm_ops(spec, w)


def lm_decode_ops(spec: ModelSpec, w: Workload, kv_len: int) -> list[Op]:
    """One decode step of HF generate: every weight read for batch-many tokens (GEMMs with M = batch), attention
    reading the whole KV cache of kv_len tokens, the element-wise ops of one token per sequence."""
    dt = dtypes_for(w)
    e, r = dt.act, dt.resid
    math = _matmul_math(w)
    b = w.batch
    s = _Steps([])
    if spec.experts:
        _moe_routing(s, spec, b, e, math, fwd=1.0, training=False, full=False)
    for lin in spec.block_linears:
        if lin.count > 1:  # MoE experts: only those the batch's tokens are routed to are read
            _experts(
                s,
                spec,
                b,
                lin.in_features,
                lin.out_features,
                e,
                math,
                layers=spec.layers,
                fwd=1.0,
                dgrad=False,
                wgrad=False,
                bias=lin.bias,
            )
            continue
        s.add(_gemm("projections", b, lin.out_features, lin.in_features, e, math, float(spec.layers)))
    kv = float(b) * spec.layers * kv_len * spec.kv_bytes_per_token_per_layer_elems * e
    # SDPA over one query token: read the cache; HF's DynamicCache appends with torch.cat (read + write the cache)
    s.add(_mem("attention", kv * 3, 6 * spec.layers))
    el_b, el_k = _lm_layer_elementwise(spec, w, b, r)
    s.add(_mem("elementwise", el_b * spec.layers, el_k * spec.layers))
    s.add(_gemm("logits_loss", b, spec.vocab, spec.hidden, e, math))
    s.add(_mem("logits_loss", float(b) * spec.vocab * 4 * 3, 12))  # logits processors and argmax, in fp32
    return s.ops
