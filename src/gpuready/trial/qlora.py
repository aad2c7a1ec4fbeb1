"""QLoRA's 4-bit base model for the probe (imported by trial/probe.py only, in the child process that runs torch).

The job measured is the usual QLoRA recipe: the base model loaded by `from_pretrained(...,
quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
bnb_4bit_compute_dtype=<the job's dtype>))`, then peft's LoRA adapters. Every nn.Linear (and GPT-2's Conv1D) but the
output head becomes bitsandbytes' Linear4bit, as transformers' `replace_with_bnb_linear` does; the embeddings, norms
and an MoE layer's fused expert parameters (3-D nn.Parameters, not modules) stay in the compute dtype. peft's
`prepare_model_for_kbit_training` (which casts those to fp32) is applied by the probe only for `--kbit-prep`
(trial/probe.py `_apply_lora`).

From a config there is no checkpoint to load, so `build_from_config` makes the same model the way from_pretrained
fills it: the modules are made without storage (accelerate's `init_empty_weights`, buffers real), the linear layers
replaced by Linear4bit, then each parameter in module order is made on the GPU in the compute dtype (random values:
memory does not depend on them) and, for a Linear4bit weight, quantized to NF4 there at once, the full-precision
copy freed before the next one is made. bitsandbytes' `Params4bit._quantize` is the step from_pretrained's
quantizer runs on each loaded weight.
"""

from __future__ import annotations

from typing import Any

KEEP = ("lm_head",)  # linear layers transformers leaves unquantized (the output head)


def bnb_config(dtype: Any) -> Any:
    """The BitsAndBytesConfig of the recipe (for a real checkpoint, `weights_path`)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call,unused-ignore]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
    )


def build_from_config(torch: Any, cfg: Any, dtype: Any, attn: str, *, device: Any = None, bnb: Any = None) -> Any:
    """The 4-bit model of `cfg` on `device` (default: the current CUDA device) (module docstring). `bnb`:
    the bitsandbytes module (a fake in tests)."""
    if bnb is None:
        import bitsandbytes as bnb  # type: ignore[import-not-found,no-redef,unused-ignore]
    from accelerate import init_empty_weights  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)  # type: ignore[no-untyped-call,unused-ignore]
    for name, module in list(model.named_modules()):
        for child, sub in list(module.named_children()):
            full = f"{name}.{child}" if name else child
            if (type(sub) is torch.nn.Linear or isinstance(sub, Conv1D)) and full not in KEEP:
                # (GPT-2's Conv1D keeps its weight as in x out: nx inputs, nf outputs)
                fan_in, fan_out = (sub.nx, sub.nf) if isinstance(sub, Conv1D) else (sub.in_features, sub.out_features)
                setattr(
                    module,
                    child,
                    bnb.nn.Linear4bit(
                        fan_in,
                        fan_out,
                        bias=sub.bias is not None,
                        compute_dtype=dtype,
                        compress_statistics=True,
                        quant_type="nf4",
                        quant_storage=torch.uint8,
                        device="meta",
                    ),
                )
    if getattr(model.config, "tie_word_embeddings", False):
        # tied before any storage is made, as from_pretrained ties them: the output head is the embedding
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        if head is not None and embed is not None:
            head.weight = embed.weight
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    made: dict[int, Any] = {}  # a tied parameter (one object under two names) is made once
    for module in model.modules():
        for pname, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            new = made.get(id(param))
            if new is None:
                data = torch.empty(param.shape, dtype=dtype, device=device).normal_(0.0, 0.02)
                if isinstance(module, bnb.nn.Linear4bit) and pname == "weight":
                    new = bnb.nn.Params4bit(
                        data,
                        requires_grad=False,
                        compress_statistics=True,
                        quant_type="nf4",
                        quant_storage=torch.uint8,
                        module=module,
                    )._quantize(device)
                else:
                    new = torch.nn.Parameter(data, requires_grad=param.requires_grad)
                del data
                made[id(param)] = new
            module._parameters[pname] = new
        for bname, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device:
                module._buffers[bname] = buf.to(device)
    return model
