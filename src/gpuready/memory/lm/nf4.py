"""QLoRA's 4-bit linear layers (bitsandbytes Linear4bit, NF4 with double quantization) as the recorded H200
histories show their allocations: docs/calibration/histories/qlora_llama8b_b1_s2048.json.gz and
qlora_qwen3_4b_ckpt_b8_s2048.json.gz (bitsandbytes 0.50.2, torch 2.11, transformers 5.17, peft 0.21; the probe's
4-bit model, trial/qlora.py).

For a weight of n parameters (blocks of 64, the absmax of each block quantized again in blocks of 256):

- Loading (`Params4bit._quantize` on each weight as it arrives, bitsandbytes functional.quantize_4bit): the
  weight in the compute dtype; the blocks' fp32 absmax (n/64 x 4 bytes); the packed NF4 codes (n/2 bytes, kept);
  the NF4 code table (16 fp32, kept) and two scratch scalars; the absmax offset (one fp32, kept) with two scratch
  tensors; the absmax less its offset (fp32, scratch); the nested quantization's code table (256 fp32, kept), its
  absmax (fp32 per 256 blocks, kept), the absmax as 8-bit codes (n/64 bytes, kept) and one more 256-entry table
  (kept); then the scratch absmax copies and the full-precision weight go.
- Each forward matmul (`_dequant_linear_fallback`): the absmax dequantized (fp32) and offset (fp32), the weight
  dequantized to the compute dtype, the output; then the two absmax copies and the weight go.
- Each backward input gradient (MatMul4Bit.backward): the absmax dequantized, the weight dequantized, the absmax
  freed, the input gradient made, the weight freed.
"""

from __future__ import annotations

from gpuready.memory.program import Program

BLOCK = 64  # bitsandbytes' default 4-bit block size
NESTED_BLOCK = 256  # the double quantization's block of absmax values
TABLE = 256 * 4  # a 256-entry fp32 code table (the nested quantization's)
NF4_TABLE = 16 * 4  # the 16 NF4 values in fp32


def absmax_bytes(n: int) -> int:
    """The fp32 absmax of n parameters' blocks."""
    return -(-n // BLOCK) * 4


def kept_bytes(n: int) -> int:
    """What a quantized weight of n parameters keeps on the GPU (the packed codes and the quantization state)."""
    blocks = -(-n // BLOCK)
    return -(-n // 2) + blocks + -(-blocks // NESTED_BLOCK) * 4 + 2 * TABLE + NF4_TABLE + 4


def load(prog: Program, n: int, param_bytes: int) -> None:
    """One weight of n parameters loaded in `param_bytes` per parameter and quantized (module docstring)."""
    blocks = -(-n // BLOCK)
    alloc, free = prog.alloc, prog.free
    weight = alloc("weights", n * param_bytes)
    absmax = alloc("quantization_temporaries", absmax_bytes(n))
    alloc("weights", -(-n // 2))  # the packed codes
    alloc("weights", NF4_TABLE)
    prog.transient("quantization_temporaries", NF4_TABLE, 4)
    alloc("weights", 4)  # the absmax offset
    prog.transient("quantization_temporaries", 128, 4)
    shifted = alloc("quantization_temporaries", absmax_bytes(n))
    alloc("weights", TABLE)
    alloc("weights", -(-blocks // NESTED_BLOCK) * 4)
    alloc("weights", blocks)  # the absmax as 8-bit codes
    alloc("weights", TABLE)
    free(shifted)
    free(absmax)
    free(weight)


def forward_output(prog: Program, n: int, act_bytes: int, output_bytes: int) -> int:
    """A 4-bit linear's forward: its output's handle (the dequantization's temporaries come and go around it)."""
    first = prog.alloc("quantization_temporaries", absmax_bytes(n))
    second = prog.alloc("quantization_temporaries", absmax_bytes(n))
    weight = prog.alloc("quantization_temporaries", n * act_bytes)
    out = prog.alloc("activations", output_bytes)
    prog.free(second)
    prog.free(first)
    prog.free(weight)
    return out


def input_grad(prog: Program, n: int, act_bytes: int, grad_bytes: int) -> int:
    """A 4-bit linear's input gradient in backward: its handle (the weight dequantized around it)."""
    absmax = prog.alloc("quantization_temporaries", absmax_bytes(n))
    weight = prog.alloc("quantization_temporaries", n * act_bytes)
    prog.free(absmax)
    grad = prog.alloc("activations", grad_bytes)
    prog.free(weight)
    return grad
