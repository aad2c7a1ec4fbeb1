"""FSDP2's per-unit all-gather and reduce-scatter buffers."""

from __future__ import annotations

from gpuready.memory.program import Program


class Fsdp:
    """FSDP2 (fully_shard on every decoder layer, then on the model) as the recorded H200 history of
    fsdp2_llama8b shows it, per unit (a layer, or the root: embeddings, final norm, lm_head):

    - all-gather: a flat buffer of the unit's full size on the all-gather stream, copied out into one full tensor
      per parameter on the compute stream; the flat buffer goes after the next unit's copy-out;
    - forward: every layer is resharded (its full tensors freed) after its forward; the root stays gathered until
      the end of backward; backward prefetches the next layer's all-gather before it computes;
    - reduce-scatter: the unit's full gradients are copied into a flat buffer on the compute stream and freed;
      the output (this GPU's shard of the gradient) is allocated on the reduce-scatter stream and kept until the
      optimizer's zero_grad; the flat input goes when the next reduce-scatter starts.
    """

    GATHER_STREAM = 1
    REDUCE_STREAM = 2

    def __init__(self, prog: Program, units: list[list[int]], shards: int) -> None:
        self.prog = prog
        self.units = units
        self.n = shards
        self.root = len(units) - 1
        self.flats: list[int] = []  # all-gather buffers not yet freed, oldest first
        self.outputs: dict[int, list[int]] = {}
        self.pending = 0  # the last reduce-scatter's input

    def gather(self, unit: int) -> None:
        self.flats.append(self.prog.alloc("fsdp_all_gather_buffers", sum(self.units[unit])))
        self.outputs[unit] = [self.prog.alloc("fsdp_gathered_params", b) for b in self.units[unit]]
        while len(self.flats) > 1:
            self.prog.free(self.flats.pop(0))

    def prefetch(self, unit: int) -> None:
        """Backward's all-gather issued one layer ahead: the flat buffer now, the copy-out when it is used."""
        self.flats.append(self.prog.alloc("fsdp_all_gather_buffers", sum(self.units[unit])))

    def copy_out(self, unit: int) -> None:
        self.outputs[unit] = [self.prog.alloc("fsdp_gathered_params", b) for b in self.units[unit]]
        self.prog.free(self.flats.pop(0))

    def reshard(self, unit: int) -> None:
        self.prog.free_all(self.outputs.pop(unit, []))

    def reduce_scatter(self, nbytes: int, full_grads: list[int], accumulate: bool) -> int:
        """Returns the handle of this GPU's gradient shard (0 when it was added into an existing one)."""
        if not nbytes:
            return 0
        if self.pending:
            self.prog.free(self.pending)
        self.pending = self.prog.alloc("fsdp_reduce_scatter_buffers", nbytes)
        self.prog.free_all(full_grads)
        shard = self.prog.alloc("sharded_gradients", -(-nbytes // self.n))
        if accumulate:
            self.prog.free(shard)
            return 0
        return shard

    def finish(self) -> None:
        self.prog.free_all(self.flats)
        self.flats = []
        if self.pending:
            self.prog.free(self.pending)
            self.pending = 0
