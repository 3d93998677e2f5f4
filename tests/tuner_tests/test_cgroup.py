"""The cgroup readers on sample trees of both versions, CPU and memory read from each tree.

Each tree is written under ``tmp_path`` as a kernel lays it out: ``/proc/self/cgroup`` and the
controller files under the mount. Every tree is read for both controllers, so the one walk that
serves them is checked against v1, v2, hybrid and namespaced layouts alike.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tuner.machine._cgroup import (
    CgroupMemory,
    cgroup_cpu_limit,
    cgroup_memory,
    parse_membership,
)

MiB = 2**20
GiB = 2**30
V1_UNLIMITED = "9223372036854771712"


@dataclasses.dataclass(frozen=True)
class Tree:
    membership: str
    files: dict[str, str]
    memory: tuple[int, str, int | None, int | None] | None
    """(version, directory relative to the root, limit, usage), or None."""
    cpus: float | None


TREES = {
    # v2: the middle level's limits bind the leaf, both for memory and for the CPU quota.
    "v2_nested": Tree(
        "0::/system.slice/job.scope/trial\n",
        {
            "cgroup.controllers": "cpuset cpu io memory hugetlb pids\n",
            "system.slice/memory.max": "max\n",
            "system.slice/memory.current": "3000000000\n",
            "system.slice/cpu.max": "400000 100000\n",
            "system.slice/job.scope/memory.max": f"{GiB}\n",
            "system.slice/job.scope/memory.current": "600000000\n",
            "system.slice/job.scope/cpu.max": "150000 100000\n",
            "system.slice/job.scope/trial/memory.max": f"{4 * GiB}\n",
            "system.slice/job.scope/trial/memory.current": "500000000\n",
            "system.slice/job.scope/trial/cpu.max": "max 100000\n",
        },
        memory=(2, "system.slice/job.scope", GiB, 600_000_000),
        cpus=1.5,
    ),
    # v2 without limits: usage from the process's own cgroup.
    "v2_unlimited": Tree(
        "0::/user.slice/user-1000.slice\n",
        {
            "cgroup.controllers": "cpu io memory pids\n",
            "user.slice/memory.max": "max\n",
            "user.slice/memory.current": "900000000\n",
            "user.slice/user-1000.slice/memory.max": "max\n",
            "user.slice/user-1000.slice/memory.current": "123456789\n",
            "user.slice/user-1000.slice/cpu.max": "max 100000\n",
        },
        memory=(2, "user.slice/user-1000.slice", None, 123_456_789),
        cpus=None,
    ),
    # A container: the host's path is not under the mount, whose root is the container's cgroup.
    "v2_namespaced": Tree(
        "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-abc.scope\n",
        {
            "cgroup.controllers": "cpu io memory pids\n",
            "memory.max": f"{512 * MiB}\n",
            "memory.current": f"{256 * MiB}\n",
            "cpu.max": "200000 100000\n",
        },
        memory=(2, "", 512 * MiB, 256 * MiB),
        cpus=2.0,
    ),
    # v1: memory and cpu,cpuacct mounted apart; v1's huge number is no limit.
    "v1_nested": Tree(
        "12:pids:/docker/abc\n11:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n"
        "1:name=systemd:/docker/abc\n0::/\n",
        {
            "memory/memory.limit_in_bytes": f"{V1_UNLIMITED}\n",
            "memory/memory.usage_in_bytes": "20000000000\n",
            "memory/docker/memory.limit_in_bytes": f"{8 * GiB}\n",
            "memory/docker/memory.usage_in_bytes": "3000000000\n",
            "memory/docker/abc/memory.limit_in_bytes": f"{2 * GiB}\n",
            "memory/docker/abc/memory.usage_in_bytes": "1000000000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
        memory=(1, "memory/docker/abc", 2 * GiB, 1_000_000_000),
        cpus=0.5,
    ),
    # A hybrid host (v1 controllers, an empty unified tree): v1 is read; -1 is no quota.
    "v1_unlimited_hybrid": Tree(
        "9:name=systemd:/\n4:memory:/process_api/job\n1:cpu:/\n0::/\n",
        {
            "unified/cgroup.controllers": "\n",
            "memory/memory.limit_in_bytes": f"{V1_UNLIMITED}\n",
            "memory/memory.usage_in_bytes": "1036693504\n",
            "memory/process_api/memory.limit_in_bytes": f"{V1_UNLIMITED}\n",
            "memory/process_api/memory.usage_in_bytes": "10000000\n",
            "memory/process_api/job/memory.limit_in_bytes": f"{V1_UNLIMITED}\n",
            "memory/process_api/job/memory.usage_in_bytes": "6946816\n",
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
        },
        memory=(1, "memory/process_api/job", None, 6_946_816),
        cpus=None,
    ),
    # A v1 container: its own cgroup is each mount's root.
    "v1_namespaced": Tree(
        "4:memory:/docker/0123456789abcdef\n2:cpu,cpuacct:/docker/0123456789abcdef\n0::/\n",
        {
            "memory/memory.limit_in_bytes": f"{4 * GiB}\n",
            "memory/memory.usage_in_bytes": "1500000000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "300000\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
        memory=(1, "memory", 4 * GiB, 1_500_000_000),
        cpus=3.0,
    ),
    # Membership names v1 memory, but only the unified tree is mounted: v2 is read.
    "hybrid_v2_memory": Tree(
        "4:memory:/job\n0::/job\n",
        {
            "unified/cgroup.controllers": "cpu memory pids\n",
            "unified/job/memory.max": f"{2 * GiB}\n",
            "unified/job/memory.current": f"{GiB}\n",
            "unified/job/cpu.max": "250000 100000\n",
        },
        memory=(2, "unified/job", 2 * GiB, GiB),
        cpus=2.5,
    ),
    # Neither controller available.
    "none": Tree("0::/\n", {"cpu/cpu.shares": "1024\n"}, memory=None, cpus=None),
}


def write_tree(tmp_path: Path, tree: Tree) -> tuple[Path, Path]:
    """(membership file, cgroup root) of ``tree`` written under ``tmp_path``."""
    root = tmp_path / "root"
    root.mkdir()
    for relative, content in tree.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    membership = tmp_path / "cgroup"
    membership.write_text(tree.membership)
    return membership, root


@pytest.mark.parametrize("name", sorted(TREES))
def test_memory_and_cpu_limits_of_each_tree(tmp_path: Path, name: str) -> None:
    tree = TREES[name]
    membership, root = write_tree(tmp_path, tree)
    expected_memory = None
    if tree.memory is not None:
        version, directory, limit, usage = tree.memory
        expected_memory = CgroupMemory(version, str(root / directory).rstrip("/"), limit, usage)
    assert cgroup_memory(membership, root) == expected_memory
    assert cgroup_cpu_limit(membership, root) == tree.cpus


@pytest.mark.parametrize(
    ("content", "cpus"),
    [("max 100000", None), ("200000 100000", 2.0), ("150000 100000", 1.5), ("garbage", None)],
)
def test_cpu_max_contents(tmp_path: Path, content: str, cpus: float | None) -> None:
    tree = Tree("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": content}, None, cpus)
    assert cgroup_cpu_limit(*write_tree(tmp_path, tree)) == cpus


def test_usage_file_is_the_one_read(tmp_path: Path) -> None:
    for name, expected_file in (
        ("v2_nested", "memory.current"),
        ("v1_nested", "memory.usage_in_bytes"),
    ):
        tree_dir = tmp_path / name
        tree_dir.mkdir()
        reading = cgroup_memory(*write_tree(tree_dir, TREES[name]))
        assert reading is not None
        assert reading.usage_file.name == expected_file
        assert int(reading.usage_file.read_text()) == reading.usage_bytes


def test_path_outside_the_cgroup_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    tree = dataclasses.replace(TREES["v2_namespaced"], membership="0::/../sibling.scope\n")
    membership, root = write_tree(tmp_path, tree)
    reading = cgroup_memory(membership, root)
    assert reading is not None
    assert (reading.path, reading.limit_bytes) == (str(root), 512 * MiB)
    assert cgroup_cpu_limit(membership, root) == 2.0


def test_unreadable_limits_count_as_no_limit(tmp_path: Path) -> None:
    files = dict(TREES["v2_nested"].files)
    files["system.slice/job.scope/memory.max"] = "garbage\n"
    files["system.slice/job.scope/cpu.max"] = "garbage\n"
    membership, root = write_tree(tmp_path, dataclasses.replace(TREES["v2_nested"], files=files))
    reading = cgroup_memory(membership, root)
    assert reading is not None
    assert (reading.limit_bytes, reading.usage_bytes) == (4 * GiB, 500_000_000)
    assert cgroup_cpu_limit(membership, root) == 4.0


def test_missing_membership_file_is_none(tmp_path: Path) -> None:
    _, root = write_tree(tmp_path, TREES["v2_nested"])
    assert cgroup_memory(tmp_path / "missing", root) is None
    assert cgroup_cpu_limit(tmp_path / "missing", root) is None


def test_membership_lines() -> None:
    membership = parse_membership("11:cpu,cpuacct:/a\n4:memory:/b\n1:name=systemd:/c\n0::/d\nbad\n")
    assert membership.v1 == {"cpu": "/a", "cpuacct": "/a", "memory": "/b", "name=systemd": "/c"}
    assert membership.v2 == "/d"


def test_pid_reads_that_process_cgroup_file(tmp_path: Path) -> None:
    """``pid`` takes the membership from ``/proc/<pid>/cgroup``, not from the file given: a tree
    with a limit only where that process's cgroup is, and a file naming another cgroup."""
    real = parse_membership(Path(f"/proc/{os.getpid()}/cgroup").read_text())
    memory_v1 = real.v1.get("memory")
    if memory_v1 is not None:
        here = f"memory/{memory_v1.strip('/')}".rstrip("/")
        files = {"memory/memory.limit_in_bytes": f"{V1_UNLIMITED}\n"}
        files["memory/memory.usage_in_bytes"] = "9000000\n"
        files[f"{here}/memory.limit_in_bytes"] = f"{3 * GiB}\n"
        files[f"{here}/memory.usage_in_bytes"] = "7000000\n"
    else:
        here = (real.v2 or "/").strip("/")
        files = {"cgroup.controllers": "cpu memory\n", "memory.max": "max\n"}
        files[f"{here}/memory.max".lstrip("/")] = f"{3 * GiB}\n"
        files[f"{here}/memory.current".lstrip("/")] = "7000000\n"
    elsewhere = "4:memory:/elsewhere\n0::/elsewhere\n"
    membership, root = write_tree(tmp_path, Tree(elsewhere, files, None, None))
    reading = cgroup_memory(membership, root, pid=os.getpid())
    assert reading is not None
    assert (reading.limit_bytes, reading.usage_bytes) == (3 * GiB, 7_000_000)
    if here not in ("", "memory"):  # below the root: the file's cgroup has no limit
        other = cgroup_memory(membership, root)
        assert other is None or other.limit_bytes != 3 * GiB


def test_this_machine_is_consistent() -> None:
    reading = cgroup_memory()
    if reading is not None:
        assert reading.version in (1, 2)
        assert os.path.isdir(reading.path)
        assert reading.limit_bytes is None or reading.limit_bytes > 0
        assert reading.usage_bytes is None or reading.usage_bytes > 0
    cpus = cgroup_cpu_limit()
    assert cpus is None or cpus > 0
