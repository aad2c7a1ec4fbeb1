"""The adapter terms: an adapted linear's LoRA path as peft runs it (skinny GEMMs and casts), and QLoRA's
dequantization of the 4-bit weights for each matmul that reads them.
"""

from __future__ import annotations

from gpuready.memory.lm import nf4
from gpuready.models.spec import ModelSpec
from gpuready.plan.ops.base import Math, _linear, _mem, _Steps
from gpuready.workload import Workload


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
