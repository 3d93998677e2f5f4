from __future__ import annotations

import logging

import pytest

from tuner.machine._gpu import (
    GpuDevice,
    GpuMappingError,
    GpuReader,
    GpuReading,
    NoGpuReader,
    NvmlGpuReader,
    gpu_memory_used_bytes,
    nvml_index_of,
    open_gpu_reader,
    visible_nvml_indices,
)
from tuner.testing import StaticGpuReader, fake_nvml, fake_pci_bus_id, fake_uuid

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
        GpuDevice(0, "NVIDIA H200 #0", 80 * GiB, fake_uuid(0), fake_pci_bus_id(0)),
        GpuDevice(1, "NVIDIA H200 #1", 80 * GiB, fake_uuid(1), fake_pci_bus_id(1)),
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


# --- cuda:N -> the NVML device, through CUDA_VISIBLE_DEVICES or the PCI address --------------

UUIDS = [f"GPU-{n}{n}aa0000-0000-0000-0000-00000000000{n}" for n in range(4)]


def _devices() -> list[GpuDevice]:
    """Four NVML devices of the fake reader, with the UUIDs above."""
    return NvmlGpuReader(nvml=fake_nvml(device_count=4, uuids=UUIDS)).devices()


def _index(device: str, visible: str | None, **kwargs: object) -> int:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return nvml_index_of(device, _devices(), environ, **kwargs)  # type: ignore[arg-type]


def _no_torch_cuda(ordinal: int) -> None:
    return None


@pytest.mark.parametrize(
    ("device", "visible", "expected"),
    [
        ("cuda:0", None, 0),  # unset: CUDA counts every GPU, as NVML does
        ("cuda:2", None, 2),
        ("cuda", None, 0),
        ("cuda:0", "3", 3),  # the case the guard got wrong: it read GPU 0
        ("cuda:1", "3,1", 1),
        ("cuda:0", "2, 0", 2),
        ("cuda:0", UUIDS[3], 3),  # a full UUID
        ("cuda:1", f"{UUIDS[2]},{UUIDS[1]}", 1),
        ("cuda:0", "GPU-22aa", 2),  # a unique prefix, as CUDA accepts one
    ],
)
def test_cuda_device_maps_to_its_nvml_index(
    device: str, visible: str | None, expected: int
) -> None:
    assert _index(device, visible, pci_address=_no_torch_cuda) == expected


@pytest.mark.parametrize(
    ("device", "visible", "message"),
    [
        ("cuda:1", "3", r"cuda:1 is not visible: CUDA_VISIBLE_DEVICES='3' names 1 device"),
        ("cuda:0", "", "makes no GPU visible"),
        ("cuda:0", "gpu0", "'gpu0' is neither a GPU index nor a GPU- UUID"),
        ("cuda:0", "0,-1", "'-1' is neither a GPU index"),
        ("cuda:0", "7", "GPU 7 does not exist"),
        ("cuda:0", "GPU-99", "no GPU has a UUID starting 'GPU-99'"),
        ("cuda:0", "GPU-", "is neither a GPU index nor a GPU- UUID"),
        ("cuda:0", "1,1", "names a device twice"),
        ("cuda:0", "MIG-4f3b2a10-0000-0000-0000-000000000000", "MIG instances are not supported"),
        ("cpu", None, "expected cuda or cuda:N, got 'cpu'"),
    ],
)
def test_a_visible_devices_value_that_names_no_gpu_is_one_clear_error(
    device: str, visible: str | None, message: str
) -> None:
    with pytest.raises(GpuMappingError, match=message) as caught:
        _index(device, visible, pci_address=_no_torch_cuda)
    assert "\n" not in str(caught.value)


def test_an_ambiguous_uuid_prefix_is_refused() -> None:
    devices = [GpuDevice(0, "a", GiB, "GPU-abc1"), GpuDevice(1, "b", GiB, "GPU-abc2")]
    with pytest.raises(GpuMappingError, match="2 GPUs have a UUID starting 'GPU-abc'"):
        nvml_index_of("cuda:0", devices, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}, _no_torch_cuda)


def test_where_torch_runs_cuda_the_pci_address_decides() -> None:
    # CUDA's own order can differ from NVML's (CUDA_DEVICE_ORDER=FASTEST_FIRST on mixed GPUs):
    # the PCI address torch reports for cuda:0 is the device's, whatever the variable says.
    address = {0: (0, 0x30, 0)}  # fake_pci_bus_id(2) is 00000000:30:00.0

    assert _index("cuda:0", "1", pci_address=address.get) == 2
    # an address NVML does not list falls back to the variable
    assert _index("cuda:0", "1", pci_address={0: (0, 0x99, 0)}.get) == 1


def test_the_default_pci_lookup_leaves_cuda_alone_where_torch_has_not_started_it() -> None:
    # torch on this machine has not initialised CUDA: nothing is asked, the variable decides
    assert _index("cuda:0", "3") == 3


def test_the_visible_gpus_are_the_variables_entries_or_all() -> None:
    devices = _devices()
    assert visible_nvml_indices(devices, {}) == [0, 1, 2, 3]
    assert visible_nvml_indices(devices, {"CUDA_VISIBLE_DEVICES": f"2,{UUIDS[0]}"}) == [2, 0]
    assert visible_nvml_indices(devices, {"CUDA_VISIBLE_DEVICES": "bad"}) == [0, 1, 2, 3]


def test_the_study_guards_and_reads_the_mapped_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.run import _config

    monkeypatch.setattr(
        _config.machine,
        "open_gpu_reader",
        lambda log: NvmlGpuReader(nvml=fake_nvml(device_count=4)),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake_uuid(3))
    assert _config._gpu_devices("cuda:0") == ((3,), 80 * GiB)  # PreparedStudy.gpu_indices
    assert _config._gpu_devices("cpu") == ((), None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(_config.ConfigError, match=r"^--device cuda:0: CUDA_VISIBLE_DEVICES='5'"):
        _config._gpu_devices("cuda:0")


@pytest.mark.parametrize(
    "visible",
    [pytest.param("3,1", id="indices"), pytest.param(f"{fake_uuid(3)},{fake_uuid(1)}", id="uuids")],
)
def test_the_study_guards_every_ranks_mapped_gpu(
    monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    """Rank r runs on cuda:r (LOCAL_RANK), the r-th device CUDA_VISIBLE_DEVICES leaves."""
    from tuner.run import _config

    monkeypatch.setattr(
        _config.machine,
        "open_gpu_reader",
        lambda log: NvmlGpuReader(nvml=fake_nvml(device_count=4)),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert _config._gpu_devices("cuda", 2) == ((3, 1), 80 * GiB)
    assert _config._gpu_devices("cuda", 1) == ((3,), 80 * GiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible.split(",")[0])
    with pytest.raises(_config.ConfigError, match=r"^--nproc-per-node 2: cuda:1 is not visible"):
        _config._gpu_devices("cuda", 2)


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


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_the_guard_watches_the_nvml_index_of_the_trials_device(device: str, index: int) -> None:
    """Without ``CUDA_VISIBLE_DEVICES`` NVML counts devices as CUDA does."""
    devices = NvmlGpuReader(nvml=fake_nvml(device_count=4)).devices()
    assert nvml_index_of(device, devices, environ={}, pci_address=lambda ordinal: None) == index
