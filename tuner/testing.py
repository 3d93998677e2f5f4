"""Stand-ins for what cannot exist on a test machine, shipped with the package as
``optuna.testing`` is: a clock the test moves (:class:`ManualClock`), a GPU
(:class:`StaticGpuReader`, which plays given readings through the
:class:`~tuner.machine.GpuReader` interface) and the NVML library (:func:`fake_nvml`, a module
with the few pynvml functions :class:`~tuner.machine.NvmlGpuReader` calls). Nothing else is
faked: DataLoaders, processes, SQLite and PostgreSQL are real in the tests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace

from tuner.machine import GpuDevice, GpuReading

__all__ = [
    "FakeNVMLError",
    "ManualClock",
    "StaticGpuReader",
    "fake_nvml",
    "fake_pci_bus_id",
    "fake_uuid",
]

GiB = 2**30


class ManualClock:
    """A ``clock=`` that moves only when the test moves it (``clock.now += 2.5``): what is
    timed against it reads the same on a busy machine as on an idle one."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class StaticGpuReader:
    """Plays given GPU readings: the one stand-in for a GPU, for tests and GPU-less machines.

    Each ``read`` returns the next of ``frames`` and the last frame repeats once they run out,
    so a test can script memory climbing towards a limit and staying there.
    """

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        frames: Sequence[Sequence[GpuReading]] = (),
        driver_version: str | None = None,
    ) -> None:
        self._devices = list(devices)
        self._frames = [list(frame) for frame in frames]
        self._next_frame = 0
        self._lock = threading.Lock()
        self.available = bool(self._devices)
        self.driver_version = driver_version
        self.closed = False

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def read(self) -> list[GpuReading]:
        with self._lock:  # the guard's sampler thread and a test may both read
            if not self._frames:
                return []
            frame = self._frames[min(self._next_frame, len(self._frames) - 1)]
            self._next_frame += 1
        return list(frame)

    def close(self) -> None:
        self.closed = True


class FakeNVMLError(Exception):
    pass


def fake_nvml(
    *,
    device_count: int = 2,
    memory_v2: bool = True,
    utilization: bool = True,
    init_error: str | None = None,
    name_as_bytes: bool = True,
    uuids: Sequence[str] | None = None,
) -> ModuleType:
    """A module with the few pynvml functions the reader calls, recording the calls.

    Device ``i`` has UUID ``uuids[i]`` (default :func:`fake_uuid`) and PCI bus id
    :func:`fake_pci_bus_id`.
    """
    nvml = ModuleType("fake_pynvml")
    calls: list[str] = []
    uuid_of = list(uuids) if uuids is not None else [fake_uuid(i) for i in range(device_count)]

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def memory_info(handle: int, version: int | None = None) -> SimpleNamespace:
        calls.append(f"memory_v{2 if version else 1}")
        if version is not None and not memory_v2:
            raise FakeNVMLError("Function Not Found")
        reserved = 0 if version else GiB // 4  # v1 counts the driver's reserve as used
        return SimpleNamespace(used=(handle + 1) * GiB + reserved, total=80 * GiB)

    def utilization_rates(handle: int) -> SimpleNamespace:
        if not utilization:
            raise FakeNVMLError("Not Supported")
        return SimpleNamespace(gpu=10 * (handle + 1), memory=5)

    def name(handle: int) -> str | bytes:
        text = f"NVIDIA H200 #{handle}"
        return text.encode() if name_as_bytes else text

    def uuid(handle: int) -> bytes:
        return uuid_of[handle].encode()

    def pci_info(handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=fake_pci_bus_id(handle).encode())

    nvml.__dict__.update(
        NVMLError=FakeNVMLError,
        nvmlMemory_v2=0x02000028,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetCount=lambda: device_count,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=name,
        nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetUtilizationRates=utilization_rates,
        nvmlDeviceGetUUID=uuid,
        nvmlDeviceGetPciInfo=pci_info,
    )
    return nvml


def fake_uuid(index: int) -> str:
    """The UUID :func:`fake_nvml` gives device ``index`` by default (as NVML writes one)."""
    return f"GPU-{0xA0 + index:08x}-1b2c-3d4e-5f60-{index:012x}"


def fake_pci_bus_id(index: int) -> str:
    """The PCI bus id :func:`fake_nvml` gives device ``index`` (NVML's form)."""
    return f"00000000:{0x10 * (index + 1):02X}:00.0"
