"""LLaMA-Factory YAML: its keys mapped onto the workload's fields, and those it has that gpuready does not use.

Field names and meanings: https://llamafactory.readthedocs.io/en/latest/advanced/arguments.html and
https://github.com/hiyouga/LLaMA-Factory/blob/main/examples/README.md
"""

from __future__ import annotations

from gpuready.workload.formats.reader import _as_bool, _as_int, _Reader
from gpuready.workload.formats.result import Mapped
from gpuready.workload.formats.shared import _map_attn, _map_optim, _packing, _precision_16, _zero_stage

_LF_NO_EFFECT = {
    "template", "dataset", "eval_dataset", "dataset_dir", "max_samples", "overwrite_cache", "preprocessing_num_workers",
    "dataloader_num_workers", "output_dir", "logging_steps", "save_steps", "plot_loss", "overwrite_output_dir",
    "save_only_model", "report_to", "learning_rate", "num_train_epochs", "lr_scheduler_type", "warmup_ratio",
    "warmup_steps", "ddp_timeout", "resume_from_checkpoint", "val_size", "per_device_eval_batch_size",
    "eval_strategy", "eval_steps", "lora_alpha", "lora_dropout", "trust_remote_code", "do_train", "max_grad_norm",
    "weight_decay", "seed", "save_strategy", "save_total_limit", "include_num_input_tokens_seen", "flash_attn_kwargs",
    "quantization_method", "quantization_type", "double_quantization", "tf32", "streaming", "tokenized_path",
    "adapter_name_or_path", "export_dir", "train_on_prompt", "mask_history", "default_system", "enable_thinking",
    "loraplus_lr_ratio", "hub_model_id", "push_to_hub", "run_name",
}  # fmt: skip
_LF_NOT_MODELLED = {
    "enable_liger_kernel": "Liger's fused kernels use less memory than sized",
    "use_unsloth": "Unsloth's kernels change activation memory",
    "use_unsloth_gc": "Unsloth's checkpointing offloads to the CPU",
    "upcast_layernorm": "norm weights upcast to fp32",
    "upcast_lmhead_output": "lm_head output upcast to fp32 (a larger logits tensor)",
    "additional_target": "modules trained in full next to LoRA (more than sized)",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "freeze_trainable_layers": "freeze tuning",
    "use_badam": "BAdam trains one block at a time (less than sized)",
    "use_galore": "GaLore projects optimizer states",
    "use_apollo": "APOLLO projects optimizer states",
    "shift_attn": "shifted-sparse attention",
    "neat_packing": "packing without cross-attention between samples",
    "moe_aux_loss_coef": "",
    "torch_compile": "torch.compile changes activation memory",
    "pref_beta": "",
    "pref_loss": "",
}


def _llamafactory(r: _Reader) -> None:
    r.known(_LF_NO_EFFECT, _LF_NOT_MODELLED)
    if r.has("model_name_or_path"):
        r.set("model", str(r.get("model_name_or_path")), "model_name_or_path")
    stage = str(r.get("stage") or "sft").lower()
    if stage in ("sft", "pt"):
        r.out.mapped.append(Mapped("stage", stage, "task", "train"))
    else:
        why = "(a reference or reward model besides the policy) is not modelled; sft and pt are"
        r.problem("task", f"stage: {stage!r} {why}")
    r.out.fields["task"] = "train"
    ftype = str(r.get("finetuning_type") or "lora").lower()
    qbit = _as_int(r, "quantization_bit")
    if ftype == "full":
        r.set("method", "full", "finetuning_type", ftype)
    elif ftype == "lora":
        if qbit == 4:
            r.set("method", "qlora", "finetuning_type", ftype)
            r.out.mapped.append(Mapped("quantization_bit", 4, "method", "qlora"))
        else:
            r.set("method", "lora", "finetuning_type", ftype)
            if qbit is not None:
                r.not_modelled["quantization_bit"] = f"{qbit}-bit base weights: sized as 16-bit"
                r.used.discard("quantization_bit")
        if "finetuning_type" not in r.flat:
            r.note("finetuning_type not set: LLaMA-Factory's default, lora")
    else:
        r.problem("method", f"finetuning_type: {ftype!r} is not modelled; gpuready sizes full and lora")
    if r.has("lora_rank"):
        r.set("lora_r", _as_int(r, "lora_rank"), "lora_rank")
    target = r.get("lora_target")
    if target is not None:
        names = target if isinstance(target, list) else [t.strip() for t in str(target).split(",") if t.strip()]
        if [n.lower() for n in names] == ["all"]:
            r.set("lora_targets", None, "lora_target", target)
            r.out.mapped[-1] = Mapped("lora_target", target, "lora_targets", "every linear layer")
        else:
            r.set("lora_targets", names, "lora_target", target)
    seq = _as_int(r, "cutoff_len")
    if seq is not None:
        r.set("seq", seq, "cutoff_len")
    else:
        r.out.fields["seq"] = 2048
        r.note("cutoff_len not set: LLaMA-Factory's default 2048 used")
    _packing(r, "packing", "cutoff_len")
    micro = _as_int(r, "per_device_train_batch_size")
    if micro is not None:
        r.set("batch", micro, "per_device_train_batch_size")
    accum = _as_int(r, "gradient_accumulation_steps")
    if accum is not None:
        r.set("grad_accum", accum, "gradient_accumulation_steps")
    # LLaMA-Factory turns gradient checkpointing on unless disable_gradient_checkpointing is set
    # (model/model_utils/checkpointing.py logs "Gradient checkpointing enabled.")
    off = _as_bool(r.get("disable_gradient_checkpointing", False))
    r.set("grad_ckpt", not off, "disable_gradient_checkpointing", off)
    if not off and "disable_gradient_checkpointing" not in r.flat:
        r.note("gradient checkpointing on: LLaMA-Factory's default (disable_gradient_checkpointing: false)")
    # trainable parameters are upcast to fp32 unless pure_bf16 (model/adapter.py: "Upcasting trainable params
    # to float32"); the frozen base stays in the compute dtype
    pure = _as_bool(r.get("pure_bf16", False))
    if pure:
        r.set("precision", "bf16", "pure_bf16", True)
    else:
        _precision_16(r, bf16_means="mixed" if ftype == "full" else "bf16")
        if ftype == "full" and r.out.fields.get("precision") == "mixed":
            r.note("full fine-tuning without pure_bf16: LLaMA-Factory keeps fp32 weights under bf16 autocast (mixed)")
    if r.has("optim"):
        _map_optim(r, "optim", r.get("optim"))
    if r.has("flash_attn"):
        _map_attn(r, "flash_attn", r.get("flash_attn"))
    if r.has("deepspeed"):
        _zero_stage(r, "deepspeed", r.get("deepspeed"))
