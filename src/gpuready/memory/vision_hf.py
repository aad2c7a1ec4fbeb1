"""transformers' vision encoders (ViT, DINOv2, SigLIP) as GPU allocations: training (hf_forward, what each
layer keeps for backward) and inference under no_grad (hf_nograd). memory/vision.py builds the programs around
them (weights, the steps, the optimizer)."""

from __future__ import annotations

from typing import Any

from gpuready.memory.dtypes import Dtypes, dtypes_for
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES, reduce_buffer_bytes
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.workload import Workload

# what a forward keeps for one backward op: (handle, bytes of its input's gradient, bytes of its weight's gradient,
# bytes its backward takes for a moment after those: a bias gradient's reduction buffer (ops.reduce_buffer_bytes) or
# the patch convolution's workspace)
Saved = tuple[int, int, int, int]


class Kept:
    """What a vision forward keeps for its backward, in forward order (`saved`), over `rows` tokens."""

    def __init__(self, prog: Program, rows: int) -> None:
        self.prog, self.rows = prog, rows
        self.saved: list[Saved] = []

    def keep(self, handle: int, grad: int = 0, wgrad: int = 0, outputs: int = 0, after: int = 0) -> int:
        """Keep `handle` (0: nothing of its own) for a backward op that makes `grad` and `wgrad` bytes, then takes
        `after` bytes for a moment, or, for a Linear whose bias gradient sums its `outputs` over the rows, that
        reduction's buffer; returns the handle."""
        self.saved.append((handle, grad, wgrad, reduce_buffer_bytes(outputs, self.rows) if outputs else after))
        return handle

    def save(self, nbytes: int, grad: int = 0, wgrad: int = 0, outputs: int = 0) -> int:
        """A new activation of `nbytes`, kept as `keep` says."""
        return self.keep(self.prog.alloc("activations", nbytes), grad, wgrad, outputs)

    def copy(self, numel: int, autocast: bool) -> None:
        """Under autocast, a weight's bf16 copy made where its layer first runs and kept for its backward (h29)."""
        if autocast:
            self.keep(self.prog.alloc("autocast_weight_copies", numel * 2))


def tokens(cfg: dict[str, Any], img: int) -> int:
    return (img // int(cfg["patch_size"])) ** 2 + (1 if cfg.get("cls_token") else 0)


def hf_shape(spec: ModelSpec, w: Workload) -> tuple[Dtypes, int, int, int, int, int, int, int]:
    """A transformers vision encoder's job: dtypes, batch, image size, hidden, MLP width, patch size, heads and
    tokens per image ([CLS] and registers included)."""
    cfg = spec.vision
    h, mlp, p, heads = (int(cfg[k]) for k in ("hidden_dim", "mlp_dim", "patch_size", "num_heads"))
    return dtypes_for(w), w.batch, w.image_size, h, mlp, p, heads, tokens(cfg, w.image_size)


# cuDNN's workspace for a ViT's patch convolution (kernel = stride = patch), taken for a moment in its forward and in
# its weight gradient, as whole multiples of the convolution's output. The recorded H200 histories at 32-128 images
# show 3.16-3.83x forward and 4.14-5.39x backward (h29_vit_l16_mixed_b32: 40.75 and 64.75 MiB over a 12.25 MiB output;
# h29_hf_vitl_mixed_b64: 77.5 and 101.5 over 24.5; h30_hf_vitb_bf16_b128: 137.75 and 161.75 over 36.75; h31, h32 in
# the same ranges), and at 1360 images none forward and 3.69x backward (h33): which algorithm cuDNN picks is not known
# ahead. Whole multiples near the top of that range: a transient counted a little large costs a little, one counted
# too small can leave out a whole segment (3x and 4x put h30's reserve at -3.7% of its replay; 4x and 5x at -2.2%);
# the fit keeps a margin for the rest (memory/fit.py "vit_train")
PATCH_CONV_WORKSPACE = (4, 5)


def patch_embedding(kept: Kept, dt: Dtypes, B: int, img: int, p: int, h: int) -> int:
    """The patch convolution of a ViT in training, up to its output (returned, for the caller to free once the
    embeddings are made): under autocast its weight's bf16 copy and the images' bf16 copy (kept), else the images
    themselves (held by vision_program: nothing made); the output; the workspace, a moment."""
    prog = kept.prog
    wgrad = 3 * p * p * h * dt.param
    out = B * (img // p) ** 2 * h * dt.act
    kept.copy(3 * p * p * h, dt.autocast)
    images = prog.alloc("activations", B * 3 * img * img * 2) if dt.autocast else 0
    kept.keep(images, 0, wgrad, after=PATCH_CONV_WORKSPACE[1] * out)
    handle = prog.alloc("activations", out)
    prog.transient("activations", PATCH_CONV_WORKSPACE[0] * out)
    return handle


def hf_forward(prog: Program, spec: ModelSpec, w: Workload, workspace: bool = False) -> list[Saved]:
    """transformers' ViTLayer / Dinov2Layer / SiglipEncoderLayer in training (modeling_vit.py, modeling_dinov2.py,
    modeling_siglip.py), as the H200 histories h29_hf_vitl_mixed_b64 (autocast) and h30_hf_vitb_bf16_b128 record
    them: pre-norm blocks with separate q/k/v Linear layers, SDPA (flash on the H200: it keeps q, k, v, its output
    and the log-sum-exp), the output projection, an MLP with GELU; DINOv2 scales both branches by a learned vector
    (the multiply keeps its input). The residual stream's sums are each kept by the next norm; a branch's last
    output lives until its add. Under autocast, layer norms and residual adds run in fp32, every Linear makes its
    weight's bf16 copy and keeps it with a bf16 copy of its input (so a norm's output goes after its Linears), and
    the classifier keeps only the class token's copy. Every Linear has a bias: its gradient is a sum over the
    tokens, whose reduction buffer is taken after the input's and weight's gradients (h30: 132 MiB for each of
    ViT-B's linears at 128 images, the peak in the last fc2's backward). `workspace`: the first Linear makes the
    cuBLAS handle's workspace (a process's first step)."""
    dt, B, img, h, mlp, p, heads, n = hf_shape(spec, w)
    e, r = dt.act, dt.resid
    ac = dt.autocast
    cfg = spec.vision
    T = B * n
    th = T * h * e
    scale = bool(cfg.get("layer_scale"))
    kept = Kept(prog, T)
    save = kept.save

    def copy(numel: int) -> None:
        kept.copy(numel, ac)

    # SigLIP has no class token to concatenate: its embeddings are the patch convolution's output viewed transposed
    # plus the positions, a sum that keeps the channel-major layout, and so does every residual sum after it; each
    # LayerNorm's kernel then reads a contiguous copy of its input, made and freed around its output (history
    # h32_siglip_b_bf16_b64; ViT and DINOv2 concatenate, and show none)
    strided = not cfg.get("cls_token")

    def norm() -> int:
        """A LayerNorm's output (fp32 under autocast); its mean and rstd kept."""
        tmp = prog.alloc("activations", T * h * r) if strided else 0
        y = prog.alloc("activations", T * h * r)
        save(T * 4)
        save(T * 4)
        prog.free(tmp)
        return y

    def branch_end(y: int, out: int) -> int:
        """A branch's last output `out` through layer scale (DINOv2) and into the residual add: the new sum."""
        if scale:  # the multiply keeps its input; its product lives until the add
            kept.keep(out, th)
            out = prog.alloc("activations", T * h * r)
        if ac:
            prog.free(y)  # the norm's output (without autocast a Linear keeps it)
        total = prog.alloc("activations", T * h * r)
        prog.free(out)
        return total

    patches = patch_embedding(kept, dt, B, img, p, h)
    cat = prog.alloc("activations", T * h * r) if cfg.get("cls_token") else 0  # [CLS] + patches
    prog.free(patches)
    res = prog.alloc("activations", T * h * r)  # + positions
    prog.free(cat)
    for layer in range(int(cfg["num_layers"])):
        kept.keep(res, T * h * r)  # layer norm 1's input
        y = norm()
        if not ac:  # q/k/v's input, kept once; each projection's weight gradient and bias reduction its own
            for proj in range(3):
                kept.keep(0 if proj else y, 0, h * h * dt.param, h)
        for qkv in range(3):
            if ac:
                copy(h * h)
                save(th, 0, h * h * dt.param, h)  # the input's bf16 copy, kept
            save(th, th)  # q, k, v: kept by the attention kernel
            if workspace and layer == 0 and qkv == 0:
                prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
        # the kernel's output, laid out (B, N, heads, head_dim): transpose(1, 2).contiguous() makes no copy, and
        # the same tensor is the output projection's input
        save(th, th, h * h * dt.param, h)
        save(B * heads * n * 4)  # log-sum-exp
        copy(h * h)
        res = branch_end(y, prog.alloc("activations", th))
        kept.keep(res, T * h * r)  # layer norm 2's input
        y = norm()
        copy(h * mlp)
        if ac:
            save(th, 0, h * mlp * dt.param, mlp)  # fc1's input, cast to bf16
        else:
            kept.keep(y, 0, h * mlp * dt.param, mlp)
        save(T * mlp * e, T * mlp * e)  # GELU input
        save(T * mlp * e, T * mlp * e, mlp * h * dt.param, h)  # fc2 input
        copy(mlp * h)
        res = branch_end(y, prog.alloc("activations", th))
    kept.keep(res, T * h * r)  # the final layer norm's input
    y = norm()
    classes = int(cfg.get("num_classes", 0))
    if cfg["head"] == "cls":  # the classifier reads the CLS token, a view that keeps the whole normed output
        copy(h * classes)
        if ac:  # but autocast's bf16 copy of the token is what it keeps
            save(B * h * 2, 0, h * classes * dt.param)
            prog.free(y)
        else:
            kept.keep(y, 0, h * classes * dt.param)
    elif cfg["head"] == "cls_mean":  # cat([CLS, mean of patches]): only the (B, 2h) input is kept
        save(B * 2 * h * e, 0, 2 * h * classes * dt.param)
        prog.free(y)
    else:  # SigLIP's attention pooling: one probe query over every token (nn.MultiheadAttention, batch_first)
        # (h32_siglip_b_bf16_b64) the packed k/v projection reads the normed tokens through a transposed view, so
        # its matmul keeps a contiguous copy of them; the projection is copied contiguous again for the heads and
        # that copy is kept; the norm's output goes once the head has run
        # (h35_siglip_so400m_bf16_b24) each weight's gradient is made on its own: the MLP's two, the output
        # projection's, then the packed in_proj's (its k/v and q parts made for a moment and concatenated); the k/v
        # bias's gradient takes a reduction buffer (132 MiB in h32)
        save(th, 0, 3 * h * h * dt.param, 2 * h)
        kv = prog.alloc("activations", 2 * th)
        save(2 * th, 2 * th)
        prog.free(kv)
        save(B * h * e, 0, h * h * dt.param)  # the attention's output, into out_proj
        save(B * h * e * 4, 0, h * mlp * dt.param)  # the pooled token through its layer norm, into fc1
        save(B * mlp * e * 2, 0, mlp * h * dt.param)  # the GELU's output, into fc2
        prog.free(y)
    return kept.saved


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
