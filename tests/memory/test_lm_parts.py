"""The parts of memory/lm/ one by one: autograd bookkeeping, the blocks, the loss, generate's sampler and FSDP2."""

from __future__ import annotations

import pytest

from gpuready.memory.lm.autograd import Layer, block_backward
from gpuready.memory.lm.blocks_infer import block_nograd
from gpuready.memory.lm.blocks_train import block_forward
from gpuready.memory.lm.context import Ctx, make_ctx
from gpuready.memory.lm.fsdp import Fsdp
from gpuready.memory.lm.loss import Sampler, logits_and_loss_backward, logits_and_loss_forward
from gpuready.memory.program import Program, rounded
from gpuready.models import resolve_model
from gpuready.workload import Workload


def ctx_for(model: str = "llama-3.2-1b", **fields: object) -> Ctx:
    w = Workload(model=model, batch=2, seq=64, **fields)  # type: ignore[arg-type]
    return make_ctx(resolve_model(model), w)


def test_backward_frees_what_the_layer_kept_and_keeps_the_weight_gradients() -> None:
    prog = Program()
    layer = Layer(prog, keep=True)
    layer.save(4096, grad=2048)
    layer.weight_grad(8192)
    layer.save(1024, grad=512, transient=(4096, 4096))
    saved = layer.finish()
    grads: list[int] = []
    block_backward(prog, saved, grads, accumulate=False)
    assert [prog.size_of(g) for g in grads] == [8192]
    assert prog.allocated == 8192  # every kept tensor and every activation gradient is gone
    # walked in reverse: the last node's scratch tensors come and go first (4096 + 1024 + 2 * 4096 live); the
    # peak is at the first node, whose gradient is made while the one before and the weight gradient still live
    assert prog.peak_allocated == 4096 + 512 + 8192 + 2048


def test_backward_with_accumulation_adds_the_weight_gradients_into_grad_and_frees_them() -> None:
    prog = Program()
    layer = Layer(prog, keep=True)
    layer.weight_grad(8192)
    grads: list[int] = []
    block_backward(prog, layer.finish(), grads, accumulate=True)
    assert grads == [] and prog.allocated == 0


def test_layer_without_autograd_keeps_nothing_after_it_ends() -> None:
    prog = Program()
    layer = Layer(prog, keep=False)
    layer.save(4096, grad=2048)
    layer.weight_grad(8192)
    assert layer.finish() == [] and prog.allocated == 0 and prog.peak_allocated == 4096


@pytest.mark.parametrize(
    "fields",
    [{}, {"method": "lora"}, {"precision": "mixed"}, {"attn": "eager"}, {"precision": "fp32"}],
    ids=["bf16-full", "lora", "mixed", "eager", "fp32"],
)
def test_a_training_layer_keeps_tensors_only_with_autograd_and_backward_frees_them(fields: dict[str, object]) -> None:
    ctx = ctx_for(**fields)
    prog = Program()
    assert block_forward(prog, ctx, 0, keep=False) == []
    assert prog.allocated == 0 and prog.peak_allocated > 0
    kept = block_forward(prog, ctx, 0, keep=True)
    assert kept and prog.allocated > 0
    grads: list[int] = []
    block_backward(prog, kept, grads, accumulate=False)
    assert prog.allocated == sum(prog.size_of(g) for g in grads)


def test_an_inference_layer_returns_its_output_and_the_cache_and_frees_its_input() -> None:
    ctx = ctx_for(task="infer")
    spec, T = ctx.spec, ctx.tokens
    prog = Program()
    x = prog.alloc("activations", T * spec.hidden * 2)
    out, kv = block_nograd(prog, ctx, x, 0, cache_kv=True)
    kv_bytes = rounded(T * spec.kv_heads * spec.head_dim * 2)
    assert [prog.size_of(h) for h in kv] == [kv_bytes, kv_bytes]
    assert prog.allocated == prog.size_of(out) + 2 * kv_bytes  # the input went with the layer


def test_the_loss_keeps_the_fp32_log_softmax_and_its_backward_leaves_one_gradient() -> None:
    ctx = ctx_for()
    T, V = ctx.tokens, ctx.spec.vocab
    prog = Program()
    kept = logits_and_loss_forward(prog, ctx)
    assert [prog.size_of(h) for h in kept] == [rounded(T * V * 4)] and prog.allocated == rounded(T * V * 4)
    g = logits_and_loss_backward(prog, ctx, kept)
    assert prog.allocated == prog.size_of(g) == rounded(T * V * 2)  # the bf16 logits' gradient


def test_the_sampler_holds_the_last_logits_copy_and_scores_until_it_finishes() -> None:
    prog = Program()
    sampler = Sampler(prog, batch=4, vocab=32000, act=2)
    sampler.step()
    sampler.step()
    assert prog.allocated == 2 * rounded(4 * 32000 * 4)  # next_token_logits and the processors' scores
    sampler.finish()
    assert prog.allocated == 0


def test_fsdp_gathers_a_unit_whole_reshards_it_and_keeps_only_the_gradient_shard() -> None:
    prog = Program(streams={"fsdp_all_gather_buffers": Fsdp.GATHER_STREAM, "sharded_gradients": Fsdp.REDUCE_STREAM})
    units = [[4096, 8192], [4096, 8192], [2048]]
    fsdp = Fsdp(prog, units, shards=4)
    fsdp.gather(0)
    assert prog.allocated == 2 * (4096 + 8192)  # the flat buffer and the copied-out parameters
    fsdp.reshard(0)
    full = [prog.alloc("gradients", 4096), prog.alloc("gradients", 8192)]
    shard = fsdp.reduce_scatter(4096 + 8192, full, accumulate=False)
    assert prog.size_of(shard) == (4096 + 8192) // 4
    fsdp.finish()
    assert prog.allocated == prog.size_of(shard)
    assert prog.handle_streams() is not None and prog.handle_streams()[shard] == Fsdp.REDUCE_STREAM  # type: ignore[index]


def test_fsdp_forward_frees_each_layer_input_after_its_reshard_and_the_embedding_output_before_lm_head() -> None:
    # the order in the recorded history of FSDP2 qwen2.5-3b (fsdp_qwen3b_b2): with the residual stream as one
    # tensor for the whole forward the program reserved 2.3 GiB too little (-5.7%)
    from gpuready.memory.lm.programs import train_program

    w = Workload(model="llama-3.2-1b", task="train", batch=2, seq=64, gpus=2, shard="fsdp")
    spec = resolve_model(w.model)
    prog = train_program(spec, w)
    resid = rounded(2 * 64 * spec.hidden * 2)
    cats, sizes = prog.categories, prog.sizes
    handle = 0
    embeds = last_resid = 0
    layer_outputs: list[int] = []  # the residual-sized activation made last before each reshard
    frees_after_reshard: list[int] = []
    in_reshard = False
    for i, ev in enumerate(prog.events):
        if ev > 0:
            handle += 1
            if cats[handle] == "logits_and_loss":
                assert prog.events[i - 1] == -embeds  # the base model returned: inputs_embeds went just before
                break
            if cats[handle] == "activations" and not embeds:
                embeds = handle
            elif cats[handle] == "activations" and sizes[handle] == resid:
                last_resid = handle
            in_reshard = False
        elif cats[-ev] == "fsdp_gathered_params":
            if not in_reshard:
                layer_outputs.append(last_resid)
            in_reshard = True
        elif in_reshard:
            frees_after_reshard.append(-ev)
            in_reshard = False
    # layer 0's input is the embedding output, kept; every later layer's input (the previous layer's output) goes
    # right after that layer's gathered weights
    assert len(layer_outputs) == spec.layers
    assert frees_after_reshard == layer_outputs[:-1]
