"""A layer's events made once per program and written out again for the layers like it.

Building a program calls the same layer function for every layer of the model and every step (32 layers x 3 steps
for an 8B model), and each call makes the same events: the same sizes, allocated and freed in the same order, on
handles numbered from where the program stands. `SpanMemo.call` runs the function the first time for a key, records
the events it appended, and for the next call with an equal key appends the recorded events with the handles
renumbered: those the span allocated become the program's next handles, and the few it frees but did not allocate
(its inputs: the residual stream, the tensors a forward kept for its backward) become the new call's inputs.

The key must name everything the span depends on; the layer functions read a layer's index only through
`layer_kind` (context.py), and the callers put the sizes of the inputs in the key. A span that frees a handle that
is neither its own nor one of the inputs it was given, or returns such a handle, is not recorded (it runs every
time). Programs recorded with the batch as a symbol (memory/template.py) are not memoised. tests/memory/
test_memo.py builds programs both ways over the benchmark sweep's jobs and finds them identical.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuready.memory.lm.autograd import Saved, block_backward
from gpuready.memory.lm.blocks_infer import block_nograd
from gpuready.memory.lm.blocks_recorded import plain_block_forward
from gpuready.memory.lm.blocks_train import block_forward
from gpuready.memory.lm.context import Ctx, layer_kind
from gpuready.memory.lm.lora_recorded import LoraBackward
from gpuready.memory.program import Program, SpanShape, span_shape
from gpuready.memory.template import Batch, _Recorder

Run = Callable[[], tuple[list[int], Any]]


@dataclass(frozen=True)
class _Span:
    events: list[int]  # allocations as sizes; frees of the span's own handles as -(k + 1), k counted from its first
    inputs: list[tuple[int, int]]  # (position in events, index into the inputs) of each free of an input
    sizes: list[int]
    categories: list[str]
    result: list[tuple[bool, int]]  # (own handle?, offset from the first handle / index into the inputs); 0 stays 0
    payload: Any  # what else run() returned, handed back as it is
    shape: SpanShape  # the running total's moves over the span (the inputs' sizes are part of the key)


ENABLED = True  # False: every span runs (tests/memory/test_memo.py builds programs both ways)


class SpanMemo:
    """Spans of one program by key (see the module docstring)."""

    def __init__(self, prog: Program, ctx: Ctx) -> None:
        self.prog = prog
        self.ctx = ctx  # the job's context: spans of another (a decode step's) run every time
        # a program being recorded as a template (memory/template.py) has its alloc/free replaced on the instance by
        # a recorder's: its spans are the recorder's ops, the sizes affine in the batch (_RecSpan)
        bound = vars(prog).get("alloc")
        self.rec: _Recorder | None = getattr(bound, "__self__", None) if bound is not None else None
        self.enabled = ENABLED and (bound is None or isinstance(self.rec, _Recorder))
        self.spans: dict[Hashable, _Span | _RecSpan | None] = {}

    def size_key(self, handle: int) -> Hashable:
        """A handle's size as a memo key part (the affine form while the batch is a symbol)."""
        if not handle:
            return 0
        if self.rec is not None:
            return (self.rec.a[handle], self.rec.c[handle])
        return self.prog.sizes[handle]

    def call(self, key: Hashable, inputs: Sequence[int], run: Run) -> tuple[list[int], Any]:
        """run()'s result (a list of handles, and a payload that names no handle), its events appended to the
        program: recorded on the first call with `key`, written out again on the next ones. `inputs`: the handles
        made before the call that the span may free or return, in an order that corresponds from call to call."""
        if not self.enabled:
            return run()
        key = (key, self.prog.phase)  # (a span's events do not depend on the phase, but its totals are the phase's)
        span = self.spans.get(key, False)
        if span is None:
            return run()
        if span is False:
            return self._record(key, inputs, run) if self.rec is None else self._record_ops(key, inputs, run)
        if isinstance(span, _RecSpan):
            return self._write_ops(span, inputs)
        assert isinstance(span, _Span)
        prog = self.prog
        first = len(prog.sizes)  # the span's first handle
        shift = first - 1
        events = [ev if ev > 0 else ev - shift for ev in span.events]
        for pos, index in span.inputs:
            events[pos] = -inputs[index]
        prog.append_span(events, span.sizes, span.categories, span.shape)
        return [(first + v if own else inputs[v]) if v >= 0 else 0 for own, v in span.result], span.payload

    def _record(self, key: Hashable, inputs: Sequence[int], run: Run) -> tuple[list[int], Any]:
        prog = self.prog
        first = len(prog.sizes)
        start = len(prog.events)
        switches: list[str] = []  # a span's totals are one phase's: one that switches phase is not recorded
        set_phase = prog.set_phase

        def switch(name: str) -> None:
            switches.append(name)
            set_phase(name)

        prog.set_phase = switch  # type: ignore[method-assign]
        try:
            made = run()
        finally:
            del prog.set_phase
        result = made[0]
        where = {h: i for i, h in enumerate(inputs) if h}
        if switches or len(where) != len([h for h in inputs if h]):
            self.spans[key] = None  # an input given twice: the correspondence would be ambiguous
            return made
        made_events = list(prog.events[start:])
        shift = first - 1
        # own frees renumbered from the span's first handle; an input's free is filled in when written out
        events = [ev if ev > 0 else (ev + shift if -ev >= first else 0) for ev in made_events]
        from_inputs: list[tuple[int, int]] = []
        for pos in [k for k, ev in enumerate(made_events) if -first < ev < 0]:
            index = where.get(-made_events[pos])
            if index is None:
                self.spans[key] = None  # frees a handle it was not given
                return made
            from_inputs.append((pos, index))
        coded: list[tuple[bool, int]] = []
        for h in result:
            if h == 0:
                coded.append((True, -1))
            elif h >= first:
                coded.append((True, h - first))
            elif h in where:
                coded.append((False, where[h]))
            else:
                self.spans[key] = None
                return made
        sizes = prog.sizes
        shape = span_shape(made_events, [0 if ev > 0 else sizes[-ev] for ev in made_events])
        self.spans[key] = _Span(
            events, from_inputs, list(prog.sizes[first:]), prog.categories[first:], coded, made[1], shape
        )
        return made

    def _record_ops(self, key: Hashable, inputs: Sequence[int], run: Run) -> tuple[list[int], Any]:
        """_record for a template's recording: the recorder's ops (+handle allocates, -handle frees), the
        handles' affine sizes and categories, the phase marks."""
        rec = self.rec
        assert rec is not None
        first, start, marks = len(rec.a), len(rec.ops), len(rec.phases)
        made = run()
        where = {h: i for i, h in enumerate(inputs) if h}
        ops = rec.ops[start:]
        switched = len(rec.phases) != marks  # (one phase per span, as in _record)
        if (
            switched
            or len(where) != len([h for h in inputs if h])
            or any(-first < op < 0 and -op not in where for op in ops)
        ):
            self.spans[key] = None
            return made
        shift = first - 1
        coded = [op - shift if op > 0 else (op + shift if -op >= first else 0) for op in ops]
        from_inputs = [(k, where[-op]) for k, op in enumerate(ops) if -first < op < 0]
        result: list[tuple[bool, int]] = []
        for h in made[0]:
            if h and h < first and h not in where:
                self.spans[key] = None
                return made
            result.append((True, -1) if not h else (True, h - first) if h >= first else (False, where[h]))
        # sizes not affine in the batch (template.PerBatch: a reduction's buffer) by the span's own handle
        per_batch = {h - first: fn for h, fn in rec.per_batch.items() if h >= first}
        self.spans[key] = _RecSpan(
            coded, from_inputs, rec.a[first:], rec.c[first:], self.prog.categories[first:], result, made[1], per_batch
        )
        return made

    def _write_ops(self, span: _RecSpan, inputs: Sequence[int]) -> tuple[list[int], Any]:
        rec = self.rec
        assert rec is not None
        first = len(rec.a)
        shift = first - 1
        ops = [op + shift if op > 0 else op - shift for op in span.ops]
        for pos, index in span.inputs:
            ops[pos] = -inputs[index]
        rec.ops.extend(ops)
        rec.a.extend(span.a)
        rec.c.extend(span.c)
        for k, fn in span.per_batch.items():
            rec.per_batch[first + k] = fn
        self.prog.categories.extend(span.categories)
        return [(first + v if own else inputs[v]) if v >= 0 else 0 for own, v in span.result], span.payload


@dataclass(frozen=True)
class _RecSpan:
    """A span of a template's recording (SpanMemo._record_ops)."""

    ops: list[int]  # +k / -k: the span's k-th own handle (from 1); 0: an input's free, filled in when written out
    inputs: list[tuple[int, int]]
    a: list[int]
    c: list[int]
    categories: list[str]
    result: list[tuple[bool, int]]
    payload: Any
    per_batch: dict[int, Callable[[int], int]]  # own handle (from 0) -> its size at a batch (template.PerBatch)


def _renumbered(saved: list[Saved], handles: list[int]) -> list[Saved]:
    """A recorded layer's saved nodes on the handles written out for this call."""
    return [
        Saved(h, s.grad_bytes, s.param_grads, s.transient, s.transient_after, s.side, s.release_side)
        for s, h in zip(saved, handles, strict=True)
    ]


def _value_key(x: Any) -> Hashable:
    """A size given to a layer function as a memo key part (a Batch by its coefficients)."""
    if isinstance(x, Batch):
        return ("batch", x.a, x.c)
    if isinstance(x, tuple):
        return tuple(_value_key(v) for v in x)
    return x  # type: ignore[no-any-return]


def layer_forward(
    memo: SpanMemo,
    ctx: Ctx,
    layer: int,
    keep: bool,
    residual_out: list[int] | None = None,
    recompute: bool = False,
) -> list[Saved]:
    """blocks_train.block_forward through the memo; the layer's output handle is appended to `residual_out` when
    given (the residual stream tensor by tensor), else freed by the layer. `recompute`: checkpointing's recompute."""
    if not memo.enabled or ctx is not memo.ctx:
        return block_forward(memo.prog, ctx, layer, keep, residual_out=residual_out, recompute=recompute)
    given = residual_out is not None

    def run() -> tuple[list[int], Any]:
        outs: list[int] | None = [] if given else None
        saved = block_forward(memo.prog, ctx, layer, keep, residual_out=outs, recompute=recompute)
        return [s.handle for s in saved] + (outs or []), (saved, len(saved))

    handles, (saved, n) = memo.call(("forward", keep, given, recompute, layer_kind(ctx.spec, layer)), (), run)
    if residual_out is not None:
        residual_out.extend(handles[n:])
    return _renumbered(saved, handles[:n])


def lora_layer_forward(
    memo: SpanMemo, ctx: Ctx, layer: int, residual_out: list[int], named: dict[str, int], input_grad: bool
) -> list[Saved]:
    """blocks_recorded.plain_block_forward for the recorded LoRA layer (lm/lora_recorded.py) through the memo:
    `named` is filled with the handles its backward reads by name, `residual_out` gets the layer's output."""

    def plain(outs: list[int], names: dict[str, int]) -> list[Saved]:
        return plain_block_forward(
            memo.prog, ctx, layer, keep=True, residual_out=outs, named=names, input_grad=input_grad
        )

    if not memo.enabled or ctx is not memo.ctx:
        return plain(residual_out, named)

    def run() -> tuple[list[int], Any]:
        outs: list[int] = []
        names: dict[str, int] = {}
        saved = plain(outs, names)
        return [s.handle for s in saved] + outs + list(names.values()), (saved, len(outs), list(names))

    handles, (saved, n_out, keys) = memo.call(("lora_forward", input_grad, layer_kind(ctx.spec, layer)), (), run)
    n = len(saved)
    residual_out.extend(handles[n : n + n_out])
    named.update(zip(keys, handles[n + n_out :], strict=True))
    return _renumbered(saved, handles[:n])


def lora_layer_backward(
    memo: SpanMemo,
    ctx: Ctx,
    layer: int,
    named: dict[str, int],
    grads: list[int],
    accumulate: bool,
    resid_grad: int,
    layer_input: int,
    input_grad: bool,
    tables: list[int] | None = None,
) -> None:
    """The recorded LoRA layer's backward (lm/lora_recorded.LoraBackward) through the memo. Under checkpointing
    (`named` empty) the nodes that need no saved tensor run first, then the recompute up to its early stop; the
    residual stream's gradient `resid_grad` is added into in place; `layer_input` (the checkpointed input, or 0) and
    `tables` (the rotary tables, freed by the first layer's backward) are freed by it."""
    ckpt = memo.ctx.w.grad_ckpt

    def body(made: list[int]) -> None:
        bw = LoraBackward(memo.prog, ctx, {} if ckpt else named, made, accumulate)
        head = None
        if ckpt:
            head = bw.head("down_proj", resid_grad, False)
            plain_block_forward(memo.prog, ctx, layer, keep=True, named=bw.kept, stop_early=True)
        bw.run(resid_grad, head, layer_input, input_grad=input_grad, tables=tables)

    if not memo.enabled or ctx is not memo.ctx:
        body(grads)
        return

    def run() -> tuple[list[int], Any]:
        made: list[int] = []
        body(made)
        return made, None

    size = memo.size_key
    tabled = list(tables or [])
    inputs = [resid_grad, layer_input, *tabled, *named.values()]
    key = (
        "lora_backward",
        layer_kind(ctx.spec, layer),
        ckpt,
        accumulate,
        input_grad,
        tuple(size(h) for h in inputs[: 2 + len(tabled)]),
        tuple((k, size(h)) for k, h in named.items()),
    )
    handles, _ = memo.call(key, inputs, run)
    grads.extend(handles)


def layer_backward(memo: SpanMemo, saved: list[Saved], grads: list[int], accumulate: bool) -> None:
    """autograd.block_backward through the memo: the key is the saved nodes' shapes and sizes."""
    if not memo.enabled:
        block_backward(memo.prog, saved, grads, accumulate)
        return
    nodes: tuple[Hashable, ...]
    if memo.rec is None:  # (the plain program: every size is an int)
        sizes = memo.prog.sizes
        nodes = tuple(
            (
                sizes[s.handle] if s.handle else 0,
                s.grad_bytes,
                s.param_grads,
                s.transient,
                s.transient_after,
                s.side,
                s.release_side,
            )
            for s in saved
        )
    else:
        size, value = memo.size_key, _value_key
        nodes = tuple(
            (
                size(s.handle),
                value(s.grad_bytes),
                value(s.param_grads),
                value(s.transient),
                value(s.transient_after),
                value(s.side),
                value(s.release_side),
            )
            for s in saved
        )
    key = ("backward", accumulate, nodes)

    def run() -> tuple[list[int], Any]:
        made: list[int] = []
        block_backward(memo.prog, saved, made, accumulate)
        return made, None

    handles, _ = memo.call(key, [s.handle for s in saved], run)
    grads.extend(handles)


def layer_nograd(memo: SpanMemo, ctx: Ctx, x: int, layer: int, **options: Any) -> tuple[int, list[int]]:
    """blocks_infer.block_nograd through the memo (not under autocast's cached weight casts, `casts` and
    `adapter_casts`)."""
    cached = options.get("casts") is not None or options.get("adapter_casts") is not None
    if not memo.enabled or ctx is not memo.ctx or cached:
        return block_nograd(memo.prog, ctx, x, layer, **options)

    def run() -> tuple[list[int], Any]:
        new_x, kv = block_nograd(memo.prog, ctx, x, layer, **options)
        return [new_x, *kv], None

    key = ("nograd", layer_kind(ctx.spec, layer), memo.size_key(x), tuple(sorted(options.items())))
    handles, _ = memo.call(key, [x], run)
    return handles[0], handles[1:]
