"""torchvision ResNet and ViT: shapes, parameter counts, and the feature maps that training keeps.

Shapes follow torchvision/models/resnet.py and vision_transformer.py (stride on the 3x3 conv of a
bottleneck, "ResNet v1.5"; BatchNorm after every conv; a 1x1 downsample conv + BN on the first block
of a stage). BatchNorm running statistics are buffers, not parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuready.errors import InputError

if TYPE_CHECKING:
    from gpuready.models.spec import ModelSpec


@dataclass(frozen=True)
class Conv:
    """One conv(+BN) of a ResNet: channels, kernel, stride, and the spatial side of its output at 224 px."""

    cin: int
    cout: int
    kernel: int
    stride: int
    relu: bool  # followed by an (in-place) ReLU
    downsample: bool = False  # the 1x1 projection of a stage's first block (its BN output is added, not kept)


def resnet_convs(block: str, layers: list[int]) -> list[tuple[Conv, int]]:
    """Every conv with its output downscale factor relative to the input image (e.g. 4 after the stem pool)."""
    convs: list[tuple[Conv, int]] = [(Conv(3, 64, 7, 2, True), 2)]
    inplanes, scale = 64, 4  # after the 3x3/2 max pool
    expansion = 4 if block == "bottleneck" else 1
    for stage, blocks in enumerate(layers):
        planes = 64 * 2**stage
        for i in range(blocks):
            stride = 2 if (stage > 0 and i == 0) else 1
            out_scale = scale * stride
            if block == "bottleneck":
                convs += [
                    (Conv(inplanes, planes, 1, 1, True), scale),
                    (Conv(planes, planes, 3, stride, True), out_scale),
                    (Conv(planes, planes * 4, 1, 1, False), out_scale),
                ]
            else:
                convs += [
                    (Conv(inplanes, planes, 3, stride, True), out_scale),
                    (Conv(planes, planes, 3, 1, False), out_scale),
                ]
            if i == 0 and (stride != 1 or inplanes != planes * expansion):
                convs.append((Conv(inplanes, planes * expansion, 1, stride, False, True), out_scale))
            inplanes = planes * expansion
            scale = out_scale
    return convs


def resnet_params(block: str, layers: list[int], num_classes: int) -> int:
    total = 0
    for conv, _ in resnet_convs(block, layers):
        total += conv.cin * conv.cout * conv.kernel * conv.kernel + 2 * conv.cout  # conv weight + BN affine
    features = 512 * (4 if block == "bottleneck" else 1)
    return total + features * num_classes + num_classes


def vit_params(cfg: dict[str, Any]) -> int:
    h, mlp, p, n = (int(cfg[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_layers"))
    classes = int(cfg["num_classes"])
    tokens = (int(cfg["image_size"]) // p) ** 2 + 1
    per_layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * mlp + mlp) + (mlp * h + h)
    return 3 * p * p * h + h + h + tokens * h + n * per_layer + 2 * h + h * classes + classes


def vision_spec(cfg: dict[str, Any], name: str, source: str) -> ModelSpec:
    from gpuready.models.spec import ModelSpec

    mtype = cfg["model_type"]
    try:
        if mtype == "resnet":
            params = resnet_params(cfg["block"], list(cfg["layers"]), int(cfg.get("num_classes", 1000)))
        else:
            params = vit_params(cfg)
    except KeyError as exc:
        raise InputError("MODEL", f"{name}: vision config lacks {exc.args[0]!r}") from None
    return ModelSpec(name=name, kind="vision", model_type=mtype, source=source, vision=dict(cfg), params=params)
