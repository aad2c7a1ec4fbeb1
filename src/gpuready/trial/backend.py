"""Backends that measure one point: the built-in probe (a fresh child process per point) and the user's
own command (wrapped, its output streamed, NVML sampled over its process tree).

Sweeps and searches (sweep.py, search.py) only see the `Backend` protocol, so tests inject fakes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpuready
from gpuready.errors import InputError
from gpuready.trial import runner
from gpuready.trial.result import Point
from gpuready.trial.sampler import Sampler, SamplerSummary
from gpuready.workload import Workload

# A probe point: loading an 8B model from its config and 3 steps take well under a minute on an H200.
DEFAULT_PROBE_TIMEOUT_SECONDS = 900.0


def _src_root() -> str:
    return str(Path(gpuready.__file__).resolve().parent.parent)


def _child_env() -> dict[str, str]:
    """The child must import this same gpuready (an editable checkout, a PYTHONPATH, an install)."""
    env = dict(os.environ)
    parts = [_src_root(), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def probe_spec(workload: Workload) -> dict[str, Any]:
    """The JSON the probe child reads: the workload plus the model's config (so the child needs no lookup)."""
    from gpuready.models import find_preset, resolve_model

    spec = resolve_model(workload.model)
    preset = find_preset(workload.model)
    weights_path: str | None = None
    if preset is not None:
        config = dict(preset.config)
    else:
        path = Path(workload.model).expanduser()
        if path.is_dir():
            cfg_file = path / "config.json"
            if not cfg_file.is_file():
                raise InputError("MODEL", f"{path}: the probe needs config.json in the folder")
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
            if any(path.glob("*.safetensors")):
                weights_path = str(path)  # real weights from a local folder
        elif path.is_file():
            config = json.loads(path.read_text(encoding="utf-8"))
        else:
            from gpuready.models.hub import fetch_config

            config = fetch_config(workload.model)
    config.setdefault("model_type", spec.model_type)
    # LoRA targets: docs/cli.md's default is every linear layer of the blocks, named as peft matches them
    # (for llama/qwen/mistral/gemma this is q,k,v,o,gate,up,down_proj as in calibration/README.md)
    from gpuready.models.lora import default_lora_targets

    lora_targets = default_lora_targets(spec)
    return {
        "workload": workload.model_dump(mode="json"),
        "kind": spec.kind,
        "model_name": spec.name,
        "config": config,
        "weights_path": weights_path,
        "lora_targets": lora_targets,
    }


def point_from_probe(
    values: dict[str, Any], results: list[dict[str, Any]], wall: float, per_rank: bool = False
) -> Point:
    """Merge the per-rank result dicts of one probe run into a Point (peaks: the largest rank's)."""
    first = results[0]

    def peak(key: str) -> int | None:
        vals = [int(r[key]) for r in results if r.get(key) is not None]
        return max(vals) if vals else None

    ok = all(bool(r.get("ok")) for r in results)
    errors = [r for r in results if not r.get("ok")]
    status = "ok" if ok else str(errors[0].get("error_kind") or "failed")
    if status == "error":
        status = "failed"
    if status == "missing_dependency":
        status = "unsupported"
    detail = {
        k: first.get(k)
        for k in (
            "phase",
            "load_seconds",
            "load_reserved_bytes",
            "step_times",
            "generate_calls",
            "torch_version",
            "transformers_version",
            "device_memory_source",
            "process_seconds",
            "traceback",
        )
        if first.get(k) is not None
    }
    ranks = (
        [
            {k: r.get(k) for k in ("rank", "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "ok")}
            for r in results
        ]
        if (per_rank or len(results) > 1)
        else []
    )
    return Point(
        values=dict(values),
        ok=ok,
        status=status,
        error=None if ok else errors[0].get("error"),
        peak_allocated_bytes=peak("peak_allocated_bytes"),
        peak_reserved_bytes=peak("peak_reserved_bytes"),
        peak_device_bytes=peak("peak_device_bytes"),
        step_seconds=max((r["step_seconds"] for r in results if r.get("step_seconds")), default=None),
        throughput=first.get("throughput"),
        throughput_unit=first.get("throughput_unit"),
        wall_seconds=wall,
        load_allocated_bytes=peak("load_allocated_bytes"),
        device_overhead_bytes=first.get("device_overhead_bytes"),
        params=first.get("params"),
        trainable=first.get("trainable"),
        gpu=first.get("gpu"),
        gpu_total_bytes=first.get("gpu_total_bytes"),
        ranks=ranks,
        detail=detail,
    )


@dataclass
class ProbeBackend:
    """Each point: write the spec, run `python -m gpuready.trial.probe` (torchrun if nproc > 1), read it."""

    workload: Workload
    nproc: int | None = None  # None: a plain child; N: torchrun with N processes (1 included)
    timeout: float = DEFAULT_PROBE_TIMEOUT_SECONDS
    run: runner.RunFn = runner.run
    on_line: Callable[[str], None] | None = None
    memory_cap_bytes: int | None = None  # emulate a smaller card: cap PyTorch's allocator at this many bytes

    def run_point(self, values: dict[str, int]) -> Point:
        workload = self.workload.model_copy(update=values)
        spec = probe_spec(workload)
        spec["memory_cap_bytes"] = self.memory_cap_bytes
        with tempfile.TemporaryDirectory(prefix="gpuready-trial-") as tmp:
            spec_path = Path(tmp) / "spec.json"
            out_path = Path(tmp) / "result.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            argv = runner.python_module_argv("gpuready.trial.probe", str(spec_path), str(out_path), nproc=self.nproc)
            proc = self.run(argv, timeout=self.timeout, env=_child_env(), on_line=self.on_line)
            files = [out_path] if out_path.exists() else sorted(Path(tmp).glob("result.json.rank*"))
            results = [json.loads(f.read_text(encoding="utf-8")) for f in files]
        if results:
            return point_from_probe(values, results, proc.duration_seconds, per_rank=self.nproc is not None)
        # no result file: the child died before it could write one (killed, segfault, hung)
        status, error = classify_output(proc.output_tail, proc.returncode, proc.timed_out)
        return Point(
            values=dict(values),
            ok=False,
            status=status,
            error=error or "the probe process ended without a result",
            wall_seconds=proc.duration_seconds,
            detail={"exit_code": proc.returncode, "output_tail": proc.output_tail[-20:]},
        )


# What a crashing CUDA job prints. Sources: torch's OutOfMemoryError text ("CUDA out of memory. Tried to
# allocate ..."), cuBLAS/cuDNN allocation failures, and CUDA runtime errors as PyTorch raises them.
_OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"),
    re.compile(r"out of memory", re.IGNORECASE),
)
_CUDA_PATTERNS = (
    re.compile(r"CUDA error", re.IGNORECASE),
    re.compile(r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+"),
    re.compile(r"an illegal memory access was encountered"),
    re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError"),
    re.compile(r"device-side assert triggered"),
    re.compile(r"no CUDA GPUs are available|CUDA driver version is insufficient", re.IGNORECASE),
)


def classify_output(tail: Sequence[str], returncode: int | None, timed_out: bool) -> tuple[str, str | None]:
    """(status, one-line error) of a finished command from its exit status and its last output lines."""
    if timed_out:
        return "timeout", "ended after the --timeout"
    for line in reversed(tail):
        if any(p.search(line) for p in _OOM_PATTERNS):
            return "oom", line.strip()[:300]
    for line in reversed(tail):
        if any(p.search(line) for p in _CUDA_PATTERNS):
            return "cuda_error", line.strip()[:300]
    if returncode == 0:
        return "ok", None
    last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
    if returncode is not None and returncode < 0:
        return "failed", f"killed by signal {-returncode}" + (f": {last[:200]}" if last else "")
    return "failed", f"exit status {returncode}" + (f": {last[:200]}" if last else "")


def substitute_arg(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """Replace the value of `flag` in argv (`--flag=V` or `--flag V`); append it when absent."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, f"{flag}={value}"]


@dataclass
class CommandBackend:
    """The user's own command, run once per point with `--sweep-arg FLAG`'s value substituted."""

    argv: list[str]
    flag: str | None = None
    timeout: float | None = None
    sampler_factory: Callable[[], Sampler] = Sampler
    run: runner.RunFn = runner.run
    on_line: Callable[[str], None] | None = None
    last_summary: SamplerSummary | None = field(default=None, init=False)

    def run_point(self, values: dict[str, int]) -> Point:
        argv = list(self.argv)
        if self.flag is not None:
            argv = substitute_arg(argv, self.flag, str(values[self.flag]))
        sampler = self.sampler_factory()
        sampler.start_baseline()
        try:
            proc = self.run(argv, timeout=self.timeout, on_line=self.on_line, on_start=sampler.start)
        finally:
            summary = sampler.stop()
        self.last_summary = summary
        status, error = classify_output(proc.output_tail, proc.returncode, proc.timed_out)
        ok = status == "ok"
        detail: dict[str, Any] = {
            "argv": argv,
            "exit_code": proc.returncode,
            "duration_seconds": proc.duration_seconds,
            "samples": summary.samples,
            "sample_hz": summary.rate_hz,
            "memory_source": summary.source,
            "peak_utilization_percent": summary.peak_utilization,
            "mean_utilization_percent": summary.mean_utilization,
        }
        if not ok:
            detail["output_tail"] = proc.output_tail[-20:]
        return Point(
            values=dict(values),
            ok=ok,
            status=status,
            error=error,
            peak_device_bytes=summary.peak_bytes,
            wall_seconds=proc.duration_seconds,
            gpu=summary.gpu,
            gpu_total_bytes=summary.total_bytes,
            detail=detail,
        )
