"""Process trees with real processes: listing, PSS against RSS, and the kept-open tree."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest

from tuner.machine._process import (
    ProcessTree,
    own_peak_memory_bytes,
    process_tree,
    process_tree_memory_bytes,
    processes_memory_bytes,
    processes_rss_bytes,
)

MiB = 2**20

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


@contextlib.contextmanager
def python_tree(script: str) -> Iterator[subprocess.Popen[bytes]]:
    """A python process running ``script`` on pipes, killed with its tree (children first)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
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


@pytest.fixture
def forked_tree() -> Iterator[subprocess.Popen[bytes]]:
    """A python process with two forked children."""
    with python_tree(_TREE_SCRIPT) as parent:
        yield parent


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


def test_the_peak_estimate_keeps_memory_freed_since() -> None:
    buffer = bytearray(256 * MiB)  # its own mapping: freed, it goes back to the kernel
    buffer[:: os.sysconf("SC_PAGE_SIZE")] = b"x" * len(buffer[:: os.sysconf("SC_PAGE_SIZE")])
    del buffer
    now = process_tree_memory_bytes(os.getpid())
    peak = own_peak_memory_bytes()
    assert now is not None and peak is not None
    assert peak - now >= 200 * MiB


def test_gone_process_has_no_tree() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert process_tree(child.pid) == []
    assert process_tree_memory_bytes(child.pid) is None


@pytest.mark.timeout(60)
def test_kept_tree_follows_children_and_agrees_with_the_one_off_readers(
    forked_tree: subprocess.Popen[bytes],
) -> None:
    assert forked_tree.stdin is not None
    wait_for_lines(forked_tree, b"idle", 2)
    with ProcessTree(forked_tree.pid) as tree:
        members = tree.members()
        assert [p.pid for p in members] == [p.pid for p in process_tree(forked_tree.pid)]
        assert members[0].pid == forked_tree.pid and len(members) == 3
        before_rss = tree.rss_bytes(members)
        assert before_rss == processes_rss_bytes(members)
        forked_tree.stdin.write(b"gg")
        forked_tree.stdin.flush()
        wait_for_lines(forked_tree, b"allocated", 2)
        # The same descriptors, read again, see the children's new pages.
        assert tree.rss_bytes(members) - before_rss >= 0.9 * 2 * _CHILD_MiB * MiB
        pss = tree.pss_bytes(members)
        assert abs(pss - processes_memory_bytes(members)) < 8 * MiB
        assert pss <= tree.rss_bytes(members)  # PSS never exceeds RSS


def test_tree_of_a_gone_root_is_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    with ProcessTree(child.pid) as tree:
        assert tree.members() == []


_LATE_FORK_SCRIPT = textwrap.dedent(
    """
    import os, signal, time

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped as they exit
    os.write(1, b"ready\\n")
    os.read(0, 1)
    if os.fork() == 0:
        while True:
            time.sleep(60)
    os.write(1, b"forked\\n")
    while True:
        time.sleep(60)
    """
)


@pytest.mark.timeout(60)
def test_kept_tree_sees_a_child_forked_after_a_listing_and_its_exit() -> None:
    """The listing is skipped only while no pid was allocated: a later fork still joins."""
    with python_tree(_LATE_FORK_SCRIPT) as parent, ProcessTree(parent.pid) as tree:
        assert parent.stdin is not None
        wait_for_lines(parent, b"ready", 1)
        assert [p.pid for p in tree.members()] == [parent.pid]
        assert [p.pid for p in tree.members()] == [parent.pid]
        parent.stdin.write(b"f")
        parent.stdin.flush()
        wait_for_lines(parent, b"forked", 1)
        members = tree.members()
        assert [p.pid for p in members] == [p.pid for p in process_tree(parent.pid)]
        assert len(members) == 2
        members[1].kill()
        deadline = time.monotonic() + 10
        while len(tree.members()) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in tree.members()] == [parent.pid]
