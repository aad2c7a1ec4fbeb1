"""Achieved speed of CUDA's scaled_dot_product_attention kernels, forward and forward + backward, as the step-time
model counts their work (plan/ops/attention.py): flash with is_causal (half the S x S square), the memory-efficient
kernel and cuDNN's with is_causal and with the boolean [B, 1, S, S] sliding-window mask that transformers builds
once the sequence reaches the window (the whole square: every score computed, the mask read), and the same two calls
as the dispatcher runs them (`dispatch_*`: every backend allowed, cuDNN's first in bf16 on the H200).
Run on a GPU machine:

    python3 benchmarks/attn_speed.py [--seqs 2048,4096,8192,16384,32768] [--heads 32] [--head-dim 128] [--window 4096]
        > docs/calibration/attn_speed_h200.tsv

One line per (case, seq): milliseconds (median of --iters timed calls after --warmup, CUDA events) and TFLOP/s
(the model's FLOPs: 4 x heads x pairs x head_dim forward, 2.5 times that backward) for the forward and for forward
+ backward. A kernel that cannot run a case says so on its line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any


def timed(torch: Any, fn: Any, warmup: int, iters: int) -> float:
    """Median milliseconds of fn() over `iters` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="2048,4096,8192,16384,32768")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    H, D = args.heads, args.head_dim
    dev = torch.device("cuda")
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, batch 1, heads {H}, head_dim {D}, bf16")
    print("case\tseq\tfwd_ms\tfwd_tflops\tfwd_bwd_ms\tfwd_bwd_tflops")
    for S in (int(s) for s in args.seqs.split(",")):
        qkv = tuple(torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16)
        i = torch.arange(S, device=dev)
        # transformers' sliding-window causal mask: True where a query may attend (masking_utils)
        window = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < args.window))[None, None]
        every = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        cases = (
            ("flash_causal", [SDPBackend.FLASH_ATTENTION], {"is_causal": True}, 0.5),
            ("efficient_causal", [SDPBackend.EFFICIENT_ATTENTION], {"is_causal": True}, 0.5),
            ("efficient_masked", [SDPBackend.EFFICIENT_ATTENTION], {"attn_mask": window}, 1.0),
            ("cudnn_causal", [SDPBackend.CUDNN_ATTENTION], {"is_causal": True}, 0.5),
            ("cudnn_masked", [SDPBackend.CUDNN_ATTENTION], {"attn_mask": window}, 1.0),
            # what the dispatcher picks by itself (cuDNN first in bf16 on the H200: docs/calibration/sdpa_layout.txt)
            ("dispatch_causal", every, {"is_causal": True}, 0.5),
            ("dispatch_masked", every, {"attn_mask": window}, 1.0),
        )
        for name, backend, kwargs, share in cases:
            flops = 4.0 * H * S * S * share * D

            def forward(backend: Any = backend, kwargs: dict[str, Any] = kwargs, qkv: Any = qkv) -> Any:
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(*qkv, **kwargs)

            def both(forward: Any = forward, grad: Any = grad) -> None:
                forward().backward(grad)

            try:
                with torch.no_grad():
                    fwd = timed(torch, forward, args.warmup, args.iters)
                full = timed(torch, both, args.warmup, args.iters)
            except RuntimeError as exc:  # no such kernel for this shape, or out of memory
                print(f"{name}\t{S}\terror: {str(exc).splitlines()[0]}", flush=True)
                continue
            print(
                f"{name}\t{S}\t{fwd:.3f}\t{flops / fwd / 1e9:.1f}\t{full:.3f}\t{3.5 * flops / full / 1e9:.1f}",
                flush=True,
            )
        del qkv, grad, window
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
