"""GPU memory readings through NVML, behind a small interface.

The guard and the hardware fingerprint talk to a :class:`GpuReader`. :func:`open_gpu_reader`
gives the real :class:`NvmlGpuReader` where NVML and a device exist, and a :class:`NoGpuReader`
elsewhere, so a machine without a GPU runs the same code with the GPU side switched off.
NVML numbers every device of the host and ignores ``CUDA_VISIBLE_DEVICES``;
:func:`nvml_index_of` says which NVML device a ``cuda:N`` is (the guard and the telemetry read
that one).
:class:`tuner.testing.StaticGpuReader` plays given readings: the one stand-in for a GPU, for tests
and for machines that have none.

Thread safety: a reader is used by one thread (the guard's sampler); NVML itself is
thread-safe, but ``close`` must not race a ``read``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

__all__ = [
    "GpuDevice",
    "GpuMappingError",
    "GpuReader",
    "GpuReading",
    "NoGpuReader",
    "NvmlGpuReader",
    "gpu_memory_used_bytes",
    "nvml_index_of",
    "open_gpu_reader",
    "torch_pci_address",
    "visible_nvml_indices",
]

_log = logging.getLogger("tuner")


@dataclass(frozen=True)
class GpuDevice:
    """One NVML device: its NVML index, name and memory, and (where NVML gives them) its UUID
    (``GPU-...``) and PCI bus id (``00000000:3B:00.0``), which :func:`nvml_index_of` matches."""

    index: int
    name: str
    memory_total_bytes: int
    uuid: str | None = None
    pci_bus_id: str | None = None


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
        name = _text(self._nvml.nvmlDeviceGetName(handle))
        return GpuDevice(index, name, total_bytes, self._uuid(handle), self._pci_bus_id(handle))

    def _uuid(self, handle: Any) -> str | None:
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return None

    def _pci_bus_id(self, handle: Any) -> str | None:
        try:
            return _text(self._nvml.nvmlDeviceGetPciInfo(handle).busId)
        except self._nvml.NVMLError:
            return None

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


class GpuMappingError(ValueError):
    """``cuda:N`` names no NVML device this process can tell (one line: why, and the value)."""


PciAddress = tuple[int, int, int]
"""A PCI device's (domain, bus, device): what CUDA and NVML both report for one GPU."""


def _pci_address(bus_id: str | None) -> PciAddress | None:
    """``domain:bus:device.function`` (hex; NVML's ``00000000:3B:00.0``) as numbers, or None."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def torch_pci_address(ordinal: int) -> PciAddress | None:
    """The PCI address of CUDA device ``ordinal`` as torch sees it, or None where torch has not
    initialised CUDA in this process (asking would initialise it, and a CUDA context must not
    exist in a process that forks trial children) or does not report it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        properties = torch.cuda.get_device_properties(ordinal)
    except (RuntimeError, AssertionError, ValueError):
        return None
    fields = ("pci_domain_id", "pci_bus_id", "pci_device_id")
    if not all(hasattr(properties, field) for field in fields):
        return None
    return tuple(int(getattr(properties, field)) for field in fields)  # type: ignore[return-value]


def _cuda_ordinal(device: str) -> int:
    """``cuda:N`` is N; ``cuda`` is 0 (the current device of a fresh process)."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise GpuMappingError(f"expected cuda or cuda:N, got {device!r}")
    return int(index) if index else 0


def _visible_entry(variable: str, ordinal: int) -> str:
    """The ``ordinal``-th entry of ``CUDA_VISIBLE_DEVICES`` (checked whole, as CUDA reads it)."""
    entries = [entry.strip() for entry in variable.split(",")]
    shown = f"CUDA_VISIBLE_DEVICES={variable!r}"
    if not any(entries):
        raise GpuMappingError(f"{shown} makes no GPU visible, so cuda:{ordinal} is none")
    for entry in entries:
        if entry.startswith("MIG-"):
            raise GpuMappingError(
                f"{shown}: MIG instances are not supported (the guard reads whole GPUs); "
                "name the GPU by index or GPU- UUID"
            )
        if not (entry.isdigit() or (entry.startswith("GPU-") and len(entry) > 4)):
            raise GpuMappingError(
                f"{shown}: {entry!r} is neither a GPU index nor a GPU- UUID (or a prefix of one)"
            )
    if len(set(entries)) < len(entries):
        raise GpuMappingError(f"{shown} names a device twice (CUDA then shows none)")
    if ordinal >= len(entries):
        raise GpuMappingError(
            f"cuda:{ordinal} is not visible: {shown} names {len(entries)} device(s)"
        )
    return entries[ordinal]


def _entry_index(entry: str, devices: Sequence[GpuDevice], shown: str) -> int:
    """The NVML index of one ``CUDA_VISIBLE_DEVICES`` entry: an index as CUDA counts (the PCI
    order NVML uses wherever the GPUs are alike or ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), or a
    UUID or a unique prefix of one, as CUDA accepts them."""
    if entry.isdigit():
        index = int(entry)
        if devices and index not in {device.index for device in devices}:
            raise GpuMappingError(f"{shown}: GPU {index} does not exist ({len(devices)} found)")
        return index
    matches = [d.index for d in devices if d.uuid is not None and d.uuid.startswith(entry)]
    if len(matches) != 1:
        problem = "no GPU has" if not matches else f"{len(matches)} GPUs have"
        raise GpuMappingError(f"{shown}: {problem} a UUID starting {entry!r}")
    return matches[0]


def nvml_index_of(
    device: str,
    devices: Sequence[GpuDevice],
    environ: Mapping[str, str] | None = None,
    pci_address: Callable[[int], PciAddress | None] = torch_pci_address,
) -> int:
    """The NVML index of the GPU that ``device`` (``cuda`` or ``cuda:N``) is in this process.

    NVML numbers every GPU of the host; CUDA numbers those ``CUDA_VISIBLE_DEVICES`` leaves
    visible, in its order. Where torch already runs CUDA here, the device's PCI address picks
    the NVML device (exact whatever the order); else the N-th entry of
    ``CUDA_VISIBLE_DEVICES`` does (an index, or a ``GPU-`` UUID or unique prefix of one); else,
    unset, N is the NVML index.

    Args:
        device: ``cuda`` or ``cuda:N``.
        devices: the NVML devices (:meth:`GpuReader.devices`), for UUIDs and PCI ids.
        environ: the environment to read ``CUDA_VISIBLE_DEVICES`` from (default: this process's).
        pci_address: CUDA device ordinal -> its PCI address, or None where unknown.

    Returns:
        The NVML index (``GpuDevice.index``) of the device.

    Raises:
        GpuMappingError: ``device`` is not a CUDA device, or ``CUDA_VISIBLE_DEVICES`` does not
            name it (too few entries, an entry that is no index or UUID, an unknown or
            ambiguous UUID, a ``MIG-`` instance, a repeated entry, an empty list).
    """
    ordinal = _cuda_ordinal(device)
    address = pci_address(ordinal)
    if address is not None:
        for candidate in devices:
            if _pci_address(candidate.pci_bus_id) == address:
                return candidate.index
    environ = os.environ if environ is None else environ
    variable = environ.get("CUDA_VISIBLE_DEVICES")
    if variable is None:
        return ordinal
    entry = _visible_entry(variable, ordinal)
    return _entry_index(entry, devices, f"CUDA_VISIBLE_DEVICES={variable!r}")


def visible_nvml_indices(
    devices: Sequence[GpuDevice], environ: Mapping[str, str] | None = None
) -> list[int]:
    """The NVML indices of the GPUs this process's CUDA can use (``CUDA_VISIBLE_DEVICES``'
    entries, each through :func:`nvml_index_of`); every device where the variable is unset or
    names none of them clearly (a reader in a training job must not fail it)."""
    environ = os.environ if environ is None else environ
    variable = environ.get("CUDA_VISIBLE_DEVICES")
    everything = [device.index for device in devices]
    if variable is None:
        return everything
    try:
        count = len(variable.split(","))
        return [nvml_index_of(f"cuda:{n}", devices, environ) for n in range(count)]
    except GpuMappingError:
        return everything


def _text(value: str | bytes) -> str:
    """NVML strings: bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else value
