"""Workload files from axolotl, LLaMA-Factory, torchtune and TRL/TrainingArguments: detection, mapping, the
ignored-keys report, and the refusals (ZeRO, unknown optimizers, FSDP without a GPU count)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuready.cli.app import main
from gpuready.errors import InputError
from gpuready.workload.formats import EMPTY, NO_EFFECT, NOT_MODELLED, NOT_READ, read_workload_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def reasons(path: Path) -> dict[str, str]:
    return {i.key: i.reason for i in read_workload_file(path).ignored}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return f


# --- the shipped examples -----------------------------------------------------------------------------------------


def test_axolotl_example_maps_qlora_packing_and_the_8bit_paged_optimizer() -> None:
    src = read_workload_file(EXAMPLES / "axolotl-qlora.yaml")
    assert src.format == "axolotl" and src.label == "axolotl YAML"
    assert src.fields == {
        "model": "meta-llama/Llama-3.1-8B",
        "method": "qlora",
        "lora_r": 32,
        "lora_targets": None,  # lora_target_linear: every linear layer, our default
        "seq": 4096,
        "batch": 2,
        "grad_accum": 4,
        "grad_ckpt": True,
        "precision": "bf16",
        "autocast": True,  # axolotl's bf16 is the Trainer's: autocast over the bf16 weights
        "optim": "adamw8bit",
        "attn": "flash",
    }
    why = reasons(EXAMPLES / "axolotl-qlora.yaml")
    assert why["learning_rate"] == NO_EFFECT and why["datasets"] == NO_EFFECT
    assert why["special_tokens.pad_token"] == NO_EFFECT
    assert why["wandb_project"] == EMPTY and why["deepspeed"] == EMPTY
    assert {m.key for m in src.mapped} >= {"sample_packing", "tf32", "base_model", "adapter"}
    assert any("paged" in n for n in src.notes)


def test_llamafactory_example_turns_checkpointing_on_by_default_and_reads_lora_target_all() -> None:
    src = read_workload_file(EXAMPLES / "llamafactory-lora.yaml")
    assert src.format == "llamafactory"
    f = src.fields
    assert (f["model"], f["method"], f["lora_r"], f["lora_targets"]) == ("Qwen/Qwen2.5-7B", "lora", 16, None)
    assert (f["seq"], f["batch"], f["grad_accum"], f["grad_ckpt"], f["precision"]) == (2048, 2, 8, True, "bf16")
    assert any("LLaMA-Factory's default" in n for n in src.notes)
    why = reasons(EXAMPLES / "llamafactory-lora.yaml")
    assert why["template"] == NO_EFFECT and why["lora_alpha"] == NO_EFFECT


def test_torchtune_example_maps_the_builder_to_a_preset_and_renames_modules_for_peft() -> None:
    src = read_workload_file(EXAMPLES / "torchtune-lora.yaml")
    assert src.format == "torchtune"
    f = src.fields
    assert (f["model"], f["method"], f["lora_r"]) == ("llama-3.2-1b", "lora", 64)
    assert f["lora_targets"] == ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert (f["seq"], f["batch"], f["grad_accum"], f["grad_ckpt"], f["precision"], f["optim"]) == (
        2048,
        4,
        8,
        False,
        "bf16",
        "adamw",
    )
    why = reasons(EXAMPLES / "torchtune-lora.yaml")
    assert why["loss._component_"] == NOT_MODELLED  # the linear cross-entropy never builds the whole logits
    assert why["optimizer.lr"] == NO_EFFECT and why["metric_logger.log_dir"] == NO_EFFECT
    assert [w.key for w in src.warnings] == ["loss._component_"]


def test_trainer_dump_maps_batch_accumulation_checkpointing_and_says_what_it_assumed() -> None:
    src = read_workload_file(EXAMPLES / "trainer-args.json")
    assert src.format == "trl"
    assert src.fields == {
        "batch": 8, "grad_accum": 4, "grad_ckpt": True, "precision": "bf16", "autocast": True, "optim": "adamw"
    }  # fmt: skip
    assert any("full fine-tuning" in n for n in src.notes)  # no PEFT in TrainingArguments
    # a transformers 5 dump with no model dtype: the script's from_pretrained loads the checkpoint's own dtype
    assert any("checkpoint's own dtype" in n and "--precision mixed" in n for n in src.notes)
    assert not any("SFTConfig" in n for n in src.notes)  # TrainingArguments' defaults, not TRL's
    why = reasons(EXAMPLES / "trainer-args.json")
    assert why["hub_token"] == NO_EFFECT and why["fsdp"] == EMPTY and why["deepspeed"] == EMPTY
    assert NOT_READ not in why.values(), [k for k, v in why.items() if v == NOT_READ]
    # every key of the dump is accounted for: used or listed
    data = json.loads((EXAMPLES / "trainer-args.json").read_text(encoding="utf-8"))
    listed = {k.split(".")[0] for k in why} | {m.key.split(".")[0] for m in src.mapped}
    assert listed >= set(data) - {"activation_checkpointing", "gradient_checkpointing"}


def test_nothing_in_a_file_is_dropped_silently(tmp_path: Path) -> None:
    f = write(tmp_path, "a.yaml", "base_model: gpt2\nmicro_batch_size: 2\nmy_own_key: 7\nliger_kernel: true\n")
    src = read_workload_file(f)
    why = {i.key: (i.reason, i.detail) for i in src.ignored}
    assert why["my_own_key"] == (NOT_READ, "")
    assert why["liger_kernel"][0] == NOT_MODELLED and "less memory" in why["liger_kernel"][1]
    used = {m.key for m in src.mapped}
    assert used | set(why) >= {"base_model", "micro_batch_size", "my_own_key", "liger_kernel"}


# --- mapping details -----------------------------------------------------------------------------------------------


def test_llamafactory_full_finetune_is_mixed_unless_pure_bf16_and_4bit_is_qlora(tmp_path: Path) -> None:
    base = "model_name_or_path: llama-3.2-1b\nstage: sft\ncutoff_len: 1024\nbf16: true\n"
    full = read_workload_file(write(tmp_path, "f.yaml", base + "finetuning_type: full\n"))
    assert full.fields["method"] == "full" and full.fields["precision"] == "mixed"
    pure = read_workload_file(write(tmp_path, "p.yaml", base + "finetuning_type: full\npure_bf16: true\n"))
    assert pure.fields["precision"] == "bf16"
    q = read_workload_file(write(tmp_path, "q.yaml", base + "finetuning_type: lora\nquantization_bit: 4\n"))
    assert q.fields["method"] == "qlora"
    off = read_workload_file(write(tmp_path, "o.yaml", base + "disable_gradient_checkpointing: true\n"))
    assert off.fields["grad_ckpt"] is False


def test_trl_sft_config_reads_peft_max_length_and_the_model_dtype(tmp_path: Path) -> None:
    cfg = {
        "model_name_or_path": "Qwen/Qwen3-0.6B",
        "output_dir": "out",
        "max_length": 4096,
        "packing": True,
        "per_device_train_batch_size": 4,
        "gradient_checkpointing": True,
        "bf16": True,
        "model_init_kwargs": {"dtype": "bfloat16"},
        "use_peft": True,
        "lora_r": 8,
        "lora_target_modules": ["q_proj", "v_proj"],
        "optim": "adamw_8bit",
        "use_liger_kernel": True,
    }
    src = read_workload_file(write(tmp_path, "sft.json", json.dumps(cfg)))
    assert src.format == "trl"
    f = src.fields
    assert (f["model"], f["method"], f["lora_r"]) == ("Qwen/Qwen3-0.6B", "lora", 8)
    assert f["lora_targets"] == ["q_proj", "v_proj"]
    assert (f["seq"], f["batch"], f["precision"], f["optim"]) == (4096, 4, "bf16", "adamw8bit")
    assert [w.key for w in src.warnings] == ["use_liger_kernel"]


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("adamw_torch", "adamw"),
        ("adamw_torch_fused", "adamw"),
        ("adamw_8bit", "adamw8bit"),
        ("adamw_bnb_8bit", "adamw8bit"),
        ("paged_adamw_8bit", "adamw8bit"),
        ("paged_adamw_32bit", "adamw"),
        ("adafactor", "adafactor"),
        ("sgd", "sgd"),
    ],
)
def test_optimizer_names_map_onto_the_modelled_ones(tmp_path: Path, name: str, ours: str) -> None:
    f = write(tmp_path, "a.yaml", f"base_model: gpt2\noptimizer: {name}\n")
    assert read_workload_file(f).fields["optim"] == ours


def test_torchtune_distributed_qlora_recipe_is_fsdp_qlora(tmp_path: Path) -> None:
    text = (
        "model:\n  _component_: torchtune.models.qwen2_5.qlora_qwen2_5_7b_instruct\n  lora_rank: 8\n"
        "  lora_attn_modules: [q_proj, k_proj, v_proj]\n"
        "tokenizer:\n  _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer\n  max_seq_len: 1024\n"
        "batch_size: 2\nfsdp_cpu_offload: false\nfsdp_reshard_after_forward: true\ndtype: bf16\n"
    )
    src = read_workload_file(write(tmp_path, "tt.yaml", text))
    f = src.fields
    assert (f["model"], f["method"], f["shard"], f["seq"]) == ("qwen2.5-7b", "qlora", "fsdp", 1024)
    assert f["lora_targets"] == ["q_proj", "k_proj", "v_proj"]
    assert "gpus" in src.problems


def test_torchtune_checkpoint_folder_with_a_config_is_the_model(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}", encoding="utf-8")
    text = (
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "checkpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\n  checkpoint_dir: ckpt\n"
    )
    src = read_workload_file(write(tmp_path, "tt.yaml", text))
    assert src.fields["model"] == str(ckpt) and src.fields["method"] == "full"


def test_our_toml_stays_our_toml(tmp_path: Path) -> None:
    src = read_workload_file(write(tmp_path, "job.toml", 'model = "gpt2"\nbatch = 4\n'))
    assert src.format == "gpuready" and src.fields == {"model": "gpt2", "batch": 4} and src.ignored == []


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("x.yaml", "just: [unclosed\n", "not readable TOML or YAML"),
        ("x.yaml", "colour: red\nsize: 3\n", "not a format gpuready reads"),
        ("x.json", '{"per_device_train_batch_size": ', "not readable JSON"),
        ("x.toml", "model = \n", "not readable TOML"),
    ],
)
def test_unreadable_or_unknown_files_are_one_line_input_errors(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    with pytest.raises(InputError) as info:
        read_workload_file(write(tmp_path, name, text))
    assert info.value.field == "--workload" and message in info.value.message and "\n" not in str(info.value)


# --- through the CLI -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "model", "fmt"),
    [
        ("axolotl-qlora.yaml", None, "axolotl"),
        ("llamafactory-lora.yaml", None, "llamafactory"),
        ("torchtune-lora.yaml", None, "torchtune"),
        ("trainer-args.json", "qwen3-0.6b", "trl"),
    ],
)
def test_estimate_reads_each_example_and_reports_it_in_json(
    capsys: pytest.CaptureFixture[str], example: str, model: str | None, fmt: str
) -> None:
    args = ["estimate", *([model] if model else []), "--workload", str(EXAMPLES / example), "--json"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    data = json.loads(out)
    assert data["workload_file"]["format"] == fmt
    assert data["workload_file"]["ignored"] and data["workload_file"]["mapped"]
    assert data["params"] > 0


def test_estimate_text_names_the_format_and_the_ignored_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--workload", str(EXAMPLES / "torchtune-lora.yaml"))
    assert code == 0
    assert "torchtune recipe" in out and "detected" in out
    assert "not modelled" in out and "loss._component_" in out
    assert "ignored, no effect on memory" in out and "optimizer.lr" in out


def test_flags_override_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "estimate", "--workload", str(EXAMPLES / "llamafactory-lora.yaml"), "--json")
    base = json.loads(out)
    _, out, _ = run(
        capsys, "estimate", "--workload", str(EXAMPLES / "llamafactory-lora.yaml"), "--batch", "4", "--json"
    )
    assert json.loads(out)["peak_allocated_bytes"] > base["peak_allocated_bytes"]


def test_zero_is_refused_naming_the_key_unless_a_modelled_shard_is_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    write(tmp_path, "ds_z2.json", json.dumps({"zero_optimization": {"stage": 2}}))
    f = write(tmp_path, "job.yaml", "base_model: llama-3.2-1b\nmicro_batch_size: 1\ndeepspeed: ds_z2.json\n")
    code, out, err = run(capsys, "estimate", "--workload", str(f))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "deepspeed" in err and "ZeRO-2" in err and "Traceback" not in err
    code, out, err = run(capsys, "estimate", "--workload", str(f), "--shard", "fsdp", "--gpus", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["workload_file"]["mapped"][-1]["to"] == "zero2"


def test_fsdp_in_the_file_asks_for_the_gpu_count(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = write(tmp_path, "job.yaml", "base_model: llama-3.2-1b\nmicro_batch_size: 1\nfsdp_version: 2\nfsdp_config:\n"
              "  offload_params: false\n  reshard_after_forward: true\n")  # fmt: skip
    code, _, err = run(capsys, "estimate", "--workload", str(f))
    assert code == 2 and "--gpus N" in err and err.count("\n") == 1
    code, out, err = run(capsys, "estimate", "--workload", str(f), "--gpus", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["workload_file"]["fields"]["shard"] == "fsdp"


def test_an_unmodelled_optimizer_is_refused_unless_optim_is_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    f = write(tmp_path, "job.yaml", "base_model: qwen2.5-0.5b\noptimizer: lion_8bit\n")
    code, _, err = run(capsys, "estimate", "--workload", str(f))
    assert code == 2 and "lion_8bit" in err and "optimizer" in err
    code, _, err = run(capsys, "estimate", "--workload", str(f), "--optim", "adamw", "--json")
    assert code == 0, err


def test_a_trainer_dump_without_a_model_asks_for_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", "--workload", str(EXAMPLES / "trainer-args.json"))
    assert code == 2 and out == ""
    assert "MODEL" in err and "names no model" in err


def test_check_is_the_one_line_preflight_for_an_axolotl_file(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(
        capsys, "check", "--workload", str(EXAMPLES / "axolotl-qlora.yaml"), "--quick", "--gpu-memory", "80GB", "--json"
    )
    data = json.loads(out)
    assert data["workload_file"]["format"] == "axolotl"
    size = next(s for s in data["steps"] if s["name"] == "size")
    assert size["status"] == "pass"
    assert "qlora r=32" in next(s for s in data["steps"] if s["name"] == "task")["summary"]


def test_yaml_is_imported_only_when_a_yaml_workload_is_given(tmp_path: Path) -> None:
    toml = write(tmp_path, "job.toml", 'model = "gpt2"\n')
    code = (
        "import sys; from gpuready.cli.app import main; "
        f"rc = main(['estimate', '--workload', {str(toml)!r}, '--json']); "
        "sys.exit(3 if 'yaml' in sys.modules else rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_an_inline_deepspeed_config_in_trainer_json_is_read_as_its_zero_stage(tmp_path: Path) -> None:
    ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    cfg = {"per_device_train_batch_size": 2, "deepspeed": ds}
    src = read_workload_file(write(tmp_path, "args.json", json.dumps(cfg)))
    assert "ZeRO-3" in src.problems["shard"]
    assert not any(i.key.startswith("deepspeed") for i in src.ignored)


@pytest.mark.parametrize(("value", "targets"), [("all-linear", None), ("[q_proj, v_proj]", ["q_proj", "v_proj"])])
def test_axolotl_lora_target_modules_list_or_all_linear(tmp_path: Path, value: str, targets: object) -> None:
    f = write(tmp_path, "a.yaml", f"base_model: gpt2\nadapter: lora\nlora_target_modules: {value}\n")
    assert read_workload_file(f).fields["lora_targets"] == targets


def test_a_transformers_4_dump_without_a_model_dtype_is_fp32_weights_under_autocast(tmp_path: Path) -> None:
    """transformers 4 loaded fp32 when from_pretrained got no dtype; its dumps carry push_to_hub_token (5 dropped
    it)."""
    dump = json.loads((EXAMPLES / "trainer-args.json").read_text(encoding="utf-8"))
    dump["push_to_hub_token"] = None
    src = read_workload_file(write(tmp_path, "v4.json", json.dumps(dump)))
    assert src.fields["precision"] == "mixed"
    assert any("transformers 4" in n for n in src.notes)


@pytest.mark.parametrize(
    ("dtype", "bf16", "precision"),
    [("auto", True, "bf16"), ("bfloat16", True, "bf16"), ("float16", False, "fp16"), ("float32", True, "mixed"),
     ("float32", False, "fp32"), ("auto", False, "bf16")],
)  # fmt: skip
def test_the_model_dtype_decides_the_weights_and_bf16_only_switches_autocast(
    tmp_path: Path, dtype: str, bf16: bool, precision: str
) -> None:
    cfg = {"output_dir": "o", "per_device_train_batch_size": 2, "model_init_kwargs": {"dtype": dtype}, "bf16": bf16}
    assert read_workload_file(write(tmp_path, "t.json", json.dumps(cfg))).fields["precision"] == precision


def test_a_trl_config_that_leaves_keys_out_gets_sftconfigs_defaults(tmp_path: Path) -> None:
    """TRL's SFTConfig defaults differ from TrainingArguments': checkpointing and bf16 on, max_length 1024."""
    text = "model_name_or_path: Qwen/Qwen3-0.6B\nper_device_train_batch_size: 2\n"
    src = read_workload_file(write(tmp_path, "sft.yaml", text))
    f = src.fields
    assert (f["seq"], f["grad_ckpt"], f["precision"], f["batch"]) == (1024, True, "bf16", 2)
    assert sum("SFTConfig" in n for n in src.notes) == 3
    assert any("fused LM head" in n for n in src.notes)  # TRL 1.x's loss never holds the whole logits
    # said in the file, the file wins; a loss_type given is named as not modelled (TRL scores every one fused)
    given = "model_name_or_path: gpt2\nmax_length: 512\ngradient_checkpointing: false\nbf16: false\nloss_type: nll\n"
    src = read_workload_file(write(tmp_path, "b.yaml", given))
    assert (src.fields["seq"], src.fields["grad_ckpt"]) == (512, False)
    assert not any("SFTConfig" in n or "fused LM head" in n for n in src.notes)
    assert [w.key for w in src.warnings] == ["loss_type"]
    # label smoothing takes the model's full logits: sized as they are
    smooth = read_workload_file(write(tmp_path, "s.yaml", given + "label_smoothing_factor: 0.1\n"))
    assert not smooth.warnings and not any("fused LM head" in n for n in smooth.notes)


def test_trl_chunked_loss_and_qlora_adapters_are_named_as_not_modelled(tmp_path: Path) -> None:
    text = (
        "model_name_or_path: meta-llama/Llama-3.1-8B\nuse_peft: true\nload_in_4bit: true\nloss_type: chunked_nll\n"
        "max_length: 2048\nmodel_init_kwargs:\n  dtype: float32\n"
    )
    src = read_workload_file(write(tmp_path, "q.yaml", text))
    assert (src.fields["method"], src.fields["precision"]) == ("qlora", "bf16")  # QLoRA computes in 16 bits
    assert src.fields["lora_dtype"] == "bf16"  # TRL casts a 4-bit model's adapters to bf16
    assert [w.key for w in src.warnings] == ["loss_type"]
    assert any("bf16" in n and "adapters" in n for n in src.notes)
    fp16 = read_workload_file(write(tmp_path, "h.yaml", text + "fp16: true\nbf16: false\n"))
    assert fp16.fields["precision"] == "fp16" and "lora_dtype" not in fp16.fields


@pytest.mark.parametrize(
    ("text", "precision", "autocast"),
    [
        # LLaMA-Factory's bf16 is the Trainer's switch: autocast over the bf16 LoRA base; full without pure_bf16
        # keeps fp32 weights (mixed, autocast implied); pure_bf16 trains in bf16 without autocast
        ("model_name_or_path: gpt2\nstage: sft\nfinetuning_type: lora\nbf16: true\n", "bf16", True),
        ("model_name_or_path: gpt2\nstage: sft\nfinetuning_type: full\nbf16: true\n", "mixed", None),
        ("model_name_or_path: gpt2\nstage: sft\nfinetuning_type: full\npure_bf16: true\n", "bf16", None),
        # a Trainer dump with the switch off: the checkpoint's dtype, no autocast
        ('{"output_dir": "o", "per_device_train_batch_size": 1, "bf16": false, "fp16": false}', "bf16", False),
        ('{"output_dir": "o", "per_device_train_batch_size": 1, "fp16": true}', "fp16", True),
    ],
)
def test_the_trainers_bf16_switch_is_autocast_over_16_bit_weights(
    tmp_path: Path, text: str, precision: str, autocast: bool | None
) -> None:
    name = "f.json" if text.startswith("{") else "f.yaml"
    f = read_workload_file(write(tmp_path, name, text)).fields
    assert (f["precision"], f.get("autocast")) == (precision, autocast)
