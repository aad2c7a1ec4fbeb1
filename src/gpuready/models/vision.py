"""torchvision ResNet and ViT, transformers' ViT/DINOv2/SigLIP vision encoders: shapes and parameter counts.

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


def conv_side(image: int, scale: int) -> int:
    """The side of a ResNet feature map `scale` times smaller than the image: each stride-2 stage halves the side,
    rounding up (padding=1 convolutions and pools)."""
    side, s = image, 1
    while s < scale:
        side = (side + 1) // 2
        s *= 2
    return side


def conv_input_elements(batch: int, image: int, conv: Conv, scale: int) -> int:
    """The elements of a convolution's input, `scale` being its output's downscale (the stem's input: the images)."""
    return batch * conv.cin * conv_side(image, scale // conv.stride) ** 2


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


# transformers' own vision encoders (a config.json with hidden_size): ViTForImageClassification and
# Dinov2ForImageClassification (AutoModelForImageClassification, 1000 classes unless the config says otherwise)
# and SiglipVisionModel (AutoModel: it has no image-classification class of its own; its attention-pooling head
# is part of the model)
HF_VISION_TYPES = ("vit", "dinov2", "siglip_vision_model")
HF_NUM_LABELS = 1000


def is_transformers_vision(cfg: dict[str, Any]) -> bool:
    return str(cfg.get("model_type")) in HF_VISION_TYPES and "hidden_size" in cfg


def hf_vision_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """The shape keys the memory program reads, from a transformers vision config (sources: modeling_vit.py,
    modeling_dinov2.py, modeling_siglip.py of transformers 5)."""
    mtype = str(cfg["model_type"])
    h = int(cfg["hidden_size"])
    mlp = int(h * float(cfg.get("mlp_ratio", 4))) if mtype == "dinov2" else int(cfg["intermediate_size"])
    if mtype == "dinov2" and cfg.get("use_swiglu_ffn"):
        raise InputError("MODEL", "dinov2 with use_swiglu_ffn is not modelled (the published configs use an MLP)")
    labels = cfg.get("num_labels") or (len(cfg["id2label"]) if cfg.get("id2label") else HF_NUM_LABELS)
    return {
        "hidden_dim": h,
        "mlp_dim": mlp,
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_heads": int(cfg["num_attention_heads"]),
        "patch_size": int(cfg["patch_size"]),
        "image_size": int(cfg.get("image_size", 224)),
        "num_classes": 0 if mtype == "siglip_vision_model" else int(labels),
        "cls_token": mtype != "siglip_vision_model",
        "layer_scale": mtype == "dinov2",
        # ViT: classifier on the CLS token; DINOv2: on [CLS, mean of patch tokens]; SigLIP: attention pooling
        "head": {"vit": "cls", "dinov2": "cls_mean", "siglip_vision_model": "attention_pool"}[mtype],
        "qkv_bias": bool(cfg.get("qkv_bias", True)),
        "transformers": True,
    }


def hf_vision_params(shape: dict[str, Any]) -> int:
    h, mlp, p, n = (int(shape[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_layers"))
    patches = (int(shape["image_size"]) // p) ** 2
    qkv_bias = 3 * h if shape["qkv_bias"] else 0
    per_layer = 2 * h + 3 * h * h + qkv_bias + h * h + h + 2 * h + h * mlp + mlp + mlp * h + h
    if shape["layer_scale"]:
        per_layer += 2 * h
    total = 3 * p * p * h + h + n * per_layer + 2 * h  # patch conv, layers, final layer norm
    if shape["cls_token"]:
        total += h + (patches + 1) * h  # CLS token, positions
    else:
        total += patches * h
    if shape["head"] == "cls_mean":
        total += h  # Dinov2Embeddings' mask_token
    classes = int(shape["num_classes"])
    if shape["head"] == "cls":
        total += h * classes + classes
    elif shape["head"] == "cls_mean":
        total += 2 * h * classes + classes
    else:  # probe, nn.MultiheadAttention, layer norm, MLP
        total += h + 4 * h * h + 4 * h + 2 * h + h * mlp + mlp + mlp * h + h
    return total


def vision_spec(cfg: dict[str, Any], name: str, source: str) -> ModelSpec:
    from gpuready.models.spec import ModelSpec

    mtype = cfg["model_type"]
    try:
        if is_transformers_vision(cfg):
            shape = hf_vision_shape(cfg)
            params = hf_vision_params(shape)
            # SigLIP's vision tower is shown as its family ("siglip"); its config keeps siglip_vision_model
            family = "siglip" if mtype == "siglip_vision_model" else mtype
            return ModelSpec(
                name=name, kind="vision", model_type=family, source=source, vision={**cfg, **shape}, params=params
            )
        if mtype == "resnet":
            params = resnet_params(cfg["block"], list(cfg["layers"]), int(cfg.get("num_classes", 1000)))
        else:
            params = vit_params(cfg)
    except KeyError as exc:
        raise InputError("MODEL", f"{name}: vision config lacks {exc.args[0]!r}") from None
    return ModelSpec(name=name, kind="vision", model_type=mtype, source=source, vision=dict(cfg), params=params)


def build_transformers_vision(transformers: Any, config: dict[str, Any], dtype: Any) -> Any:
    """The model the probe and the traced mode build for a transformers vision config, on the current default
    device: AutoModelForImageClassification (HF_NUM_LABELS classes unless the config names its labels) for ViT
    and DINOv2, AutoModel (SiglipVisionModel) for SigLIP's vision tower; SDPA attention."""
    cfg = dict(config)
    mtype = str(cfg.pop("model_type"))
    if mtype != "siglip_vision_model" and not cfg.get("id2label"):
        cfg.setdefault("num_labels", HF_NUM_LABELS)
    hf = transformers.AutoConfig.for_model(mtype, **cfg)
    auto = transformers.AutoModel if mtype == "siglip_vision_model" else transformers.AutoModelForImageClassification
    return auto.from_config(hf, dtype=dtype, attn_implementation="sdpa")
