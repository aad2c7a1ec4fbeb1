"""torchvision's ResNet/ViT and transformers' ViT/DINOv2/SigLIP in training or inference, as GPU allocations.

What is kept for backward follows PyTorch's autograd formulas and torchvision's model code: a convolution
keeps its input, cuDNN batch norm keeps its input (the conv output), the in-place ReLU keeps its output, max
pooling keeps int64 indices; ViT's nn.MultiheadAttention (training path, F.multi_head_attention_forward)
makes a contiguous copy of the packed q/k/v projection (and, with the fp32 kernel, of the attention output); every
Linear's bias gradient takes CUDA's reduction buffer for a moment. The transformers encoders' layers are in
memory/vision_hf.py.
"""

from __future__ import annotations

from gpuready.memory.ddp import DdpBuckets
from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES
from gpuready.memory.optimizer import optimizer_step
from gpuready.memory.program import Program
from gpuready.memory.resnet_train import resnet_train_steps
from gpuready.memory.vision_hf import Kept, Saved, hf_forward, hf_nograd, mlp_nograd, patch_embedding
from gpuready.memory.vision_weights import load_for_inference, load_weights
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import conv_input_elements, conv_side, resnet_convs
from gpuready.workload import Workload

# cuDNN convolution workspaces come from PyTorch's caching allocator (aten/src/ATen/native/cudnn/Conv_v8.cpp) and
# their segment stays cached. Their size depends on the algorithm cuDNN's heuristics pick and is not published per
# layer. Measured on the H200 (torch 2.11): reserved - allocated = 2.06 GiB (resnet50, fp32, 128 x 224 px),
# 2.29 GiB (resnet18, fp32, 64 x 320 px), 0.53 GiB (resnet101, bf16 autocast, 64 x 224 px): about six times the
# largest feature map in each case (../shared/calibration/h200.jsonl, docs/calibration/h200_gpuready.jsonl).
CUDNN_WORKSPACE_PER_LARGEST_MAP = 6.0
# Inference (torch.no_grad(), forward convolutions only) needs less: resnet50 bf16, batch 512, measured 4.09 GiB
# reserved on the H200 (issue 14) over 2.68 GiB of live tensors: 1.84 largest feature maps. Only the traced mode
# (memory/trace.py) still takes it so; the arithmetic program makes each workspace (INFER_WORKSPACE_PER_OUTPUT).
CUDNN_INFER_WORKSPACE_PER_LARGEST_MAP = 1.84
# Past 32-bit indexing (2**31 - 1 elements in a map) kernels take other paths: batch norm over a bf16 map that large
# also holds an fp32 copy of its input while it runs (inference histories h36_*: none at 1.64e9 elements, 4 bytes an
# element at 3.21e9 and 3.25e9; in fp16 none at 2.41e9, h39_resnet50_inf_fp16_b3000_cap24), and cuDNN picks other
# workspaces (LARGE_CONV_WORKSPACE)
LARGE_ELEMENTS = 2**31 - 1
# cuDNN's workspace for a ResNet convolution under no_grad, a moment after its output is made, as a multiple of the
# output by (kernel, stride): the H200's inference histories (h36_resnet50_inf_bf16_b2048,
# h36_resnet101_inf_bf16_b1888_cap16) show the same multiples at every stage but the last: the 7x7/2 stem 1.5x,
# 3x3 2.0x, 3x3/2 5.0x, the 1x1/2 projection 3.0x, 1x1 none (on the last stage's 7x7 maps 1x1 takes 1.25-2.05x,
# left out: 0.2-0.5 GiB at 2048 images). Past 2**31 input elements cuDNN picks otherwise (h36_*_b4000_cap40: 1x1
# convolutions 2-3.3x, the stem 1.0x).
INFER_WORKSPACE_PER_OUTPUT = {(7, 2): 1.5, (3, 1): 2.0, (3, 2): 5.0, (1, 2): 3.0}
# fp16 takes the same but for the stem, 1.25x (h41_resnet50_inf_fp16_b512 and h40_infer_resnet18_fp16_b1024; the
# stages of h39_resnet50_inf_fp16_b3000_cap24 past 2**31 as bf16's). ResNet-18's basic blocks take other multiples
# again for their strided convolutions (3x3/2 3.0x, the projection none or 3.0x), which the table leaves at the
# bottleneck's: they run on maps a quarter of the stem's and set no peak. Each workspace also has a constant part,
# left out: a 3x3's is its filter's size plus about 147 bytes (73,875 B for 64 x 64 channels in 16 bits, 1,179,795 B
# for 256 x 256; the same at every batch), the stem's 25,104 B in fp16 and 50,192 B in bf16. fp32 others
# (h39_resnet18_inf_fp32_b1508_cap16: the stem 1.19x, 3x3 2.0-2.06x, 3x3/2 2.0-3.03x, the 1x1/2 projection none
# but on the last stage 2.0x), taken at the top of each range
INFER_WORKSPACE_PER_OUTPUT_FP32 = {(7, 2): 1.19, (3, 1): 2.06, (3, 2): 3.03, (1, 2): 2.0}
INFER_WORKSPACE_PER_OUTPUT_FP16 = {**INFER_WORKSPACE_PER_OUTPUT, (7, 2): 1.25}
# ... and the stem's and a 1x1's when its input or output has 2**31 elements or more: the largest workspace those
# histories record there, the stem's at both 4000 and 4050 images (the 1x1s took 5.37e9 and 6.44e9 bytes)
LARGE_CONV_WORKSPACE = 6_440_240_144


def cudnn_workspace_bytes(spec: ModelSpec, w: Workload) -> int:
    """The cached cuDNN workspace segment a ResNet job holds at its peak (measured coefficients above)."""
    per_map = CUDNN_WORKSPACE_PER_LARGEST_MAP if w.training else CUDNN_INFER_WORKSPACE_PER_LARGEST_MAP
    # (per image, then times the batch: affine in it, for the job's batch template)
    return w.batch * int(per_map * _largest_map_per_image(spec, w))


def _largest_map_per_image(spec: ModelSpec, w: Workload) -> int:
    e = dtypes_for(w).act
    convs = resnet_convs(spec.vision["block"], list(spec.vision["layers"]))
    return max(c.cout * conv_side(w.image_size, s) ** 2 * e for c, s in convs)


def _resnet_forward(prog: Program, spec: ModelSpec, w: Workload) -> list[Saved]:
    """Returns what the forward keeps (vision_hf.Saved) in forward order."""
    dt = dtypes_for(w)
    e = dt.act
    B, img = w.batch, w.image_size
    saved: list[Saved] = []

    def save(nbytes: int, grad: int, wgrad: int = 0) -> None:
        saved.append((prog.alloc("activations", nbytes), grad, wgrad, 0))

    cfg = spec.vision
    image = prog.alloc("activations", B * 3 * img * img * 4)
    if dt.autocast:
        save(B * 3 * img * img * 2, 0)  # autocast's bf16 copy of the images, kept by the first conv
    prev = B * 3 * img * img * e  # the tensor the next convolution reads
    for conv, scale in resnet_convs(cfg["block"], list(cfg["layers"])):
        side = conv_side(img, scale)
        out = B * conv.cout * side * side * e
        wgrad = conv.cin * conv.cout * conv.kernel**2 * dt.param
        cin_bytes = prev if not conv.downsample else conv_input_elements(B, img, conv, scale) * e
        # the convolution keeps its input (already kept by the op before it); its backward makes the input's
        # gradient and the weight's (cuDNN's workspaces: cudnn_workspace_bytes, a cached segment beside these)
        saved.append((0, cin_bytes, wgrad, 0))
        save(out, out)  # conv output, kept by batch norm
        if conv.downsample:
            prog.transient("activations", out)  # its BN output is added into the main path and dropped
        else:
            save(out, out)  # batch-norm output, kept by the in-place ReLU (or the residual add's ReLU)
            prev = out
        if scale == 2:  # the stem's 3x3/2 max pool keeps int64 indices of its output
            pooled = B * conv.cout * conv_side(img, 4) ** 2
            save(pooled * 8, 0)
            save(pooled * e, pooled * e)
            prev = pooled * e
    features = 512 * (4 if cfg["block"] == "bottleneck" else 1)
    save(B * features * e, 0, features * 1000 * dt.param)
    prog.free(image)
    return saved


def _vit_forward(prog: Program, spec: ModelSpec, w: Workload, workspace: bool = False) -> list[Saved]:
    """torchvision's VisionTransformer in training, as h29_vit_l16_mixed_b32 records it layer by layer; `workspace`:
    make the cuBLAS handle's workspace at the first Linear (a process's first step)."""
    dt = dtypes_for(w)
    e, r = dt.act, dt.resid
    cfg = spec.vision
    B, img = w.batch, w.image_size
    hdim, mlp, p = cfg["hidden_dim"], cfg["mlp_dim"], cfg["patch_size"]
    per_image = (img // p) ** 2 + 1  # the patches and the class token
    T = B * per_image
    # (every Linear's bias gradient takes its reduction buffer: h29_vit_l16_mixed_b32 shows in_proj's, out_proj's,
    # fc1's and fc2's)
    kept = Kept(prog, T)
    save = kept.save

    def copy(numel: int) -> None:
        kept.copy(numel, dt.autocast)

    # conv_proj's output lives until the class token is concatenated to its patches (h29_vit_l16_mixed_b32)
    patches = patch_embedding(kept, dt, B, img, p, hdim)
    x = prog.alloc("activations", T * hdim * r)  # class token + patches (held to the end of the forward)
    prog.free(patches)
    embedded = prog.alloc("activations", T * hdim * r)  # + positions
    heads = hdim // cfg["num_heads"]
    flash = e == 2 and heads <= 256  # SDPA's kernel (memory/lm/context.py attention_backend: no mask here)
    ac = dt.autocast
    stats = T * 4  # a LayerNorm's fp32 mean and rstd, kept

    def layer_norm(strided: bool) -> int:
        """A LayerNorm's output (fp32 under autocast); its statistics saved. nn.MultiheadAttention (batch_first)
        returns its output transposed, so a residual sum with it in the first place keeps that token-major layout,
        and the norm's kernel reads a contiguous copy of it, made and freed around its output (every norm but the
        first layer's first in h29_vit_l16_mixed_b32; transformers' encoders, whose sums are contiguous, show none)."""
        tmp = prog.alloc("activations", T * hdim * r) if strided else 0
        y = prog.alloc("activations", T * hdim * r)
        save(stats)
        save(stats)
        prog.free(tmp)
        return y

    res = embedded  # the residual stream: the embeddings, then each block's sums (each kept by the next norm)
    for layer in range(cfg["num_layers"]):
        kept.keep(res, T * hdim * r)  # ln_1's input
        y = layer_norm(layer > 0)
        copy(3 * hdim * hdim)
        # in_proj reads the norm's output through the transposed view nn.MultiheadAttention (batch_first) takes; its
        # reshape copies that contiguous, and the copy is what the matmul keeps (under autocast, a copy of the bf16
        # cast, which goes once the projection is made); the norm's output goes when the attention returns
        cast = prog.alloc("activations", T * hdim * 2) if ac else 0
        save(T * hdim * e, 0, 3 * hdim * hdim * dt.param, 3 * hdim)
        t = prog.alloc("activations", T * 3 * hdim * e)  # packed projection, then its contiguous copy
        if workspace and layer == 0:
            prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
        prog.free(cast)
        save(T * 3 * hdim * e, T * 3 * hdim * e)
        prog.free(t)
        save(T * hdim * e)  # attention output
        save(B * cfg["num_heads"] * per_image * 4 if heads else 0)  # log-sum-exp
        copy(hdim * hdim)
        # out_proj reads the attention output permuted to (tokens, batch, ...) and made contiguous: flash attention
        # (16-bit) writes its output in q's layout, which is that order, so no copy is made (h29_vit_l16_mixed_b32);
        # the fp32 kernel's (batch, tokens, ...) output is copied
        if flash:
            kept.keep(0, T * hdim * e, hdim * hdim * dt.param, hdim)
        else:
            save(T * hdim * e, T * hdim * e, hdim * hdim * dt.param, hdim)
        out = prog.alloc("activations", T * hdim * e)  # out_proj's output, until the residual add
        prog.free(y)
        res = prog.alloc("activations", T * hdim * r)
        prog.free(out)
        kept.keep(res, T * hdim * r)  # ln_2's input
        y = layer_norm(True)
        copy(hdim * mlp)
        if ac:
            save(T * hdim * 2, 0, hdim * mlp * dt.param, mlp)  # fc1's input, cast to bf16
        else:
            kept.keep(y, 0, hdim * mlp * dt.param, mlp)
        save(T * mlp * e, T * mlp * e)  # GELU input
        copy(mlp * hdim)
        save(T * mlp * e, T * mlp * e, mlp * hdim * dt.param, hdim)  # fc2 input
        out = prog.alloc("activations", T * hdim * e)  # fc2's output, until the residual add
        if ac:
            prog.free(y)
        res = prog.alloc("activations", T * hdim * r)
        prog.free(out)
    kept.keep(res, T * hdim * r)  # the final norm's input
    y = layer_norm(True)
    copy(hdim * 1000)
    if ac:  # the head reads the class token (a view), cast to bf16: that copy is kept, the norm's output is not
        save(B * hdim * 2, 0, hdim * 1000 * dt.param)
        prog.free(y)
    else:  # the head keeps the view, and so the whole normed output
        kept.keep(y, 0, hdim * 1000 * dt.param)
    prog.free(x)
    return kept.saved


def _conv_ratios(w: Workload) -> dict[tuple[int, int], float]:
    """cuDNN's workspace per convolution output by (kernel, stride) for the job's dtype."""
    if dtypes_for(w).act == 4:
        return INFER_WORKSPACE_PER_OUTPUT_FP32
    return INFER_WORKSPACE_PER_OUTPUT_FP16 if w.precision == "fp16" else INFER_WORKSPACE_PER_OUTPUT


# -- inference: torch.no_grad() over a model left in train mode (the probe's `model(x)` twice) ----------------------
def _resnet_nograd(prog: Program, spec: ModelSpec, w: Workload, first: bool) -> None:
    """ResNet's forward without autograd: each conv's output lives until batch norm has made its own; a block's
    input lives until the block returns (it is the identity); a downsample's BN output is added in place; the
    stem's max pooling makes int64 indices it drops at once (CUDA always runs max_pool2d_with_indices)."""
    dt = dtypes_for(w)
    e = dt.act
    B, img = w.batch, w.image_size
    cfg = spec.vision
    convs = resnet_convs(cfg["block"], list(cfg["layers"]))
    per_block = 3 if cfg["block"] == "bottleneck" else 2

    def out_bytes(k: int) -> int:
        conv, scale = convs[k]
        return B * conv.cout * conv_side(img, scale) ** 2 * e

    bf16 = w.precision in ("bf16", "mixed")  # (fp16 makes no copy: h39_resnet50_inf_fp16_b3000_cap24)
    ratios = _conv_ratios(w)

    def batch_norm(k: int) -> int:
        """Batch norm's output over conv k's; in bf16 from 2**31 elements on, the op also holds an fp32 copy of its
        input while it runs (histories h36_resnet50_inf_bf16_b4000_cap40 and _b4050: 11.96 and 12.11 GiB over the
        stem's 64 x 112 x 112 maps, none at 2048 images)."""
        out = prog.alloc("activations", out_bytes(k))
        if bf16 and out_bytes(k) // e >= LARGE_ELEMENTS:
            prog.transient("activations", out_bytes(k) // e * 4)
        return out

    def conv(k: int) -> int:
        """Conv k's output, and cuDNN's workspace for it, a moment."""
        out = prog.alloc("activations", out_bytes(k))
        kernel, stride = convs[k][0].kernel, convs[k][0].stride
        ws = int(ratios.get((kernel, stride), 0.0) * out_bytes(k))
        if kernel in (1, 7) and max(conv_input_elements(B, img, *convs[k]), out_bytes(k) // e) >= LARGE_ELEMENTS:
            ws = LARGE_CONV_WORKSPACE
        if ws:
            prog.transient("cudnn_workspaces", ws)
        return out

    cast = prog.alloc("activations", B * 3 * img * img * 2) if dt.autocast else 0
    c = conv(0)
    prog.free(cast)
    b = batch_norm(0)
    prog.free(c)
    pooled = B * convs[0][0].cout * conv_side(img, 4) ** 2
    x = prog.alloc("activations", pooled * e)
    prog.transient("activations", pooled * 8)
    prog.free(b)
    k = 1
    while k < len(convs):
        inp = x
        prev = inp
        for j in range(per_block):
            c = conv(k + j)
            if prev != inp:
                prog.free(prev)
            bn = batch_norm(k + j)
            prog.free(c)
            prev = bn
        k += per_block
        if k < len(convs) and convs[k][0].downsample:
            dc = conv(k)
            db = batch_norm(k)
            prog.free(dc)
            prog.free(db)  # added in place into the block's output, then dropped with the block
            k += 1
        prog.free(inp)
        x = prev
    features = 512 * (4 if cfg["block"] == "bottleneck" else 1)
    pooled_out = prog.alloc("activations", B * features * e)
    prog.free(x)
    logits = prog.alloc("activations", B * int(cfg.get("num_classes", 1000)) * e)
    if first:  # fc is the job's first cuBLAS matmul: its handle's workspace, kept
        prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
    prog.free(pooled_out)
    prog.free(logits)


def _vit_nograd(prog: Program, spec: ModelSpec, w: Workload, first: bool) -> None:
    """torchvision's VisionTransformer without autograd, its nn.MultiheadAttention on the slow path (the model is
    in train mode): the patch embedding and its concatenation with the class token; the encoder's input plus the
    positions (both held through the encoder); per block ln_1, in_proj through matmul (a contiguous copy of the
    transposed input) and the packed projection's contiguous copy, attention's output and its permuted copy,
    out_proj, the residual, ln_2, fc1, GELU, fc2 and the second residual. Dropout with p=0 returns its input."""
    dt = dtypes_for(w)
    e = dt.act
    cfg = spec.vision
    B, img = w.batch, w.image_size
    hdim, mlp, p = int(cfg["hidden_dim"]), int(cfg["mlp_dim"]), int(cfg["patch_size"])
    patches = (img // p) ** 2
    T = B * (patches + 1)
    th = T * hdim * e
    cast = prog.alloc("activations", B * 3 * img * img * 2) if dt.autocast else 0
    conv = prog.alloc("activations", B * patches * hdim * e)
    prog.free(cast)
    cat = prog.alloc("activations", th)
    prog.free(conv)
    x = prog.alloc("activations", th)  # + pos_embedding
    inp = x
    for _ in range(int(cfg["num_layers"])):
        ln1 = prog.alloc("activations", th)
        copy = prog.alloc("activations", th)  # matmul's contiguous copy of the (L, B, E) view
        proj = prog.alloc("activations", 3 * th)
        if first:  # in_proj is the job's first cuBLAS matmul: its handle's workspace, kept
            prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
            first = False
        prog.free(copy)
        packed = prog.alloc("activations", 3 * th)  # unflatten/transpose(...).contiguous()
        prog.free(proj)
        attn = prog.alloc("activations", th)
        prog.transient("activations", B * int(cfg["num_heads"]) * (patches + 1) * 4)  # log-sum-exp
        perm = prog.alloc("activations", th)  # permute(2, 0, 1, 3).contiguous()
        prog.free(attn)
        out = prog.alloc("activations", th)  # out_proj
        prog.free(perm)
        prog.free(packed)
        prog.free(ln1)
        x1 = prog.alloc("activations", th)  # x + input
        prog.free(out)
        fc2 = mlp_nograd(prog, th, T * mlp * e, th)
        x2 = prog.alloc("activations", th)  # x + y
        prog.free(fc2)
        prog.free(x1)
        if inp != x:
            prog.free(inp)
        inp = x2
    final = prog.alloc("activations", th)  # encoder.ln
    if inp != x:
        prog.free(inp)
    prog.free(x)
    prog.free(cat)
    head = prog.alloc("activations", B * int(cfg.get("num_classes", 1000)) * e)
    prog.free(final)
    prog.free(head)


def _inference_program(spec: ModelSpec, w: Workload) -> Program:
    prog = Program()
    dt = dtypes_for(w)
    load_for_inference(prog, spec, w)
    prog.set_phase("forward")
    in_bytes = 2 if w.precision in ("bf16", "fp16") else 4
    image = prog.alloc("activations", w.batch * 3 * w.image_size**2 * in_bytes)
    # under autocast every weight's bf16 copy is cached for the autocast region (one forward)
    for rep in range(2):  # the probe runs two forward passes
        casts = prog.alloc("autocast_weight_copies", spec.params * 2) if dt.autocast else 0
        if spec.model_type == "resnet":
            _resnet_nograd(prog, spec, w, rep == 0)
        elif spec.vision.get("transformers"):
            hf_nograd(prog, spec, w, rep == 0)
        else:
            _vit_nograd(prog, spec, w, rep == 0)
        prog.free(casts)
    prog.free(image)
    return prog


def vision_program(spec: ModelSpec, w: Workload) -> Program:
    if not w.training:
        return _inference_program(spec, w)
    prog = Program()
    dt = dtypes_for(w)
    resnet = spec.model_type == "resnet"
    if resnet:
        prog.cached_outside_bytes = cudnn_workspace_bytes(spec, w)
    trainable = load_weights(prog, spec, w)
    if resnet and w.gpus == 1:
        # op by op as recorded (memory/resnet_train.py), the reserve kept at its floor of six largest maps; DDP keeps
        # the coarser program below
        resnet_train_steps(prog, spec, w, trainable, _conv_ratios(w))
        return prog
    if not resnet:
        # the batch, made once after the model and held through every step (the probe's x and y, as a training loop
        # holds its batch): images in the weights' dtype (fp32 under autocast), int64 labels (histories
        # h29_vit_l16_mixed_b32, h29_hf_vitl_mixed_b64, h30_hf_vitb_bf16_b128)
        prog.alloc("activations", w.batch * 3 * w.image_size**2 * dt.param)
        prog.alloc("activations", w.batch * 8)
    vit = hf_forward if spec.vision.get("transformers") else _vit_forward
    state: list[int] | None = None
    ddp = DdpBuckets(prog, spec.params * dt.param) if w.shard == "ddp" else None
    ready_order: list[int] = []
    for step in range(3):
        prog.mark_step()
        grads: list[int] = []
        # gradient accumulation (the probe's loop): the weights' gradients made in the first micro-batch's backward
        # stay through the next micro-batch; there each new gradient is made, added into .grad in place and freed.
        # Two micro-batches show everything: the third and later repeat the second.
        for micro in range(min(w.grad_accum, 2)):
            prog.set_phase("forward")
            if step == 1 and micro == 0 and ddp:
                ddp.rebuild(ready_order)
            # (the ViTs make their weight copies layer by layer: _vit_forward, hf_forward)
            casts = prog.alloc("autocast_weight_copies", spec.params * 2) if dt.autocast and resnet else 0
            # a ViT's first step makes the forward's cuBLAS handle workspace at its first Linear, kept, and the
            # backward thread's (h30_hf_vitb_bf16_b128, h29_vit_l16_mixed_b32: two 32 MiB segments)
            first = step == 0 and micro == 0 and not resnet
            saved = _resnet_forward(prog, spec, w) if resnet else vit(prog, spec, w, workspace=first)
            ready_order = [wgrad for _, _, wgrad, _ in reversed(saved) if wgrad]
            logits = prog.alloc("logits_and_loss", w.batch * 1000 * 4)
            prog.set_phase("backward")
            current = prog.alloc("activations", w.batch * 1000 * 4)
            if first:  # autograd's backward thread has a cuBLAS handle (and workspace) of its own
                prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
            prog.free(logits)
            if step == 1 and micro == 0 and ddp:
                ddp.release_first()
            for handle, grad, wgrad, reduce in reversed(saved):
                if wgrad and micro == 0:
                    grads.append(prog.alloc("gradients", wgrad))
                elif wgrad:
                    prog.transient("gradients", wgrad)
                new = prog.alloc("activations", grad) if grad else 0
                if reduce:
                    prog.transient("activations", reduce)
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
