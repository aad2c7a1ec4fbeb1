"""torchtune recipe YAML: its keys mapped onto the workload's fields, its model builders onto checkpoints
(data/torchtune_models.json), and the keys gpuready does not use.

Field names and meanings: https://docs.pytorch.org/torchtune/stable/deep_dives/configs.html and the shipped
recipes, e.g. https://github.com/pytorch/torchtune/blob/main/recipes/configs/llama3/8B_lora_single_device.yaml
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path

from gpuready.workload.formats.reader import _as_bool, _as_int, _Reader
from gpuready.workload.formats.result import Mapped
from gpuready.workload.formats.shared import _map_optim

_TT_NO_EFFECT = {
    "output_dir", "tokenizer._component_", "tokenizer.path", "tokenizer.merges_file", "tokenizer.prompt_template",
    "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch", "lr_scheduler", "optimizer.lr",
    "optimizer.weight_decay", "optimizer.betas", "optimizer.eps", "optimizer.fused", "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats", "log_level", "profiler", "device", "resume_from_checkpoint", "save_adapter_weights_only",
    "model.lora_alpha", "model.lora_dropout", "loss._component_", "checkpointer._component_",
    "checkpointer.checkpoint_files", "checkpointer.recipe_checkpoint", "checkpointer.output_dir",
    "checkpointer.model_type", "checkpointer.adapter_checkpoint", "clip_grad_norm", "run_val_every_n_steps",
    "dataset_val", "batch_size_val", "custom_sharded_layers", "fsdp_reshard_after_forward", "quantizer",
}  # fmt: skip
_TT_NOT_MODELLED = {
    "enable_activation_offloading": "activations offloaded to the CPU: less than sized",
    "optimizer_in_bwd": "optimizer step fused into backward: gradients freed per parameter (less than sized)",
    "compile": "torch.compile changes activation memory",
    "fsdp_cpu_offload": "parameters offloaded to the CPU: less than sized",
    "model.apply_lora_to_output": "LoRA on the output projection (the adapter is sized without it)",
    "model.use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "model.quantize_base": "",
    "tensor_parallel_dim": "tensor parallelism",
}
# torchtune module names -> transformers' (peft targets the HF names); torchtune's MLP: w1 gate, w2 down, w3 up
_TT_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


@functools.cache
def _torchtune_builders() -> dict[str, str]:
    text = resources.files("gpuready.workload").joinpath("data/torchtune_models.json").read_text(encoding="utf-8")
    builders: dict[str, str] = json.loads(text)["builders"]
    return builders


def _torchtune(r: _Reader) -> None:
    r.known(_TT_NO_EFFECT, _TT_NOT_MODELLED)
    component = str(r.get("model._component_") or "")
    builder = component.rsplit(".", 1)[-1]
    method = "full"
    for prefix, m in (("qlora_", "qlora"), ("lora_", "lora")):
        if builder.startswith(prefix):
            builder, method = builder[len(prefix) :], m
            break
    if _as_bool(r.get("model.quantize_base", False)):
        method = "qlora"
    base = re.sub(r"_(base|instruct)$", "", builder)
    ckpt_dir = r.peek("checkpointer.checkpoint_dir")
    local = None
    if ckpt_dir is not None:
        d = Path(str(ckpt_dir)).expanduser()
        if not d.is_absolute():
            d = Path(r.out.path).parent / d
        if (d / "config.json").is_file():
            local = d
    if local is not None:
        r.set("model", str(local), "checkpointer.checkpoint_dir", ckpt_dir)
        r.out.mapped.append(Mapped("model._component_", component, "model", "(the checkpoint's config.json)"))
    elif base in _torchtune_builders():
        r.set("model", _torchtune_builders()[base], "model._component_", component)
        if ckpt_dir is not None:
            r.used.add("checkpointer.checkpoint_dir")
            r.note(f"checkpointer.checkpoint_dir {ckpt_dir} has no config.json here; the model is {component}'s shape")
    elif component:
        r.problem("model", f"model._component_: {component} is not a builder gpuready knows; give MODEL")
    r.set("method", method, "model._component_", component)
    if method != "full":
        if r.has("model.lora_rank"):
            r.set("lora_r", _as_int(r, "model.lora_rank"), "model.lora_rank")
        attn = r.get("model.lora_attn_modules") or []
        names = [_TT_ATTN.get(str(a), str(a)) for a in attn]
        if _as_bool(r.get("model.apply_lora_to_mlp", False)):
            names += ["gate_proj", "up_proj", "down_proj"]
        if names:
            r.set("lora_targets", names, "model.lora_attn_modules", attn)
        mlp = "lora_targets += gate_proj, up_proj, down_proj" if "up_proj" in names else "off"
        r.also("model.apply_lora_to_mlp", mlp)
    seq = _as_int(r, "tokenizer.max_seq_len")
    if seq is not None:
        r.set("seq", seq, "tokenizer.max_seq_len")
    else:
        r.note("tokenizer.max_seq_len not set: sequences as long as the data; gpuready's default 2048 used (--seq)")
    packed = r.peek("dataset.packed")
    if packed is not None:
        r.used.add("dataset.packed")
        r.out.mapped.append(
            Mapped("dataset.packed", packed, "", "rows packed to full length" if packed else "seq is the upper bound")
        )
    if r.has("batch_size"):
        r.set("batch", _as_int(r, "batch_size"), "batch_size")
    if r.has("gradient_accumulation_steps"):
        r.set("grad_accum", _as_int(r, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    if r.has("enable_activation_checkpointing"):
        v = _as_bool(r.get("enable_activation_checkpointing"))
        r.set("grad_ckpt", v, "enable_activation_checkpointing")
    dtype = str(r.get("dtype") or "").lower()
    if dtype:
        table = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "fp16": "fp16"}
        if dtype in table:
            r.set("precision", table[dtype], "dtype")
        else:
            r.problem("precision", f"dtype: {dtype!r} is not modelled; bf16, fp32")
    if r.has("optimizer._component_"):
        _map_optim(r, "optimizer._component_", r.get("optimizer._component_"))
    if r.has("fsdp_cpu_offload") or r.has("fsdp_reshard_after_forward") or r.has("data_parallel_shard_dim"):
        key = next(k for k in ("fsdp_reshard_after_forward", "fsdp_cpu_offload", "data_parallel_shard_dim") if r.has(k))
        r.set("shard", "fsdp", key, r.peek(key))
        r.problem("gpus", f"{key}: a distributed recipe (FSDP2); say how many GPUs with --gpus N")
    loss = str(r.peek("loss._component_") or "").lower()
    if "chunked" in loss or "linearcrossentropy" in loss:
        r.not_modelled["loss._component_"] = "chunked cross-entropy never holds the whole logits: less than sized"
        r.no_effect.discard("loss._component_")
