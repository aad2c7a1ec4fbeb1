"""Mixture-of-experts layers as transformers' grouped_mm experts run them: how tokens spread over the experts
(`expert_spread`), the experts' grouped GEMMs, and the router's linear and the dispatch and combine traffic.
"""

from __future__ import annotations

from gpuready.models.spec import ModelSpec
from gpuready.plan.ops.base import Math, Op, _linear, _mem, _Steps


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
