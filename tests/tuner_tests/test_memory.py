from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tuner.machine._memory import (
    CgroupMemory,
    DiskUsage,
    MemoryPressure,
    available_memory_bytes,
    cgroup_memory,
    format_bytes,
    memory_pressure,
    parse_size,
    process_tree,
    process_tree_memory_bytes,
    shm_usage,
    swap_out_bytes_total,
    swap_used_bytes,
    total_memory_bytes,
)

DATA = Path(__file__).parent / "data"
CGROUPS = DATA / "cgroup"
MiB = 2**20
GiB = 2**30


def read_sample(name: str) -> CgroupMemory | None:
    sample = CGROUPS / name
    return cgroup_memory(str(sample / "proc_self_cgroup"), str(sample / "root"))


# --- host memory, on this machine --------------------------------------------------------------


def test_available_is_positive_and_at_most_total() -> None:
    assert 0 < available_memory_bytes() <= total_memory_bytes()


def test_swap_readings_are_not_negative() -> None:
    assert swap_used_bytes() >= 0
    swapped_out = swap_out_bytes_total()
    assert swapped_out is None or swapped_out >= 0


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


# --- cgroups, from sample trees ----------------------------------------------------------------


def test_v2_parent_with_the_smaller_limit_wins() -> None:
    reading = read_sample("v2_nested")
    assert reading == CgroupMemory(
        version=2,
        path=str(CGROUPS / "v2_nested/root/system.slice/job.scope"),
        limit_bytes=GiB,
        usage_bytes=600_000_000,
    )


def test_v2_max_everywhere_is_unlimited_with_usage_at_the_leaf() -> None:
    reading = read_sample("v2_unlimited")
    assert reading is not None
    assert reading.limit_bytes is None
    assert reading.usage_bytes == 123_456_789
    assert reading.path == str(CGROUPS / "v2_unlimited/root/user.slice/user-1000.slice")


def test_v2_path_missing_under_the_mount_falls_back_to_its_root() -> None:
    reading = read_sample("v2_namespaced")
    assert reading == CgroupMemory(2, str(CGROUPS / "v2_namespaced/root"), 512 * MiB, 256 * MiB)


def test_v1_leaf_with_the_smaller_limit_wins() -> None:
    reading = read_sample("v1_nested")
    assert reading == CgroupMemory(
        1, str(CGROUPS / "v1_nested/root/memory/docker/abc"), 2 * GiB, 1_000_000_000
    )


def test_v1_huge_limit_is_unlimited_and_preferred_on_a_hybrid_host() -> None:
    reading = read_sample("v1_unlimited_hybrid")
    assert reading == CgroupMemory(
        1, str(CGROUPS / "v1_unlimited_hybrid/root/memory/process_api/job"), None, 6_946_816
    )


def test_v1_path_missing_under_the_mount_falls_back_to_its_root() -> None:
    reading = read_sample("v1_namespaced")
    assert reading == CgroupMemory(
        1, str(CGROUPS / "v1_namespaced/root/memory"), 4 * GiB, 1_500_000_000
    )


def test_hybrid_host_without_v1_memory_uses_the_unified_tree() -> None:
    reading = read_sample("hybrid_v2_memory")
    assert reading == CgroupMemory(
        2, str(CGROUPS / "hybrid_v2_memory/root/unified/job"), 2 * GiB, GiB
    )


def test_no_memory_cgroup_layout_is_none() -> None:
    assert read_sample("none") is None


def test_missing_proc_cgroup_file_is_none(tmp_path: Path) -> None:
    assert cgroup_memory(str(tmp_path / "missing"), str(CGROUPS / "v2_nested/root")) is None


def test_path_outside_the_cgroup_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(CGROUPS / "v2_namespaced/root", root)
    membership = tmp_path / "cgroup"
    membership.write_text("0::/../sibling.scope\n")
    reading = cgroup_memory(str(membership), str(root))
    assert reading is not None
    assert (reading.path, reading.limit_bytes) == (str(root), 512 * MiB)


def test_unreadable_limit_file_counts_as_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(CGROUPS / "v2_nested/root", root)
    (root / "system.slice/job.scope/memory.max").write_text("garbage\n")
    reading = cgroup_memory(str(CGROUPS / "v2_nested/proc_self_cgroup"), str(root))
    assert reading is not None
    assert reading.limit_bytes == 4 * GiB
    assert reading.usage_bytes == 500_000_000


def test_pid_reads_that_process_cgroup_file() -> None:
    assert cgroup_memory(pid=os.getpid()) == cgroup_memory()


def test_cgroup_memory_on_this_machine_is_consistent() -> None:
    reading = cgroup_memory()
    if reading is None:
        pytest.skip("no memory cgroup visible on this machine")
    assert reading.version in (1, 2)
    assert os.path.isdir(reading.path)
    assert reading.limit_bytes is None or reading.limit_bytes > 0
    assert reading.usage_bytes is None or reading.usage_bytes > 0


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


def test_pressure_on_this_machine() -> None:
    try:
        Path("/proc/pressure/memory").read_text()
    except OSError:
        pytest.skip("this kernel or container offers no memory PSI")
    reading = memory_pressure()
    assert reading is not None
    assert reading.some_avg10 >= 0 and reading.some_total_us >= 0


# --- process trees, with real processes --------------------------------------------------------

_SHARED_MiB = 64
_CHILD_MiB = 100

# The parent touches a buffer before forking (pages the children share copy-on-write), then
# each child allocates its own buffer when the test writes one byte to the shared stdin pipe.
_TREE_SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time

    def touched(mib):
        buffer = bytearray(mib * 2**20)
        buffer[::4096] = b"\\1" * len(range(0, len(buffer), 4096))
        return buffer

    shared = touched({_SHARED_MiB})
    for _ in range(2):
        if os.fork() == 0:
            os.write(1, b"idle\\n")
            os.read(0, 1)
            own = touched({_CHILD_MiB})
            os.write(1, b"allocated\\n")
            while True:
                time.sleep(60)
    while True:
        time.sleep(60)
    """
)


@pytest.fixture
def forked_tree() -> Iterator[subprocess.Popen[bytes]]:
    """A python process with two forked children, killed (children first) afterwards."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _TREE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield parent
    finally:
        for process in reversed(process_tree(parent.pid)):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        parent.wait(timeout=10)
        for stream in (parent.stdin, parent.stdout):
            if stream is not None:
                stream.close()


def wait_for_lines(process: subprocess.Popen[bytes], expected: bytes, count: int) -> None:
    assert process.stdout is not None
    for _ in range(count):
        assert process.stdout.readline().strip() == expected


def summed_rss_bytes(pid: int) -> int:
    return sum(process.memory_info().rss for process in process_tree(pid))


@pytest.mark.timeout(60)
def test_tree_memory_grows_with_children_and_counts_shared_pages_once(
    forked_tree: subprocess.Popen[bytes],
) -> None:
    assert forked_tree.stdin is not None
    wait_for_lines(forked_tree, b"idle", 2)
    assert len(process_tree(forked_tree.pid)) == 3
    before = process_tree_memory_bytes(forked_tree.pid)
    assert before is not None and before >= _SHARED_MiB * MiB

    forked_tree.stdin.write(b"gg")
    forked_tree.stdin.flush()
    wait_for_lines(forked_tree, b"allocated", 2)
    after = process_tree_memory_bytes(forked_tree.pid)

    assert after is not None
    assert after - before >= 0.9 * 2 * _CHILD_MiB * MiB
    # RSS counts the parent's buffer in all three processes; PSS splits it among them.
    assert after < summed_rss_bytes(forked_tree.pid) - _SHARED_MiB * MiB


def test_tree_of_this_process_includes_itself() -> None:
    tree = process_tree(os.getpid())
    assert tree[0].pid == os.getpid()
    tree_bytes = process_tree_memory_bytes(os.getpid())
    assert tree_bytes is not None and tree_bytes > 0


def test_gone_process_has_no_tree() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert process_tree(child.pid) == []
    assert process_tree_memory_bytes(child.pid) is None


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
