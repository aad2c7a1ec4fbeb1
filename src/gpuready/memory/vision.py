"""torchvision image classifiers (ResNet, ViT) in training or inference, as a program of GPU allocations.

What is kept for backward follows PyTorch's autograd formulas and torchvision's model code: a convolution
keeps its input, cuDNN batch norm keeps its input (the conv output), the in-place ReLU keeps its output, max
pooling keeps int64 indices; ViT's nn.MultiheadAttention (training path, F.multi_head_attention_forward)
makes a contiguous copy of the packed q/k/v projection and of the attention output.
"""

from __future__ import annotations

from gpuready.memory.ddp import DdpBuckets
from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.optimizer import Trainable, optimizer_step
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import resnet_convs
from gpuready.workload import Workload

# cuDNN convolution workspaces come from PyTorch's caching allocator (aten/src/ATen/native/cudnn/Conv_v8.cpp) and
# their segment stays cached. Their size depends on the algorithm cuDNN's heuristics pick and is not published per
# layer. Measured on the H200 (torch 2.11): reserved - allocated = 2.06 GiB (resnet50, fp32, 128 x 224 px),
# 2.29 GiB (resnet18, fp32, 64 x 320 px), 0.53 GiB (resnet101, bf16 autocast, 64 x 224 px): about six times the
# largest feature map in each case (../shared/calibration/h200.jsonl, docs/calibration/h200_gpuready.jsonl).
CUDNN_WORKSPACE_PER_LARGEST_MAP = 6.0


def resnet_largest_map_bytes(spec: ModelSpec, w: Workload) -> int:
    e = dtypes_for(w).act
    sizes = [
        w.batch * c.cout * _side(w.image_size, s) ** 2 * e
        for c, s in resnet_convs(spec.vision["block"], list(spec.vision["layers"]))
    ]
    return max(sizes)


def _side(image: int, scale: int) -> int:
    # each stride-2 stage halves the side, rounding up (padding=1 convs and pools)
    side = image
    s = 1
    while s < scale:
        side = (side + 1) // 2
        s *= 2
    return side


def _resnet_forward(prog: Program, spec: ModelSpec, w: Workload, keep: bool) -> list[tuple[int, int, int]]:
    """Returns saved (handle, grad_bytes, weight_grad_bytes) in forward order."""
    dt = dtypes_for(w)
    e = dt.act
    B, img = w.batch, w.image_size
    saved: list[tuple[int, int, int]] = []
    temps: list[int] = []

    def save(nbytes: int, grad: int, wgrad: int = 0) -> None:
        h = prog.alloc("activations", nbytes)
        (saved.append((h, grad, wgrad)) if keep else temps.append(h))

    cfg = spec.vision
    image = prog.alloc("activations", B * 3 * img * img * 4)
    if dt.autocast:
        save(B * 3 * img * img * 2, 0)  # autocast's bf16 copy of the images, kept by the first conv
    prev = B * 3 * img * img * e  # the tensor the next convolution reads
    for conv, scale in resnet_convs(cfg["block"], list(cfg["layers"])):
        side = _side(img, scale)
        out = B * conv.cout * side * side * e
        wgrad = conv.cin * conv.cout * conv.kernel**2 * dt.param
        cin_bytes = prev if not conv.downsample else B * conv.cin * _side(img, scale // conv.stride) ** 2 * e
        # the convolution keeps its input (already kept by the op before it); its backward makes the input's
        # gradient and the weight's. cuDNN's workspaces (also from the caching allocator) are not modelled:
        # their sizes depend on the algorithm cuDNN picks, and no fraction of the feature maps fitted the rows
        if keep:
            saved.append((0, cin_bytes, wgrad))
        save(out, out)  # conv output, kept by batch norm
        if conv.downsample:
            prog.transient("activations", out)  # its BN output is added into the main path and dropped
        else:
            save(out, out)  # batch-norm output, kept by the in-place ReLU (or the residual add's ReLU)
            prev = out
        if scale == 2:  # the stem's 3x3/2 max pool keeps int64 indices of its output
            pooled = B * conv.cout * _side(img, 4) ** 2
            save(pooled * 8, 0)
            save(pooled * e, pooled * e)
            prev = pooled * e
    features = 512 * (4 if cfg["block"] == "bottleneck" else 1)
    save(B * features * e, 0, features * 1000 * dt.param)
    prog.free(image)
    for h in temps:
        prog.free(h)
    return saved


def _vit_forward(prog: Program, spec: ModelSpec, w: Workload, keep: bool) -> list[tuple[int, int, int]]:
    dt = dtypes_for(w)
    e, r = dt.act, dt.resid
    cfg = spec.vision
    B, img = w.batch, w.image_size
    hdim, mlp, p = cfg["hidden_dim"], cfg["mlp_dim"], cfg["patch_size"]
    T = B * ((img // p) ** 2 + 1)
    saved: list[tuple[int, int, int]] = []
    temps: list[int] = []

    def save(nbytes: int, grad: int = 0, wgrad: int = 0) -> None:
        h = prog.alloc("activations", nbytes)
        (saved.append((h, grad, wgrad)) if keep else temps.append(h))

    save(B * 3 * img * img * (2 if dt.autocast else 4), 0, 3 * p * p * hdim * dt.param)
    x = prog.alloc("activations", T * hdim * r)  # class token + patches + positions
    heads = hdim // cfg["num_heads"]
    for _ in range(cfg["num_layers"]):
        save(T * hdim * r, T * hdim * r)  # ln_1 input
        save(T * hdim * e, 0, 3 * hdim * hdim * dt.param)  # in_proj input (bf16 copy under autocast)
        t = prog.alloc("activations", T * 3 * hdim * e)  # packed projection, then its contiguous copy
        save(T * 3 * hdim * e, T * 3 * hdim * e)
        prog.free(t)
        save(T * hdim * e)  # attention output
        save(B * cfg["num_heads"] * (T // B) * 4 if heads else 0)  # log-sum-exp
        save(T * hdim * e, T * hdim * e, hdim * hdim * dt.param)  # permuted contiguous copy for out_proj
        save(T * hdim * r, T * hdim * r)  # ln_2 input
        save(T * hdim * e, 0, hdim * mlp * dt.param)  # fc1 input
        save(T * mlp * e, T * mlp * e)  # GELU input
        save(T * mlp * e, T * mlp * e, mlp * hdim * dt.param)  # fc2 input
    save(T * hdim * r, T * hdim * r)  # final ln input
    save(T * hdim * (4 if dt.autocast else e), 0, hdim * 1000 * dt.param)  # its output, viewed by the head
    prog.free(x)
    for h in temps:
        prog.free(h)
    return saved


def _weights(prog: Program, spec: ModelSpec, w: Workload) -> list[Trainable]:
    dt = dtypes_for(w)
    # one allocation per parameter tensor would be exact; a handful of blocks per stage is enough here
    prog.alloc("weights", spec.params * dt.param)
    return [Trainable(spec.params, dt.param)]


def vision_program(spec: ModelSpec, w: Workload) -> Program:
    prog = Program()
    if spec.model_type == "resnet":
        prog.cached_outside_bytes = int(CUDNN_WORKSPACE_PER_LARGEST_MAP * resnet_largest_map_bytes(spec, w))
    dt = dtypes_for(w)
    trainable = _weights(prog, spec, w)
    forward = _resnet_forward if spec.model_type == "resnet" else _vit_forward
    if not w.training:
        prog.set_phase("forward")
        forward(prog, spec, w, keep=False)
        return prog
    state: list[int] | None = None
    ddp = DdpBuckets(prog, spec.params * dt.param) if w.shard == "ddp" else None
    ready_order: list[int] = []
    for step in range(3):
        prog.set_phase("forward")
        if step == 1 and ddp:
            ddp.rebuild(ready_order)
        casts = prog.alloc("autocast_weight_copies", spec.params * 2) if dt.autocast else 0
        saved = forward(prog, spec, w, keep=True)
        ready_order = [wgrad for _, _, wgrad in reversed(saved) if wgrad]
        logits = prog.alloc("logits_and_loss", w.batch * 1000 * 4)
        prog.set_phase("backward")
        grads: list[int] = []
        current = prog.alloc("activations", w.batch * 1000 * 4)
        prog.free(logits)
        if step == 1 and ddp:
            ddp.release_first()
        for handle, grad, wgrad in reversed(saved):
            if wgrad:
                grads.append(prog.alloc("gradients", wgrad))
            new = prog.alloc("activations", grad) if grad else 0
            prog.free(handle)
            if new:
                prog.free(current)
                current = new
        prog.free(current)
        prog.free(casts)
        prog.set_phase("optimizer step")
        state = optimizer_step(prog, w.optim, trainable, state)
        prog.free_all(grads)
    return prog
