"""Vision models: the ops of one micro-batch forward (+ backward) of a torchvision ResNet (convolutions as
implicit GEMMs, batch norm and ReLU as element-wise passes) or ViT (a transformer encoder) (`vision_ops`).
"""

from __future__ import annotations

from gpuready.memory.dtypes import dtypes_for
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import conv_side, resnet_convs
from gpuready.plan.ops.attention import _attention
from gpuready.plan.ops.base import Math, Op, _linear, _matmul_math, _mem, _Steps
from gpuready.workload import Workload


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
            side = conv_side(img, scale)
            m, n, k = B * side * side, conv.cout, conv.cin * conv.kernel**2
            in_side = conv_side(img, scale // conv.stride) if scale > 2 else img
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
