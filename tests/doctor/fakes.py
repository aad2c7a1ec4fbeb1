"""Injected fakes: a pynvml-like module, ready-made facts and probe results."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuready.doctor.checks import DoctorFacts
from gpuready.doctor.packages import InstalledDist, PackageScan, TorchBuild
from gpuready.doctor.probe import ProbeDevice, ProbeResult
from gpuready.doctor.system import LibraryDir, SystemInfo
from gpuready.nvml import NvmlGpu, NvmlReport

GIB = 1024**3


class FakeNvml:
    """The pynvml functions the doctor calls, answering from dicts; errors are pynvml's real ones."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        driver: str = "580.159.04",
        cuda: int = 13000,
        init_error: int | None = None,
    ) -> None:
        self.gpus, self.driver, self.cuda, self.init_error = gpus, driver, cuda, init_error
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _field(self, h: int, key: str) -> Any:
        value = self.gpus[h].get(key)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._field(h, "name"))

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._field(h, "uuid"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        total, used = self._field(h, "memory")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return tuple(self._field(h, "cc"))  # type: ignore[return-value]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.gpus[h].get("procs", [])]

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return int(self.gpus[h].get("ecc", (0, 0))[kind])

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return tuple(self._field(h, "rows"))  # type: ignore[return-value]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self.gpus[h].get("throttle", 1))

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [int(self.gpus[h].get("mig", 0)), 0]

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return 1

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16


def gpu(index: int = 0, name: str = "NVIDIA H200", cc: tuple[int, int] = (9, 0), **kw: Any) -> NvmlGpu:
    return NvmlGpu(
        index=index,
        name=name,
        uuid=f"GPU-{index}abc",
        memory_total_bytes=140 * GIB,
        memory_used_bytes=GIB,
        memory_free_bytes=139 * GIB,
        compute_capability=cc,
        processes=(),
        ecc_enabled=True,
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
        throttle_reasons=1,
        mig_enabled=False,
        persistence_enabled=True,
        **kw,
    )


def nvml(driver: str = "580.159.04", cuda: int = 13000, gpus: tuple[NvmlGpu, ...] | None = None) -> NvmlReport:
    return NvmlReport(driver_version=driver, cuda_driver_version=cuda, gpus=(gpu(),) if gpus is None else gpus)


NO_DRIVER = NvmlReport(error="NVML: NVML Shared Library Not Found", error_kind="library_not_found")

SITE = "/venv/lib/python3.12/site-packages"


def torch_build(version: str = "2.11.0+cu130", cuda: str | None = "13.0", location: str = SITE) -> TorchBuild:
    return TorchBuild(version, location, cuda, None, True)


def dist(name: str, version: str, location: str = SITE, requires: tuple[str, ...] = ()) -> InstalledDist:
    return InstalledDist(name, version, location, "pip", requires)


def scan(
    builds: tuple[TorchBuild, ...] | None = None,
    extra: tuple[InstalledDist, ...] = (),
    nvidia: tuple[str, ...] = ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13"),
) -> PackageScan:
    builds = (torch_build(),) if builds is None else builds
    dists = tuple(dist("torch", b.version, b.location) for b in builds)
    versions = {"nvidia-cuda-runtime": "13.0.96", "nvidia-cublas": "13.1.0.3"}
    dists += tuple(dist(n, versions.get(n, "9.19.0.56")) for n in nvidia) + extra
    return PackageScan(
        dists=dists,
        torch_builds=builds,
        torch_import_origin=f"{builds[0].location}/torch/__init__.py" if builds else None,
        conflicts=(),
        leftovers=(),
        conda_packages=(),
    )


def system(env: dict[str, str] | None = None, ld_dirs: tuple[LibraryDir, ...] = (), shm: int = 64 * GIB) -> SystemInfo:
    return SystemInfo(
        python_version="3.12.3",
        python_executable="/venv/bin/python",
        in_venv=True,
        ram_total_bytes=125 * GIB,
        ram_available_bytes=120 * GIB,
        shm_total_bytes=shm,
        shm_free_bytes=shm,
        env=tuple((env or {}).items()),
        ld_library_dirs=ld_dirs,
    )


def facts(**kw: Any) -> DoctorFacts:
    base = DoctorFacts(nvml=nvml(), packages=scan(), system=system())
    return replace(base, **kw)


def probe_ok(**kw: Any) -> ProbeResult:
    base = ProbeResult(
        seconds=5.0,
        torch_version="2.11.0+cu130",
        torch_file=f"{SITE}/torch/__init__.py",
        cuda="13.0",
        is_available=True,
        device_count=1,
        arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
        devices=(ProbeDevice("NVIDIA H200", (9, 0)),),
        cudnn_version=91900,
        loaded_libraries=(
            f"{SITE}/nvidia/cu13/lib/libcudart.so.13",
            f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9",
        ),
    )
    return replace(base, **kw)
