from __future__ import annotations

import logging

import pytest

from tuner.machine._gpu import (
    GpuDevice,
    GpuReader,
    GpuReading,
    NoGpuReader,
    NvmlGpuReader,
    gpu_memory_used_bytes,
    open_gpu_reader,
)
from tuner.run._config import gpu_index
from tuner.testing import StaticGpuReader, fake_nvml

GiB = 2**30


def nvml_works_here() -> bool:
    """True on a machine with the NVML library and at least one device."""
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    finally:
        pynvml.nvmlShutdown()


NVML_HERE = nvml_works_here()


# --- the real NVML -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(NVML_HERE, reason="this machine has a GPU that NVML can read")
def test_open_without_nvml_gives_no_gpu_reader_and_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tuner.test_gpu")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        reader = open_gpu_reader(log)
    assert isinstance(reader, NoGpuReader)
    assert (reader.available, reader.devices(), reader.read()) == (False, [], [])
    records = [r for r in caplog.records if r.name == log.name]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO and records[0].exc_info is None
    assert records[0].getMessage().startswith("GPU memory guard off: NVML not available (")
    assert reader.reason in records[0].getMessage()
    reader.close()


@pytest.mark.gpu
@pytest.mark.skipif(not NVML_HERE, reason="needs a GPU that NVML can read")
def test_open_with_nvml_reads_every_device() -> None:
    reader = open_gpu_reader()
    try:
        assert isinstance(reader, NvmlGpuReader) and reader.available
        assert reader.driver_version
        devices = reader.devices()
        readings = reader.read()
        assert devices and [r.index for r in readings] == [d.index for d in devices]
        for device, reading in zip(devices, readings, strict=True):
            assert device.name and device.memory_total_bytes == reading.memory_total_bytes
            assert 0 <= reading.memory_used_bytes <= reading.memory_total_bytes
            util = reading.utilization_percent
            assert util is None or 0 <= util <= 100
    finally:
        reader.close()


# --- NvmlGpuReader against a stand-in pynvml (no GPU on the test machine) ----------------------


def test_nvml_reader_prefers_memory_info_v2() -> None:
    nvml = fake_nvml()
    reader = NvmlGpuReader(nvml=nvml)
    assert reader.driver_version == "550.54.15"
    assert reader.devices() == [
        GpuDevice(0, "NVIDIA H200 #0", 80 * GiB),
        GpuDevice(1, "NVIDIA H200 #1", 80 * GiB),
    ]
    assert reader.read() == [
        GpuReading(0, GiB, 80 * GiB, 10.0),
        GpuReading(1, 2 * GiB, 80 * GiB, 20.0),
    ]
    assert "memory_v1" not in nvml.calls


def test_nvml_reader_falls_back_to_v1_once_v2_fails() -> None:
    nvml = fake_nvml(memory_v2=False, name_as_bytes=False)
    reader = NvmlGpuReader(nvml=nvml)
    assert reader.devices()[0].name == "NVIDIA H200 #0"
    readings = reader.read()
    assert [r.memory_used_bytes for r in readings] == [GiB + GiB // 4, 2 * GiB + GiB // 4]
    # v2 was tried once, on the first device; every later call goes straight to v1.
    assert nvml.calls.count("memory_v2") == 1
    assert nvml.calls.count("memory_v1") == 4


def test_nvml_reader_without_utilization_reports_none() -> None:
    reader = NvmlGpuReader(nvml=fake_nvml(utilization=False))
    assert [r.utilization_percent for r in reader.read()] == [None, None]


def test_nvml_reader_close_shuts_nvml_down_once() -> None:
    nvml = fake_nvml()
    reader = NvmlGpuReader(nvml=nvml)
    reader.close()
    reader.close()
    assert nvml.calls.count("shutdown") == 1


def test_open_with_failing_init_logs_the_nvml_reason(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tuner.test_gpu")
    with caplog.at_level(logging.INFO, logger=log.name):
        reader = open_gpu_reader(log, nvml=fake_nvml(init_error="Driver Not Loaded"))
    assert isinstance(reader, NoGpuReader) and reader.reason == "Driver Not Loaded"
    assert [r.getMessage() for r in caplog.records if r.name == log.name] == [
        "GPU memory guard off: NVML not available (Driver Not Loaded)"
    ]


def test_open_with_no_device_closes_nvml_and_gives_no_gpu_reader() -> None:
    nvml = fake_nvml(device_count=0)
    reader = open_gpu_reader(nvml=nvml)
    assert isinstance(reader, NoGpuReader)
    assert nvml.calls[-1] == "shutdown"


def test_open_with_a_device_gives_the_nvml_reader() -> None:
    reader = open_gpu_reader(nvml=fake_nvml(device_count=1))
    assert isinstance(reader, NvmlGpuReader) and len(reader.devices()) == 1


# --- StaticGpuReader and the helper ------------------------------------------------------------

H200 = GpuDevice(0, "NVIDIA H200", 141 * GiB)


def reading(used_gib: int, index: int = 0) -> GpuReading:
    return GpuReading(index, used_gib * GiB, 141 * GiB, None)


def test_static_reader_plays_frames_then_repeats_the_last() -> None:
    reader = StaticGpuReader([H200], frames=[[reading(1)], [reading(50)], [reading(140)]])
    assert reader.available and reader.devices() == [H200]
    played = [gpu_memory_used_bytes(reader.read()) for _ in range(5)]
    assert played == [GiB, 50 * GiB, 140 * GiB, 140 * GiB, 140 * GiB]
    reader.close()
    assert reader.closed


def test_static_reader_without_devices_is_unavailable() -> None:
    reader = StaticGpuReader([])
    assert (reader.available, reader.read()) == (False, [])


@pytest.mark.parametrize(
    "reader",
    [NoGpuReader("test"), StaticGpuReader([H200]), NvmlGpuReader(nvml=fake_nvml())],
    ids=["none", "static", "nvml"],
)
def test_every_reader_has_the_interface(reader: GpuReader) -> None:
    typed: GpuReader = reader
    assert isinstance(typed.available, bool)
    assert typed.driver_version is None or isinstance(typed.driver_version, str)
    assert isinstance(typed.devices(), list) and isinstance(typed.read(), list)
    typed.close()


@pytest.mark.parametrize(
    ("indices", "expected"),
    [(None, 30 * GiB), ([0], 10 * GiB), ([0, 2], 20 * GiB), ([5], None)],
)
def test_gpu_memory_used_is_the_fullest_selected_device(
    indices: list[int] | None, expected: int | None
) -> None:
    readings = [reading(10, 0), reading(30, 1), reading(20, 2)]
    assert gpu_memory_used_bytes(readings, indices) == expected


def test_gpu_memory_used_without_readings_is_none() -> None:
    assert gpu_memory_used_bytes([]) is None


@pytest.mark.parametrize(
    ("device", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3), ("cpu", 0)]
)
def test_the_guard_watches_the_nvml_index_of_the_trials_device(
    monkeypatch: pytest.MonkeyPatch, device: str, index: int
) -> None:
    """Without ``CUDA_VISIBLE_DEVICES`` NVML counts devices as CUDA does."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_index(device) == index
