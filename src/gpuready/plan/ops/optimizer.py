"""The optimizer step and zero_grad (`optimizer_ops`): the trainable parameters and tensors, and the passes and
launches of torch.optim's foreach AdamW and SGD (torch/optim/adamw.py `_multi_tensor_adamw`: lerp, mul, addcmul, sqrt,
div, add, addcdiv over params/grads/states: 20 tensor passes; SGD with momentum 8), bitsandbytes' 8-bit AdamW and
transformers' Adafactor, plus gradient accumulation's adds into .grad.
"""

from __future__ import annotations

from gpuready.memory.dtypes import dtypes_for
from gpuready.memory.lm.context import lora_targets
from gpuready.models.spec import ModelSpec
from gpuready.models.vision import resnet_convs
from gpuready.plan.ops.base import Op, _mem
from gpuready.workload import Workload

# foreach optimizer passes over each trainable element (see module docstring)
OPTIMIZER_PASSES = {"adamw": 20, "sgd": 8, "adamw8bit": 6}
OPTIMIZER_KERNELS = {"adamw": 10, "sgd": 4}
# bitsandbytes' 8-bit optimizers update one parameter tensor per launch (optimizer_update_8bit_blockwise, or the
# 32-bit update for tensors under 4,096 elements): reads the parameter, gradient and both 8-bit states, writes them
PER_TENSOR_KERNELS = {"adamw8bit": 1}
# transformers' Adafactor.step (transformers/optimization.py), parameter by parameter, counted for a matrix from its
# code: grad.float(), p.float(), the RMS (norm, divide), grad ** 2, + eps, the two means and the row and column
# statistics' mul_/add_, _approx_sq_grad (mean, divide, rsqrt_, rsqrt, the outer product), update * grad, the
# update's RMS, clip and clamp, div_, * lr, -update, add_ into the fp32 parameter, copy_ back: 28 kernels, and
# bytes per element: 102 for a 16-bit parameter (its fp32 copies made and written back), 84 for an fp32 one
ADAFACTOR_KERNELS = 28
ADAFACTOR_BYTES = {2: 102, 4: 84}
# multi_tensor_apply launches one kernel per this many tensors (ATen/native/cuda/MultiTensorApply.cuh depth
# 4 lists: 36 tensors per launch)
FOREACH_TENSORS_PER_LAUNCH = 36


def param_tensors(spec: ModelSpec, w: Workload) -> int:
    """Trainable parameter tensors (the foreach optimizer launches kernels per group of them)."""
    if spec.kind == "vision":
        if spec.model_type == "resnet":
            return 3 * len(resnet_convs(spec.vision["block"], list(spec.vision["layers"]))) + 2
        return 12 * int(spec.vision["num_layers"]) + 6
    if w.method != "full":
        return 2 * len(lora_targets(spec, w)) * spec.layers
    per_layer = sum(1 + (1 if lin.bias else 0) for lin in spec.block_linears) + spec.norms_per_layer * (
        2 if spec.norm == "layer" else 1
    )
    return per_layer * spec.layers + 2 + (0 if spec.tied else 1)


def trainable_params(spec: ModelSpec, w: Workload) -> int:
    if w.method == "full" or spec.kind == "vision":
        return spec.params
    total = 0
    for lin in spec.block_linears:
        if lin.name in lora_targets(spec, w):
            total += w.lora_r * (lin.in_features + lin.out_features) * spec.layers
    return total


def optimizer_ops(spec: ModelSpec, w: Workload, shards: int = 1) -> list[Op]:
    """The optimizer step and zero_grad, once per optimizer step, on this GPU's share (FSDP) of the parameters."""
    n = trainable_params(spec, w) / shards
    pb = dtypes_for(w).param
    tensors = param_tensors(spec, w)
    if w.optim == "adafactor":
        # one parameter at a time; LoRA adapters and the fp32 master weights of mixed precision are fp32
        eb = pb if w.method == "full" else 4
        nbytes = n * ADAFACTOR_BYTES.get(eb, ADAFACTOR_BYTES[2])
        ops = [Op("optimizer", "memory", 0.0, nbytes, ADAFACTOR_KERNELS * tensors, module_ops=False)]
    elif w.optim in PER_TENSOR_KERNELS:
        nbytes = n * pb * OPTIMIZER_PASSES[w.optim]
        ops = [Op("optimizer", "memory", 0.0, nbytes, PER_TENSOR_KERNELS[w.optim] * tensors, module_ops=False)]
    else:
        launches = OPTIMIZER_KERNELS[w.optim] * max(1.0, tensors / FOREACH_TENSORS_PER_LAUNCH)
        ops = [_mem("optimizer", n * pb * OPTIMIZER_PASSES[w.optim], launches)]
    if w.grad_accum > 1:  # each later micro-batch adds into .grad: read both, write one
        ops.append(_mem("optimizer", n * pb * 3 * (w.grad_accum - 1), tensors * (w.grad_accum - 1)))
    return ops
