"""Process trees: which processes a trial is, and how much memory they hold.

A trial is its child process and every descendant (the DataLoader workers). Its memory is the
summed PSS of the tree: pages shared after fork count once, split among their sharers, where
summed RSS would count the parent's dataset once per worker. PSS costs milliseconds per process
(the kernel walks every page), RSS microseconds, so a sampler that reads often keeps a
:class:`ProcessTree`: it lists the tree from an incremental parent map (``/proc`` is listed only
when a pid was allocated since the last listing, as ``/proc/loadavg``'s last pid tells, or a
member is gone; only pids not seen before have their ``stat`` read) and keeps each member's
``statm`` and ``smaps_rollup`` open. Two facts bound the estimate between exact readings: PSS
never exceeds RSS, and a tree's PSS can grow without its RSS moving only by copy-on-write of
shared pages, by at most its RSS minus its PSS.

The one-off readers (:func:`process_tree`, :func:`process_tree_memory_bytes`) are the same code
on a fresh tree. Nothing here is thread-safe.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

import psutil

from tuner.machine._procfs import KeptOpenFile

__all__ = [
    "ProcessTree",
    "own_peak_memory_bytes",
    "process_tree",
    "process_tree_memory_bytes",
    "processes_memory_bytes",
    "processes_rss_bytes",
]

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class ProcessTree:
    """The processes under one root pid, listed and measured again and again, cheaply."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._parents: dict[int, int | None] = {}
        self._processes: dict[int, psutil.Process] = {}
        self._statm: dict[int, KeptOpenFile] = {}
        self._rollup: dict[int, KeptOpenFile] = {}
        self._loadavg = KeptOpenFile("/proc/loadavg")
        self._listed_after_pid: int | None = None
        self._members: list[psutil.Process] = []

    def members(self) -> list[psutil.Process]:
        """The root and all its descendants, root first; empty once the root is gone.

        Listing ``/proc`` is most of a guard tick's cost outside its exact readings (0.6 ms
        with 84 processes here): it is skipped while no pid was allocated since the last
        listing (no fork, no thread) and every member is still there, when nothing can have
        joined the tree.
        """
        last_pid = _last_allocated_pid(self._loadavg)
        if (
            last_pid is not None
            and last_pid == self._listed_after_pid
            and self._members
            and all(os.path.exists(f"/proc/{process.pid}") for process in self._members)
        ):
            return list(self._members)
        self._listed_after_pid = last_pid
        self._members = self._list()
        return list(self._members)

    def _list(self) -> list[psutil.Process]:
        try:
            listed = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        except FileNotFoundError:  # no procfs: psutil's own walk
            return _psutil_tree(self.root_pid)
        for gone in self._parents.keys() - listed:
            self._forget(gone)
        for new in listed - self._parents.keys():
            self._parents[new] = _parent_pid(new)
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, parent in self._parents.items():
            if parent is not None:
                children[parent].append(pid)
        order = [self.root_pid] if self.root_pid in listed else []
        for pid in order:  # grows while it is walked: breadth first
            order.extend(sorted(children.get(pid, ())))
        return [process for pid in order if (process := self._process(pid)) is not None]

    def rss_bytes(self, members: Sequence[psutil.Process]) -> int:
        """Summed RSS: cheap enough for every tick, but counts a shared page once per sharer."""
        total = 0
        for process in members:
            text = _kept(self._statm, process.pid, "statm").read()
            fields = text.split() if text else []
            total += int(fields[1]) * _PAGE_BYTES if len(fields) > 1 else 0
        return total

    def pss_bytes(self, members: Sequence[psutil.Process]) -> int:
        """Summed PSS, exact; milliseconds per process."""
        total = 0
        for process in members:
            pss = _pss_from_rollup(_kept(self._rollup, process.pid, "smaps_rollup").read())
            total += pss if pss is not None else _process_memory_bytes(process) or 0
        return total

    def close(self) -> None:
        for pid in list(self._parents):
            self._forget(pid)
        self._members = []
        self._loadavg.close()

    def __enter__(self) -> ProcessTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _process(self, pid: int) -> psutil.Process | None:
        process = self._processes.get(pid)
        if process is None:
            try:
                process = self._processes[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
        return process

    def _forget(self, pid: int) -> None:
        self._parents.pop(pid, None)
        self._processes.pop(pid, None)
        for files in (self._statm, self._rollup):
            kept = files.pop(pid, None)
            if kept is not None:
                kept.close()


def _kept(files: dict[int, KeptOpenFile], pid: int, name: str) -> KeptOpenFile:
    kept = files.get(pid)
    if kept is None:
        kept = files[pid] = KeptOpenFile(f"/proc/{pid}/{name}")
    return kept


def _last_allocated_pid(loadavg: KeptOpenFile) -> int | None:
    """The pid (or thread id) allocated last in this pid namespace: ``/proc/loadavg``'s fifth
    field; None where it cannot be read."""
    fields = (loadavg.read() or "").split()
    try:
        return int(fields[4])
    except (IndexError, ValueError):
        return None


def _parent_pid(pid: int) -> int | None:
    """The parent from /proc/PID/stat (``pid (comm) state ppid ...``; comm may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def _pss_from_rollup(text: str | None) -> int | None:
    for line in (text or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


def _psutil_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess too
        return []


def _process_memory_bytes(process: psutil.Process) -> int | None:
    """PSS, else USS, else RSS (kernels without smaps_rollup); None if it vanished or is hidden."""
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


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants; empty when it is gone."""
    with ProcessTree(pid) as tree:
        return tree.members()


def process_tree_memory_bytes(pid: int) -> int | None:
    """Summed PSS of the tree (shared pages counted once); None when ``pid`` is gone."""
    with ProcessTree(pid) as tree:
        members = tree.members()
        return tree.pss_bytes(members) if members else None


def processes_memory_bytes(processes: Sequence[psutil.Process]) -> int:
    """Summed PSS of ``processes``; milliseconds each."""
    with ProcessTree(-1) as tree:
        return tree.pss_bytes(processes)


def processes_rss_bytes(processes: Sequence[psutil.Process]) -> int:
    """Summed RSS of ``processes``: follows growth between PSS readings; not the reading."""
    with ProcessTree(-1) as tree:
        return tree.rss_bytes(processes)


def own_peak_memory_bytes() -> int | None:
    """This process tree's peak so far, estimated: its PSS now plus how far this process's RSS
    has been above where it is now (the kernel keeps the RSS high-water mark, not PSS's)."""
    pss = process_tree_memory_bytes(os.getpid())
    if pss is None:
        return None
    rss = hwm = None
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss + max(0, hwm - rss) if rss is not None and hwm is not None else pss
