"""Where generate()'s time per new token goes on a GPU: the same request timed in several ways in one process.

The memory sets' generation rows (the probe times one generate() call, with no call of that shape before it) run
50-400 ms a new token on the H200, largely whatever the model's size (docs/steptime.md). This separates the
candidates. For each job (written as `gpuready estimate` arguments, one per line of JOBS, `#` comments), the model
is built as the probe builds it (trial/probe.py: random weights, on the GPU) and the request is timed:

- `first`: one generate() call of the job's batch x prompt + new tokens, the first of its shapes in the process (what
  the probe measures);
- `second`: the same call again, every shape seen before;
- `nocudnn_first`, `nocudnn_second`: the same with cuDNN's attention taken out of SDPA's choice
  (`torch.backends.cuda.enable_cudnn_sdp(False)`) and a prompt 8 tokens longer, so that no shape has been seen;
- `loop`: a plain decode loop without generate() (one prefill forward, then one forward per new token with the
  cache, greedy argmax), cuDNN's attention still out, every shape seen before;
- `kernels`: the GPU time of the loop's decode steps under torch.profiler (the sum of the kernels' durations) and
  the kernels launched per step.

    python3 benchmarks/gen_speed.py JOBS > docs/calibration/gen_speed_h200.tsv
    python3 benchmarks/gen_speed.py --probe JOBS   # the probe itself, two generate() calls per job
    python3 benchmarks/gen_speed.py --names JOBS   # what a decode step launches, by CUDA kernel and by aten op

`--names` profiles 8 decode steps of the plain loop (cuDNN's attention left in) and generate()'s own steps (a call of
9 new tokens less one of 1, over 8) and prints, per job and path, each CUDA kernel name and each top-level aten op
(one the host dispatched, not one inside another) with its count and GPU microseconds per step: what the step-time
model's kernel counts (plan/ops/lm.py lm_decode_ops) are checked against.

`--probe` runs gpuready's probe (trial/probe.py, a fresh process per job, GPUREADY_PROBE_GENERATE_CALLS=2) and prints
each call's seconds and the peaks after the first call against the whole run's: whether a second call, which times
the request warm, leaves the measured peaks as one call leaves them.

One line per (job, way): seconds for the request, milliseconds per new token, and the process's CPU seconds over
the same span (a loop bound by the host shows CPU seconds close to the wall seconds).
"""

from __future__ import annotations

import sys
import time
from typing import Any


def _timed(torch: Any, fn: Any) -> tuple[float, float]:
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def _model(torch: Any, args: str) -> tuple[Any, Any, int]:
    """(the job, its model built as the probe builds it, in eval mode, its vocabulary size)."""
    from gpuready.trial.backend import probe_spec
    from gpuready.trial.probe import _build_lm
    from gpuready.workload import workload_from_args

    w = workload_from_args(args)
    spec = probe_spec(w)
    model = _build_lm(torch, spec)
    model.eval()
    return w, model, int(spec["config"]["vocab_size"])


def _job(torch: Any, args: str) -> None:
    from gpuready.workload.spec import SAMPLING

    w, model, vocab = _model(torch, args)
    n, batch, seq = int(w.new_tokens), int(w.batch), int(w.seq)
    decoding: dict[str, Any] = {"do_sample": False}
    if w.decoding == "sample":
        decoding = {"do_sample": True, **SAMPLING}

    def request(length: int) -> Any:
        ids = torch.randint(0, vocab, (batch, length), device="cuda")

        def call() -> None:
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, **decoding)

        return call

    def show(way: str, seconds: float, cpu: float) -> None:
        print(f"{args}\t{way}\t{seconds:.3f}\t{1000 * seconds / n:.2f}\t{cpu:.3f}", flush=True)

    first = request(seq)
    show("first", *_timed(torch, first))
    show("second", *_timed(torch, first))
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        other = request(seq + 8)
        show("nocudnn_first", *_timed(torch, other))
        show("nocudnn_second", *_timed(torch, other))
        ids = torch.randint(0, vocab, (batch, seq + 8), device="cuda")

        def loop(steps: int = n) -> None:
            with torch.no_grad():
                out = model(ids, use_cache=True)
                cache = out.past_key_values
                for _ in range(steps - 1):
                    nxt = out.logits[:, -1:].argmax(-1)
                    out = model(nxt, past_key_values=cache, use_cache=True)

        show("loop", *_timed(torch, loop))
        try:
            from torch.profiler import ProfilerActivity, profile

            with torch.no_grad():
                out = model(ids, use_cache=True)
                cache = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                steps = 8
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(steps):
                        out = model(nxt, past_key_values=cache, use_cache=True)
                        nxt = out.logits[:, -1:].argmax(-1)
                    torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu_us = sum(e.device_time for e in kernels)
            print(
                f"{args}\tkernels\t{gpu_us / 1e6 / steps:.5f}\t{gpu_us / 1e3 / steps:.2f}\t{len(kernels) / steps:.0f}",
                flush=True,
            )
        except Exception as exc:  # the profiler may be missing or refuse on this machine: say so, go on
            print(f"{args}\tkernels\terror: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def _names(torch: Any, args: str) -> None:
    """--names: per decode step, the CUDA kernels and top-level aten ops of the loop and of generate()."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    w, model, vocab = _model(torch, args)
    ids = torch.randint(0, vocab, (int(w.batch), int(w.seq)), device="cuda")
    steps = 8

    def tally(prof: Any) -> tuple[Counter[str], Counter[str], Counter[str]]:
        kernels: Counter[str] = Counter()
        kernel_us: Counter[str] = Counter()
        ops: Counter[str] = Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:90]] += 1
                kernel_us[e.name[:90]] += e.device_time
            elif e.name.startswith("aten::"):
                parent = e.cpu_parent
                while parent is not None and not parent.name.startswith("aten::"):
                    parent = parent.cpu_parent
                if parent is None:
                    ops[e.name] += 1
        return kernels, kernel_us, ops

    def show(path: str, kernels: Counter[str], kernel_us: Counter[str], ops: Counter[str], per: float) -> None:
        print(f"{args}\t{path}\tTOTAL kernels\t{sum(kernels.values()) / per:.1f}\t{sum(kernel_us.values()) / per:.0f}")
        print(f"{args}\t{path}\tTOTAL aten ops\t{sum(ops.values()) / per:.1f}\t")
        for name, n in kernels.most_common():
            if n / per >= 0.5:
                print(f"{args}\t{path}\tkernel {name}\t{n / per:.1f}\t{kernel_us[name] / per:.0f}")
        for name, n in ops.most_common():
            if n / per >= 0.5:
                print(f"{args}\t{path}\top {name}\t{n / per:.1f}\t")

    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(2):  # every shape seen once
            out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                out = model(nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
        show("loop", *tally(prof), steps)
        del out, cache
        counts = []
        for n in (1, steps + 1, 1, steps + 1):  # the first pair sees the shapes, the second is counted
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
                torch.cuda.synchronize()
            counts.append(tally(prof))
        one, many = counts[2], counts[3]
        show("generate", *(many[k] - one[k] for k in range(3)), steps)


def probe_twice(args: str) -> str:
    """One job through the probe with two generate() calls: a line of the --probe table."""
    import json
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    from gpuready.trial.backend import probe_spec
    from gpuready.workload import workload_from_args

    with tempfile.TemporaryDirectory() as tmp:
        spec, result = Path(tmp, "spec.json"), Path(tmp, "result.json")
        spec.write_text(json.dumps(probe_spec(workload_from_args(args))), encoding="utf-8")
        env = {**os.environ, "GPUREADY_PROBE_GENERATE_CALLS": "2"}
        cmd = [sys.executable, "-m", "gpuready.trial.probe", str(spec), str(result)]
        subprocess.run(cmd, env=env, check=False, timeout=600)
        r = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else {"error": "no result"}
    if not r.get("ok"):
        return f"{args}\terror: {r.get('error')}"
    first, second = r["step_times"][:2]
    cells = [f"{first:.3f}", f"{second:.3f}"]
    for key in ("allocated", "reserved"):
        cells += [str(r[f"first_step_peak_{key}_bytes"]), str(r[f"peak_{key}_bytes"])]
    return "\t".join([args, *cells])


def _jobs(path: str) -> list[str]:
    """A job list's jobs: one per line, `#` comments and blank lines left out."""
    with open(path, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.strip().startswith("#")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--names":
        import torch

        jobs = _jobs(argv[1])
        print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC')}")
        print("job\tpath\twhat\tper_step\tgpu_us_per_step")
        for args in jobs:
            try:
                _names(torch, args)
            except Exception as exc:  # one job's fault is a line of the table
                print(f"{args}\terror\t{type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            torch.cuda.empty_cache()
        return 0
    if len(argv) == 2 and argv[0] == "--probe":
        jobs = _jobs(argv[1])
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# {stamp}, gpuready's probe, GPUREADY_PROBE_GENERATE_CALLS=2")
        print("job\tfirst_s\tsecond_s\talloc_after_first\talloc_run\treserved_after_first\treserved_run")
        for args in jobs:
            print(probe_twice(args), flush=True)
        return 0
    import torch

    if len(argv) != 1:
        sys.stderr.write("usage: gen_speed.py [--probe | --names] JOBS\n")
        return 2
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, {stamp}")
    print("# `kernels`: seconds and ms are the GPU's kernel time per decode step, the last column the kernels per step")
    print("job\tway\tseconds\tms_per_token\tcpu_seconds")
    for args in _jobs(argv[0]):
        try:
            _job(torch, args)
            torch.cuda.empty_cache()
        except Exception as exc:  # one job's fault is a line of the table, not the end of the run
            print(f"{args}\terror\t{type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
