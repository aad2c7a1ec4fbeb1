"""The vision models' parameters on the GPU, tensor by tensor as the probe makes them: torchvision's ResNet and ViT
(built in fp32, then converted for bf16/fp16) and transformers' ViT, DINOv2 and SigLIP (built in the job's dtype).
memory/vision.py's programs start from these."""

from __future__ import annotations

from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.optimizer import Trainable
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import resnet_convs
from gpuready.workload import Workload


def load_weights(prog: Program, spec: ModelSpec, w: Workload) -> list[Trainable]:
    """The parameters. The vision transformers tensor by tensor as their constructors make them, so that the
    optimizer's states and temporaries are per tensor too, as foreach AdamW makes them (the recorded history
    h29_vit_l16_mixed_b32: with the weights, states and temporaries as one block each, vit_l_16 mixed at 32 x 224
    reserved +9.4%; SigLIP-so400m at 16 x 384 and torchvision's ViT at 384, which fell back to one block, +8.5%);
    torchvision's ViT is built for the job's image size (its position embedding), transformers' keep their config's
    and interpolate. ResNets as one block."""
    dt = dtypes_for(w)
    if spec.model_type == "resnet":
        built, applied = module_tensors(spec, w.image_size)
        build_and_convert(prog, built, applied, w.precision in ("bf16", "fp16"))
        return [Trainable(numel, dt.param) for numel in resnet_parameters(spec)]
    if spec.vision.get("transformers"):  # built in the job's weight dtype
        built, buffers = hf_vision_tensors(spec)
        for numel in built:
            prog.alloc("weights", numel * dt.param)
        for nbytes in buffers:
            prog.alloc("weights", nbytes)
        return [Trainable(numel, dt.param) for numel in built]
    built, applied = module_tensors(spec, w.image_size)
    build_and_convert(prog, built, applied, w.precision in ("bf16", "fp16"))
    return [Trainable(numel, dt.param) for numel in built]


def hf_vision_tensors(spec: ModelSpec) -> tuple[list[int], list[int]]:
    """Element counts of a transformers vision encoder's parameters in the order its constructor makes them, and the
    bytes of its buffers. ViTForImageClassification as the recorded history h29_hf_vitl_mixed_b64 shows it: the class
    token, the patch convolution, the position embeddings; per layer q, k, v and the attention's output dense, the
    two layer norms, then the MLP's two denses; the final layer norm and the classifier. SiglipVisionModel as
    h32_siglip_b_bf16_b64 shows it: the patch convolution, the position embedding (and its int64 position ids, a
    buffer); per layer norm 1, q, k, v, out, norm 2, fc1, fc2; the post-layernorm; the pooling head (probe,
    nn.MultiheadAttention's packed in_proj and out_proj, its norm and MLP). Dinov2ForImageClassification in its
    constructors' order (modeling_dinov2.py): class and mask tokens, patch convolution, position embeddings; per
    layer norm 1, q, k, v, o, layer scale 1, norm 2, fc1, fc2, layer scale 2; the final norm and the classifier on
    [CLS, mean of patches]. The sum is models/vision.py's hf_vision_params."""
    cfg = spec.vision
    h, mlp, p, n = (int(cfg[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_layers"))
    patches = (int(cfg["image_size"]) // p) ** 2
    classes = int(cfg.get("num_classes", 0))
    qkv = [h * h, h] if cfg.get("qkv_bias", True) else [h * h]
    conv = [3 * p * p * h, h]
    if cfg["head"] == "attention_pool":  # SigLIP
        layer = [h, h, *qkv, *qkv, *qkv, h * h, h, h, h, mlp * h, mlp, h * mlp, h]
        head = [h, 3 * h * h, 3 * h, h * h, h, h, h, mlp * h, mlp, h * mlp, h]
        return [*conv, patches * h, *layer * n, h, h, *head], [patches * 8]
    if cfg["head"] == "cls_mean":  # DINOv2
        layer = [h, h, *qkv, *qkv, *qkv, h * h, h, h, h, h, mlp * h, mlp, h * mlp, h, h]
        return [h, h, *conv, (patches + 1) * h, *layer * n, h, h, 2 * h * classes, classes], []
    layer = [*qkv, *qkv, *qkv, h * h, h, h, h, h, h, mlp * h, mlp, h * mlp, h]
    return [h, *conv, (patches + 1) * h, *layer * n, h, h, classes * h, classes], []


def module_tensors(spec: ModelSpec, image_size: int) -> tuple[list[int], list[int]]:
    """Element counts of every floating-point parameter and buffer, in the order the model's constructor creates
    them and in the order `Module.to(dtype)` converts them (`Module._apply`: children first, then a module's own
    parameters and buffers). torchvision's resnet.py builds a stage's downsample before its first block;
    vision_transformer.py builds conv_proj, class_token, the encoder (pos_embedding first), heads; nn.MultiheadAttention
    owns in_proj_weight/bias and holds out_proj as a child."""
    cfg = spec.vision
    built: list[int] = []
    applied: list[int] = []
    if spec.model_type == "resnet":
        pending: list[int] = []  # the stage's downsample conv + BN, converted after the block that holds it
        convs = resnet_convs(cfg["block"], list(cfg["layers"]))
        per_block = 3 if cfg["block"] == "bottleneck" else 2
        i = 0
        while i < len(convs):
            conv = convs[i][0]
            # conv weight; BN weight, bias, running_mean, running_var (num_batches_tracked is int64: not converted)
            unit = [conv.cin * conv.cout * conv.kernel**2, conv.cout, conv.cout, conv.cout, conv.cout]
            if i == 0:
                built += unit
                applied += unit
                i += 1
                continue
            block = [unit]
            for k in range(1, per_block):
                c = convs[i + k][0]
                block.append([c.cin * c.cout * c.kernel**2, c.cout, c.cout, c.cout, c.cout])
            i += per_block
            if i < len(convs) and convs[i][0].downsample:
                c = convs[i][0]
                pending = [c.cin * c.cout, c.cout, c.cout, c.cout, c.cout]
                built += pending
                i += 1
            for u in block:
                built += u
                applied += u
            applied += pending
            pending = []
        features = 512 * (4 if cfg["block"] == "bottleneck" else 1)
        fc = [features * int(cfg.get("num_classes", 1000)), int(cfg.get("num_classes", 1000))]
        return built + fc, applied + fc
    h, mlp, p = int(cfg["hidden_dim"]), int(cfg["mlp_dim"]), int(cfg["patch_size"])
    tokens = (image_size // p) ** 2 + 1
    classes = int(cfg.get("num_classes", 1000))
    patch_embed = [h * 3 * p * p, h]
    layer_built = [h, h, 3 * h * h, 3 * h, h * h, h, h, h, mlp * h, mlp, h * mlp, h]
    # _apply: ln_1; self_attention's child out_proj, then its own in_proj_weight, in_proj_bias; ln_2; mlp
    layer_applied = [h, h, h * h, h, 3 * h * h, 3 * h, h, h, mlp * h, mlp, h * mlp, h]
    layers = int(cfg["num_layers"])
    built = patch_embed + [h, tokens * h] + layer_built * layers + [h, h, classes * h, classes]
    applied = patch_embed + layer_applied * layers + [h, h, tokens * h, classes * h, classes, h]
    return built, applied


def resnet_parameters(spec: ModelSpec) -> list[int]:
    """Element counts of a ResNet's trainable parameters in constructor order (module_tensors less batch norm's
    running mean and variance, which are buffers): each convolution's weight, its batch norm's weight and bias; the
    classifier's weight and bias."""
    built, _ = module_tensors(spec, 224)
    body, fc = built[:-2], built[-2:]
    return [n for i, n in enumerate(body) if i % 5 < 3] + fc


def load_for_inference(prog: Program, spec: ModelSpec, w: Workload) -> None:
    """The probe builds the model in fp32 on the GPU, one tensor at a time, and for bf16/fp16 converts it with
    `model.to(dtype)`: each new 16-bit tensor is made before its fp32 one goes, and the fp32 blocks stay cached.
    transformers' models are built in the job's weight dtype, tensor by tensor as for training (the recorded
    history h82_inf_dinov2l_b256: thirty 20 MiB segments of parameters where one 586 MiB block reserved 2.6% less)."""
    if spec.vision.get("transformers"):  # built in the job's weight dtype, no conversion
        load_weights(prog, spec, w)
        return
    built, applied = module_tensors(spec, w.image_size)
    build_and_convert(prog, built, applied, w.precision in ("bf16", "fp16"))


def build_and_convert(prog: Program, built: list[int], applied: list[int], half: bool) -> None:
    """torchvision's models as the probe makes them: in fp32 on the GPU, one tensor at a time in constructor order,
    then for bf16/fp16 `model.to(dtype)` in its order, each 16-bit tensor made before its fp32 one goes (the fp32
    blocks stay cached; h32_vitl16_bf16_b64 for training, as inference's histories)."""
    fp32 = [prog.alloc("weights", n * 4) for n in built]
    if not half:
        return
    by_size: dict[int, list[int]] = {}
    for n, handle in zip(built, fp32, strict=True):
        by_size.setdefault(n, []).append(handle)
    for n in applied:
        prog.alloc("weights", n * 2)
        prog.free(by_size[n].pop(0))
