"""GPU memory readings through NVML, behind a small interface.

The guard and the hardware fingerprint talk to a :class:`GpuReader`. :func:`open_gpu_reader`
gives the real :class:`NvmlGpuReader` where NVML and a device exist, and a :class:`NoGpuReader`
elsewhere, so a machine without a GPU runs the same code with the GPU side switched off.
:class:`tuner.testing.StaticGpuReader` plays given readings: the one stand-in for a GPU, for tests
and for machines that have none.

Thread safety: a reader is used by one thread (the guard's sampler); NVML itself is
thread-safe, but ``close`` must not race a ``read``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

__all__ = [
    "GpuDevice",
    "GpuReader",
    "GpuReading",
    "NoGpuReader",
    "NvmlGpuReader",
    "gpu_memory_used_bytes",
    "open_gpu_reader",
]

_log = logging.getLogger("tuner")


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuReading:
    index: int
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: float | None


class GpuReader(Protocol):
    available: bool
    driver_version: str | None

    def devices(self) -> list[GpuDevice]: ...

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


class NvmlGpuReader:
    """Reads every visible NVIDIA device through NVML.

    ``nvml`` is the ``pynvml`` module, or a stand-in with the same functions. The constructor
    initialises NVML and raises ``nvml.NVMLError`` when that fails; ``close`` shuts it down.
    """

    available = True

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self._nvml.nvmlInit()
        self._closed = False
        # NVML's v2 memory info leaves out the driver's reserved memory that v1 counts as
        # used; drivers before 510 lack it, so the first failure switches to v1 for good.
        self._memory_v2 = True
        try:
            self.driver_version = self._driver_version()
            self._handles = self._device_handles()
            self._devices = [self._describe(index, handle) for index, handle in self._handles]
        except self._nvml.NVMLError:
            self.close()  # balance nvmlInit: NVML counts init/shutdown pairs
            raise

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def read(self) -> list[GpuReading]:
        """One reading per device; a device NVML cannot read right now (lost, reset) is left out."""
        readings = []
        for index, handle in self._handles:
            try:
                used_bytes, total_bytes = self._memory(handle)
            except self._nvml.NVMLError as error:
                _log.debug("GPU %d memory not readable: %s", index, error)
                continue
            readings.append(GpuReading(index, used_bytes, total_bytes, self._utilization(handle)))
        return readings

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            _log.debug("nvmlShutdown failed: %s", error)

    def _driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return None

    def _device_handles(self) -> list[tuple[int, Any]]:
        count = int(self._nvml.nvmlDeviceGetCount())
        return [(index, self._nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(count)]

    def _describe(self, index: int, handle: Any) -> GpuDevice:
        _, total_bytes = self._memory(handle)
        return GpuDevice(index, _text(self._nvml.nvmlDeviceGetName(handle)), total_bytes)

    def _memory(self, handle: Any) -> tuple[int, int]:
        """(used, total) bytes, from memory info v2 where the driver has it, else v1."""
        if self._memory_v2:
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle, version=self._nvml.nvmlMemory_v2)
                return int(info.used), int(info.total)
            except self._nvml.NVMLError as error:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                _log.debug("NVML memory info v2 unsupported (%s); using v1", error)
                self._memory_v2 = False
                return int(info.used), int(info.total)
        info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.used), int(info.total)

    def _utilization(self, handle: Any) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self._nvml.NVMLError:  # not supported on some boards and MIG slices
            return None


class NoGpuReader:
    """The reader where no GPU can be read; ``reason`` says why, for logs and the fingerprint."""

    available = False
    driver_version: str | None = None

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def devices(self) -> list[GpuDevice]:
        return []

    def read(self) -> list[GpuReading]:
        return []

    def close(self) -> None:
        pass


def open_gpu_reader(
    log: logging.Logger | None = None, *, nvml: ModuleType | None = None
) -> GpuReader:
    """The NVML reader, or a :class:`NoGpuReader` after one info line saying why not.

    ``nvml`` replaces the ``pynvml`` module (for tests); by default it is imported here, lazily,
    because CPU-only machines may not have it installed.
    """
    logger = log if log is not None else _log
    reader = _try_nvml(nvml)
    if isinstance(reader, NoGpuReader):
        logger.info("GPU memory guard off: NVML not available (%s)", reader.reason)
    return reader


def _try_nvml(nvml: ModuleType | None) -> GpuReader:
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return NoGpuReader("pynvml is not installed: pip install nvidia-ml-py")
    try:
        reader = NvmlGpuReader(nvml=nvml)
    except nvml.NVMLError as error:
        return NoGpuReader(str(error) or type(error).__name__)
    if not reader.devices():
        reader.close()
        return NoGpuReader("no NVIDIA device found")
    return reader


def gpu_memory_used_bytes(
    readings: Sequence[GpuReading], indices: Sequence[int] | None = None
) -> int | None:
    """The most memory used on any selected device (the one closest to running out)."""
    selected = [r for r in readings if indices is None or r.index in indices]
    if not selected:
        return None
    return max(reading.memory_used_bytes for reading in selected)


def _text(value: str | bytes) -> str:
    """NVML strings: bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else value
