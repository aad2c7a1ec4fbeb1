"""Which kernel CUDA's scaled_dot_product_attention picks for a shape, and the layout of its output: whether
`out.transpose(1, 2).contiguous()` (what transformers' sdpa_attention_forward does next) copies, and what the
forward keeps. A probe for the estimator's attention model (memory/lm): run on a GPU machine,

    python3 benchmarks/sdpa_layout.py [--seq 2048] [--batch 2] > docs/calibration/sdpa_layout.txt

One line per case: heads, head_dim, mask (a boolean [B, 1, S, S] as transformers builds past a sliding window, or
is_causal), dtype; the kernels the profiler saw; whether transpose(1, 2) of the output is contiguous; the MiB the
forward allocated beyond its inputs and still held after it (output, log-sum-exp, the mask's converted copy)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--head-dims", default="64,80,96,112,128,160,192,256")
    args = parser.parse_args(argv)
    B, S = args.batch, args.seq
    dev = torch.device("cuda")
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, batch {B}, seq {S}")
    print("heads\thead_dim\tmask\tdtype\tkernels\tout_T_contiguous\theld_MiB")
    for dtype in (torch.bfloat16, torch.float32):
        for d in (int(x) for x in args.head_dims.split(",")):
            heads = max(1, 4096 // d)
            for masked in (True, False):
                q, k, v = (
                    torch.randn(B, S, heads, d, device=dev, dtype=dtype).transpose(1, 2).requires_grad_()
                    for _ in range(3)
                )
                mask = torch.ones(S, S, device=dev, dtype=torch.bool).tril()[None, None].expand(B, 1, S, S)
                mask = mask.contiguous() if masked else None
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                try:
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
                        torch.cuda.synchronize()
                except RuntimeError as exc:  # a kernel refusing the shape is a result
                    print(f"{heads}\t{d}\t{masked}\t{dtype}\terror: {str(exc).splitlines()[0][:80]}\t-\t-")
                    continue
                held = (torch.cuda.memory_allocated() - before) / 2**20
                names = sorted(
                    {e.name.split("<")[0][:48] for e in prof.events() if e.device_type.name == "CUDA"}
                    - {"Memcpy HtoD (Pageable -> Device)"}
                )
                contiguous = out.transpose(1, 2).is_contiguous()
                print(f"{heads}\t{d}\t{masked}\t{dtype}\t{'; '.join(names)[:160]}\t{contiguous}\t{held:.1f}")
                del out, q, k, v, mask
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
