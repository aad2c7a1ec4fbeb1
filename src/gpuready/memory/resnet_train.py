"""torchvision's ResNet in training, op by op as the recorded H200 histories run it (the probe's loop: the batch
made once, then forward, cross-entropy, backward, AdamW and zero_grad(set_to_none=True), three steps).

What the histories show (h40_train_resnet18_bf16_b512, h34_resnet50_bf16_b128, h34_resnet18_fp32_b64_320,
h41_resnet101_train_mixed_b96):

- a convolution makes its output, then cuDNN's workspace for a moment; under autocast it first makes its weight's
  bf16 copy (and the stem the images' bf16 cast), which it keeps for its backward. The workspace is a multiple of
  the output by kernel and stride (the inference multiples, memory/vision.py) plus, for a 3x3, a copy of its filter
  and 147 bytes (exact in every 3x3 of the first three stages of all four histories: 64 x 64 channels in bf16 take
  2 x 205,520,896 + 73,728 + 147 B at 512 images), and the stem's 50,192 B (bf16) or 25,104 B (fp16);
- batch norm makes its output and its saved mean and inverse std (fp32, a channel each); ReLU works in place; a
  block's projection (the downsample) is added into the main path in place and its batch-norm output dropped as the
  block returns; the stem's max pooling keeps int64 indices;
- backward, block by block from the last: ReLU's backward makes a new gradient and drops the incoming one and the
  output it kept; batch norm's makes the input's gradient and the weight's and bias's, then drops the incoming
  gradient (where nothing else holds it), the convolution's output, its mean and inverse std; a convolution's makes
  the input's gradient, cuDNN's workspace for it (the forward's bytes), the weight's gradient and its workspace
  (taken as the forward's: cuDNN's split-K partial sums make it 0.4-16 MiB larger, by shape and batch), then drops
  the incoming gradient (under autocast: the weight's gradient in bf16, cast to the fp32 .grad, the weight's copy
  dropped); the projection's path runs before the main path's, whose input gradient is added in place into the one
  the block's input already has and dropped; a block's input goes with the first convolution that read it last;
- the classifier's matmuls make the cuBLAS handle's workspace (32 MiB) and a 1 MiB block on the first step, and the
  backward thread's workspace at its first matmul, all kept.

Allocated at the peak: -0.1 to -0.7% on the eight single-GPU training rows (-0.5 to -4.4% before). The replay alone
falls 1-27% short of the recorded reserves: the weight gradients' larger workspaces and the 1x1 convolutions' own
(a bottleneck's 1x1 weight gradient takes up to 5x its output) make segments the program does not, so the reserve
keeps its floor of six largest feature maps (vision.cudnn_workspace_bytes). The weights and AdamW's states stay one
block each.

What the weight gradients' workspaces add, measured (not modelled): over the input gradient's, a 3x3 takes
468 B x cin x cout at 56 x 56 and 28 x 28 at every recorded batch (96-512 images: 13 fp32 split-K partials of the
9 taps), 72-252 B x cin x cout at 14 x 14 (2-7 splits as the batch grows: 96, 128, 512 images) and 12-30 at 7 x 7;
a strided 1x1 projection 16-192 B x cin x cout; the stem 6.1 MB at 512 images in bf16. With h40_train_resnet18's
own figures put in per convolution, the replay alone comes to 9.01 GiB against the GPU's 9.36 (6.87 without): the
split counts at other batches and shapes are what a model of them would need.
"""

from __future__ import annotations

from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES
from gpuready.memory.optimizer import Trainable, optimizer_step
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import Conv, conv_input_elements, conv_side, resnet_convs
from gpuready.workload import Workload

CLASSES = 1000
FIRST_MATMUL_BLOCK = 1 << 20  # the 1 MiB block the first step's first matmul makes and keeps (all four histories)
WORKSPACE_EXTRA = 147  # bytes past the multiple (and a 3x3's filter copy) in every recorded convolution workspace
STEM_WORKSPACE_EXTRA = {"bf16": 50_192, "mixed": 50_192, "fp16": 25_104}  # the stem's (bf16 under autocast too)


class _Step:
    """One training step's tensors; its methods make each op's events in the recorded order."""

    def __init__(
        self,
        prog: Program,
        w: Workload,
        convs: list[tuple[Conv, int]],
        ratios: dict[tuple[int, int], float],
        grads: list[int],
        accumulate: bool,
    ) -> None:
        dt = dtypes_for(w)
        self.prog, self.w, self.convs, self.ratios = prog, w, convs, ratios
        self.e, self.auto, self.param = dt.act, dt.autocast, dt.param
        self.copies: list[tuple[int, int]] = []  # per conv: its weight's bf16 copy and the images' cast (autocast)
        self.outs: list[int] = []  # per conv: its output (kept by its batch norm)
        self.bns: list[tuple[int, int, int]] = []  # per batch norm: output, mean, inverse std
        self.grads = grads  # the weights' gradients, kept to the optimizer's step
        self.accumulate = accumulate  # a later micro-batch: each new gradient is added into .grad and freed

    def grad(self, nbytes: int) -> None:
        """A weight's gradient made: kept as .grad, or (a later micro-batch) added into it and freed."""
        handle = self.prog.alloc("gradients", nbytes)
        if self.accumulate:
            self.prog.free(handle)
        else:
            self.grads.append(handle)

    def out_bytes(self, k: int) -> int:
        return self.w.batch * self.out_per_image(k)

    def out_per_image(self, k: int) -> int:
        conv, scale = self.convs[k]
        return conv.cout * conv_side(self.w.image_size, scale) ** 2 * self.e

    def in_bytes(self, k: int) -> int:
        return conv_input_elements(self.w.batch, self.w.image_size, *self.convs[k]) * self.e

    def workspace(self, k: int) -> int:
        conv = self.convs[k][0]
        ratio = self.ratios.get((conv.kernel, conv.stride), 0.0)
        if not ratio:
            return 0
        if conv.kernel == 7:
            extra = STEM_WORKSPACE_EXTRA.get(self.w.precision, 0)
        else:
            extra = WORKSPACE_EXTRA + (conv.cin * conv.cout * 9 * self.e if conv.kernel == 3 else 0)
        # (per image, then times the batch: affine in it, so the job's batch template holds; memory/template.py)
        return self.w.batch * int(ratio * self.out_per_image(k)) + extra

    def filter_numel(self, k: int) -> int:
        conv = self.convs[k][0]
        return conv.cin * conv.cout * conv.kernel**2

    # --- forward
    def conv_bn(self, k: int, cast: int = 0) -> int:
        """Conv k (its weight copy under autocast, output, workspace) and its batch norm; the norm's output."""
        alloc = self.prog.alloc
        copy = alloc("autocast_weight_copies", self.filter_numel(k) * 2) if self.auto else 0
        self.copies.append((copy, cast))
        self.outs.append(alloc("activations", self.out_bytes(k)))
        ws = self.workspace(k)
        if ws:
            self.prog.transient("cudnn_workspaces", ws)
        bn = alloc("activations", self.out_bytes(k))
        cout = self.convs[k][0].cout
        self.bns.append((bn, alloc("activations", cout * 4), alloc("activations", cout * 4)))
        return bn

    # --- backward
    def relu_back(self, grad: int, result: int, nbytes: int) -> int:
        new = self.prog.alloc("activations", nbytes)
        self.prog.free(grad)
        self.prog.free(result)
        return new

    def bn_back(self, k: int, grad: int, release_grad: bool) -> int:
        alloc, free = self.prog.alloc, self.prog.free
        gi = alloc("activations", self.out_bytes(k))
        cout = self.convs[k][0].cout
        if self.accumulate:  # (the weight's and bias's gradients both made, then added in)
            self.prog.free_all([alloc("gradients", cout * self.param), alloc("gradients", cout * self.param)])
        else:
            self.grads += [alloc("gradients", cout * self.param), alloc("gradients", cout * self.param)]
        if release_grad:
            free(grad)
        free(self.outs[k])
        free(self.bns[k][1])
        free(self.bns[k][2])
        return gi

    def conv_back(self, k: int, grad: int, input_grad: bool) -> int:
        alloc, free = self.prog.alloc, self.prog.free
        gx = alloc("activations", self.in_bytes(k)) if input_grad else 0
        ws = self.workspace(k)
        if input_grad and ws:
            self.prog.transient("cudnn_workspaces", ws)
        numel = self.filter_numel(k)
        wg = alloc("gradients", numel * (2 if self.auto else self.param))
        if ws:
            self.prog.transient("cudnn_workspaces", ws)
        free(grad)
        if self.auto:
            copy, cast = self.copies[k]
            free(cast)  # (the images' cast, kept by the stem)
            free(copy)
            self.grad(numel * 4)
            free(wg)
        elif self.accumulate:
            free(wg)
        else:
            self.grads.append(wg)
        return gx


def resnet_train_steps(
    prog: Program, spec: ModelSpec, w: Workload, trainable: list[Trainable], ratios: dict[tuple[int, int], float]
) -> None:
    """The job's steps after its weights are loaded; `ratios`: cuDNN's workspace per output by (kernel, stride)."""
    dt = dtypes_for(w)
    B, img = w.batch, w.image_size
    bottleneck = spec.vision["block"] == "bottleneck"
    convs = resnet_convs(spec.vision["block"], list(spec.vision["layers"]))
    images = prog.alloc("activations", B * 3 * img * img * dt.param)
    prog.alloc("activations", B * 8)  # the labels, int64
    state: list[int] | None = None
    for step in range(3):
        prog.mark_step()
        grads: list[int] = []
        # gradient accumulation (the probe's loop): the first micro-batch's gradients stay through the next, whose
        # new gradients are each added into .grad in place and freed; the third and later repeat the second
        losses = [
            _micro_batch(prog, w, _Step(prog, w, convs, ratios, grads, micro > 0), bottleneck, step == 0 and micro == 0)
            for micro in range(min(w.grad_accum, 2))
        ]
        prog.set_phase("optimizer step")
        rest = sum(t.nbytes for t in trainable) - sum(prog.size_of(h) for h in grads)
        if rest > 0:
            grads.append(prog.alloc("gradients", rest))
        state = optimizer_step(prog, w.optim, trainable, state)
        prog.free_all(grads)
        prog.free_all(losses)
    prog.free(images)


def _micro_batch(prog: Program, w: Workload, s: _Step, bottleneck: bool, first: bool) -> int:
    """One micro-batch's forward, loss and backward (`first`: the job's first, which makes the cuBLAS handles'
    workspaces); returns the loss's handle, kept to the step's end."""
    dt = dtypes_for(w)
    e, auto = dt.act, dt.autocast
    B, img, convs = w.batch, w.image_size, s.convs
    per_block = 3 if bottleneck else 2
    features = 512 * (4 if bottleneck else 1)
    alloc, free = prog.alloc, prog.free
    prog.set_phase("forward")
    stem = s.conv_bn(0, alloc("activations", B * 3 * img * img * 2) if auto else 0)
    pooled = B * convs[0][0].cout * conv_side(img, 4) ** 2
    pool_out, indices = alloc("activations", pooled * e), alloc("activations", pooled * 8)
    x, k = pool_out, 1
    blocks: list[tuple[int, int, bool]] = []  # (first conv, block input, has a projection)
    while k < len(convs):
        start, block_in = k, x
        for j in range(per_block):
            x = s.conv_bn(k + j)
        k += per_block
        projected = k < len(convs) and convs[k][0].downsample
        if projected:
            free(s.conv_bn(k))  # added into the main path in place, dropped as the block returns
            k += 1
        blocks.append((start, block_in, projected))
    pooled_feat = alloc("activations", B * features * e)
    fc_copy = alloc("autocast_weight_copies", (features + 1) * CLASSES * 2) if auto else 0
    logits = alloc("activations", B * CLASSES * e)
    if first:
        alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
        alloc("cublas_workspaces", FIRST_MATMUL_BLOCK)
    le = 4 if auto else e  # cross-entropy runs in fp32 under autocast
    log_probs = alloc("logits_and_loss", B * CLASSES * le)
    loss, total = alloc("logits_and_loss", le), alloc("logits_and_loss", le)
    free(logits)
    prog.set_phase("backward")
    ones = alloc("logits_and_loss", le)
    g = alloc("logits_and_loss", B * CLASSES * le)
    free(total)
    g2 = alloc("logits_and_loss", B * CLASSES * le)
    free(g)
    free(log_probs)
    if auto:  # the loss's fp32 gradient cast to bf16 for the classifier
        g16 = alloc("activations", B * CLASSES * 2)
        free(g2)
        g2 = g16
    g_feat = alloc("activations", B * features * e)
    if first:
        alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)  # the backward thread's handle
    head_numel = (features * CLASSES, CLASSES)
    head = [alloc("gradients", n * (2 if auto else dt.param)) for n in head_numel]
    free(g2)
    free(pooled_feat)
    if auto:
        free(fc_copy)
        for n, h in zip(head_numel, head, strict=True):
            s.grad(n * 4)
            free(h)
    elif s.accumulate:
        prog.free_all(head)
    else:
        s.grads += head
    last = len(convs) - (2 if convs[-1][0].downsample else 1)
    buf = alloc("activations", s.out_bytes(last))  # average pooling's backward
    free(g_feat)
    for start, block_in, projected in reversed(blocks):
        end = start + per_block  # (the projection's index when there is one)
        r = s.relu_back(buf, s.bns[end - 1][0], s.out_bytes(end - 1))
        buf = s.conv_back(end, s.bn_back(end, r, release_grad=False), True) if projected else r
        grad = s.bn_back(end - 1, r, release_grad=projected)
        for j in range(per_block - 1, 0, -1):
            g_in = s.conv_back(start + j, grad, True)
            prev = start + j - 1
            grad = s.bn_back(prev, s.relu_back(g_in, s.bns[prev][0], s.out_bytes(prev)), release_grad=True)
        g_in = s.conv_back(start, grad, True)
        if block_in == pool_out:
            free(pool_out)  # the first block's convolutions read the pooled maps last
        free(g_in)  # added in place into the gradient the block's input already has
    # the stem: max pooling's backward, ReLU's, batch norm's, the convolution's weight gradient
    g_pool = alloc("activations", s.out_bytes(0))
    free(buf)
    free(indices)
    s.conv_back(0, s.bn_back(0, s.relu_back(g_pool, stem, s.out_bytes(0)), release_grad=True), False)
    free(ones)
    return loss
