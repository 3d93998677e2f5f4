"""Host memory readings for the memory guard, the telemetry and the hardware fingerprint.

Each reader is one small function that returns a number (or a small frozen dataclass), and
``None`` where this kernel or container does not offer the reading, so callers decide what a
missing reading means. None of them keeps state: the guard samples every ~0.2 s and computes
rates (swap-out, PSI totals) from two readings itself. What it reads every tick it reads through
:class:`HostMemoryFiles`, the same parsers on files kept open (one ``pread`` each, no ``open``).
Process trees and their PSS are in ``_process``, cgroup limits and usage in ``_cgroup``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from tuner.machine._procfs import KeptOpenFile

__all__ = [
    "DiskUsage",
    "HostMemoryFiles",
    "MemoryPressure",
    "available_memory_bytes",
    "format_bytes",
    "memory_pressure",
    "parse_memory_pressure",
    "parse_size",
    "shm_usage",
    "swap_out_bytes_total",
    "swap_used_bytes",
    "total_memory_bytes",
]


@dataclass(frozen=True)
class DiskUsage:
    used_bytes: int
    total_bytes: int


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

_MEMINFO = "/proc/meminfo"
_VMSTAT = "/proc/vmstat"
_PRESSURE = "/proc/pressure/memory"
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def available_memory_bytes() -> int:
    """MemAvailable: what can be allocated without swapping (free ignores reclaimable cache)."""
    available = _mem_available(_read_text(_MEMINFO))
    return available if available is not None else int(psutil.virtual_memory().available)


def total_memory_bytes() -> int:
    return int(psutil.virtual_memory().total)


def swap_used_bytes() -> int | None:
    """Swap in use; None where the machine has no swap or a container hides /proc/swaps."""
    try:
        swap = psutil.swap_memory()
    except (OSError, RuntimeError):
        return None
    return int(swap.used) if swap.total else None


def swap_out_bytes_total() -> int | None:
    """Bytes swapped out since boot; None where /proc/vmstat does not say (some containers)."""
    return _swapped_out(_read_text(_VMSTAT))


def _mem_available(meminfo: str | None) -> int | None:
    """``MemAvailable:  123 kB`` from /proc/meminfo (kernels before 3.14 lack it: psutil's
    estimate is used instead)."""
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _swapped_out(vmstat: str | None) -> int | None:
    """``pswpout`` pages from /proc/vmstat, in bytes."""
    for line in (vmstat or "").splitlines():
        if line.startswith("pswpout "):
            return int(line.split()[1]) * _PAGE_BYTES
    return None


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def shm_usage(path: str = "/dev/shm") -> DiskUsage | None:
    """Use of the tmpfs that DataLoader workers pass batches through; None if it is missing."""
    try:
        stat = os.statvfs(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    total_bytes = stat.f_blocks * stat.f_frsize
    return DiskUsage(used_bytes=total_bytes - stat.f_bfree * stat.f_frsize, total_bytes=total_bytes)


# --- pressure stall information ----------------------------------------------------------------


def memory_pressure(path: str = _PRESSURE) -> MemoryPressure | None:
    """Memory PSI; None on kernels without PSI, with ``psi=0``, or where a container hides it."""
    # absent, or EOPNOTSUPP when PSI is compiled in but disabled: _read_text says None
    return parse_memory_pressure(_read_text(path))


def parse_memory_pressure(text: str | None) -> MemoryPressure | None:
    """The PSI file's ``some`` and ``full`` lines; None for an absent or unparsable file."""
    lines = _parse_pressure_lines(text or "")
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


# --- kept open, for the guard ------------------------------------------------------------------


class HostMemoryFiles:
    """The host readings a sampler takes every tick, each one ``pread`` of a file kept open.

    The same parsers as the one-off readers above; ``cgroup_usage_file`` is
    :attr:`~tuner.machine.CgroupMemory.usage_file` of the binding cgroup, or None.
    """

    def __init__(self, cgroup_usage_file: str | Path | None = None) -> None:
        self._meminfo = KeptOpenFile(_MEMINFO)
        self._vmstat = KeptOpenFile(_VMSTAT)
        self._pressure = KeptOpenFile(_PRESSURE)
        self._cgroup = KeptOpenFile(cgroup_usage_file) if cgroup_usage_file else None

    def available_bytes(self) -> int:
        available = _mem_available(self._meminfo.read())
        return available if available is not None else available_memory_bytes()

    def swap_out_bytes_total(self) -> int | None:
        return _swapped_out(self._vmstat.read())

    def pressure(self) -> MemoryPressure | None:
        return parse_memory_pressure(self._pressure.read())

    def cgroup_usage_bytes(self) -> int | None:
        text = self._cgroup.read() if self._cgroup is not None else None
        try:
            return int(text) if text else None
        except ValueError:
            return None

    def close(self) -> None:
        for kept in (self._meminfo, self._vmstat, self._pressure, self._cgroup):
            if kept is not None:
                kept.close()


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

    Args:
        text: the size as written.
        total_bytes: what a share is of; None refuses shares.

    Returns:
        The size in bytes, at least 1.

    Raises:
        ValueError: not a size, an unknown unit, a share above 100% or without a total, or
            less than one byte (a one-line message).

    Example:
        >>> parse_size("1.5GiB"), parse_size("50%", 2**30)
        (1610612736, 536870912)
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
