"""What the probe (trial/probe.py) records of the GPU's memory, with the torch module it is handed: the peaks, the
device's overhead beside them (NVML, else cudaMemGetInfo), and on request the caching allocator's history.

Set GPUREADY_PROBE_MEMORY_HISTORY to a file path to record the caching allocator's history
(torch.cuda.memory._record_memory_history) and have it written compactly there (".rank<r>" appended under torchrun):
every alloc / free / segment event in order with its size, address, stream and innermost Python frames.
benchmarks/allocator_check.py replays it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MEMORY_HISTORY_ENV = "GPUREADY_PROBE_MEMORY_HISTORY"
HISTORY_FRAMES = 6


def start_history(torch: Any) -> None:
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=4_000_000)


def history_length(torch: Any) -> int:
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return len(traces[torch.cuda.current_device()])


def write_history(torch: Any, result: dict[str, Any], path: str) -> None:
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    frames: dict[str, int] = {}
    events: list[list[Any]] = []
    for entry in snap["device_traces"][torch.cuda.current_device()]:
        stack = " < ".join(
            f"{f.get('name')}@{Path(str(f.get('filename'))).name}:{f.get('line')}"
            for f in (entry.get("frames") or [])[:HISTORY_FRAMES]
        )
        fid = frames.setdefault(stack, len(frames))
        events.append(
            [entry["action"], int(entry.get("addr", 0)), int(entry.get("size", 0)), int(entry.get("stream", 0)), fid]
        )
    out = Path(path)
    if under_torchrun():
        out = out.with_name(f"{out.name}.rank{os.environ.get('RANK', '0')}")
    doc = {
        "events": events,
        "frames": list(frames),
        "reset_at": result.get("memory_history_reset_at", 0),
        "peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "peak_reserved_bytes": result.get("peak_reserved_bytes"),
        # the allocator's limit when `--gpu-memory` capped it (set_per_process_memory_fraction's allowed maximum):
        # allocator_check.py replays the requests under the same limit
        "memory_cap_bytes": result.get("memory_cap_bytes"),
        "error_kind": result.get("error_kind"),
    }
    out.write_text(json.dumps(doc), encoding="utf-8")
    result["memory_history"] = str(out)


def record_memory(torch: Any, result: dict[str, Any], device: int) -> None:
    torch.cuda.synchronize()
    result["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    result["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    reserved_now = int(torch.cuda.memory_reserved())
    from gpuready.nvml import Nvml

    nvml = Nvml()
    index = nvml.index_for_uuid(str(getattr(torch.cuda.get_device_properties(device), "uuid", "")))
    mem = nvml.memory(device if index is None else index)
    if mem is None:
        # cudaMemGetInfo sees the same device memory when NVML cannot be read
        free, total = torch.cuda.mem_get_info()
        used = int(total - free)
        result["device_memory_source"] = "cudaMemGetInfo"
    else:
        used = mem.used_bytes
        result["device_memory_source"] = "nvml"
    result["device_used_bytes"] = used
    result["device_overhead_bytes"] = used - reserved_now
    result["peak_device_bytes"] = result["peak_reserved_bytes"] + result["device_overhead_bytes"]


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
