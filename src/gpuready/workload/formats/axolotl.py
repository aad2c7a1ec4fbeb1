"""axolotl YAML: its keys mapped onto the workload's fields, and those it has that gpuready does not use.

Field names and meanings: https://docs.axolotl.ai/docs/config-reference.html
"""

from __future__ import annotations

from gpuready.workload.formats.reader import _as_bool, _as_int, _Reader
from gpuready.workload.formats.result import Mapped
from gpuready.workload.formats.shared import _fsdp, _map_optim, _packing, _precision_16, _zero_stage

_AXOLOTL_NO_EFFECT = {
    "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "output_dir", "num_epochs", "max_steps",
    "learning_rate", "lr_scheduler", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "weight_decay",
    "logging_steps", "save_steps", "saves_per_epoch", "evals_per_epoch", "eval_steps", "save_strategy",
    "eval_strategy", "wandb_project", "wandb_entity", "wandb_watch", "wandb_name", "wandb_log_model",
    "hub_model_id", "hub_strategy", "special_tokens", "tokens", "chat_template", "tokenizer_type", "tokenizer_config",
    "model_type", "trust_remote_code", "strict", "seed", "train_on_inputs", "group_by_length", "lora_alpha",
    "lora_dropout", "lora_fan_in_fan_out", "lora_model_dir", "resume_from_checkpoint", "early_stopping_patience",
    "local_rank", "debug", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "save_safetensors",
    "save_total_limit", "eval_table_size", "eval_max_new_tokens", "loss_watchdog_threshold", "loss_watchdog_patience",
    "shuffle_merged_datasets", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "tf32", "pad_to_sequence_len", "eval_sample_packing", "is_llama_derived_model", "is_mistral_derived_model",
    "hf_use_auth_token", "push_dataset_to_hub", "dataset_processes", "gptq_groupsize", "gptq_model_v1",
    "torchdistx_path", "rl", "orpo_alpha", "fsdp_version", "gradient_checkpointing_kwargs", "lora_mlp_kernel",
    "lora_qkv_kernel", "lora_o_kernel", "ddp_timeout", "ddp_find_unused_parameters", "plugins",
}  # fmt: skip
_AXOLOTL_NOT_MODELLED = {
    "load_in_8bit": "8-bit (LLM.int8) base weights: sized as 16-bit (over)",
    "liger_kernel": "Liger's fused kernels (chunked cross-entropy) use less memory than sized",
    "liger_fused_linear_cross_entropy": "fused linear cross-entropy never builds the logits: less than sized",
    "liger_cross_entropy": "Liger's cross-entropy uses less memory than sized",
    "cut_cross_entropy": "Cut Cross-Entropy never builds the logits: less than sized",
    "unsloth_lora_mlp": "Unsloth's kernels change activation memory",
    "unsloth_lora_qkv": "Unsloth's kernels change activation memory",
    "unsloth_lora_o": "Unsloth's kernels change activation memory",
    "unsloth_cross_entropy_loss": "Unsloth's cross-entropy uses less memory than sized",
    "lora_modules_to_save": "modules_to_save train a full copy of those modules (more than sized)",
    "lora_on_cpu": "LoRA loaded on the CPU",
    "gpu_memory_limit": "a per-GPU memory cap with device_map offload",
    "torch_compile": "torch.compile changes activation memory",
    "relora_steps": "ReLoRA",
    "peft_use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "unfrozen_parameters": "only the named parameters train (less than a full fine-tune)",
    "context_parallel_size": "context parallelism splits the sequence over GPUs",
    "tensor_parallel_size": "tensor parallelism",
    "activation_offloading": "activations offloaded to the CPU: less than sized",
    "xformers_attention": "xformers attention sized as PyTorch SDPA",
    "s2_attention": "shifted-sparse attention",
    "eval_batch_size": "the evaluation batch (no gradients) may set the peak only when far larger than training's",
    "neftune_noise_alpha": "",
}


def _axolotl(r: _Reader) -> None:
    r.known(_AXOLOTL_NO_EFFECT, _AXOLOTL_NOT_MODELLED)
    model_key = "base_model_config" if r.has("base_model_config") else "base_model"
    if r.has(model_key):
        r.set("model", str(r.get(model_key)), model_key)
        if model_key == "base_model_config":
            r.also("base_model", "superseded by base_model_config")
    adapter = str(r.get("adapter") or "").lower()
    four_bit = _as_bool(r.get("load_in_4bit", False))
    if adapter in ("lora", "qlora"):
        method = "qlora" if adapter == "qlora" or four_bit else "lora"
        r.set("method", method, "adapter")
        if method == "qlora" and adapter == "lora":
            r.note("adapter: lora with load_in_4bit sized as QLoRA (NF4 base weights)")
        r.also("load_in_4bit", f"method = {method}" if four_bit else "off")
    elif adapter:
        r.problem("method", f"adapter: {adapter!r} is not modelled; gpuready sizes lora and qlora (or none: full)")
    else:
        r.set("method", "full", "adapter", None)
        r.out.mapped[-1] = Mapped("adapter", None, "method", "full")
    if r.has("lora_r"):
        r.set("lora_r", _as_int(r, "lora_r"), "lora_r")
    if _as_bool(r.get("lora_target_linear", False)):
        r.set("lora_targets", None, "lora_target_linear", True)
        r.out.mapped[-1] = Mapped("lora_target_linear", True, "lora_targets", "every linear layer")
        r.also("lora_target_modules", "superseded by lora_target_linear")
    elif r.has("lora_target_modules"):
        targets = r.get("lora_target_modules")
        names = [str(t) for t in targets] if isinstance(targets, list) else [str(targets)]
        if [n.lower() for n in names] == ["all-linear"]:  # peft's shorthand for every linear layer
            r.set("lora_targets", None, "lora_target_modules", targets)
            r.out.mapped[-1] = Mapped("lora_target_modules", targets, "lora_targets", "every linear layer")
        else:
            r.set("lora_targets", names, "lora_target_modules", targets)
    seq = _as_int(r, "sequence_len")
    if seq is not None:
        r.set("seq", seq, "sequence_len")
    else:
        r.note("sequence_len not set: axolotl's default 2048 used")
        r.out.fields["seq"] = 2048
    _packing(r, "sample_packing", "sequence_len")
    micro = _as_int(r, "micro_batch_size")
    accum = _as_int(r, "gradient_accumulation_steps")
    if micro is not None:
        r.set("batch", micro, "micro_batch_size")
    elif r.has("batch_size"):
        total = _as_int(r, "batch_size") or 1
        r.set("batch", max(1, total // (accum or 1)), "batch_size", total)
        r.note("batch_size is the per-GPU batch over all accumulation steps; micro-batch = batch_size / accumulation")
    if accum is not None:
        r.set("grad_accum", accum, "gradient_accumulation_steps")
    gc = r.get("gradient_checkpointing")
    if gc is not None:
        r.set("grad_ckpt", gc is True or str(gc).lower() in ("true", "unsloth", "offload"), "gradient_checkpointing")
        if str(gc).lower() in ("unsloth", "offload"):
            r.note(f"gradient_checkpointing: {gc} offloads checkpoints to the CPU; sized as on the GPU (over)")
    _precision_16(r, bf16_means="bf16")
    if r.has("optimizer"):
        _map_optim(r, "optimizer", r.get("optimizer"))
    if _as_bool(r.get("flash_attention", False)):
        r.set("attn", "flash", "flash_attention")
    elif _as_bool(r.get("sdp_attention", False)):
        r.set("attn", "sdpa", "sdp_attention")
    elif _as_bool(r.get("eager_attention", False)):
        r.set("attn", "eager", "eager_attention")
    if r.has("deepspeed"):
        _zero_stage(r, "deepspeed", r.get("deepspeed"))
    if r.has("fsdp") or r.has("fsdp_config.fsdp_version") or r.has("fsdp_version"):
        key = "fsdp" if r.has("fsdp") else "fsdp_version" if r.has("fsdp_version") else "fsdp_config.fsdp_version"
        _fsdp(r, key, r.get(key))
