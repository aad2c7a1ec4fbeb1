"""TRL SFTConfig / transformers TrainingArguments (JSON, a .to_json_string() dump, or TRL's YAML config): keys
mapped onto the workload's fields, SFTConfig's own defaults, and the Trainer's precision rules.

Field names and meanings: https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
(optimizer names: `transformers.training_args.OptimizerNames`); TRL SFTConfig / ModelConfig:
https://huggingface.co/docs/trl/sft_trainer and https://huggingface.co/docs/trl/clis
"""

from __future__ import annotations

from typing import Any

from gpuready.workload.formats.reader import _as_bool, _as_int, _Reader
from gpuready.workload.formats.result import Mapped
from gpuready.workload.formats.shared import _fsdp, _map_attn, _map_optim, _packing, _precision_16, _zero_stage

_TRL_NO_EFFECT = {
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy", "evaluation_strategy",
    "prediction_loss_only", "per_device_eval_batch_size", "eval_accumulation_steps", "eval_delay", "learning_rate",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "log_level", "log_level_replica",
    "log_on_each_node", "logging_dir", "logging_strategy", "logging_first_step", "logging_steps",
    "logging_nan_inf_filter",
    "save_strategy", "save_steps", "save_total_limit", "save_safetensors", "save_on_each_node", "save_only_model",
    "seed", "data_seed", "jit_mode_eval", "bf16_full_eval", "fp16_full_eval", "local_rank", "ddp_backend",
    "tpu_num_cores", "dataloader_drop_last", "eval_steps", "dataloader_num_workers", "dataloader_prefetch_factor",
    "past_index", "run_name", "disable_tqdm", "remove_unused_columns", "label_names", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "ignore_data_skip", "report_to", "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "skip_memory_metrics", "push_to_hub", "resume_from_checkpoint", "hub_model_id", "hub_strategy", "hub_token",
    "hub_private_repo", "hub_always_push", "gradient_checkpointing_kwargs", "include_inputs_for_metrics",
    "include_for_metrics", "eval_do_concat_batches", "fp16_backend", "push_to_hub_model_id",
    "push_to_hub_organization", "push_to_hub_token", "mp_parameters", "auto_find_batch_size", "full_determinism",
    "ray_scope", "ddp_timeout", "use_mps_device", "dispatch_batches", "split_batches", "include_tokens_per_second",
    "include_num_input_tokens_seen", "neftune_noise_alpha", "optim_args", "accelerator_config", "debug",
    "batch_eval_metrics", "eval_on_start", "eval_use_gather_object", "average_tokens_across_devices", "use_cpu",
    "restore_callback_states_from_checkpoint", "length_column_name", "group_by_length", "_n_gpu",
    "half_precision_backend",
    "fp16_opt_level", "tf32", "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "eos_token", "pad_token",
    "completion_only_loss", "assistant_only_loss", "chat_template_path", "dataset_name", "dataset_config",
    "dataset_train_split", "dataset_test_split", "lora_alpha", "lora_dropout", "lora_task_type", "trust_remote_code",
    "model_revision", "tokenizer_name_or_path", "hub_revision", "project", "trackio_space_id",
    "liger_kernel_config", "torch_empty_cache_steps", "eval_packing", "shuffle_dataset", "activation_offloading_kwargs",
    "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt",
    "fsdp_config", "packing_strategy", "padding_free", "pad_to_multiple_of", "use_liger_kernel_for_loss",
    "activation_checkpointing_kwargs", "label_smoothing_factor", "use_cache", "trackio_bucket_id",
    "trackio_static_space_id", "enable_jit_checkpoint", "dataloader_multiprocessing_context", "dataloader_in_order",
    "train_sampling_strategy", "ddp_static_graph", "model_init_kwargs",
}  # fmt: skip
_TRL_NOT_MODELLED = {
    "use_liger_kernel": "Liger's fused kernels (no logits tensor) use less memory than sized",
    "torch_compile": "torch.compile changes activation memory",
    "activation_offloading": "activations offloaded to the CPU: less than sized",
    "load_in_8bit": "8-bit (LLM.int8) base weights: sized as 16-bit (over)",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "lora_modules_to_save": "modules trained in full next to LoRA (more than sized)",
    "fsdp_config.offload_params": "parameters offloaded to the CPU: less than sized",
    "optim_target_modules": "GaLore/APOLLO projected optimizer states",
    "parallelism_config": "tensor/context parallelism",
    "torch_compile_backend": "",
    "torch_compile_mode": "",
}


# Where TRL's SFTConfig defaults differ from TrainingArguments' (TRL 1.x, trl/trainer/sft_config.py: "These parameters
# have default values different from TrainingArguments"): they apply when the file is a TRL config that leaves them out
_SFT_DEFAULTS: dict[str, Any] = {"max_length": 1024, "gradient_checkpointing": True, "bf16": True}
# keys of TRL's SFTConfig / ModelConfig that TrainingArguments does not have
_SFT_KEYS = {
    "max_length", "max_seq_length", "packing", "packing_strategy", "padding_free", "dataset_text_field",
    "completion_only_loss", "assistant_only_loss", "loss_type", "model_init_kwargs", "use_peft", "model_name_or_path",
    "load_in_4bit", "lora_r", "lora_target_modules", "dataset_name", "chat_template_path", "eos_token",
}  # fmt: skip


def _is_sft_config(r: _Reader) -> bool:
    return any(k.split(".")[0] in _SFT_KEYS for k in r.flat)


def _trainer_precision(r: _Reader, sft: bool) -> None:
    """The Trainer's bf16/fp16 are autocast switches; the weights keep the dtype the model was loaded in. transformers
    5's from_pretrained loads the checkpoint's own dtype when given none (dtype="auto", modeling_utils.py), and so does
    TRL's create_model_from_path; transformers 4 loaded fp32. A transformers 4 dump carries push_to_hub_token, which
    5 dropped."""
    keys = ("model_init_kwargs.torch_dtype", "model_init_kwargs.dtype", "dtype", "torch_dtype")
    key = next((k for k in keys if r.has(k)), None)
    dtype = str(r.peek(key)).lower().removeprefix("torch.") if key else None
    bf16, fp16 = r.peek("bf16"), r.peek("fp16")
    if sft and bf16 is None and not _as_bool(fp16 or False):
        bf16 = _SFT_DEFAULTS["bf16"]
        r.note("no bf16 in the file: TRL's SFTConfig turns bf16 autocast on by default")
    qlora = r.out.fields.get("method") == "qlora"
    switch = _as_bool(bf16 or False) or _as_bool(fp16 or False)  # the Trainer's autocast
    if dtype in ("bfloat16", "bf16", "float16", "fp16", "half"):
        assert key is not None
        r.set("precision", "bf16" if "b" in dtype else "fp16", key, r.peek(key))
        r.out.fields["autocast"] = switch
        r.also("bf16", "autocast over the 16-bit weights" if _as_bool(bf16 or False) else "off")
        r.also("fp16", "autocast over the 16-bit weights" if _as_bool(fp16 or False) else "off")
        return
    transformers4 = "push_to_hub_token" in r.flat
    if dtype == "auto" or (dtype is None and not transformers4) or qlora:
        # the checkpoint's dtype: bf16 for most published LLMs (GPT-2 is fp32, Llama 2 and Pythia fp16)
        half = "fp16" if (fp16 is not None and _as_bool(fp16)) else "bf16"
        r.out.fields["precision"] = half
        r.out.fields["autocast"] = switch
        on = f"precision = {half}, under autocast"
        r.also("bf16", on if half == "bf16" and switch else "off")
        r.also("fp16", on if half == "fp16" else "off")
        if key is not None:
            r.also(key, "the checkpoint's own dtype")
        if qlora:
            r.note(
                f"QLoRA: the 4-bit base computes in bnb_4bit_compute_dtype, sized as {half}; embeddings, norms and "
                "lm_head in the checkpoint's dtype"
            )
        else:
            why = "dtype: auto" if dtype == "auto" else "no model dtype in the file"
            r.note(
                f"{why}: transformers 5 (and TRL) load the checkpoint's own dtype, sized as {half} (that of most "
                "published LLMs); give --precision mixed for an fp32 checkpoint (GPT-2), --precision fp16 for an "
                "fp16 one (Llama 2, Pythia)"
            )
        return
    if key is not None:
        r.also(key, "fp32 weights")
    if sft and r.peek("bf16") is None and bf16:
        r.out.fields["precision"] = "mixed"
    else:
        _precision_16(r, bf16_means="mixed")
    if r.out.fields.get("precision") == "mixed":
        why = "transformers 4 (this dump's version) loads fp32 when given no dtype" if dtype is None else "fp32 weights"
        r.note(
            f"{why}: fp32 weights under bf16 autocast (the Trainer's mixed precision); give --precision bf16 if the "
            "script loads the model in bf16"
        )


def _trl(r: _Reader) -> None:
    r.known(_TRL_NO_EFFECT, _TRL_NOT_MODELLED)
    if r.has("model_name_or_path"):
        r.set("model", str(r.get("model_name_or_path")), "model_name_or_path")
    elif r.has("model_init_kwargs.pretrained_model_name_or_path"):
        r.set("model", str(r.get("model_init_kwargs.pretrained_model_name_or_path")), "model_init_kwargs")
    # PEFT: TRL's ModelConfig (use_peft, lora_r, lora_target_modules, load_in_4bit); TrainingArguments has none
    if _as_bool(r.get("use_peft", False)):
        four = _as_bool(r.get("load_in_4bit", False))
        r.set("method", "qlora" if four else "lora", "use_peft", True)
        if r.has("lora_r"):
            r.set("lora_r", _as_int(r, "lora_r"), "lora_r")
        targets = r.get("lora_target_modules")
        if targets is not None:
            names = targets if isinstance(targets, list) else [str(targets)]
            if [str(n).lower() for n in names] in (["all-linear"], ["all"]):
                r.set("lora_targets", None, "lora_target_modules", targets)
                r.out.mapped[-1] = Mapped("lora_target_modules", targets, "lora_targets", "every linear layer")
            else:
                r.set("lora_targets", names, "lora_target_modules", targets)
        if four:
            r.out.fields["lora_dtype"] = "bf16"
            r.note(
                "QLoRA under TRL's SFTTrainer: recent TRL casts the adapters of a 4-bit model to bf16 "
                "(sft_trainer.py), sized so (--lora-dtype bf16); give --lora-dtype fp32 for a TRL that keeps peft's "
                "fp32 adapters"
            )
    else:
        r.also("use_peft", "method = full")
        r.note(
            "no PEFT settings in the file (TrainingArguments has none): sized as full fine-tuning; "
            "give --method lora if the script wraps the model with peft"
        )
    sft = _is_sft_config(r)
    seq_key = next((k for k in ("max_length", "max_seq_length") if r.has(k)), None)
    if seq_key:
        r.set("seq", _as_int(r, seq_key), seq_key)
        r.also("max_seq_length", f"superseded by {seq_key}")
    elif sft:
        r.out.fields["seq"] = _SFT_DEFAULTS["max_length"]
        r.note(f"no max_length in the file: TRL's SFTConfig default {_SFT_DEFAULTS['max_length']} used")
    else:
        r.note("no max_length in the file: gpuready's default 2048 used (--seq)")
    if "packing" in r.flat:
        _packing(r, "packing", seq_key or "--seq")
    if r.has("per_device_train_batch_size"):
        r.set("batch", _as_int(r, "per_device_train_batch_size"), "per_device_train_batch_size")
    if r.has("gradient_accumulation_steps"):
        r.set("grad_accum", _as_int(r, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    # transformers 5 renamed gradient_checkpointing to activation_checkpointing (a dump holds both)
    ckpt_key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if k in r.flat), None)
    if ckpt_key is not None:
        r.set("grad_ckpt", _as_bool(r.get(ckpt_key)), ckpt_key)
        r.also("gradient_checkpointing", "the same as activation_checkpointing")
    elif sft:
        r.out.fields["grad_ckpt"] = _SFT_DEFAULTS["gradient_checkpointing"]
        r.note("no gradient_checkpointing in the file: TRL's SFTConfig turns it on by default")
    _trainer_precision(r, sft)
    if r.out.fields.get("lora_dtype") == "bf16" and r.out.fields.get("precision") != "bf16":
        del r.out.fields["lora_dtype"]  # bf16 adapters are modelled over bf16 weights only
        r.note("QLoRA in fp16: TRL's bf16 adapters not modelled over fp16 weights; sized with fp32 adapters (over)")
    # TRL 1.16's SFTTrainer scores every loss_type (nll, dft, and chunked_nll, an alias of nll) through its fused LM
    # head: per-token log-probabilities in tiles of 32,768 positions, never the whole logits (trl/trainer/
    # sft_trainer.py compute_loss and utils.add_fused_lm_head); label smoothing alone takes the model's full logits
    loss = r.peek("loss_type")
    smoothing = r.peek("label_smoothing_factor")
    if not sft or (smoothing is not None and float(smoothing) > 0):
        r.also("loss_type", "the whole logits, as sized")
    elif loss is not None:
        r.not_modelled["loss_type"] = "TRL's fused LM head never holds the whole logits: less than sized"
    else:
        r.note(
            "TRL's SFTTrainer (1.x) computes the loss through its fused LM head (log-probabilities in tiles, never the "
            "whole logits) for every loss_type, not modelled: sized with the whole logits (over)"
        )
        r.also("loss_type", "unset")
    if r.has("optim"):
        _map_optim(r, "optim", r.get("optim"))
    elif _as_bool(r.peek("adafactor") or False):
        r.set("optim", "adafactor", "adafactor")
    r.also("adafactor", "superseded by optim")
    if r.has("attn_implementation"):
        _map_attn(r, "attn_implementation", r.get("attn_implementation"))
    elif r.has("model_init_kwargs.attn_implementation"):
        _map_attn(r, "model_init_kwargs.attn_implementation", r.get("model_init_kwargs.attn_implementation"))
    ds = r.peek("deepspeed")
    if ds is not None:
        _zero_stage(r, "deepspeed", ds)
    fsdp = r.peek("fsdp")
    if fsdp is not None and fsdp is not False:
        _fsdp(r, "fsdp", fsdp)
