"""What a layer's forward keeps for backward (Saved, Layer) and backward's walk over it (block_backward).

What each op keeps follows PyTorch autograd's formulas (tools/autograd/derivatives.yaml: an input is saved only
when the *other* operand needs its gradient, e.g. a frozen linear does not keep its input).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.program import Program

NOTHING_KEPT = 0  # a backward node that keeps no tensor of its own (Program handle 0 is "nothing")


@dataclass
class Saved:
    handle: int
    grad_bytes: int  # the gradient backward produces at this node (activation-sized)
    param_grads: tuple[int, ...] = ()  # weight gradients allocated at this node
    transient: tuple[int, ...] = ()  # scratch tensors this node's backward allocates together and frees
    # scratch tensors made after the node's gradient (and freed before its saved tensor goes): eager attention's
    # softmax backward (blocks_train)
    transient_after: tuple[int, ...] = ()
    # a matmul's gradient of its other operand, made before this node's own and held until a later node releases it
    # (eager attention: dV with dP, dK with dQ, which live until repeat_kv's backward sums them)
    side: tuple[int, ...] = ()
    # released here, after this node: each held side gradient summed to these sizes (repeat_kv's backward), then freed
    release_side: tuple[int, ...] = ()


class Layer:
    """One layer's forward bookkeeping: what it keeps for backward (`saved`, in order) or, without autograd
    (keep=False: no_grad, or the first pass of a checkpointed layer), the same tensors as temporaries; temporaries
    are freed when the layer ends."""

    def __init__(self, prog: Program, keep: bool) -> None:
        self.prog = prog
        self.keep = keep
        self.saved: list[Saved] = []
        self.temps: list[int] = []

    def alloc(self, nbytes: int) -> int:
        return self.prog.alloc("activations", nbytes)

    def keep_handle(
        self,
        handle: int,
        grad: int = 0,
        pgrads: tuple[int, ...] = (),
        transient: tuple[int, ...] = (),
        transient_after: tuple[int, ...] = (),
        side: tuple[int, ...] = (),
        release_side: tuple[int, ...] = (),
    ) -> None:
        if self.keep:
            self.saved.append(Saved(handle, grad, pgrads, transient, transient_after, side, release_side))
        else:
            self.temps.append(handle)

    def save(
        self,
        nbytes: int,
        grad: int = 0,
        pgrads: tuple[int, ...] = (),
        transient: tuple[int, ...] = (),
        transient_after: tuple[int, ...] = (),
    ) -> None:
        self.keep_handle(self.alloc(nbytes), grad, pgrads, transient, transient_after)

    def tmp(self, nbytes: int) -> int:
        handle = self.alloc(nbytes)
        self.temps.append(handle)
        return handle

    def temp(self, handle: int) -> int:
        """Take an allocated handle as one of the layer's temporaries (freed by drop() or when the layer ends)."""
        self.temps.append(handle)
        return handle

    def drop(self, handle: int) -> None:
        self.temps.remove(handle)
        self.prog.free(handle)

    def weight_grad(self, nbytes: int, transient: tuple[int, ...] = ()) -> None:
        """A node that keeps nothing of its own but makes a weight's gradient in backward (and, after it, the
        `transient` scratch tensors)."""
        if self.keep:
            self.saved.append(Saved(NOTHING_KEPT, 0, (nbytes,), transient))

    def grad_node(self, grad_bytes: int) -> None:
        """A node that keeps nothing of its own but makes an activation gradient in backward (a matmul with a
        frozen weight)."""
        if self.keep:
            self.saved.append(Saved(NOTHING_KEPT, grad_bytes))

    def finish(self) -> list[Saved]:
        for handle in self.temps:
            self.prog.free(handle)
        self.temps = []
        return self.saved


def block_backward(prog: Program, saved: list[Saved], grads: list[int], accumulate: bool) -> None:
    """Walk one layer's saved tensors in reverse: each node allocates its input gradient, then frees what it
    kept and the gradient it consumed; weight gradients appear at their linear (with gradient accumulation
    after the first micro-batch the new gradient is added into .grad and freed)."""
    current: int | None = None
    held: list[int] = []
    for node in reversed(saved):
        for g in node.param_grads:
            handle = prog.alloc("gradients", g)
            if accumulate:
                prog.free(handle)
            else:
                grads.append(handle)
        if node.transient:
            prog.transient("activations", *node.transient)
        held += [prog.alloc("activations", nbytes) for nbytes in node.side]
        new = prog.alloc("activations", node.grad_bytes) if node.grad_bytes else None
        if node.transient_after:
            prog.transient("activations", *node.transient_after)
        if node.handle != NOTHING_KEPT:
            prog.free(node.handle)
        if new is not None:
            if current is not None:
                prog.free(current)
            current = new
        if node.release_side:
            for side, nbytes in zip(held, node.release_side, strict=True):
                prog.free(prog.alloc("activations", nbytes))
                prog.free(side)
            held = []
    if current is not None:
        prog.free(current)
    prog.free_all(held)
