"""The traced mode on a tiny model (CPU, fake tensors): skipped without torch/transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuready.memory.trace_record import cuda_sdpa_kernel
from gpuready.workload import make_workload

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
# embed 64k + 2 layers x (q 4096, k 2048, v 2048, o 4096, mlp 3 x 8192, 2 norms x 64) + norm 64 + head 64k
TINY_PARAMS = 64_000 + 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192 + 128) + 64 + 64_000


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_cuda_kernel_choice_follows_sdp_utils() -> None:
    assert cuda_sdpa_kernel(dtype_is_half=True, head_dim=128, has_mask=False, gqa=True) == "flash"
    fp32 = cuda_sdpa_kernel(dtype_is_half=False, head_dim=64, has_mask=False, gqa=False, fp32=True)
    assert fp32 == "efficient"
    assert cuda_sdpa_kernel(dtype_is_half=True, head_dim=128, has_mask=True, gqa=False) == "efficient"
    assert cuda_sdpa_kernel(dtype_is_half=False, head_dim=128, has_mask=False, gqa=True, fp32=True) == "math"
    assert cuda_sdpa_kernel(dtype_is_half=True, head_dim=512, has_mask=False, gqa=True) == "math"


@pytest.mark.torch
def test_full_training_trace(tiny: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpuready.memory.trace import trace_estimate

    est = trace_estimate(make_workload(model=tiny, batch=2, seq=32, precision="bf16"))
    assert est.mode == "trace"
    assert est.params == TINY_PARAMS
    assert est.trainable_params == TINY_PARAMS
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes > 2 * TINY_PARAMS
    assert est.peak_device_bytes > est.peak_reserved_bytes
    assert {"load", "forward", "backward", "optimizer"} <= set(est.phases)
    assert sum(est.breakdown.values()) == est.peak_allocated_bytes
    # bf16 weights: every parameter tensor is live at the peak, rounded to 512 B blocks
    assert est.breakdown["weights"] >= 2 * TINY_PARAMS
    assert est.phase in est.phases


@pytest.mark.torch
def test_optimizer_states_and_lora(tiny: str) -> None:
    pytest.importorskip("peft")
    from gpuready.memory.trace_run import run_trace

    full = run_trace(make_workload(model=tiny, batch=1, seq=16))
    assert "optimizer_states" in full.trace.labels
    lora = run_trace(make_workload(model=tiny, batch=1, seq=16, method="lora", lora_r=4))
    assert lora.params == TINY_PARAMS
    # 7 targets x 2 layers x r * (in + out)
    per_layer = 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert lora.trainable == 2 * per_layer


@pytest.mark.torch
def test_more_tokens_need_more_memory_and_extrapolation_matches_tracing(tiny: str) -> None:
    pytest.importorskip("transformers")
    from gpuready.memory.trace import _extrapolate_decode, _replay, trace_estimate
    from gpuready.memory.trace_run import run_trace

    w = make_workload(model=tiny, task="infer", batch=4, seq=64, new_tokens=9)
    traced = run_trace(w, decode_steps=8).trace
    short = run_trace(w, decode_steps=3).trace
    assert _extrapolate_decode(short, 8)
    assert len(short.events) == len(traced.events)
    assert _replay(short).peak_reserved == _replay(traced).peak_reserved
    assert _replay(short).peak_allocated == _replay(traced).peak_allocated
    small = trace_estimate(make_workload(model=tiny, task="infer", batch=4, seq=64, new_tokens=2))
    big = trace_estimate(make_workload(model=tiny, task="infer", batch=4, seq=64, new_tokens=200))
    # the tiny model's peak is the 32 MiB cuBLAS workspace plus prefill; decode grows with the cache:
    # 2 layers x (K + V) x 2 kv heads x 16 dims x 2 B x batch 4 = 1024 B per token, 198 more tokens
    assert big.phases["decode"] - small.phases["decode"] >= 198 * 1024


def test_sharded_jobs_are_refused() -> None:
    from gpuready.errors import InputError
    from gpuready.memory.trace import trace_estimate

    with pytest.raises(InputError):
        trace_estimate(make_workload(model="gpt2", gpus=2, shard="ddp"))


def test_sampling_is_refused_naming_the_flag() -> None:
    # top-p's sort scratch is made inside CUDA's kernels, which fake tensors never run (memory/lm/sampling.py)
    from gpuready.errors import InputError
    from gpuready.memory.trace import trace_estimate

    w = make_workload(model="gpt2", task="infer", seq=64, new_tokens=4, decoding="sample")
    with pytest.raises(InputError, match="greedy") as refused:
        trace_estimate(w)
    assert refused.value.field == "--decoding"


@pytest.mark.torch
def test_fit_against_a_gpu_size(tiny: str) -> None:
    pytest.importorskip("transformers")
    from gpuready.memory.trace import trace_estimate

    w = make_workload(model=tiny, batch=1, seq=16)
    roomy = trace_estimate(w, gpu_memory_bytes=80 * 2**30, find_max_batch=False)
    assert roomy.fits is True and roomy.cache_releases == 0
    # one rule with the arithmetic mode (memory/fit.py): headroom is the limit less the reserve there
    assert roomy.reserved_on_card_bytes == roomy.peak_reserved_bytes
    assert roomy.headroom_bytes == (roomy.allocator_limit_bytes or 0) - roomy.peak_reserved_bytes
    tight = trace_estimate(w, gpu_memory_bytes=2**20)
    assert tight.fits is False and (tight.headroom_bytes or 0) < 0


@pytest.mark.torch
def test_traced_max_batch_uses_the_fit_rule_of_both_modes(tiny: str) -> None:
    pytest.importorskip("transformers")
    from gpuready.memory.estimate import device_overhead_bytes
    from gpuready.memory.trace import _traced, _traced_fit, trace_estimate, traced_largest_batch

    w = make_workload(model=tiny, batch=1, seq=512)
    six = trace_estimate(w.model_copy(update={"batch": 6}), gpu_memory_bytes=80 * 2**30, find_max_batch=False)
    margin = 80 * 2**30 - device_overhead_bytes(w) - (six.allocator_limit_bytes or 0)
    card = six.peak_reserved_bytes + device_overhead_bytes(w) + margin  # batch 6 just fits
    found = {traced_largest_batch(w, card, guess)[0] for guess in (1, 6, 20)}
    assert len(found) == 1, "the search lands on the same batch from any starting guess"
    best = found.pop()
    assert best >= 6

    def fits(b: int) -> bool:
        wb = w.model_copy(update={"batch": b})
        return _traced_fit(wb, _traced(wb), card).fits

    assert fits(best) and not fits(best + 1)
    at = trace_estimate(w, gpu_memory_bytes=card)
    assert at.max_batch == best and at.fits is True and (at.headroom_bytes or 0) >= 0


def test_traced_vision_inference_runs_the_probes_no_grad_forwards() -> None:
    # vision inference was traced as a language model (model(input_ids=...)) and crashed; it now builds in fp32,
    # converts to bf16 and runs two no_grad forwards, and agrees with the arithmetic mode's live-tensor program
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from gpuready.memory import estimate
    from gpuready.memory.trace import trace_estimate

    w = make_workload(model="resnet18", task="infer", batch=8, precision="bf16")
    traced = trace_estimate(w)
    assert traced.phase == "forward"
    assert traced.peak_allocated_bytes == pytest.approx(estimate(w).peak_allocated_bytes, rel=0.05)


@pytest.mark.torch
def test_traced_fp32_prefill_takes_cudas_math_kernel_not_the_cpu_decomposition() -> None:
    # fp32 with grouped-query heads and no mask: CUDA's math kernel holds the scores, the safe softmax's output and
    # its one-byte mask at the peak; the CPU decomposition traced before allocated otherwise (llama-3.2-1b fp32
    # prefill 2 x 8192, measured 42.76 GiB allocated and 46.10 reserved: traced -9.4% and +17.3% before)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpuready.memory.trace import trace_estimate

    est = trace_estimate(make_workload(model="llama-3.2-1b", task="infer", batch=2, seq=8192, precision="fp32"))
    gib = 2**30
    assert est.peak_allocated_bytes == pytest.approx(42.76 * gib, rel=0.01)
    assert est.peak_reserved_bytes == pytest.approx(46.10 * gib, rel=0.02)


def _record(fn: object) -> list[tuple[int, str]]:
    """Run `fn(torch)` on fake CPU tensors under the traced mode's recorder and CUDA patches; returns the recorded
    allocations as (bytes, dtype-free label order) in order."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuready.memory.trace_record import Trace, as_on_cuda, make_recorder

    trace = Trace()
    with FakeTensorMode(allow_non_fake_inputs=True), make_recorder(torch, trace), as_on_cuda(torch, transformers):
        trace.mark("forward", "activations")
        fn(torch)  # type: ignore[operator]
    trace.recording = False
    return [(ev, trace.labels[i]) for i, ev in enumerate((e for e in trace.events if e > 0), start=1)]


@pytest.mark.torch
def test_training_dropout_keeps_cudas_one_byte_mask_not_a_noise_tensor() -> None:
    # CUDA's dropout is the fused native_dropout (output + bool mask kept for backward); the CPU's _dropout_impl makes
    # a noise tensor of the input's dtype (history ft_gpt2m_fp16: 4 MiB masks beside 8 MiB fp16 outputs; gpt2-medium
    # fp16 4 x 1024 traced +4.6% before)
    pytest.importorskip("transformers")

    def run(torch: object) -> None:
        import torch as t

        x = t.empty((4, 1024, 256), dtype=t.float16, requires_grad=True)
        y = t.nn.functional.dropout(x, 0.1, training=True)
        assert y.dtype == t.float16 and y.shape == x.shape
        off = t.nn.functional.dropout(x, 0.1, training=False)
        assert off is x
        (grad,) = t.autograd.grad(y, x, t.empty_like(y))
        assert grad.shape == x.shape and grad.dtype == t.float16

    allocs = [n for n, _ in _record(run)]
    element = 4 * 1024 * 256
    # input; the one-byte mask before the output, as CUDA's kernel makes them (history ac_gpt2_full_b8); backward:
    # the incoming gradient and native_dropout_backward's one output
    assert allocs == [2 * element, element, 2 * element, 2 * element, 2 * element]


@pytest.mark.torch
def test_cuda_autocast_casts_a_layer_norms_arguments_right_to_left() -> None:
    # under CUDA autocast layer_norm runs in fp32; its wrapper casts the arguments of one C++ call, which GCC
    # evaluates last to first: with bf16 weights the GPU casts bias and weight (3 KiB each for 768) before the
    # 24 MiB input (history ac_gpt2_full_b8)
    pytest.importorskip("transformers")

    def run(torch: object) -> None:
        import torch as t

        from gpuready.memory.trace_record import cuda_autocast_lists

        x = t.empty((8, 1024, 768), dtype=t.bfloat16)
        weight = t.empty(768, dtype=t.bfloat16)
        bias = t.empty(768, dtype=t.bfloat16)
        with t.autocast("cpu", dtype=t.bfloat16), cuda_autocast_lists(t):
            y = t.nn.functional.layer_norm(x, (768,), weight, bias, 1e-5)
        assert y.dtype == t.float32

    allocs = [n for n, _ in _record(run)]
    tokens = 8 * 1024
    assert allocs[:6] == [2 * tokens * 768, 2 * 768, 2 * 768, 4 * 768, 4 * 768, 4 * tokens * 768]
    assert allocs[6] == 4 * tokens * 768  # the fp32 output


@pytest.mark.torch
def test_math_attention_with_autograd_allocates_as_cudas_composite() -> None:
    # fp32 with grouped-query heads takes CUDA's math path; with autograd it adds the mask in place and _safe_softmax
    # makes a one-byte comparison of the scores (history ft_qwen05_fp32); the CPU's composite on fake tensors added
    # out of place (one more fp32 scores tensor) and had no comparison: qwen2.5-0.5b fp32 4 x 1024 traced -7.0%
    pytest.importorskip("transformers")

    b, h, hk, length, d = 2, 4, 2, 96, 8  # every tensor size below distinct

    def run(torch: object) -> None:
        import torch as t

        q = t.empty((b, h, length, d), requires_grad=True)
        k = t.empty((b, hk, length, d), requires_grad=True)
        v = t.empty((b, hk, length, d), requires_grad=True)
        out = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.sum().backward()

    recorded = _record(run)
    # the cuBLAS workspace ("other", once per thread: one here, where no backward phase is marked) comes right after
    # the first matmul's output, the scores, as on CUDA
    sizes = [n for n, _ in recorded]
    assert [n for n, label in recorded if label == "other"] == [32 << 20]
    assert sizes[sizes.index(32 << 20) - 1] == b * h * length * length * 4
    allocs = [n for n, label in recorded if label != "other"]
    scores = b * h * length * length
    assert allocs.count(scores) == 1  # the comparison's bool mask
    first = allocs.index(scores * 4)
    # scores, probabilities, the comparison: no out-of-place copy of the scores in between
    assert allocs[first : first + 3] == [scores * 4, scores * 4, scores]
    # before them: the causal mask as CUDA makes it (bool ones, tril, two scalars, the float mask)
    mask = allocs.index(length * length * 4)
    assert mask < first
    assert allocs[mask - 4 : mask + 1] == [length * length, length * length, 4, 4, length * length * 4]


@pytest.mark.torch
def test_autocast_runs_cudas_fp32_ops_in_fp32() -> None:
    # CUDA autocast runs pow (GPT-2's gelu_new), layer_norm, exp... in fp32 and softmax/sum with dtype=float32; CPU
    # autocast leaves them in bf16 (history ft_gpt2l_mixed: gpt2-large mixed 4 x 1024 traced -8.8%, allocated -13.9%)
    pytest.importorskip("transformers")
    seen: dict[str, object] = {}

    def run(torch: object) -> None:
        import torch as t

        x = t.empty((4, 8), dtype=t.bfloat16)
        with t.autocast("cpu", dtype=t.bfloat16):
            seen["pow"] = t.pow(x, 3.0).dtype
            seen["operator"] = (x**3.0).dtype
            seen["softmax"] = t.nn.functional.softmax(x, dim=-1).dtype
            seen["sum"] = x.sum().dtype
            seen["linear"] = t.nn.functional.linear(t.empty((4, 8)), t.empty((8, 8))).dtype
        seen["outside"] = t.pow(x, 3.0).dtype

    _record(run)
    import torch

    assert seen["pow"] == seen["operator"] == seen["softmax"] == seen["sum"] == torch.float32
    assert seen["linear"] == seen["outside"] == torch.bfloat16


@pytest.mark.torch
def test_bias_gradient_sum_takes_cudas_reduction_buffer() -> None:
    # a sum over the leading dimensions into 2048 contiguous outputs over 32768 rows stages fp32 partials in a
    # 132 MiB global buffer on the H200 (history ft_llama1b_mixed_ckpt_b8, the norm weights' gradients); the CPU
    # kernel has none. Summing the last dimension (one output per row) does not.
    pytest.importorskip("transformers")
    from gpuready.memory.lm.ops import reduce_buffer_bytes

    def run(torch: object) -> None:
        import torch as t

        x = t.empty((8, 4096, 2048))
        x.sum((0, 1))
        x.sum(-1)

    allocs = [n for n, _ in _record(run)]
    buffer = reduce_buffer_bytes(2048, 8 * 4096)
    assert buffer == 132 * 2**20
    assert allocs == [8 * 4096 * 2048 * 4, 2048 * 4, buffer, 8 * 4096 * 4]


@pytest.mark.torch
def test_flash_backward_scratch_is_one_block_after_the_gradients() -> None:
    # flash's backward under GQA: dq, dk, dv, then one scratch block (fp32 dq accumulator, row sums, dk and dv at the
    # query's head count) freed on return: 516 MiB at 8 x 4096, 32 heads of 64 over 8 (history ft_llama1b_mixed_ckpt_b8)
    pytest.importorskip("transformers")
    b, h, hk, length, d = 1, 8, 2, 256, 64

    def run(torch: object) -> None:
        import torch as t

        q = t.empty((b, h, length, d), dtype=t.bfloat16, requires_grad=True)
        k = t.empty((b, hk, length, d), dtype=t.bfloat16, requires_grad=True)
        v = t.empty((b, hk, length, d), dtype=t.bfloat16, requires_grad=True)
        out = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(t.empty_like(out))

    allocs = [n for n, _ in _record(run)]
    qb, kb = b * h * length * d * 2, b * hk * length * d * 2
    scratch = b * h * length * (d + 1) * 4 + 2 * b * h * length * d * 2
    assert allocs[-4:] == [qb, kb, kb, scratch]


@pytest.mark.torch
@pytest.mark.parametrize(
    ("history", "job"),
    [
        ("ft_qwen05_fp32.json.gz", {"model": "qwen2.5-0.5b", "batch": 4, "seq": 1024, "precision": "fp32"}),
        ("ft_gpt2m_fp16.json.gz", {"model": "gpt2-medium", "batch": 4, "seq": 1024, "precision": "fp16"}),
    ],
)
def test_traced_training_reserve_matches_the_recorded_history(history: str, job: dict[str, object]) -> None:
    # the math path with autograd (qwen2.5-0.5b fp32: -7.0% before) and CUDA's dropout (gpt2-medium fp16: +4.6%
    # before), against the H200's own allocator history of the same job
    pytest.importorskip("transformers")
    from gpuready.memory.history import load_history
    from gpuready.memory.trace import trace_estimate

    doc = load_history(Path(__file__).resolve().parents[2] / "docs" / "calibration" / "histories" / history)
    est = trace_estimate(make_workload(**job))  # type: ignore[arg-type]
    assert est.peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.003)
    assert est.peak_reserved_bytes == pytest.approx(doc["peak_reserved_bytes"], rel=0.005)


@pytest.mark.torch
def test_traced_mixed_precision_with_checkpointing_recomputes_with_cudas_fp32_ops(tmp_path: Path) -> None:
    # GPT-2's gelu_new runs pow in fp32 under CUDA autocast (the traced mode's cuda_autocast_lists); checkpointing
    # recomputes it in backward, outside the trace's TorchFunctionModes: without the lists entered again there the
    # recomputed tensors came out bf16 and torch.utils.checkpoint refused them (CheckpointError, an internal error of
    # `estimate --trace`)
    pytest.importorskip("transformers")
    import json

    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 512}
    path = tmp_path / "gpt2_tiny.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    w = make_workload(model=str(path), precision="mixed", grad_ckpt=True, batch=2, seq=64)
    from gpuready.memory.trace import trace_estimate

    est = trace_estimate(w)
    plain = trace_estimate(w.model_copy(update={"grad_ckpt": False}))
    assert 0 < est.peak_allocated_bytes < plain.peak_allocated_bytes  # checkpointing keeps less
