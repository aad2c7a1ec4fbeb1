"""The model families added after the first nine: Gemma 3 (text), Qwen3-MoE, Qwen2-MoE, gpt-oss, Llama 4 (text),
DeepSeek-V3 and GPT-NeoX, read from their config.json as transformers builds them (parameter names and shapes
checked against a meta-device instantiation, tests/models/test_params.py).

Each family's features that the memory program does not model are data (data/families.json), named in the
estimate's assumptions; the same table names, for a model_type gpuready does not know, what sizing it as a
generic decoder leaves out.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from gpuready.errors import InputError
from gpuready.models.spec import ModelSpec, _get, _replace, _req, _with_params, has_eos_token

FAMILY_TYPES = ("gemma3_text", "qwen3_moe", "qwen2_moe", "gpt_oss", "llama4_text", "deepseek_v3", "gpt_neox")


@functools.cache
def family_table() -> dict[str, dict[str, Any]]:
    """model_type -> {features: [...], modelled: [...], not_modelled: [...], source}: data/families.json."""
    text = resources.files("gpuready.models").joinpath("data/families.json").read_text(encoding="utf-8")
    families: dict[str, dict[str, Any]] = json.loads(text)["families"]
    return families


def unmodelled_features(model_type: str) -> tuple[str, ...]:
    """What the memory program leaves out for this model_type (empty for a family it models fully or does not
    know)."""
    entry = family_table().get(model_type.lower())
    return tuple(entry["not_modelled"]) if entry else ()


def _layer_types(cfg: dict[str, Any], layers: int, pattern: int) -> list[str]:
    """transformers' layer_types: the config's own list, else every `pattern`-th layer full attention."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return [str(t) for t in types]
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]


def family_spec(cfg: dict[str, Any], mtype: str, name: str, source: str) -> ModelSpec:
    h = _req(cfg, "hidden_size")
    heads = _req(cfg, "num_attention_heads")
    layers = _req(cfg, "num_hidden_layers")
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    common: dict[str, Any] = {
        "name": name,
        "kind": "lm",
        "model_type": mtype,
        "source": source,
        "vocab": _req(cfg, "vocab_size"),
        "hidden": h,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "intermediate": _req(cfg, "intermediate_size"),
        "family_gaps": unmodelled_features(mtype),
        "max_positions": int(_get(cfg, "max_position_embeddings", default=0) or 0),
        "eos_token": has_eos_token(cfg, mtype),
    }
    bias: dict[str, bool] = {}
    extra: dict[str, Any]
    if mtype == "gemma3_text":
        # Gemma3DecoderLayer: input, post-attention, pre- and post-feedforward RMSNorms; q_norm and k_norm;
        # sliding_window on all but every sliding_window_pattern-th layer (5:1); embeddings tied by default
        window = cfg.get("sliding_window")
        pattern = int(_get(cfg, "sliding_window_pattern", default=6))
        types = _layer_types(cfg, layers, pattern)
        sliding = sum(t == "sliding_attention" for t in types) if window else 0
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", True)),
            "norms_per_layer": 4,
            "qk_norm": True,
            "sliding_window": int(window) if window else None,
            "sliding_layers": sliding,
            "logit_softcap": bool(cfg.get("final_logit_softcapping")),
            "attn_softcap": bool(cfg.get("attn_logit_softcapping")),
        }
        bias = {"qkv": bool(cfg.get("attention_bias")), "o": bool(cfg.get("attention_bias"))}
    elif mtype in ("qwen3_moe", "qwen2_moe"):
        sparse_step = int(_get(cfg, "decoder_sparse_step", default=1))
        if sparse_step != 1 or cfg.get("mlp_only_layers"):
            raise InputError("MODEL", f"{name}: {mtype} with dense layers between the MoE ones is not modelled")
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "qk_norm": mtype == "qwen3_moe",
            "experts": _req(cfg, "num_experts"),
            "experts_per_token": _req(cfg, "num_experts_per_tok"),
            "moe_intermediate": _req(cfg, "moe_intermediate_size"),
            "shared_intermediate": int(_get(cfg, "shared_expert_intermediate_size", default=0))
            if mtype == "qwen2_moe"
            else 0,
        }
        if mtype == "qwen2_moe":
            bias = {"qkv": bool(cfg.get("qkv_bias", True))}
        else:
            bias = {"qkv": bool(cfg.get("attention_bias")), "o": bool(cfg.get("attention_bias"))}
    elif mtype == "gpt_oss":
        # GptOssAttention: q/k/v/o with bias, one sink per head; GptOssMLP: a router with bias, experts as fused
        # gate_up (2 x intermediate) and down projections with biases; sliding and full attention alternate
        experts = int(_get(cfg, "num_local_experts", "num_experts", default=0))
        types = _layer_types(cfg, layers, 2)
        window = cfg.get("sliding_window")
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "experts": experts,
            "experts_per_token": int(_get(cfg, "num_experts_per_tok", "experts_per_token", default=0)),
            "moe_intermediate": _req(cfg, "intermediate_size"),
            "sliding_window": int(window) if window else None,
            "sliding_layers": sum(t == "sliding_attention" for t in types) if window else 0,
            "attn_sinks": True,
            "layer_extra_params": (heads, experts),  # sinks, router bias
        }
        bias = {"qkv": bool(cfg.get("attention_bias", True)), "o": bool(cfg.get("attention_bias", True)), "mlp": True}
    elif mtype == "llama4_text":
        # Llama4TextDecoderLayer: MoE every interleave_moe_layer_step-th layer (a router, experts of
        # intermediate_size and a shared expert of the same width), Llama4TextMLP of intermediate_size_mlp
        # elsewhere; the q/k L2 norm has no weight
        step = int(_get(cfg, "interleave_moe_layer_step", default=1))
        moe_layers = cfg.get("moe_layers")
        n_moe = len(moe_layers) if isinstance(moe_layers, list) else len(range(step - 1, layers, step))
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "intermediate": int(_get(cfg, "intermediate_size_mlp", default=common["intermediate"])),
            "experts": _req(cfg, "num_local_experts"),
            # Llama4TextMoe runs every expert on every token (routed_in = hidden_states.repeat(num_experts, 1),
            # scaled by the router's scores, zero for the experts not picked): the fan-out is all experts
            "experts_per_token": _req(cfg, "num_local_experts"),
            "moe_intermediate": _req(cfg, "intermediate_size"),
            "shared_intermediate": _req(cfg, "intermediate_size"),
            "dense_layers": layers - n_moe,
        }
        bias = {"qkv": bool(cfg.get("attention_bias")), "o": bool(cfg.get("attention_bias"))}
    elif mtype == "deepseek_v3":
        experts = _req(cfg, "n_routed_experts")
        q_lora = int(_get(cfg, "q_lora_rank", default=0) or 0)
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "experts": experts,
            "experts_per_token": _req(cfg, "num_experts_per_tok"),
            "moe_intermediate": _req(cfg, "moe_intermediate_size"),
            "shared_intermediate": _req(cfg, "moe_intermediate_size") * int(_get(cfg, "n_shared_experts", default=0)),
            "dense_layers": int(_get(cfg, "first_k_dense_replace", default=0)),
            "kv_lora_rank": _req(cfg, "kv_lora_rank"),
            "qk_rope_dim": _req(cfg, "qk_rope_head_dim"),
            "qk_nope_dim": _req(cfg, "qk_nope_head_dim"),
            "v_head_dim": _req(cfg, "v_head_dim"),
            "q_lora_rank": q_lora,
            "layer_extra_params": (q_lora,) if q_lora else (),  # q_a_layernorm
        }
        bias = {"qkv": bool(cfg.get("attention_bias")), "o": bool(cfg.get("attention_bias"))}
    elif mtype == "gpt_neox":
        # GPTNeoXLayer: LayerNorms with bias, a fused query_key_value and dense (o) with bias, an MLP of two
        # biased linears with GELU, rotary on rotary_pct of each head, attention and MLP in parallel
        pct = float(_get(cfg, "rotary_pct", "partial_rotary_factor", default=1.0))
        extra = {
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "gated_mlp": False,
            "norm": "layer",
            "kv_heads": heads,
            "head_dim": h // heads,
            "parallel_residual": bool(cfg.get("use_parallel_residual", True)),
            "rotary_dims": int(h // heads * pct),
        }
    else:  # pragma: no cover - FAMILY_TYPES lists the branches above
        raise InputError("MODEL", f"model_type {mtype!r} has no family reader")
    spec = ModelSpec(**{**common, **extra})
    if spec.experts and spec.layers and spec.dense_layers > spec.layers:
        raise InputError("MODEL", f"{name}: more dense layers than layers")
    return _with_params(_replace(spec), bias)
