"""Files under /proc and /sys kept open, for readers that sample them several times a second.

The kernel regenerates a /proc or /sys file on each read from offset 0, so one descriptor,
re-read with ``pread``, gives a fresh reading without an ``open`` and a ``close`` per sample.
A file that cannot be opened (absent, hidden by a container, its process gone) reads as None;
the caller decides what a missing reading means.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["KeptOpenFile"]

_READ_BYTES = 64 * 1024
"""More than /proc/meminfo, /proc/vmstat or a smaps_rollup ever holds."""


class KeptOpenFile:
    """One file opened on first read and re-read in place; not thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd: int | None = None
        self._failed = False

    def read(self) -> str | None:
        """The file's current text, or None where it cannot be read (it is not retried)."""
        if self._failed:
            return None
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(self._fd, _READ_BYTES, 0).decode("ascii", "replace")
        except OSError:  # absent, EOPNOTSUPP (PSI compiled in but off), ESRCH (process gone)
            self.close()
            self._failed = True
            return None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> KeptOpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
