"""The GPU operations of one optimizer step (training) or one request (inference), enumerated from the model's
shapes and the workload, for the step-time model (plan/steptime.py).

Each `Op` is one class of kernel with its FLOPs, the bytes it moves through HBM and the number of kernel launches,
per GPU. Matmuls keep their GEMM shape (M, N, K) because small and skinny GEMMs run far below peak. What runs
follows the code that the calibration probe runs (trial/probe.py): Hugging Face transformers' eager modules
under PyTorch autograd, torchvision's ResNet/ViT, torch.optim's foreach AdamW/SGD.

- Linear layers: forward (M=tokens, N=out, K=in), the input gradient (M=tokens, N=in, K=out) and, where the
  weight trains, the weight gradient (M=out, N=in, K=tokens). LoRA keeps the frozen base's forward and input
  gradient but no weight gradient, and adds the adapter's two skinny GEMMs (rank r) each way.
- Activation checkpointing (HF gradient_checkpointing: each decoder layer re-runs its forward in backward).
- Mixture-of-experts layers as transformers 5 runs them by default (`experts_implementation="grouped_mm"`,
  integrations/moe.py `grouped_mm_experts_forward`): the router's linear and top-k, the tokens sorted by
  expert and gathered, one grouped GEMM per expert projection over the experts that received tokens, the
  routing weights, the rows put back in order and summed per token. The FLOPs follow the active parameters
  (each token through experts_per_token experts); the weights read are those of the experts hit
  (`expert_spread`: all of them at training sizes, experts_per_token of them in a batch-1 decode step).
- Attention by the kernel SDPA picks (memory/lm/context.py's `attention_backend`, read-only): flash and memory-efficient
  kernels are fused (causal: half the S² FLOPs; backward 2.5x the forward, FlashAttention-2 paper §3.1:
  five GEMMs against two); the math path and eager attention are batched GEMMs over the full S² plus
  element-wise passes over the B·heads·S² scores (scale, mask, fp32 softmax, cast back).
- Element-wise ops (norms, activations, RoPE, residual adds, dropout, the fp32 upcast of the logits and the
  cross-entropy) as bytes read + written; their backward as about twice those bytes.
- The optimizer step as the bytes its foreach kernels read and write (torch/optim/adamw.py `_multi_tensor_adamw`:
  lerp, mul, addcmul, sqrt, div, add, addcdiv over params/grads/states: 20 tensor passes; SGD with momentum 8).
- Vision: ResNet convolutions as implicit GEMMs (M = batch·H·W, N = C_out, K = C_in·k²), batch norm and ReLU
  as element-wise passes; ViT as a transformer encoder (nn.MultiheadAttention through SDPA).
- Several GPUs: DDP's gradient all-reduce, FSDP2's parameter all-gathers (forward and backward) and gradient
  reduce-scatter, as bytes on the link (`comm` ops; plan/steptime.py overlaps them with compute).

The package: base.py (the `Op` record and the builders the others share), attention.py, moe.py (mixture-of-experts
layers), lora.py (LoRA adapters, QLoRA's dequantization), lm.py (decoder-only LMs: a training or prefill micro-batch,
a decode step), vision.py (ResNet, ViT), optimizer.py (the optimizer step), step.py (a whole training step and its
communication across GPUs).
"""

from gpuready.plan.ops.base import Kind, Math, Op
from gpuready.plan.ops.lm import lm_decode_ops, lm_ops
from gpuready.plan.ops.moe import MOE_ROUTING_KERNELS, expert_spread
from gpuready.plan.ops.optimizer import (
    ADAFACTOR_BYTES,
    ADAFACTOR_KERNELS,
    FOREACH_TENSORS_PER_LAUNCH,
    OPTIMIZER_KERNELS,
    OPTIMIZER_PASSES,
    PER_TENSOR_KERNELS,
    optimizer_ops,
    param_tensors,
    trainable_params,
)
from gpuready.plan.ops.step import comm_ops, training_ops
from gpuready.plan.ops.vision import vision_ops

__all__ = [
    "ADAFACTOR_BYTES",
    "ADAFACTOR_KERNELS",
    "FOREACH_TENSORS_PER_LAUNCH",
    "MOE_ROUTING_KERNELS",
    "OPTIMIZER_KERNELS",
    "OPTIMIZER_PASSES",
    "PER_TENSOR_KERNELS",
    "Kind",
    "Math",
    "Op",
    "comm_ops",
    "expert_spread",
    "lm_decode_ops",
    "lm_ops",
    "optimizer_ops",
    "param_tensors",
    "trainable_params",
    "training_ops",
    "vision_ops",
]
