"""A new user's first hour (issue 12): every refusal is exit 2 with one line naming the flag, never a traceback;
sizes, card names and hub ids mean what people mean."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuready.catalog import find_gpu
from gpuready.cli.app import main
from gpuready.errors import InputError


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], flag: str, *args: str) -> str:
    """Run, expect exit 2 and exactly one stderr line naming `flag`; return that line."""
    code, _, err = run(capsys, *args)
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gpuready: error: {flag}:"), err
    return err


# ------------------------------------------------------------------------------------------------ sizes


def test_bare_number_gpu_memory_is_refused_with_the_units_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--gpu-memory", "estimate", "llama-3.2-1b", "--gpu-memory", "24")
    assert "24GiB" in line and "24GB" in line


@pytest.mark.parametrize("command", ["estimate", "check"])
def test_bare_number_is_refused_by_every_command_with_gpu_memory(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = ["--quick"] if command == "check" else []
    refused(capsys, "--gpu-memory", command, "llama-3.2-1b", *extra, "--gpu-memory", "40")


def test_trial_refuses_a_bare_number_before_running(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    refused(capsys, "--gpu-memory", "trial", "gpt2", "--gpu-memory", "24", "--db", str(tmp_path / "r.db"))


def test_marketing_size_is_the_cards_real_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-3.2-1b", "--gpu-memory", "80GB", "--json")
    assert code == 0
    card = find_gpu("A100 SXM 80GB")
    assert json.loads(out)["gpu_memory_bytes"] == card.usable_bytes
    assert card.usable_bytes > 79 * 1024**3  # not 80e9 bytes = 74.5 GiB


def test_card_name_in_gpu_memory_is_that_cards_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-3.2-1b", "--gpu-memory", "rtx4090", "--json")
    assert code == 0
    assert json.loads(out)["gpu_memory_bytes"] == find_gpu("RTX 4090").usable_bytes


def test_exact_binary_size_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-3.2-1b", "--gpu-memory", "81559MiB", "--json")
    assert code == 0
    assert json.loads(out)["gpu_memory_bytes"] == 81559 * 1024**2


def test_nonsense_gpu_memory_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--gpu-memory", "estimate", "gpt2", "--gpu-memory", "lots")
    assert "allowed" in line


def test_check_takes_gpu_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "llama-3.2-1b", "--quick", "--gpu", "A100-80GB", "--json")
    size = next(s for s in json.loads(out)["steps"] if s["name"] == "size")
    assert code in (0, 1)
    assert size["data"]["gpu_memory_bytes"] == find_gpu("A100-80GB").usable_bytes
    assert "A100 SXM 80GB" in size["summary"]


def test_gpu_and_gpu_memory_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, "--gpu", "check", "gpt2", "--quick", "--gpu", "T4", "--gpu-memory", "16GiB")


def test_bf16_on_a_card_without_bf16_warns(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "estimate", "gpt2", "--gpu", "T4")
    assert "warning: T4 (compute capability 7.5) has no bf16 support" in err
    _, _, err = run(capsys, "estimate", "gpt2", "--gpu", "V100 SXM2 32GB", "--precision", "mixed")
    assert "has no bf16 support" in err
    _, _, err = run(capsys, "estimate", "gpt2", "--gpu", "T4", "--precision", "fp16")
    assert "bf16" not in err
    _, _, err = run(capsys, "estimate", "gpt2", "--gpu", "A10")
    assert "bf16" not in err


# ------------------------------------------------------------------------------------------------ paths


def test_check_html_in_a_missing_folder_is_refused_before_work(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--html", "check", "llama-3.2-1b", "--quick", "--html", "/nonexistent/x.html")
    assert "/nonexistent" in line


def test_check_html_that_is_a_folder_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = refused(capsys, "--html", "check", "gpt2", "--quick", "--html", str(tmp_path))
    assert "folder" in line


def test_check_requirements_missing_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, "--requirements", "check", "gpt2", "--quick", "--requirements", "/nonexistent/req.txt")


# ------------------------------------------------------------------------------------------------ workload


def test_lora_targets_must_exist_in_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(
        capsys, "--lora-targets", "estimate", "llama-3.2-1b", "--method", "lora", "--lora-targets", "foo,bar"
    )
    assert "foo, bar" in line and "q_proj" in line


def test_lora_targets_that_exist_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "estimate", "llama-3.2-1b", "--method", "lora", "--lora-targets", "q_proj,v_proj", "--json"
    )
    assert code == 0 and json.loads(out)["trainable_params"] > 0


def test_seq_beyond_learned_positions_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--seq", "estimate", "gpt2", "--seq", "4096")
    assert "1024" in line


def test_new_tokens_past_positions_name_new_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, "--new-tokens", "estimate", "gpt2", "--task", "infer", "--seq", "1000", "--new-tokens", "100")


def test_default_seq_takes_the_models_own_length_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "gpt2", "--json")
    data = json.loads(out)
    assert code == 0
    assert any("--seq 1024" in a for a in data["assumptions"])


def test_seq_past_rope_context_warns(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "estimate", "llama-3.2-1b", "--seq", "200000", "--json")
    assert code == 0
    assert "warning: --seq: 200000 tokens exceed llama-3.2-1b's trained context (131072" in err


def test_range_message_says_the_real_range(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--batch", "estimate", "gpt2", "--batch", "2000000")
    assert "from 1 to 1,000,000" in line


def _gemma3_text(tmp_path: Path, **extra: object) -> Path:
    cfg = {
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 6912,
        "vocab_size": 262144,
        "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 26,
        "final_logit_softcapping": None,
        "max_position_embeddings": 32768,
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def test_unknown_model_type_warns_and_says_what_is_assumed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "estimate", str(_gemma3_text(tmp_path)), "--json")
    assert code == 0
    assert "warning: model_type 'gemma3_text' is not modelled" in err and "--as-family" in err
    first = json.loads(out)["assumptions"][0]
    assert "generic llama-style decoder" in first and "layer_types" in first and "sliding_window" in first


def test_as_family_sizes_as_that_family(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = str(_gemma3_text(tmp_path))
    code, out, err = run(capsys, "estimate", config, "--as-family", "gemma2", "--json")
    assert code == 0 and "warning" not in err
    assert json.loads(out)["assumptions"][0].startswith("model_type 'gemma3_text' sized as gemma2 (--as-family)")
    _, llama, _ = run(capsys, "estimate", config, "--json")
    # gemma2 ties the embeddings and has four norms a layer: a different count than the llama layout
    assert json.loads(out)["params"] != json.loads(llama)["params"]


def test_unknown_model_type_lacking_keys_is_refused_naming_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768, "vocab_size": 50280}), encoding="utf-8")
    line = refused(capsys, "MODEL", "estimate", str(path))
    assert "num_hidden_layers" in line and "num_attention_heads" in line


def test_as_family_unknown_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--as-family", "estimate", "gpt2", "--as-family", "gemma9")
    assert "llama" in line


# ------------------------------------------------------------------------------------------------ hub


def test_hub_offline_is_found_out_in_under_two_seconds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from gpuready.models.hub import fetch_config

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(InputError, match="cannot be reached"):
        fetch_config("Qwen/Qwen2.5-7B-Instruct")
    assert time.monotonic() - start < 2.0


def test_hf_hub_offline_is_respected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from gpuready.models.hub import fetch_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))

    def never(endpoint: str) -> str | None:
        raise AssertionError("HF_HUB_OFFLINE=1 must not touch the network")

    with pytest.raises(InputError, match="HF_HUB_OFFLINE"):
        fetch_config("org/model", reachable=never)


def test_local_hf_cache_config_is_used_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from gpuready.models.hub import fetch_config

    snap = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123", encoding="utf-8")
    (snap / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}), encoding="utf-8")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert fetch_config("org/tiny") == {"model_type": "llama", "hidden_size": 64}
