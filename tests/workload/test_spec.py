from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.workload import load_workload_file, make_workload


def test_defaults_follow_the_contract() -> None:
    w = make_workload(model="llama-3.1-8b")
    assert (w.task, w.method, w.batch, w.seq, w.new_tokens, w.image_size) == (
        "train",
        "full",
        1,
        2048,
        0,
        224,
    )
    assert (w.precision, w.optim, w.grad_ckpt, w.grad_accum, w.lora_r) == ("bf16", "adamw", False, 1, 16)
    assert (w.attn, w.gpus, w.shard, w.lora_targets) == ("sdpa", 1, "none", None)


@pytest.mark.parametrize(
    ("fields", "flag", "allowed"),
    [
        ({"task": "serve"}, "--task", "'train' or 'infer'"),
        ({"precision": "fp8"}, "--precision", "'bf16'"),
        ({"batch": 0}, "--batch", "from 1 to 1,000,000"),
        ({"batch": 2_000_000}, "--batch", "from 1 to 1,000,000"),
        ({"as_family": "gemma9"}, "--as-family", "llama"),
        ({"shard": "fsdp"}, "--shard", "--gpus 2"),
        ({"task": "infer", "method": "lora"}, "--method", "training methods"),
        ({"method": "qlora", "precision": "mixed"}, "--precision", "4-bit"),
        ({"autocast": True, "precision": "mixed"}, "--autocast", "--precision mixed"),
        ({"autocast": True, "precision": "fp32"}, "--autocast", "16-bit weights"),
        ({"autocast": True, "task": "infer"}, "--autocast", "training"),
        ({"kbit_prep": True, "method": "lora", "autocast": True}, "--kbit-prep", "--method qlora"),
        ({"kbit_prep": True, "method": "qlora"}, "--kbit-prep", "--autocast"),
        ({"lora_dtype": "bf16", "method": "full"}, "--lora-dtype", "--method lora"),
        ({"attn": "flash", "precision": "fp32"}, "--attn", "sdpa or eager"),
        ({"lora_dtype": "bf16", "method": "lora", "precision": "fp16"}, "--lora-dtype", "--precision bf16"),
        ({"colour": "red"}, "colour", "allowed"),
    ],
)
def test_bad_values_name_the_flag_and_what_is_allowed(fields: dict[str, object], flag: str, allowed: str) -> None:
    with pytest.raises(InputError) as info:
        make_workload(model="gpt2", **fields)
    assert info.value.field == flag
    assert allowed in info.value.message
    assert "\n" not in str(info.value)


def test_lora_targets_accept_a_comma_list() -> None:
    w = make_workload(model="gpt2", method="lora", lora_targets="q_proj, v_proj")
    assert w.lora_targets == ("q_proj", "v_proj")


def test_toml_file_uses_flag_names_either_spelling(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('model = "qwen2.5-7b"\nmethod = "lora"\nlora-r = 8\n[ignored]\n', encoding="utf-8")
    fields = load_workload_file(f)
    fields.pop("ignored")
    w = make_workload(**fields)
    assert (w.model, w.method, w.lora_r) == ("qwen2.5-7b", "lora", 8)


def test_unreadable_toml_is_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("model = \n", encoding="utf-8")
    with pytest.raises(InputError, match="--workload"):
        load_workload_file(f)
    with pytest.raises(InputError, match="no such file"):
        load_workload_file(tmp_path / "missing.toml")
