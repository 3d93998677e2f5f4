"""Host memory readings for the memory guard and the hardware fingerprint.

Each reader is one small function that returns a number (or a small frozen dataclass), and
``None`` where this kernel or container does not offer the reading, so callers decide what a
missing reading means. None of them keeps state: the guard samples every ~0.2 s and computes
rates (swap-out, PSI totals) from two readings itself.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = [
    "CgroupMemory",
    "DiskUsage",
    "MemoryPressure",
    "available_memory_bytes",
    "cgroup_memory",
    "format_bytes",
    "memory_pressure",
    "parse_size",
    "process_tree",
    "process_tree_memory_bytes",
    "shm_usage",
    "swap_out_bytes_total",
    "swap_used_bytes",
    "total_memory_bytes",
]

_V1_UNLIMITED_BYTES = 2**60
"""cgroup v1 writes "no limit" as a huge page-aligned number (9223372036854771712)."""


@dataclass(frozen=True)
class DiskUsage:
    used_bytes: int
    total_bytes: int


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


@dataclass(frozen=True)
class MemoryPressure:
    """/proc/pressure/memory: percent of time tasks stalled on memory (PSI).

    The ``full_*`` fields are None where the kernel writes only the ``some`` line.
    """

    some_avg10: float
    some_avg60: float
    some_total_us: int
    full_avg10: float | None
    full_avg60: float | None
    full_total_us: int | None


# --- host memory -------------------------------------------------------------------------------


def available_memory_bytes() -> int:
    """MemAvailable: what can be allocated without swapping (free ignores reclaimable cache)."""
    return int(psutil.virtual_memory().available)


def total_memory_bytes() -> int:
    return int(psutil.virtual_memory().total)


def swap_used_bytes() -> int:
    return int(psutil.swap_memory().used)


def swap_out_bytes_total() -> int | None:
    """Bytes swapped out since boot; None where /proc/vmstat does not say (some containers)."""
    with warnings.catch_warnings():
        # psutil warns and reports 0 when it cannot read the counters; 0 would read as "no
        # swapping" to the guard, so the warning is turned into None instead.
        warnings.simplefilter("error", RuntimeWarning)
        try:
            sout = psutil.swap_memory().sout
        except RuntimeWarning:
            return None
    return int(sout)


def shm_usage(path: str = "/dev/shm") -> DiskUsage | None:
    """Use of the tmpfs that DataLoader workers pass batches through; None if it is missing."""
    try:
        stat = os.statvfs(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    total_bytes = stat.f_blocks * stat.f_frsize
    return DiskUsage(used_bytes=total_bytes - stat.f_bfree * stat.f_frsize, total_bytes=total_bytes)


# --- cgroups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CgroupLayout:
    version: int
    mount: Path
    cgroup_path: str
    limit_file: str
    usage_file: str


def cgroup_memory(
    proc_self_cgroup: str = "/proc/self/cgroup",
    cgroup_root: str = "/sys/fs/cgroup",
    pid: int | None = None,
) -> CgroupMemory | None:
    """The binding cgroup memory limit and its usage, or None without a memory cgroup.

    ``pid`` reads ``/proc/<pid>/cgroup`` instead of ``proc_self_cgroup``. Every ancestor up to
    the mount root is read because a parent's limit binds its children: the smallest one wins.
    """
    cgroup_file = f"/proc/{pid}/cgroup" if pid is not None else proc_self_cgroup
    try:
        membership = Path(cgroup_file).read_text()
    except OSError:
        return None
    layout = _cgroup_layout(membership, Path(cgroup_root))
    if layout is None:
        return None
    leaf = _cgroup_dir(layout.mount, layout.cgroup_path)
    return _binding_limit(layout, _ancestors(leaf, layout.mount))


def _cgroup_layout(membership: str, root: Path) -> _CgroupLayout | None:
    """Pick the memory hierarchy: v1's memory controller if mounted (hybrid hosts), else v2."""
    v1_path, v2_path = _parse_membership(membership)
    v1_mount = root / "memory"
    if v1_path is not None and (v1_mount / "memory.usage_in_bytes").is_file():
        return _CgroupLayout(1, v1_mount, v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes")
    if v2_path is None:
        return None
    for v2_mount in (root, root / "unified"):
        if "memory" in _read_text(v2_mount / "cgroup.controllers", "").split():
            return _CgroupLayout(2, v2_mount, v2_path, "memory.max", "memory.current")
    return None


def _parse_membership(membership: str) -> tuple[str | None, str | None]:
    """(v1 memory cgroup path, v2 cgroup path) from the lines of /proc/<pid>/cgroup."""
    v1_path: str | None = None
    v2_path: str | None = None
    for line in membership.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy_id, controllers, path = parts
        if hierarchy_id == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    return v1_path, v2_path


def _cgroup_dir(mount: Path, cgroup_path: str) -> Path:
    """The cgroup's directory, or the mount root where the path is not visible from here.

    Inside a container the path can name the host's view ("/docker/<id>") while the container's
    own cgroup is mounted as the root, or lie outside a cgroup namespace ("/../sibling").
    """
    relative = cgroup_path.strip("/")
    if not relative or ".." in relative.split("/"):
        return mount
    leaf = mount / relative
    return leaf if leaf.is_dir() else mount


def _ancestors(leaf: Path, mount: Path) -> list[Path]:
    """``leaf`` and its parents up to and including ``mount``, innermost first."""
    chain = [leaf]
    while chain[-1] != mount and chain[-1].parent != chain[-1]:
        chain.append(chain[-1].parent)
    return chain


def _binding_limit(layout: _CgroupLayout, chain: list[Path]) -> CgroupMemory:
    winner = chain[0]
    smallest: int | None = None
    for directory in chain:
        limit = _read_limit(directory / layout.limit_file)
        if limit is not None and (smallest is None or limit < smallest):
            winner, smallest = directory, limit
    return CgroupMemory(
        version=layout.version,
        path=str(winner),
        limit_bytes=smallest,
        usage_bytes=_read_int(winner / layout.usage_file),
    )


def _read_limit(path: Path) -> int | None:
    """A limit in bytes; None for "no limit" (v2 "max", v1's huge number, or no file)."""
    text = _read_text(path, "").strip()
    if text in ("", "max"):
        return None
    try:
        limit = int(text)
    except ValueError:
        return None
    return None if limit >= _V1_UNLIMITED_BYTES else limit


def _read_int(path: Path) -> int | None:
    try:
        return int(_read_text(path, "").strip())
    except ValueError:
        return None


def _read_text(path: Path, default: str) -> str:
    try:
        return path.read_text()
    except OSError:
        return default


# --- pressure stall information ----------------------------------------------------------------


def memory_pressure(path: str = "/proc/pressure/memory") -> MemoryPressure | None:
    """Memory PSI; None on kernels without PSI, with ``psi=0``, or where a container hides it."""
    try:
        text = Path(path).read_text()
    except OSError:  # absent, or EOPNOTSUPP when PSI is compiled in but disabled
        return None
    lines = _parse_pressure_lines(text)
    some = lines.get("some")
    if some is None:
        return None
    full = lines.get("full")
    return MemoryPressure(
        some_avg10=some[0],
        some_avg60=some[1],
        some_total_us=some[2],
        full_avg10=full[0] if full else None,
        full_avg60=full[1] if full else None,
        full_total_us=full[2] if full else None,
    )


def _parse_pressure_lines(text: str) -> dict[str, tuple[float, float, int]]:
    """``{"some": (avg10, avg60, total_us), ...}`` from lines like ``some avg10=0.00 ...``."""
    parsed: dict[str, tuple[float, float, int]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(field.split("=", 1) for field in rest.split() if "=" in field)
        try:
            parsed[kind] = (float(fields["avg10"]), float(fields["avg60"]), int(fields["total"]))
        except (KeyError, ValueError):
            continue
    return parsed


# --- process trees -----------------------------------------------------------------------------


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants; empty when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess too
        return []


def process_tree_memory_bytes(pid: int) -> int | None:
    """Memory of the tree, counting pages shared after fork once; None when ``pid`` is gone.

    Summed PSS splits each shared page among its sharers, so forked DataLoader workers do not
    count the parent's dataset N times, as summed RSS would.
    """
    tree = process_tree(pid)
    if not tree:
        return None
    return processes_memory_bytes(tree)


def processes_memory_bytes(processes: list[psutil.Process]) -> int:
    """Summed PSS of ``processes`` (see :func:`process_tree_memory_bytes`); costly, ~ms each."""
    return sum(_process_memory_bytes(process) or 0 for process in processes)


def processes_rss_bytes(processes: list[psutil.Process]) -> int:
    """Summed RSS from /proc/PID/statm: cheap enough for every tick, but counts shared pages
    once per sharer, so it serves to follow growth between PSS readings, not as the reading."""
    total = 0
    for process in processes:
        try:
            total += int(process.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _process_memory_bytes(process: psutil.Process) -> int | None:
    """PSS, else USS, else RSS (where smaps cannot be read); None if it vanished or is hidden."""
    try:
        full = process.memory_full_info()
    except psutil.AccessDenied:
        full = None
    except psutil.NoSuchProcess:
        return None
    for field in ("pss", "uss"):
        value = getattr(full, field, None)
        if value is not None:
            return int(value)
    try:
        return int(process.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


# --- sizes -------------------------------------------------------------------------------------

_SIZE_PATTERN = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*([a-z%]*)\s*$", re.IGNORECASE)

# Binary multiples throughout, so "2G" on the command line is the 2 GiB a user sees in top/free;
# the SI reading (10**9) would undershoot a limit by 7%.
_UNIT_BYTES = {
    "": 1,
    "b": 1,
    **{
        spelling: 1024**power
        for power, letter in enumerate("kmgt", start=1)
        for spelling in (letter, f"{letter}b", f"{letter}i", f"{letter}ib")
    },
}


def parse_size(text: str, total_bytes: int | None = None) -> int:
    """Bytes from ``1.5GiB``, ``1536M``, ``2G``, ``512MB``, ``1073741824``, ``0.9`` or ``90%``.

    K/M/G/T are binary (1G == 1GiB == 2**30) with or without ``i``/``B``, in any case. A
    unitless number with a decimal point, or a percent, is a share of ``total_bytes``; a
    unitless integer is a byte count.
    """
    match = _SIZE_PATTERN.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (expected e.g. 2G, 1536MiB, 0.9 or 90%)")
    number, unit = match.group(1), match.group(2).lower()
    value = float(number)
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    if unit == "%" or (unit == "" and "." in number):
        return _share_of_total(text, value / 100 if unit == "%" else value, total_bytes)
    if unit not in _UNIT_BYTES:
        raise ValueError(f"unknown size unit in {text!r} (use B, K, M, G or T)")
    size_bytes = int(value * _UNIT_BYTES[unit])
    if size_bytes <= 0:
        raise ValueError(f"size must be at least one byte: {text!r}")
    return size_bytes


def _share_of_total(text: str, fraction: float, total_bytes: int | None) -> int:
    if fraction > 1:
        raise ValueError(f"share of total memory above 100%: {text!r}")
    if total_bytes is None:
        raise ValueError(f"a fraction or percent needs a total to be a share of: {text!r}")
    size_bytes = int(total_bytes * fraction)
    if size_bytes <= 0:
        raise ValueError(f"size must be at least one byte: {text!r}")
    return size_bytes


def format_bytes(n: int | float | None) -> str:
    """``1.50 GiB``, ``512 MiB``, ``-`` for a missing reading: whole numbers drop the decimals."""
    if n is None or not math.isfinite(n):
        return "-"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while power < len(units) - 1 and abs(n) >= 1024 ** (power + 1):
        power += 1
    scaled = n / 1024**power
    if scaled == int(scaled):
        return f"{int(scaled)} {units[power]}"
    return f"{scaled:.2f} {units[power]}"
