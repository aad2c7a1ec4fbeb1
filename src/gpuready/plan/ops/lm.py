"""Decoder-only language models: the ops of one micro-batch forward (+ backward) (`lm_ops`), of one decode step
of generation (`lm_decode_ops`), and of a decoder layer's element-wise ops.
"""

from __future__ import annotations

from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.lm.context import GEMMA_NORMS, attention_backend, lora_targets, masked_attention
from gpuready.models.spec import ModelSpec
from gpuready.plan.ops.attention import _attention
from gpuready.plan.ops.base import Op, _gemm, _linear, _matmul_math, _mem, _Steps
from gpuready.plan.ops.lora import _dequantize, _lora
from gpuready.plan.ops.moe import _experts, _moe_routing, expert_spread
from gpuready.workload import Workload


def _lm_layer_elementwise(
    spec: ModelSpec, w: Workload, tokens: int, r: int, *, decode: bool = False
) -> tuple[float, float]:
    """Forward bytes and kernels of one decoder layer's element-wise ops (norms, activation, RoPE, residuals).
    `decode`: the kernel counts a profiled decode step shows (docs/calibration/gen_names_h200.tsv); training keeps
    the counts its constants were fitted with (RMSNorm 7, RoPE 12): refitted on the profiled counts, the training
    rows came out no better (held-out median 6.3% -> 5.6%, but the new rows 4.2% -> 6.8% and the memory sets' rows
    within ±25% 260 -> 255 of 281; session 21)."""
    h, t = spec.hidden, tokens
    e = dtypes_for(w).act
    if spec.norm == "rms":
        # HF RMSNorm in eager: to fp32, pow, mean, add, rsqrt, mul, cast back, mul by the weight (r = resid bytes):
        # eight kernels (a decode step profiled on the H200, docs/calibration/gen_names_h200.tsv: 65 each of pow,
        # mean, rsqrt per step of Llama-3.1-8B's 32 layers and final norm); Gemma's multiplies by (1 + weight) in
        # fp32, casting the weight too and adding one: ten (Gemma-3-4B: 205 of each over 34 layers of six norms)
        norm_b = t * h * ((r + 4) + 8 + 4 + 8 + (4 + r) + 2 * r)
        norm_k = (10 if spec.model_type in GEMMA_NORMS else 8) if decode else 7
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
    elif spec.model_type == "gpt2":
        # gpt2's gelu_new is written out in Python: pow, mul, add, mul, tanh, add, mul, mul (8 kernels)
        act_b = t * inter * 8 * 2 * e
        act_k = 8
    else:
        # GPT-NeoX's hidden_act "gelu": transformers' GELUActivation calls F.gelu, one fused kernel (read, write)
        act_b = t * inter * 2 * e
        act_k = 1
    resid_b = 2 * t * h * 3 * r  # two residual adds: read two, write one
    rope_b = 0.0
    rope_k = 0
    if spec.model_type != "gpt2":
        qk = t * (spec.heads + spec.kv_heads) * spec.head_dim
        rope_b = qk * e * 10  # rotate_half (two slices, neg, cat) then q*cos + rot*sin
        rope_k = 10 if decode else 12  # per q and k: mul, neg, cat, mul, add (the slices are views)
        if spec.rotary_dims and spec.rotary_dims < spec.head_dim:
            # GPT-NeoX's partial rotary: the same on the rotated slice, then cat with the rest (read, write all)
            rope_b = qk * e * (10 * spec.rotary_dims / spec.head_dim + 2)
            rope_k += 2
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
    backend, mask = attention_backend(spec, w, dt, seq)
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
                masked=window is not None and masked_attention(backend, mask, spec),
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
    # SDPA over one query token: read the cache; HF's DynamicCache appends with torch.cat (read + write the cache):
    # two cats and the attention kernel a layer (gen_names_h200.tsv: Llama-3.1-8B 64 cache cats and 32 SDPA kernels)
    s.add(_mem("attention", kv * 3, 3 * spec.layers))
    backend, mask = attention_backend(spec, w, dt, kv_len)
    if masked_attention(backend, mask, spec):
        # past the window a sliding layer takes the masked path: K and V repeated to every head and the mask made
        # in the query's dtype (Mistral-7B at its 4,096 window: 171 kernels a step more than Llama-3.1-8B's)
        s.add(_mem("attention", 0.0, 5 * spec.sliding_layers))
    el_b, el_k = _lm_layer_elementwise(spec, w, b, r, decode=True)
    s.add(_mem("elementwise", el_b * spec.layers, el_k * spec.layers))
    s.add(_gemm("logits_loss", b, spec.vocab, spec.hidden, e, math))
    # the model's own ops outside its layers (embedding, rotary tables, final norm: 23 kernels for Llama-3.1-8B)
    # and generate()'s per step (47 more kernels than a plain decode loop: the stopping criteria's two
    # device-to-host copies, isin over the end-of-sequence ids, cache positions, the ids' cat), logits in fp32
    s.add(_mem("logits_loss", float(b) * spec.vocab * 4 * 3, GENERATE_STEP_KERNELS))
    return s.ops


# kernels of a decode step outside the decoder layers, generate()'s own included (docs/calibration/
# gen_names_h200.tsv: Llama-3.1-8B 1510 a step in generate(), 1463 in a plain loop, 1440 in its 32 layers)
GENERATE_STEP_KERNELS = 70
