"""The torch probe, run as the source of `python -c` in a child process by probe.py (never imported).

It imports torch, initialises CUDA, runs one matmul and one convolution (so cuBLAS and cuDNN load), and
prints one
line `GPUREADY_PROBE {json}` with what it saw, including the CUDA libraries really mapped into the process.
It uses only the standard library besides torch, so it runs in whatever interpreter the project uses.
"""

import ctypes
import json
import re
import sys
import time
import warnings
from typing import Any

LIBS = re.compile(
    r"/(lib(?:cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvJitLink|nvrtc|cusparse|nvidia-ml)\.so[.0-9]*)$"
)


def err(exc: BaseException) -> str:
    return (type(exc).__name__ + ": " + " ".join(str(exc).split()))[:600]


def main() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.executable}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch  # type: ignore[import-not-found, unused-ignore]
        except BaseException as exc:
            out["import_error"] = err(exc)
            out["warnings"] = [str(w.message)[:600] for w in caught]
            return out
        out["import_seconds"] = round(time.perf_counter() - start, 3)
        out["torch_version"] = torch.__version__
        out["torch_file"] = torch.__file__
        out["cuda"] = torch.version.cuda
        out["hip"] = getattr(torch.version, "hip", None)
        try:
            out["is_available"] = bool(torch.cuda.is_available())
            out["device_count"] = int(torch.cuda.device_count())
        except BaseException as exc:
            out["init_error"] = err(exc)
        try:
            out["arch_list"] = list(torch.cuda.get_arch_list())
        except BaseException as exc:
            out["arch_list"] = []
            out["arch_error"] = err(exc)
        if out.get("is_available"):
            devices: list[dict[str, Any]] = []
            for i in range(out.get("device_count", 0)):
                props = torch.cuda.get_device_properties(i)
                devices.append(
                    {
                        "name": props.name,
                        "capability": [props.major, props.minor],
                        "uuid": str(getattr(props, "uuid", "")) or None,
                    }
                )
            out["devices"] = devices
            try:
                x = torch.ones(64, 64, device="cuda")
                float((x @ x).sum().item())
            except BaseException as exc:
                out["kernel_error"] = err(exc)
            try:
                out["cudnn_version"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call, unused-ignore]
                img = torch.ones(1, 1, 8, 8, device="cuda")
                float(torch.nn.functional.conv2d(img, torch.ones(1, 1, 3, 3, device="cuda")).sum().item())
            except BaseException as exc:
                out["cudnn_error"] = err(exc)
        elif out.get("cuda") is not None or out.get("hip") is not None:
            try:
                torch.zeros(1, device="cuda")
            except BaseException as exc:
                out["init_error"] = err(exc)
        out["warnings"] = [" ".join(str(w.message).split())[:600] for w in caught]
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            out["driver_cuda_version"] = version.value
    except OSError:
        pass
    loaded: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                if LIBS.search(path):
                    loaded.add(path)
    except OSError:
        pass
    out["loaded_libraries"] = sorted(loaded)
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


print("GPUREADY_PROBE " + json.dumps(main()), flush=True)
