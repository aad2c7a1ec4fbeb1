"""Inference as a program of GPU allocations: generate() (prefill, then decode steps into a growing cache) or, with
--new-tokens 0, forward passes over the prompt (infer_program).
"""

from __future__ import annotations

from gpuready.memory.lm.blocks_infer import block_nograd
from gpuready.memory.lm.context import GEMMA_FAMILY, make_ctx, sliding_layer
from gpuready.memory.lm.loss import (
    Sampler,
    softcap_nograd,
)
from gpuready.memory.lm.memo import (
    SpanMemo,
    layer_nograd,
)
from gpuready.memory.lm.ops import (
    eager_mask,
    embedding_output,
    rms_norm_nograd,
    rotary_tables,
    sliding_mask,
)
from gpuready.memory.lm.weights import load_weights
from gpuready.memory.program import Program
from gpuready.models.spec import ModelSpec
from gpuready.workload import Workload

# Decode steps replayed one token at a time; the rest of a longer generation is replayed in DECODE_COARSE steps of
# several tokens each, so any --new-tokens costs at most DECODE_EXACT + DECODE_COARSE steps (docs/estimator.md
# gives the error against token-by-token replay)
DECODE_EXACT = 256


DECODE_COARSE = 128


def decode_lengths(steps: int) -> list[int]:
    """Tokens added to the cache by the end of each simulated decode step: every step up to DECODE_EXACT, then
    DECODE_COARSE evenly spaced lengths ending at `steps` (each such step grows the cache by several tokens)."""
    if steps <= DECODE_EXACT:
        return list(range(1, steps + 1))
    rest = steps - DECODE_EXACT
    coarse = min(rest, DECODE_COARSE)
    return list(range(1, DECODE_EXACT + 1)) + [DECODE_EXACT + -(-k * rest // coarse) for k in range(1, coarse + 1)]


def generation_inputs(prog: Program, tokens: int, pad: bool) -> list[int]:
    """generate()'s [B, S] int64 inputs before the prefill, as the recorded history h66_gen_sample_llama1b_b176 shows
    them (transformers 5.17 generation/utils.py): the caller's input_ids; the attention mask, torch.ones, which with a
    pad token (generate() takes the end-of-sequence token as pad where the config names none) is inferred from the
    padding instead: `ids.ne(pad).long() * can_infer + ones * ~can_infer`, three int64 temporaries besides (and
    one-byte ones: isin's, ne's); then position ids, `mask.long().cumsum(-1) - 1` with masked_fill (the cumsum and the
    difference go). Past 1 MiB (batch x prompt >= 131,072 tokens) these are large-pool blocks. Returns the three kept
    to the end: input_ids, mask, position ids."""
    ids = prog.alloc("activations", tokens * 8)
    mask = prog.alloc("activations", tokens * 8)  # torch.ones (utils.py:918)
    if pad:
        isin = [prog.alloc("activations", tokens) for _ in range(3)]  # isin_mps_friendly(ids, pad).any()
        prog.free(isin[2])
        prog.free(isin[1])
        prog.free(isin[0])
        ne = prog.alloc("activations", tokens)
        padding = prog.alloc("activations", tokens * 8)  # .long() (931)
        prog.free(ne)
        terms = [prog.alloc("activations", tokens * 8) for _ in range(3)]  # the products and their sum (934)
        prog.free_all([terms[0], terms[1], mask, padding])
        mask = terms[2]
    cumsum = prog.alloc("activations", tokens * 8)  # _prepare_position_ids_for_generation (892-894)
    less = prog.alloc("activations", tokens * 8)
    prog.free(cumsum)
    zero = prog.alloc("activations", tokens)
    positions = prog.alloc("activations", tokens * 8)
    prog.free(zero)
    prog.free(less)
    return [ids, mask, positions]


def infer_program(spec: ModelSpec, w: Workload) -> Program:
    """generate() (prefill, then one token per step into a DynamicCache grown by torch.cat), or with
    --new-tokens 0 two plain forward passes with use_cache=True over the prompt."""
    ctx = make_ctx(spec, w)
    prog = Program()
    memo = SpanMemo(prog, ctx)
    load_weights(prog, ctx)
    workspace = False
    h, e, B, S, V = spec.hidden, ctx.dt.act, w.batch, w.seq, spec.vocab
    kv_tok = spec.kv_bytes_per_token_per_layer_elems * e // 2  # bytes per K (or V), per token, per layer

    def window(tokens: int, layer: int) -> int:
        # sliding-window layers keep only the window (transformers' DynamicSlidingWindowLayer)
        if spec.sliding_window and sliding_layer(spec, layer):
            return min(tokens, spec.sliding_window)
        return tokens

    # generate()'s int64 [B, S] inputs: the caller's input_ids, the attention mask and position ids generate() makes
    # for them, alive to the end (generation_inputs); prepare_inputs' position ids for the prefill (the Sampler frees
    # them)
    given = generation_inputs(prog, B * S, spec.eos_token) if w.new_tokens else []
    for _rep in range(1 if w.new_tokens else 2):
        prog.set_phase("prefill")
        positions = prog.alloc("activations", B * S * 8) if w.new_tokens else 0
        # the model's forward keeps `inputs_embeds` referenced for the whole pass
        embeds = embedding_output(prog, ctx, B * S * h * ctx.dt.resid)
        x = embeds
        # the model's forward builds eager attention's masks, then the rotary tables (h47_gen_gemma2b_eager_b16)
        mask = eager_mask(prog, ctx, B, S)
        if ctx.mask and ctx.backend != "eager":
            # SDPA's boolean sliding-window mask, batch-sized under generate() (h48_gen_gemma3_1b_b8: 32 MiB, 8 x 2048)
            mask.append(sliding_mask(prog, S, B, padded=w.new_tokens > 0))
        # the positions: [B, S] under generate() (from the attention mask), [1, S] for a plain forward, whose rotary
        # tables are then one sequence's (h49_prefill_gemma3_4b_b8: 2 MiB fp32 and 1 MiB bf16 tables at 8 x 2048)
        rows = B if w.new_tokens else 1
        tables = rotary_tables(prog, ctx, rows, S, first_matmul=not workspace)
        if spec.model_type == "gemma3_text":  # its local (sliding) layers' rotary embedding has a base of its own
            tables += rotary_tables(prog, ctx, rows, S, first_matmul=False)
        workspace = True
        cache: list[int] = []
        for layer in range(spec.layers):
            # a sliding-window layer keeps the whole prompt's K and V through the prefill: transformers'
            # DynamicSlidingWindowLayer stores `full[:, :, -window + 1:]`, a view that holds the whole tensor until
            # the first decode step's torch.cat makes a window-sized one (transformers cache_utils.py)
            x, kv = layer_nograd(memo, ctx, x, layer, cache_kv=True, keep_input=layer == 0)
            cache.extend(kv)
        if spec.model_type == "gpt2":
            normed = prog.alloc("activations", B * S * h * ctx.dt.resid)
        else:
            normed = rms_norm_nograd(prog, B * S, h, ctx.dt.resid, gemma=spec.model_type in GEMMA_FAMILY)
        prog.free(x)
        # the base model returns: its input embeddings, mask and rotary tables go before lm_head runs
        prog.free(embeds)
        prog.free_all(mask)
        prog.free_all(tables)
        if w.new_tokens == 0:
            logits = prog.alloc("logits_and_loss", B * S * V * e)  # every position's logits
            if spec.logit_softcap:
                logits = softcap_nograd(prog, logits, B * S * V * e)
            prog.free(normed)
            prog.free(logits)
            prog.free_all(cache)
            continue
        sampler = Sampler(
            prog,
            B,
            V,
            e,
            spec.logit_softcap,
            processors=spec.eos_token,
            row_bytes=B * 8,
            positions=positions,
            sample=w.decoding == "sample",
        )
        sampler.step(S + 1)  # generate asks for the last position's logits only
        prog.free(normed)
        prog.set_phase("decode")
        decode = make_ctx(spec, w.model_copy(update={"seq": 1}))
        # every step grows each layer's K and V by one token (torch.cat makes the longer tensor, then the old one
        # goes): these large-pool allocations drive the allocator, so they are replayed step by step; a step's own
        # activations (batch x width, mostly small-pool) are simulated on the first and the last step. Past
        # DECODE_EXACT steps, each simulated step stands for several tokens (the cache grows by as many at once),
        # so that any --new-tokens costs at most DECODE_EXACT + DECODE_COARSE steps; the last ends at full length
        steps = decode_lengths(w.new_tokens - 1)
        for i, step in enumerate(steps):
            t = S + step
            full_step = i in (0, len(steps) - 1)
            x = prog.alloc("activations", B * h * ctx.dt.resid) if full_step else 0
            for layer in range(spec.layers):
                if full_step:
                    x, _ = block_nograd(prog, decode, x, layer, cache_kv=False, decode=True, context=B * t)
                old = cache[2 * layer : 2 * layer + 2]
                if sliding_layer(spec, layer):
                    # DynamicSlidingWindowLayer.update concatenates K and V, then rebinds both: the old two go after
                    # the new two are made (gen_phi3_b16, h48_gen_gemma3_4b_b8: cache_utils.py:251/252)
                    for i in (0, 1):
                        cache[2 * layer + i] = prog.alloc("kv_cache", B * window(t, layer) * kv_tok)
                    prog.free_all(old)
                    continue
                for i in (0, 1):  # DynamicLayer.update: each torch.cat rebinds its tensor at once
                    cache[2 * layer + i] = prog.alloc("kv_cache", B * window(t, layer) * kv_tok)
                    prog.free(old[i])
            prog.free(x)
            sampler.step(t + 1)
        sampler.finish()
        prog.free_all(cache)
        prog.free_all(given)
    return prog
