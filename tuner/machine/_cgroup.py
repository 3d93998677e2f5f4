"""cgroup readers: the CPU quota and the memory limit that bind a process, cgroup v1 and v2.

One way through the tree for both controllers: parse ``/proc/<pid>/cgroup`` once
(:func:`parse_membership`), find the controller's hierarchy (v1's own mount where the kernel
mounts one, as hybrid hosts do, else the unified v2 tree), walk from the process's cgroup up to
the mount root (:func:`controller_chain`), and take the smallest limit over that chain, because
a parent's limit binds its children. Each reader returns a number (or a small frozen dataclass),
or ``None`` where this kernel or container sets no limit or offers no reading; nothing is cached,
so a limit changed at run time is seen on the next call.

Inside a container the membership path can name the host's view (``/docker/<id>``) while the
container's own cgroup is mounted as the root, or lie outside a cgroup namespace
(``/../sibling``); the mount root is then the cgroup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = [
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "CgroupMemory",
    "Chain",
    "Membership",
    "cgroup_cpu_limit",
    "cgroup_memory",
    "controller_chain",
    "parse_membership",
]

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")

_Limit = TypeVar("_Limit", int, float)

_V1_UNLIMITED_BYTES = 2**60
"""cgroup v1 writes "no limit" as a huge page-aligned number (9223372036854771712)."""


@dataclass(frozen=True)
class _Controller:
    """Where one controller lives: its v1 mount names and a file that proves the mount."""

    name: str
    v1_mounts: tuple[str, ...]
    v1_probe: str


_MEMORY = _Controller("memory", ("memory",), "memory.usage_in_bytes")
_MEMORY_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    2: ("memory.max", "memory.current"),
}
"""(limit file, usage file) by cgroup version."""
_CPU = _Controller("cpu", ("cpu,cpuacct", "cpu"), "cpu.cfs_quota_us")


@dataclass(frozen=True)
class Membership:
    """``/proc/<pid>/cgroup``: the v1 path of each controller, and the v2 (unified) path."""

    v1: dict[str, str]
    v2: str | None


@dataclass(frozen=True)
class Chain:
    """A controller's hierarchy for one process: the cgroup and its ancestors, innermost first."""

    version: int
    directories: tuple[Path, ...]


@dataclass(frozen=True)
class CgroupMemory:
    """The memory limit that binds this process, and the usage counted against it.

    ``path`` is the cgroup directory the readings came from: the one holding the smallest
    limit, or the process's own cgroup when no level sets a limit.
    """

    version: int
    path: str
    limit_bytes: int | None
    usage_bytes: int | None

    @property
    def usage_file(self) -> Path:
        """The file :attr:`usage_bytes` came from, for a reader that keeps it open."""
        return Path(self.path) / _MEMORY_FILES[self.version][1]


def parse_membership(text: str) -> Membership:
    """The lines ``hierarchy-id:controllers:path`` of /proc/<pid>/cgroup; v2's id is 0."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy_id, controllers, path = parts
        if hierarchy_id == "0" and controllers == "":
            v2 = path
            continue
        for controller in controllers.split(","):
            v1.setdefault(controller, path)
    return Membership(v1, v2)


def controller_chain(controller: _Controller, membership: Membership, root: Path) -> Chain | None:
    """The controller's cgroup and its ancestors: v1's own mount if there is one, else v2."""
    v1_path = membership.v1.get(controller.name)
    if v1_path is not None:
        for name in controller.v1_mounts:
            mount = root / name
            if (mount / controller.v1_probe).is_file():
                return Chain(1, _ancestors(mount, v1_path))
    if membership.v2 is None:
        return None
    for mount in (root, root / "unified"):
        if controller.name in _read_text(mount / "cgroup.controllers").split():
            return Chain(2, _ancestors(mount, membership.v2))
    return None


def _ancestors(mount: Path, cgroup_path: str) -> tuple[Path, ...]:
    """The cgroup's directory and its parents up to ``mount``; the mount alone if not visible."""
    relative = cgroup_path.strip("/")
    leaf = mount / relative
    if not relative or ".." in relative.split("/") or not leaf.is_dir():
        return (mount,)
    return (leaf, *[parent for parent in leaf.parents if parent.is_relative_to(mount)])


def _chain_for(
    controller: _Controller, proc_cgroup: str | Path, cgroup_root: str | Path, pid: int | None
) -> Chain | None:
    membership_file = Path(f"/proc/{pid}/cgroup") if pid is not None else Path(proc_cgroup)
    try:
        membership = parse_membership(membership_file.read_text())
    except OSError:
        return None
    return controller_chain(controller, membership, Path(cgroup_root))


# --- memory ------------------------------------------------------------------------------------


def cgroup_memory(
    proc_self_cgroup: str | Path = PROC_SELF_CGROUP,
    cgroup_root: str | Path = CGROUP_ROOT,
    pid: int | None = None,
) -> CgroupMemory | None:
    """The binding cgroup memory limit and its usage, or None without a memory cgroup.

    ``pid`` reads ``/proc/<pid>/cgroup`` instead of ``proc_self_cgroup``.
    """
    chain = _chain_for(_MEMORY, proc_self_cgroup, cgroup_root, pid)
    if chain is None:
        return None
    limit_file, usage_file = _MEMORY_FILES[chain.version]
    winner, smallest = _smallest(chain, lambda directory: _memory_limit(directory / limit_file))
    return CgroupMemory(chain.version, str(winner), smallest, _read_int(winner / usage_file))


def _memory_limit(path: Path) -> int | None:
    """A limit in bytes; None for "no limit" (v2 "max", v1's huge number, or no file)."""
    limit = _read_int(path)
    return None if limit is None or limit >= _V1_UNLIMITED_BYTES else limit


# --- cpu ---------------------------------------------------------------------------------------


def cgroup_cpu_limit(
    proc_self_cgroup: str | Path = PROC_SELF_CGROUP,
    cgroup_root: str | Path = CGROUP_ROOT,
    pid: int | None = None,
) -> float | None:
    """CPUs the binding quota allows (e.g. 2.5), or None when nothing limits the process."""
    chain = _chain_for(_CPU, proc_self_cgroup, cgroup_root, pid)
    if chain is None:
        return None
    quota = _cpu_max if chain.version == 2 else _cfs_quota
    return _smallest(chain, quota)[1]


def _cpu_max(directory: Path) -> float | None:
    """cgroup v2 ``cpu.max``: ``"<quota|max> <period>"``."""
    fields = _read_text(directory / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _quota_ratio(fields[0], fields[1])


def _cfs_quota(directory: Path) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; a quota of -1 is unlimited."""
    quota = _read_text(directory / "cpu.cfs_quota_us").strip()
    period = _read_text(directory / "cpu.cfs_period_us").strip()
    return _quota_ratio(quota, period)


def _quota_ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


# --- files -------------------------------------------------------------------------------------


def _smallest(chain: Chain, read: Callable[[Path], _Limit | None]) -> tuple[Path, _Limit | None]:
    """The directory with the smallest limit over the chain (the leaf when none sets one)."""
    winner: Path = chain.directories[0]
    smallest: _Limit | None = None
    for directory in chain.directories:
        limit = read(directory)
        if limit is not None and (smallest is None or limit < smallest):
            winner, smallest = directory, limit
    return winner, smallest


def _read_int(path: Path) -> int | None:
    try:
        return int(_read_text(path).strip())
    except ValueError:
        return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
