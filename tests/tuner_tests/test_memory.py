from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import psutil
import pytest

from tuner.machine._cgroup import cgroup_memory
from tuner.machine._memory import (
    DiskUsage,
    HostMemoryFiles,
    MemoryPressure,
    available_memory_bytes,
    format_bytes,
    memory_pressure,
    parse_memory_pressure,
    parse_size,
    shm_usage,
    swap_out_bytes_total,
    swap_used_bytes,
    total_memory_bytes,
)

DATA = Path(__file__).parent / "data"
MiB = 2**20
GiB = 2**30


# --- host memory, on this machine --------------------------------------------------------------


def test_available_is_the_kernels_memavailable_as_psutil_reads_it_too() -> None:
    ours = available_memory_bytes()
    theirs = int(psutil.virtual_memory().available)  # psutil parses the same MemAvailable line
    assert abs(ours - theirs) < 256 * MiB  # the machine moves between the two reads
    assert 0 < ours <= total_memory_bytes() == psutil.virtual_memory().total


def _swap_used_from_proc_swaps() -> int | None:
    rows = [line.split() for line in Path("/proc/swaps").read_text().splitlines()[1:]]
    return sum(int(row[3]) * 1024 for row in rows) if rows else None


def _pswpout_bytes() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, value = line.split()
        if name == "pswpout":
            return int(value) * os.sysconf("SC_PAGE_SIZE")
    raise AssertionError("no pswpout in /proc/vmstat")


def test_swap_readings_are_the_kernels_counters() -> None:
    try:
        before = _pswpout_bytes()
        swaps = _swap_used_from_proc_swaps()
    except (OSError, AssertionError):
        pytest.skip("this container hides /proc/swaps or /proc/vmstat")
    swapped_out = swap_out_bytes_total()
    assert swapped_out is not None and before <= swapped_out <= _pswpout_bytes()
    used = swap_used_bytes()
    if swaps is None:
        assert used is None  # no swap device: "no swap", not "0 bytes of swap"
    else:
        assert used is not None and abs(used - swaps) < 64 * MiB


def test_kept_open_files_read_what_the_one_off_readers_read() -> None:
    cgroup = cgroup_memory()
    with contextlib.closing(HostMemoryFiles(cgroup.usage_file if cgroup else None)) as files:
        for _ in range(2):  # the second reading comes from the same descriptors
            # MemAvailable moves with every allocation on the machine: within 64 MiB.
            assert abs(files.available_bytes() - available_memory_bytes()) < 64 * MiB
            assert files.swap_out_bytes_total() == swap_out_bytes_total()
            pressure, expected = files.pressure(), memory_pressure()
            assert (pressure is None) == (expected is None)
            usage = files.cgroup_usage_bytes()
            assert (usage is None) == (cgroup is None or cgroup.usage_bytes is None)


def test_kept_open_files_that_do_not_exist_read_as_none(tmp_path: Path) -> None:
    files = HostMemoryFiles(tmp_path / "missing" / "memory.current")
    assert files.cgroup_usage_bytes() is None
    files.close()
    assert HostMemoryFiles(None).cgroup_usage_bytes() is None


def test_shm_usage_reads_the_real_dev_shm() -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    usage = shm_usage("/dev/shm")
    assert usage is not None
    assert usage.total_bytes == shutil.disk_usage("/dev/shm").total
    assert 0 <= usage.used_bytes <= usage.total_bytes


def test_shm_usage_is_none_for_a_missing_path(tmp_path: Path) -> None:
    assert shm_usage(str(tmp_path / "missing")) is None


def test_shm_usage_reads_any_mounted_directory(tmp_path: Path) -> None:
    usage = shm_usage(str(tmp_path))
    assert isinstance(usage, DiskUsage)
    assert usage.total_bytes == shutil.disk_usage(tmp_path).total


# --- pressure stall information ----------------------------------------------------------------


def test_pressure_with_some_and_full_lines() -> None:
    assert memory_pressure(str(DATA / "pressure/memory_some_full")) == MemoryPressure(
        some_avg10=1.25,
        some_avg60=0.5,
        some_total_us=123456,
        full_avg10=0.75,
        full_avg60=0.25,
        full_total_us=65432,
    )


def test_pressure_without_full_line_leaves_full_fields_none() -> None:
    reading = memory_pressure(str(DATA / "pressure/memory_some_only"))
    assert reading == MemoryPressure(2.0, 1.0, 987, None, None, None)


@pytest.mark.parametrize("name", ["missing", "memory_garbage"])
def test_pressure_absent_or_unparseable_is_none(name: str) -> None:
    assert memory_pressure(str(DATA / "pressure" / name)) is None


def test_pressure_parser_is_the_reader() -> None:
    text = (DATA / "pressure/memory_some_full").read_text()
    assert parse_memory_pressure(text) == memory_pressure(str(DATA / "pressure/memory_some_full"))
    assert parse_memory_pressure(None) is None


def test_pressure_on_this_machine() -> None:
    try:
        Path("/proc/pressure/memory").read_text()
    except OSError:
        pytest.skip("this kernel or container offers no memory PSI")
    before = parse_memory_pressure(Path("/proc/pressure/memory").read_text())
    reading = memory_pressure()
    after = parse_memory_pressure(Path("/proc/pressure/memory").read_text())
    assert before is not None and reading is not None and after is not None
    # The stall counters only grow: the reader's lies between two direct reads of the file.
    assert before.some_total_us <= reading.some_total_us <= after.some_total_us


# --- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5GiB", 3 * 2**29),
        ("1536M", 1536 * MiB),
        ("2G", 2 * GiB),
        ("2g", 2 * GiB),
        ("2 gb", 2 * GiB),
        ("512MB", 512 * MiB),
        ("512mib", 512 * MiB),
        ("64k", 64 * 1024),
        ("1T", 2**40),
        ("1073741824", GiB),
        ("100B", 100),
        (" 3Gi ", 3 * GiB),
    ],
)
def test_parse_size_absolute(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("0.9", 900), ("90%", 900), ("1.0", 1000)])
def test_parse_size_share_of_total(text: str, expected: int) -> None:
    assert parse_size(text, total_bytes=1000) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "1.5X", "G", "1e9", "0", "0G", "-1G", "1.5", "150%", "0%", "1..5G", "nan"]
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|unit|share") as raised:
        parse_size(text, total_bytes=1000)
    assert repr(text) in str(raised.value) and "\n" not in str(raised.value)


def test_parse_size_fraction_needs_a_total() -> None:
    with pytest.raises(ValueError, match="needs a total"):
        parse_size("50%")


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (None, "-"),
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.50 KiB"),
        (512 * MiB, "512 MiB"),
        (3 * 2**29, "1.50 GiB"),
        (1.5 * GiB, "1.50 GiB"),
        (-2 * GiB, "-2 GiB"),
        (5 * 2**40, "5 TiB"),
    ],
)
def test_format_bytes(n: int | float | None, expected: str) -> None:
    assert format_bytes(n) == expected


def test_format_then_parse_round_trips() -> None:
    assert parse_size(format_bytes(3 * 2**29).replace(" ", "")) == 3 * 2**29
