"""A model's shape, read from a Hugging Face config.json (or torchvision constructor arguments).

Parameter counts are computed from these shapes and must equal what transformers/torchvision count for the
same config (tests/models check every preset against a meta-device instantiation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpuready.errors import InputError

LM_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma2",
    "phi3",
    "deepseek_v2",
    "gpt2",
    # families added with their presets (models/families.py): transformers' model types
    "gemma3_text",
    "qwen3_moe",
    "qwen2_moe",
    "gpt_oss",
    "llama4_text",
    "deepseek_v3",
    "gpt_neox",
)
VISION_TYPES = ("resnet", "vit", "dinov2", "siglip_vision_model")


@dataclass(frozen=True)
class Linear:
    """One linear layer inside a transformer block: its name as peft targets it, and its shape."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1  # identical copies per layer (MoE experts)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: resolve_model caches them
class ModelSpec:
    name: str
    kind: Literal["lm", "vision"]
    model_type: str
    source: str = ""
    # language models (zeros for vision)
    vocab: int = 0
    hidden: int = 0
    layers: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    tied: bool = False
    gated_mlp: bool = True
    norm: Literal["rms", "layer"] = "rms"
    norms_per_layer: int = 2
    qk_norm: bool = False
    learned_positions: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers use the sliding window (gemma2: every other one)
    logit_softcap: bool = False
    attn_softcap: bool = False  # gemma2: eager attention soft-caps its scores (/ cap, tanh, * cap)
    # mixture of experts
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP (deepseek first_k_dense_replace)
    # multi-head latent attention (deepseek)
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0  # deepseek_v3: queries through a low-rank q_a_proj -> q_a_layernorm -> q_b_proj
    # small per-layer parameters the linears and norms do not cover (numel each): gpt-oss's attention sinks and
    # router bias, qwen2_moe's shared-expert gate is a Linear, deepseek_v3's q_a_layernorm
    layer_extra_params: tuple[int, ...] = ()
    parallel_residual: bool = False  # gpt_neox: x + attn(ln1(x)) + mlp(ln2(x))
    rotary_dims: int = 0  # rotated part of each head (gpt_neox rotary_pct); 0: the whole head
    attn_sinks: bool = False  # gpt-oss: a learned sink per head; transformers runs its eager attention
    # the config names an end-of-sequence token, so generate(min_new_tokens=...) adds its two minimum-length
    # processors (has_eos_token)
    eos_token: bool = True
    # features of this family that the memory program does not model (named in the estimate's assumptions)
    family_gaps: tuple[str, ...] = ()
    # vision
    vision: dict[str, Any] = field(default_factory=dict)
    # derived
    params: int = 0
    block_linears: tuple[Linear, ...] = ()  # per decoder layer (MoE layer for MoE models)
    max_positions: int = 0  # max_position_embeddings / n_positions (0: the config does not say)
    # sized as another family: the config's own model_type, and its keys that family does not model
    assumed_from: str | None = None
    unmodelled: tuple[str, ...] = ()

    @property
    def active_params(self) -> int:
        """Parameters one token's forward multiplies by: for MoE, the experts it is routed to (experts_per_token,
        which for Llama 4 is every expert, as transformers computes them), for step-time FLOPs."""
        if not self.experts:
            return self.params
        per_expert = sum(lin.in_features * lin.out_features for lin in self.block_linears if lin.count > 1)
        idle = (self.layers - self.dense_layers) * per_expert * (self.experts - self.experts_per_token)
        return self.params - idle

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_bytes_per_token_per_layer_elems(self) -> int:
        """Elements cached per token per layer (K and V). MLA: transformers 5 caches the compressed latent
        (DeepseekV2/V3Attention: `past_key_values.update(kv_nope, k_rot)`, kv_lora_rank + qk_rope_head_dim, one
        head) and expands it at every step."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_dim
        return 2 * self.kv_heads * self.head_dim


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _req(cfg: dict[str, Any], *names: str) -> int:
    value = _get(cfg, *names)
    if value is None:
        raise InputError("MODEL", f"config.json lacks {names[0]!r}; cannot size this model")
    return int(value)


# What the llama layout reads; an unknown model_type needs these to be sized as a generic decoder.
GENERIC_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
# Config keys whose names point at architecture the generic (llama) layout does not model.
_FEATURE_HINTS = (
    "sliding",
    "window",
    "layer_types",
    "softcap",
    "expert",
    "moe",
    "vision",
    "audio",
    "cross_attention",
    "ssm",
    "mamba",
    "conv",
    "linear_attn",
    "chunk",
    "pattern",
    "lora_rank",
    "per_layer",
    "shared_kv",
    "altup",
    "laurel",
    "query_pre_attn",
    "num_nextn",
    "mtp",
)


def unmodelled_keys(cfg: dict[str, Any]) -> tuple[str, ...]:
    """Keys of a config that name features a generic decoder estimate leaves out (sliding windows, experts...)."""
    return tuple(sorted(k for k in cfg if any(h in k.lower() for h in _FEATURE_HINTS) and cfg[k] not in (None, False)))


def spec_from_config(cfg: dict[str, Any], name: str, source: str = "", family: str | None = None) -> ModelSpec:
    """Turn a config dict (HF config.json or a torchvision preset) into a ModelSpec with its parameter count.

    `family` (the `--as-family` flag) sizes the config as that model_type. A model_type gpuready does not model
    is sized as a generic llama-style decoder when the config has the keys that needs, and the spec says so
    (`assumed_from`, `unmodelled`); without those keys it is refused, naming the missing ones."""
    own = str(cfg.get("model_type", "")).lower()
    if family is not None:
        if family not in LM_TYPES:
            raise InputError("--as-family", f"got {family!r}; allowed: {', '.join(LM_TYPES)}")
        if own in VISION_TYPES:
            raise InputError("--as-family", f"{name} is a vision model ({own}); --as-family is for language models")
        spec = _family_or_lm({**cfg, "model_type": family}, family, name, source)
        if own == family:
            return spec
        return _replace(spec, assumed_from=own or "(none)", unmodelled=unmodelled_keys(cfg))
    if own in VISION_TYPES:
        from gpuready.models.vision import vision_spec

        return vision_spec(cfg, name, source)
    if own in LM_TYPES:
        return _family_or_lm(cfg, own, name, source)
    missing = [k for k in GENERIC_KEYS if cfg.get(k) is None]
    if missing:
        allowed = ", ".join(LM_TYPES + VISION_TYPES)
        raise InputError(
            "MODEL",
            f"model_type {own or '(none)'!r} is not modelled and its config lacks {', '.join(missing)} (needed to "
            f"size it as a generic decoder); modelled: {allowed}",
        )
    spec = _lm_spec({**cfg, "model_type": "llama"}, "llama", name, source)
    return _replace(spec, model_type=own or "llama", assumed_from=own or "(none)", unmodelled=unmodelled_keys(cfg))


def _family_or_lm(cfg: dict[str, Any], mtype: str, name: str, source: str) -> ModelSpec:
    """A language model's spec by its model_type: the families' own layouts (models/families.py), else _lm_spec."""
    from gpuready.models.families import FAMILY_TYPES, family_spec

    return family_spec(cfg, mtype, name, source) if mtype in FAMILY_TYPES else _lm_spec(cfg, mtype, name, source)


def _lm_spec(cfg: dict[str, Any], mtype: str, name: str, source: str) -> ModelSpec:
    positions = int(_get(cfg, "max_position_embeddings", "n_positions", default=0) or 0)
    if mtype == "gpt2":
        h = _req(cfg, "n_embd", "hidden_size")
        heads = _req(cfg, "n_head", "num_attention_heads")
        spec = ModelSpec(
            name=name,
            kind="lm",
            model_type=mtype,
            source=source,
            vocab=_req(cfg, "vocab_size"),
            hidden=h,
            layers=_req(cfg, "n_layer", "num_hidden_layers"),
            heads=heads,
            kv_heads=heads,
            head_dim=h // heads,
            intermediate=int(_get(cfg, "n_inner", default=None) or 4 * h),
            tied=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False,
            norm="layer",
            learned_positions=_req(cfg, "n_positions", "max_position_embeddings"),
            max_positions=positions,
        )
        return _with_params(spec)
    h = _req(cfg, "hidden_size")
    heads = _req(cfg, "num_attention_heads")
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    sliding = cfg.get("sliding_window")
    if mtype in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        sliding = None
    layers = _req(cfg, "num_hidden_layers")
    sliding_layers = 0
    if sliding:
        sliding_layers = (layers + 1) // 2 if mtype == "gemma2" else layers
    experts = int(_get(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0))
    spec = ModelSpec(
        name=name,
        kind="lm",
        model_type=mtype,
        source=source,
        max_positions=positions,
        vocab=_req(cfg, "vocab_size"),
        hidden=h,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        intermediate=_req(cfg, "intermediate_size"),
        tied=bool(cfg.get("tie_word_embeddings", mtype == "gemma2")),
        norms_per_layer=4 if mtype == "gemma2" else 2,
        qk_norm=mtype == "qwen3",
        sliding_window=int(sliding) if sliding else None,
        sliding_layers=sliding_layers,
        logit_softcap=bool(cfg.get("final_logit_softcapping")),
        attn_softcap=bool(cfg.get("attn_logit_softcapping")),
        experts=experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", default=0)),
        moe_intermediate=int(_get(cfg, "moe_intermediate_size", default=0) or _get(cfg, "intermediate_size")),
        shared_intermediate=int(_get(cfg, "moe_intermediate_size", default=0))
        * int(_get(cfg, "n_shared_experts", default=0)),
        dense_layers=int(_get(cfg, "first_k_dense_replace", default=0)) if experts else 0,
        kv_lora_rank=int(_get(cfg, "kv_lora_rank", default=0)),
        qk_rope_dim=int(_get(cfg, "qk_rope_head_dim", default=0)),
        qk_nope_dim=int(_get(cfg, "qk_nope_head_dim", default=0)),
        v_head_dim=int(_get(cfg, "v_head_dim", default=0)),
        eos_token=has_eos_token(cfg, mtype),
    )
    bias = {
        "qkv": mtype == "qwen2" or bool(cfg.get("attention_bias", False)),
        "o": bool(cfg.get("attention_bias", False)) and mtype != "qwen2",
        "mlp": bool(cfg.get("mlp_bias", False)),
    }
    return _with_params(spec, bias)


# transformers 5's config classes that set no default eos_token_id (Qwen2Config, Qwen3Config, Qwen2MoeConfig,
# Qwen3MoeConfig, GptOssConfig: read on transformers 5.24; LlamaConfig, Phi3Config, MistralConfig, Gemma2/3 and the
# others default to one). A model built from a config without the key then has no end-of-sequence token.
NO_DEFAULT_EOS = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gpt_oss")


def has_eos_token(cfg: dict[str, Any], model_type: str) -> bool:
    """Whether a model built from `cfg` has an end-of-sequence token: the config's eos_token_id where it gives
    one (every hub config does), else its config class's default (NO_DEFAULT_EOS). generate() adds the minimum-length
    processors only with one (the recorded histories gen_qwen05_b64, gen_qwen3_4b_b64 and h57_gen_qwen3_06b_b128 of
    presets built without the key have none; gen_llama8b_b8 has them)."""
    if "eos_token_id" in cfg:
        return cfg["eos_token_id"] is not None
    return model_type not in NO_DEFAULT_EOS


def block_linears(spec: ModelSpec, bias: dict[str, bool] | None = None) -> tuple[Linear, ...]:
    """The linear layers of one decoder block, named as peft's target_modules name them."""
    b = bias or {}
    h, d, a, kv = spec.hidden, spec.head_dim, spec.heads, spec.kv_heads
    if spec.model_type == "gpt2":
        return (
            Linear("c_attn", h, 3 * h, True),
            Linear("c_proj", h, h, True),
            Linear("c_fc", h, spec.intermediate, True),
            Linear("mlp.c_proj", spec.intermediate, h, True),
        )
    attn: tuple[Linear, ...]
    if spec.mla and spec.q_lora_rank:
        attn = (
            Linear("q_a_proj", h, spec.q_lora_rank),
            Linear("q_b_proj", spec.q_lora_rank, a * (spec.qk_nope_dim + spec.qk_rope_dim)),
            Linear("kv_a_proj_with_mqa", h, spec.kv_lora_rank + spec.qk_rope_dim),
            Linear("kv_b_proj", spec.kv_lora_rank, a * (spec.qk_nope_dim + spec.v_head_dim)),
            Linear("o_proj", a * spec.v_head_dim, h),
        )
    elif spec.model_type == "gpt_neox":
        return (
            Linear("query_key_value", h, 3 * h, True),
            Linear("dense", h, h, True),
            Linear("dense_h_to_4h", h, spec.intermediate, True),
            Linear("dense_4h_to_h", spec.intermediate, h, True),
        )
    elif spec.mla:
        attn = (
            Linear("q_proj", h, a * (spec.qk_nope_dim + spec.qk_rope_dim)),
            Linear("kv_a_proj_with_mqa", h, spec.kv_lora_rank + spec.qk_rope_dim),
            Linear("kv_b_proj", spec.kv_lora_rank, a * (spec.qk_nope_dim + spec.v_head_dim)),
            Linear("o_proj", a * spec.v_head_dim, h),
        )
    elif spec.model_type == "phi3":
        attn = (Linear("qkv_proj", h, (a + 2 * kv) * d), Linear("o_proj", a * d, h))
    else:
        qkv = b.get("qkv", False)
        attn = (
            Linear("q_proj", h, a * d, qkv),
            Linear("k_proj", h, kv * d, qkv),
            Linear("v_proj", h, kv * d, qkv),
            Linear("o_proj", a * d, h, b.get("o", False)),
        )
    mb = b.get("mlp", False)
    if spec.model_type == "phi3":
        return (
            *attn,
            Linear("gate_up_proj", h, 2 * spec.intermediate),
            Linear("down_proj", spec.intermediate, h),
        )
    if spec.experts:
        i = spec.moe_intermediate
        mlp: tuple[Linear, ...] = (
            Linear("gate_proj", h, i, mb, spec.experts),
            Linear("up_proj", h, i, mb, spec.experts),
            Linear("down_proj", i, h, mb, spec.experts),
        )
        if spec.shared_intermediate:
            s = spec.shared_intermediate
            # deepseek names them shared_experts, qwen2_moe and llama4 shared_expert (peft matches either by the
            # last part of the name)
            prefix = "shared_expert." if spec.model_type in ("qwen2_moe", "llama4_text") else "shared_experts."
            mlp += (
                Linear(prefix + "gate_proj", h, s),
                Linear(prefix + "up_proj", h, s),
                Linear(prefix + "down_proj", s, h),
            )
            if spec.model_type == "qwen2_moe":
                mlp += (Linear("shared_expert_gate", h, 1),)
        return attn + mlp
    i = spec.intermediate
    return (*attn, Linear("gate_proj", h, i, mb), Linear("up_proj", h, i, mb), Linear("down_proj", i, h, mb))


def _linear_params(lins: tuple[Linear, ...]) -> int:
    return sum((lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0)) * lin.count for lin in lins)


def _with_params(spec: ModelSpec, bias: dict[str, bool] | None = None) -> ModelSpec:
    lins = block_linears(spec, bias)
    h = spec.hidden
    norm_params = h * (2 if spec.norm == "layer" else 1)
    per_layer = _linear_params(lins) + spec.norms_per_layer * norm_params
    if spec.qk_norm:
        per_layer += 2 * spec.head_dim
    if spec.mla:
        per_layer += spec.kv_lora_rank  # kv_a_layernorm
    per_layer += sum(spec.layer_extra_params)
    total_layers = per_layer * spec.layers
    if spec.experts:
        total_layers += spec.layers * h * spec.experts  # router
        if spec.dense_layers:
            dense = 3 * h * spec.intermediate
            moe = sum(
                lin.in_features * lin.out_features * lin.count
                for lin in lins
                if lin.name.endswith(("gate_proj", "up_proj", "down_proj"))
            )
            total_layers += spec.dense_layers * (dense - moe - h * spec.experts)
    embed = spec.vocab * h
    params = total_layers + embed + norm_params + spec.learned_positions * h
    if not spec.tied:
        params += embed
    return _replace(spec, params=params, block_linears=lins)


def _replace(spec: ModelSpec, **changes: Any) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, **changes)
