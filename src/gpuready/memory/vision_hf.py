"""transformers' vision encoders (ViT, DINOv2, SigLIP) as GPU allocations: training (hf_forward, what each
layer keeps for backward) and inference under no_grad (hf_nograd). memory/vision.py builds the programs around
them (weights, the steps, the optimizer)."""

from __future__ import annotations

from typing import Any

from gpuready.memory.dtypes import Dtypes, dtypes_for
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.workload import Workload


def tokens(cfg: dict[str, Any], img: int) -> int:
    return (img // int(cfg["patch_size"])) ** 2 + (1 if cfg.get("cls_token") else 0)


def hf_shape(spec: ModelSpec, w: Workload) -> tuple[Dtypes, int, int, int, int, int, int, int]:
    """A transformers vision encoder's job: dtypes, batch, image size, hidden, MLP width, patch size, heads and
    tokens per image ([CLS] and registers included)."""
    cfg = spec.vision
    h, mlp, p, heads = (int(cfg[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_heads"))
    return dtypes_for(w), w.batch, w.image_size, h, mlp, p, heads, tokens(cfg, w.image_size)


def hf_forward(prog: Program, spec: ModelSpec, w: Workload) -> list[tuple[int, int, int]]:
    """transformers' ViTLayer / Dinov2Layer / SiglipEncoderLayer in training (modeling_vit.py, modeling_dinov2.py,
    modeling_siglip.py): pre-norm blocks with separate q/k/v Linear layers, SDPA (flash on the H200: it keeps
    q, k, v, its output and the log-sum-exp), the output projection, an MLP with GELU; DINOv2 scales both
    branches by a learned vector (the multiply keeps its input). Under autocast, layer norms and residual adds
    run in fp32 and every Linear keeps its bf16 input."""
    dt, B, img, h, mlp, p, heads, n = hf_shape(spec, w)
    e, r = dt.act, dt.resid
    cfg = spec.vision
    T = B * n
    th = T * h * e
    saved: list[tuple[int, int, int]] = []

    def save(nbytes: int, grad: int = 0, wgrad: int = 0) -> None:
        saved.append((prog.alloc("activations", nbytes), grad, wgrad))

    # the patch convolution keeps its input (the probe's images, or autocast's bf16 copy of them)
    save(B * 3 * img * img * (2 if dt.autocast else e), 0, 3 * p * p * h * dt.param)
    x = prog.alloc("activations", T * h * r)  # [CLS +] patches + positions
    for _ in range(int(cfg["num_layers"])):
        save(T * h * r, T * h * r)  # layer norm 1 input
        if dt.autocast:  # the fp32 layer-norm output is cast to bf16 once per Linear (q, k, v): three copies kept
            for _cast in range(3):
                save(th, 0, h * h * dt.param)
        else:
            save(th, 0, 3 * h * h * dt.param)  # q/k/v input
        for _qkv in range(3):
            save(th, th)  # q, k, v: kept by the attention kernel
        # the kernel's output, laid out (B, N, heads, head_dim): transpose(1, 2).contiguous() makes no copy, and
        # the same tensor is the output projection's input
        save(th, th, h * h * dt.param)
        save(B * heads * n * 4)  # log-sum-exp
        if cfg.get("layer_scale"):
            save(th, th)  # output projection's result, kept by layer scale 1
        save(T * h * r, T * h * r)  # layer norm 2 input
        save(th, 0, h * mlp * dt.param)  # fc1 input
        save(T * mlp * e, T * mlp * e)  # GELU input
        save(T * mlp * e, T * mlp * e, mlp * h * dt.param)  # fc2 input
        if cfg.get("layer_scale"):
            save(th, th)  # fc2's result, kept by layer scale 2
    save(T * h * r, T * h * r)  # final layer norm input
    classes = int(cfg.get("num_classes", 0))
    if cfg["head"] == "cls":  # the classifier reads the CLS token, a view that keeps the whole normed output
        save(T * h * (4 if dt.autocast else e), 0, h * classes * dt.param)
    elif cfg["head"] == "cls_mean":  # cat([CLS, mean of patches]): only the (B, 2h) input is kept
        save(B * 2 * h * e, 0, 2 * h * classes * dt.param)
    else:  # SigLIP's attention pooling: one probe query over every token (nn.MultiheadAttention)
        save(T * h * (4 if dt.autocast else e), 0, 4 * h * h * dt.param)  # post-layernorm output
        save(2 * th, 2 * th)  # k and v projections
        save(B * h * e * 4, 0, 2 * h * mlp * dt.param)  # the pooled token through its layer norm and MLP
        save(B * mlp * e * 2)
    prog.free(x)
    return saved


def mlp_nograd(prog: Program, norm_bytes: int, hidden_bytes: int, out_bytes: int) -> int:
    """A vision transformer's second half without autograd: the layer norm's output, fc1, the GELU (fc1's output
    goes), fc2 (the GELU's and the norm's outputs go). Returns fc2's output."""
    ln2 = prog.alloc("activations", norm_bytes)
    fc1 = prog.alloc("activations", hidden_bytes)
    act = prog.alloc("activations", hidden_bytes)
    prog.free(fc1)
    fc2 = prog.alloc("activations", out_bytes)
    prog.free(act)
    prog.free(ln2)
    return fc2


def hf_nograd(prog: Program, spec: ModelSpec, w: Workload, first: bool) -> None:
    """The same blocks under torch.no_grad(): a layer's input lives until its second residual add is made."""
    dt, B, img, h, mlp, p, heads, n = hf_shape(spec, w)
    e, r = dt.act, dt.resid
    cfg = spec.vision
    T = B * n
    th = T * h * e
    patches = (img // p) ** 2
    cast = prog.alloc("activations", B * 3 * img * img * 2) if dt.autocast else 0
    conv = prog.alloc("activations", B * patches * h * e)
    prog.free(cast)
    if cfg.get("cls_token"):
        cat = prog.alloc("activations", T * h * r)
        prog.free(conv)
        conv = cat
    x = prog.alloc("activations", T * h * r)  # + positions
    prog.free(conv)
    emb = x  # the embeddings' output: held by the model's forward until the encoder returns
    for _ in range(int(cfg["num_layers"])):
        ln1 = prog.alloc("activations", T * h * r)
        qkv = [prog.alloc("activations", th) for _q in range(3)]
        if first:  # the first cuBLAS matmul: its handle's workspace, kept
            prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
            first = False
        attn = prog.alloc("activations", th)  # laid out (B, N, heads, head_dim): no copy for the projection
        prog.transient("activations", B * heads * n * 4)  # log-sum-exp
        if spec.model_type in ("vit", "dinov2"):
            # ViTSelfAttention / Dinov2SelfAttention return the context and drop q, k and v before the output
            # dense (ViTSelfOutput) runs: its output can take q's block (the recorded history of DINOv2-base
            # inference, inf_dinov2_base_b64: q, k, v freed, then the dense's output). SigLIP's out_proj runs
            # inside the attention's forward, with q, k and v still held.
            prog.free_all(qkv)
            out = prog.alloc("activations", th)
        else:
            out = prog.alloc("activations", th)
            prog.free_all(qkv)
        prog.free(attn)
        held: list[int] = []
        if cfg.get("layer_scale"):
            # transformers 5.17's Dinov2Layer.forward (what the H200 ran) keeps the norm's output and the scaled
            # attention output in locals until the layer returns; 5.24's rewrite frees them (its trace does)
            scaled = prog.alloc("activations", th)
            prog.free(out)
            held = [ln1, scaled]
            out = 0
        else:
            prog.free(ln1)
        x1 = prog.alloc("activations", T * h * r)
        prog.free(out)
        fc2 = mlp_nograd(prog, T * h * r, T * mlp * e, th)
        if cfg.get("layer_scale"):
            scaled = prog.alloc("activations", th)
            prog.free(fc2)
            fc2 = scaled
        x2 = prog.alloc("activations", T * h * r)
        prog.free(fc2)
        prog.free(x1)
        prog.free_all(held)
        if x != emb:
            prog.free(x)
        x = x2
    final = prog.alloc("activations", T * h * r)
    if x != emb:
        prog.free(x)
    prog.free(emb)
    if cfg["head"] == "attention_pool":
        kv = prog.alloc("activations", 2 * th)
        prog.transient("activations", B * mlp * e)
        prog.free(kv)
        out = prog.alloc("activations", B * h * e)
    else:
        out = prog.alloc("activations", B * int(cfg.get("num_classes", 1000)) * e)
    prog.free(final)
    prog.free(out)
