"""The whole training job as a program of GPU allocations: the optimizer steps (train_program). Inference and
generate(): memory/lm/infer.py.
"""

from __future__ import annotations

from gpuready.memory.ddp import DdpBuckets
from gpuready.memory.lm import kbit_prep
from gpuready.memory.lm.autocast_ckpt import (
    MixedLayer,
    autocast_full_recorded,
    mixed_ckpt_layer_backward,
    mixed_ckpt_recorded,
    mixed_final_norm_backward,
    mixed_layer_backward,
    mixed_layer_forward,
)
from gpuready.memory.lm.autograd import Saved, block_backward
from gpuready.memory.lm.blocks_gpt2 import gpt2_embeddings, gpt2_embeddings_backward
from gpuready.memory.lm.blocks_recorded import recorded_layer_order
from gpuready.memory.lm.blocks_train import block_forward
from gpuready.memory.lm.context import make_ctx
from gpuready.memory.lm.fsdp import Fsdp
from gpuready.memory.lm.lora_recorded import lora_recorded
from gpuready.memory.lm.loss import (
    final_norm_backward_frozen,
    final_norm_backward_trainable,
    final_norm_forward,
    logits_and_loss_backward,
    logits_and_loss_forward,
)
from gpuready.memory.lm.memo import (
    SpanMemo,
    layer_backward,
    layer_forward,
    layer_nograd,
    lora_layer_backward,
    lora_layer_forward,
)
from gpuready.memory.lm.neox import NeoxKept, neox_recorded, neox_train_backward, neox_train_forward
from gpuready.memory.lm.ops import (
    CUBLAS_WORKSPACE_BYTES,
    embedding_output,
    rotary_tables,
    training_masks,
)
from gpuready.memory.lm.weights import load_weights
from gpuready.memory.optimizer import optimizer_step
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.workload import Workload

# Optimizer steps simulated: as many as the probe runs (trial/probe.py LM_STEPS, the calibration runs' three). The
# first creates the optimizer states, the second runs with them and sets the peak with no limit; under a limit the
# third can fail where the second did not, because the second's release leaves the cache laid out differently: the
# recorded history lora_llama8b_b1 (llama-3.1-8b LoRA, 1 x 2048) replayed under caps of 36.9-37.4 GiB fails on the
# third step's fp32 logits, and the program of two steps completed there (tests/memory/test_history.py).
STEPS = 3


def train_program(spec: ModelSpec, w: Workload, *, meta_init: bool = False) -> Program:
    """STEPS optimizer steps (states appear in the first), each of grad_accum micro-batches (at most two are
    simulated: the second already has the first's gradients alive)."""
    ctx = make_ctx(spec, w)
    streams = {"fsdp_all_gather_buffers": Fsdp.GATHER_STREAM, "sharded_gradients": Fsdp.REDUCE_STREAM}
    prog = Program(streams=streams if ctx.shards > 1 else {})
    memo = SpanMemo(prog, ctx)
    weights = load_weights(prog, ctx, whole_first=not meta_init)
    trainable, cast_bytes = weights.trainable, weights.cast_bytes
    h, T, e, r = spec.hidden, ctx.tokens, ctx.dt.act, ctx.dt.resid
    fsdp = Fsdp(prog, weights.units, ctx.shards) if ctx.shards > 1 else None
    root = spec.layers  # the root's FSDP unit
    ddp = DdpBuckets(prog, sum(t.nbytes for t in trainable)) if w.shard == "ddp" and trainable else None
    # one cuBLAS workspace for the forward's handle, and one for the autograd thread's, made by backward's first
    # matmul (after that matmul's output): the recorded history of qwen2.5-0.5b (ddp_qwen05, rank 0) places it in
    # a freed fp32-logits block, which splits it, and the next step's logits need a segment of their own
    # (qwen2.5-0.5b full, 8 x 1024: 27.90 GiB predicted with both made up front, 32.52 measured). The forward's is
    # made by the job's first matmul, the rotary embedding's inv_freq @ positions, after the embedding output (the
    # recorded H200 history lora_qwen7b_s2048_b3_cap80: the 42 MiB embedding output, then the 32 MiB workspace)
    forward_workspace = True
    backward_workspace = True
    # LoRA layers whose backward (and checkpointed recompute) follow the recorded order (lm/lora_recorded.py)
    lora_rec = not fsdp and all(lora_recorded(ctx, layer) for layer in range(spec.layers))
    # peft makes the embedding output require grad when the model checkpoints (PeftModel's
    # _prepare_model_for_gradient_checkpointing: enable_input_require_grads), so the residual stream's gradient
    # ends as that leaf's .grad; both live as long as the step's `loss` (its graph's AccumulateGrad node): after
    # zero_grad, until the next step's embedding (qwen3_8b_lora_ckpt_s2048_b5_cap40). With one micro-batch only.
    held_input = lora_rec and w.grad_ckpt and w.grad_accum == 1
    # QLoRA after prepare_model_for_kbit_training (lm/kbit_prep.py): an fp32 residual stream
    prep = lora_rec and w.kbit_prep
    if prep:
        r = 4
    # GPT-2's embeddings under peft's checkpointing (below), with one micro-batch, as held_input
    gpt2_embed = (
        spec.model_type == "gpt2" and w.grad_ckpt and bool(ctx.lora) and not prep and not fsdp and w.grad_accum == 1
    )
    # GPT-2's embeddings in any other training job (ft_gpt2xl_sgd): the token and position embeddings (locals of the
    # base model's forward, gone when it returns), their sum (gone once dropout has run), dropout's one-byte mask
    # (kept for its backward, which ends the step's) and its output, the residual stream
    gpt2_dropout = spec.model_type == "gpt2" and not gpt2_embed and not fsdp and w.method != "qlora"
    state: list[int] | None = None

    def one_step(step: int) -> None:
        nonlocal forward_workspace, backward_workspace, state
        embed_grad = 0  # GPT-2's embedding gradient, held until the token embedding's weight gradient is made
        prog.mark_step()
        grads: list[int] = []
        held: list[int] = []  # (freed at the step's end, below)
        if step == 1 and ddp:
            ddp.rebuild([t.nbytes for t in reversed(trainable)], release_first=w.grad_ckpt)

        def weight_grad_made(handle: int, accumulate: bool) -> None:
            """A weight's gradient made: kept as .grad, or (a later micro-batch) added into it and freed."""
            if accumulate:
                prog.free(handle)
            else:
                grads.append(handle)

        for micro in range(min(w.grad_accum, 2)):
            accumulate = micro > 0
            prog.set_phase("forward")
            # autocast caches a bf16 copy of each weight for the duration of the autocast region (forward and
            # loss). Under checkpointing, as the recorded history of llama-3.2-1b mixed + checkpointing at 8 x 4096
            # (ft_llama1b_mixed_ckpt_s4096) shows: each layer's copies are made in its checkpointed forward and
            # stay cached until the region ends after the loss; lm_head's copy is made when lm_head runs, after the
            # layers, and is kept by its matmul until lm_head's backward; the recompute casts again, per layer
            ckpt_casts = ctx.dt.autocast and w.grad_ckpt
            recorded_mixed = mixed_ckpt_recorded(ctx)
            full_cast = autocast_full_recorded(ctx)  # (layers: autocast_ckpt.mixed_layer_forward, whole)
            mixed_layers: list[tuple[MixedLayer, int]] = []  # (its kept handles, its input)
            neox = neox_recorded(ctx)
            # (without checkpointing each linear's copy is made and freed with its layer: blocks_train's
            # weight_copy)
            layer_casts = cast_bytes if ckpt_casts else 0
            forward_copies: list[int] = []
            if fsdp:
                fsdp.gather(root)
            x = embedding_output(prog, ctx, T * h * r)  # the residual stream
            wte = wpe = embd_mask = 0
            if gpt2_embed or gpt2_dropout:
                wte = x
                wpe, embd_mask, x = gpt2_embeddings(prog, ctx, r)
            mask = training_masks(prog, ctx)  # eager attention's float mask or SDPA's sliding-window one
            tables: list[int] = []
            if lora_rec:
                # the rotary embedding's cos and sin for the batch's positions (one row: position_ids is 1 x seq in
                # training), kept by RoPE's products, or under checkpointing by the checkpoint's saved inputs, until
                # the first layer's backward (lora_qwen3_8b_ckpt: 2 MiB large-pool blocks at 4096 tokens)
                tables = rotary_tables(prog, ctx, 1, w.seq, first_matmul=forward_workspace)
                forward_workspace = False
            elif forward_workspace:
                prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                forward_workspace = False
            # the residual stream is replayed tensor by tensor, as the recorded histories of FSDP2 qwen2.5-3b
            # (fsdp_qwen3b_b2) and of one GPU (full_llama3b_s2048_b2_cap40, lora_qwen3b_s1024_b2_cap24) show it:
            # each plain 16-bit layer's output is a new tensor, and the decoder loop drops the layer's input only
            # once the layer has returned (under FSDP after its post-forward hook has resharded it, freeing its
            # gathered weights); the model's forward keeps the embedding output (`inputs_embeds`) until it returns,
            # after the final norm. Elsewhere (other layers) the stream is one tensor for the whole forward.
            embeds = x
            replaced = False
            per_layer: list[list[Saved]] = []
            named: list[dict[str, int]] = []
            ckpt_inputs: list[int] = []
            neox_kept: list[NeoxKept] = []
            for layer in range(spec.layers):
                outs: list[int] = []
                if fsdp:
                    fsdp.gather(layer)
                if neox:
                    x, kept_layer = neox_train_forward(prog, ctx, x, free_input=x != embeds)
                    neox_kept.append(kept_layer)
                elif w.grad_ckpt and prep:
                    ckpt_inputs.append(x)
                    x = kbit_prep.block_first_pass(prog, ctx, x, forward_copies)
                    per_layer.append([])
                elif w.grad_ckpt:
                    # non-reentrant checkpointing keeps each layer's input and recomputes the rest in backward
                    ckpt_inputs.append(x)
                    x, _ = layer_nograd(
                        memo,
                        ctx,
                        x,
                        layer,
                        cache_kv=False,
                        keep_input=True,
                        casts=forward_copies if ckpt_casts else None,
                        cache_casts=ctx.full,
                        **({"adapter_casts": forward_copies} if ctx.dt.autocast16 and ctx.lora else {}),
                    )
                    per_layer.append([])
                elif prep:
                    named.append({})
                    prep_saved, out = kbit_prep.block_forward(prog, ctx, x, named[-1], input_grad=layer > 0)
                    per_layer.append(prep_saved)
                    x, replaced = out, True  # (the input goes with the norm's backward; the first, after the norm)
                elif lora_rec:
                    named.append({})
                    # without checkpointing the embedding output needs no gradient (lora_recorded.LoraBackward.run)
                    per_layer.append(lora_layer_forward(memo, ctx, layer, outs, named[-1], input_grad=layer > 0))
                elif full_cast:
                    # the layer's input is kept by its first norm's pow and goes in that norm's backward; its output
                    # is the next layer's input (h45_mixed_smollm2_360m_b16)
                    kept_mixed, out = mixed_layer_forward(prog, ctx, whole=True)
                    mixed_layers.append((kept_mixed, x))
                    per_layer.append([])
                    x = out
                elif fsdp:
                    per_layer.append(block_forward(prog, ctx, layer, keep=True, residual_out=outs))
                else:
                    per_layer.append(layer_forward(memo, ctx, layer, keep=True, residual_out=outs))
                if fsdp:
                    fsdp.reshard(layer)
                if outs:
                    if x != embeds:
                        prog.free(x)
                    x, replaced = outs[0], True
            head_cast = norm_out = frozen_out = 0
            norm_trains = False
            if ckpt_casts or full_cast:
                # the final norm on the fp32 residual (ft_llama1b_mixed_ckpt_s4096; without checkpointing
                # h45_mixed_smollm2_360m_b16, where pow keeps the last layer's output): pow (a temporary), x * rsqrt
                # (kept for the weight's gradient), weight * y (the output, alive until the loss is made); lm_head's
                # weight copy, the output cast to bf16 (kept by lm_head)
                prog.free(prog.alloc("activations", T * h * 4))
                final = [prog.alloc("activations", T * h * 4)]
                norm_out = prog.alloc("activations", T * h * 4)
                head_cast = prog.alloc("autocast_weight_copies", spec.vocab * h * 2)
                final.append(prog.alloc("activations", T * h * e))
            elif neox and ctx.dt.autocast16:
                # final_layer_norm under autocast (ac_pythia1b_b8): the fp32 copy of its input (kept, with its mean
                # and rstd), its fp32 output (held until the loss); the last layer's output and the embedding output
                # go; lm_head's input cast to bf16 (kept: its weight trains)
                final = [prog.alloc("activations", T * h * 4)]
                frozen_out = prog.alloc("activations", T * h * 4)
                final += [prog.alloc("activations", T * 4), prog.alloc("activations", T * 4)]
                prog.free(x)
                prog.free(embeds)
                x = 0
                final.insert(0, prog.alloc("activations", T * h * e))
            elif neox:
                final = [prog.alloc("activations", T * h * r)]  # final_layer_norm's output (it keeps its input, x)
            elif prep:
                final, frozen_out = kbit_prep.final_norm(prog, ctx, x)
                x = 0
            elif recorded_layer_order(ctx, spec.layers - 1) and spec.model_type != "gemma2":
                final, x, frozen_out = final_norm_forward(prog, ctx, x)
                # its weight trains in 16 bits without autocast: its backward as recorded (loss.py)
                norm_trains = ctx.full and not ctx.dt.autocast and ctx.dt.resid == 2 and not fsdp
            else:
                final = [prog.alloc("activations", T * h * 4)]  # final norm keeps its fp32 input
                if ctx.dt.autocast:
                    # lm_head's bf16 weight copy, kept by its matmul until lm_head's backward (h25_llama1b_mixed_b3:
                    # 501 MiB at the peak, made before the input's cast; frozen under LoRA, its copy is not cached
                    # but the matmul keeps it all the same for the input's gradient: h28_lora_llama1b_mixed_b4)
                    head_cast = prog.alloc("autocast_weight_copies", spec.vocab * h * 2)
                if ctx.full:
                    final.append(prog.alloc("activations", T * h * e))  # lm_head keeps its input
            if replaced:
                prog.free(embeds)  # the base model returns (fsdp_qwen3b_b2: after the final norm, before lm_head)
            prog.free(wpe)
            if gpt2_dropout:
                prog.free(wte)
            if prep:  # lm_head's fp32 weight cast to bf16 by autocast (frozen: not cached), kept for backward
                head_cast = prog.alloc("autocast_weight_copies", spec.vocab * h * 2)
            kept = logits_and_loss_forward(prog, ctx, frozen_out, cast_input=prep)
            if ckpt_casts or full_cast:
                # the region ends: the final norm's output and (checkpointed) the layers' cached weight copies go
                prog.free(norm_out)
                prog.free_all(forward_copies)
            elif forward_copies:  # --autocast: the adapters' weight copies cached in the checkpointed first pass
                prog.free_all(forward_copies)
            prog.set_phase("backward")
            g = logits_and_loss_backward(prog, ctx, kept)
            if step == 1 and micro == 0 and ddp:
                ddp.release_first()
            root_grads: list[int] = []
            lm_head_grad = 0
            if (ckpt_casts or full_cast) and ctx.full and not fsdp:
                # lm_head's backward on the bf16 copies (ft_llama1b_mixed_ckpt_s4096): the bf16 weight gradient, the
                # input's bf16 gradient; the logits' gradient, the weight copy and lm_head's saved input go; then
                # autocast's casts backward: the input's gradient to fp32, the weight's gradient to fp32 (.grad)
                lm16 = prog.alloc("gradients", spec.vocab * h * 2)
                if backward_workspace:
                    prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                    backward_workspace = False
                dx16 = prog.alloc("activations", T * h * e)
                prog.free(g)
                prog.free(head_cast)
                head_cast = 0
                prog.free(final.pop())
                g = prog.alloc("activations", T * h * 4)
                prog.free(dx16)
                lm_head = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                prog.free(lm16)
                weight_grad_made(lm_head, accumulate)
                lm_head_grad = 0 if accumulate else lm_head
                dx = g
                g = 0
            elif ctx.full:
                lm_head = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                if backward_workspace:
                    prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                    backward_workspace = False
                if fsdp:
                    root_grads.append(lm_head)
                elif accumulate:
                    prog.free(lm_head)
                else:
                    grads.append(lm_head)
                    lm_head_grad = lm_head
            if fsdp:
                fsdp.finish()  # the last layer's all-gather buffer
                fsdp.prefetch(spec.layers - 1)
            if g:
                dx = prog.alloc("activations", T * h * e)
                if backward_workspace:
                    prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                    backward_workspace = False
                prog.free(g)
            prog.free(head_cast)  # checkpointing under autocast without full fine-tuning (no lm_head gradient)
            if prep:
                dx32 = prog.alloc("activations", T * h * 4)  # autocast's cast of lm_head's input, backward
                prog.free(dx)
                dx = kbit_prep.final_norm_backward(prog, ctx, dx32, final)
                final = []
            elif frozen_out and not neox:
                dx = final_norm_backward_frozen(prog, ctx, dx, final)  # frees the fp32 input and rsqrt it kept
                final = []
            elif norm_trains and g:
                dx, norm_grad = final_norm_backward_trainable(prog, ctx, dx, final)
                final = []
                weight_grad_made(norm_grad, accumulate)
            if recorded_mixed or full_cast:
                dx = mixed_final_norm_backward(prog, ctx, dx, final.pop(0), x)
                x = 0
            if neox and ctx.dt.autocast16:
                # under autocast: lm_head's input cast goes, the gradient through fp32 (the final norm frees its fp32
                # input copy, mean and rstd), cast back
                prog.free(final.pop(0))
                g32 = prog.alloc("activations", T * h * 4)
                prog.free(dx)
                t32 = prog.alloc("activations", T * h * 4)
                prog.free(g32)
                prog.free_all(final)
                final = []
                dx = prog.alloc("activations", T * h * e)
                prog.free(t32)
            elif neox:
                # final_layer_norm's backward (ft_pythia1b_b8): its output goes, its input's gradient is made, lm_head's
                # input gradient goes, then the last layer's output
                prog.free(final.pop())
                g_in = prog.alloc("activations", T * h * e)
                prog.free(dx)
                prog.free(x)
                dx, x = g_in, 0
            if neox:
                for layer in reversed(range(spec.layers)):
                    dx = neox_train_backward(prog, ctx, neox_kept[layer], dx, grads, accumulate)
            prog.free_all(final)
            prog.free(x)
            for layer in reversed(range(spec.layers) if not neox else ()):
                if fsdp:
                    fsdp.copy_out(layer)
                    if layer > 0:
                        fsdp.prefetch(layer - 1)
                if recorded_mixed:
                    mixed_ckpt_layer_backward(prog, ctx, ckpt_inputs[layer], grads, accumulate)
                    continue
                if full_cast:
                    kept_mixed, x_in = mixed_layers[layer]
                    dy16 = prog.alloc("activations", T * h * e)  # the incoming gradient cast to bf16
                    mixed_layer_backward(prog, ctx, kept_mixed, dy16, x_in, grads, accumulate)
                    continue
                if prep:
                    bw = kbit_prep.PrepBackward(prog, ctx, {} if w.grad_ckpt else named[layer], grads, accumulate)
                    first_tables = tables if layer == 0 else []
                    if w.grad_ckpt:
                        bw.ckpt = True
                        scaled = bw.head16("down_proj")  # the nodes that need no saved tensor, before the recompute
                        kbit_prep.block_forward(prog, ctx, ckpt_inputs[layer], bw.kept, stop_early=True)
                        bw.run32(dx, True, scaled, first_tables, hold_input=held_input and layer == 0)
                    else:
                        bw.run32(dx, layer > 0, tables=first_tables)
                        if layer == 0:
                            dx = 0  # freed by the first layer's o_proj backward
                    continue
                if lora_rec:
                    # the backward nodes that need no saved tensor run before the recompute (down_proj's head)
                    first = layer == 0 and not w.grad_ckpt
                    lora_layer_backward(
                        memo,
                        ctx,
                        layer,
                        {} if w.grad_ckpt else named[layer],
                        grads,
                        accumulate,
                        dx,
                        ckpt_inputs[layer] if w.grad_ckpt and not (held_input and layer == 0) else 0,
                        input_grad=not first,
                        tables=tables if layer == 0 else [],
                    )
                    if first:
                        dx = 0  # freed by o_proj's backward: nothing below needs it
                    continue
                saved = per_layer[layer]
                copies = 0
                if w.grad_ckpt:
                    copies = prog.alloc("autocast_weight_copies", layer_casts // spec.layers) if layer_casts else 0
                    # recomputed for its backward (stopped early under full fine-tuning; the generic LoRA backward
                    # reads the whole layer's saved list)
                    saved = layer_forward(memo, ctx, layer, keep=True, recompute=ctx.full)
                if fsdp:
                    full: list[int] = []
                    block_backward(prog, saved, full, False)
                    prog.free(copies)
                    if w.grad_ckpt:
                        prog.free(ckpt_inputs[layer])
                    fsdp.reshard(layer)
                    nbytes = sum(weights.units[layer]) if ctx.full else _sum_sizes(prog, full)
                    shard = fsdp.reduce_scatter(nbytes, full, accumulate)
                    if shard:
                        grads.append(shard)
                    continue
                layer_backward(memo, saved, grads, accumulate)
                prog.free(copies)
                if w.grad_ckpt:
                    prog.free(ckpt_inputs[layer])
            prog.free_all(mask)
            if recorded_mixed or full_cast:
                # the embedding's gradient is added in place into the tied weight's fp32 .grad (lm_head's), after
                # the residual gradient goes (ft_llama1b_mixed_ckpt_s4096)
                emb = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                prog.free(dx)
                if spec.tied or accumulate:
                    prog.free(emb)
                else:
                    grads.append(emb)
            elif held_input:
                held = [ckpt_inputs[0], dx]
            elif gpt2_embed:  # the embedding dropout's backward; its gradient and the embeddings held (above)
                grad = prog.alloc("activations", T * h * r)
                prog.free(dx)
                prog.free(embd_mask)
                held = [grad, wte]
            elif gpt2_dropout and ctx.full:
                # (the dropout's gradient goes once the token embedding's gradient is made, below)
                embed_grad, pos = gpt2_embeddings_backward(prog, ctx, dx, embd_mask, r)
                weight_grad_made(pos, accumulate)
            else:
                prog.free(dx)
                prog.free(embd_mask)  # (GPT-2: the embedding dropout's backward)
            if recorded_mixed or full_cast:
                pass
            elif ctx.full:
                # embedding_dense_backward builds a full vocab x hidden gradient. With tied embeddings the shared
                # weight's .grad becomes lm_head's gradient plus this one, a third tensor, and both go (every tied
                # model's recorded history: ft_qwen15_bf16, ft_qwen3_4b, ft_gemma2b_bf16)
                emb = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                prog.free(embed_grad)
                if fsdp and not spec.tied:
                    root_grads.append(emb)
                elif spec.tied and not fsdp and not accumulate and lm_head_grad and not ctx.dt.autocast:
                    # (fp32 weights under autocast add it into lm_head's fp32 .grad in place: the recorded histories
                    # h25_llama1b_mixed_b3 and h26_gemma2_2b_mixed_b2 make the embedding's gradient and free it)
                    total = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                    grads.remove(lm_head_grad)
                    prog.free(lm_head_grad)
                    prog.free(emb)
                    grads.append(total)
                elif spec.tied or accumulate:
                    prog.free(emb)
                else:
                    grads.append(emb)
            elif not accumulate and not fsdp and not lora_rec:  # (lora_rec: made by each adapter's backward)
                grads.extend(prog.alloc("gradients", t.nbytes) for t in trainable)
            if fsdp:
                if ctx.full:
                    shard = fsdp.reduce_scatter(sum(weights.units[root]), root_grads, accumulate)
                    if shard:
                        grads.append(shard)
                fsdp.reshard(root)
                fsdp.finish()
        prog.set_phase("optimizer step")
        if ctx.full or fsdp:
            # norms, biases and routers get their (small) gradients along the way
            rest = sum(t.nbytes for t in trainable) - _sum_sizes(prog, grads)
            if rest > 0:
                grads.append(prog.alloc("gradients", rest))
        state = optimizer_step(prog, w.optim, trainable, state)
        prog.set_phase("forward")
        prog.free_all(grads)
        prog.free_all(held)

    # (every step after the first makes the same events, but writing the third out from a recorded second costs more
    # than building it from the layers' recorded spans: 174 ms against 140 for five 8B LoRA programs)
    for step in range(STEPS):
        one_step(step)
    return prog


def _sum_sizes(prog: Program, handles: list[int]) -> int:
    return sum(prog.size_of(h) for h in handles)
