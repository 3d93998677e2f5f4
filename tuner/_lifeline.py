"""Tying every process of a study to the study process, so a killed study leaves nothing behind.

Contract (who dies with whom, and how fast):

* the forkserver dies with the study process: it sets ``PR_SET_PDEATHSIG`` at its preload
  (:mod:`tuner._forkserver_preload`), before it spends seconds importing torch. The kernel
  fires it when the *thread* that started the forkserver exits; the supervisor starts it from
  the thread that runs trials, and if that thread ends first, multiprocessing starts a new one;
* the trial child watches the study process itself (a ``pidfd``, or polling where the kernel has
  none) from a daemon thread and SIGKILLs its own process group, DataLoader workers included, the
  moment the study is gone. Not ``PR_SET_PDEATHSIG`` tied to the forkserver: the forkserver only
  exits once every process holding its "alive" pipe has closed it, and the trial child and its
  forked workers hold a copy, so each waited for the other;
* each DataLoader worker asks for SIGKILL when the thread that forked it, the trial child's main
  thread, exits (PyTorch's own watchdog notices an orphaned worker only every 5 s);
* once all of them are gone, the multiprocessing resource tracker sees its pipe close and exits.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time

__all__ = ["STUDY_PID_ENV", "die_with_parent", "kill_group_when_gone", "start_forkserver"]

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05

STUDY_PID_ENV = "TUNER_STUDY_PID"
"""The study's pid, in the forkserver's environment only, for its check at preload."""


def start_forkserver() -> None:
    """Start multiprocessing's forkserver now, from this thread, with the study's pid in its
    environment (restored here at once; the forkserver removes it from its own)."""
    from multiprocessing import forkserver

    previous = os.environ.get(STUDY_PID_ENV)
    os.environ[STUDY_PID_ENV] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        if previous is None:
            del os.environ[STUDY_PID_ENV]
        else:
            os.environ[STUDY_PID_ENV] = previous


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel for SIGKILL when the parent thread exits; exit now if it already has.

    ``expected_parent`` is the pid that should still be there; without it the check is skipped.
    Not Linux/glibc: nothing happens, and the supervisor's process-group kill still applies.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if expected_parent is not None and not _alive(expected_parent):
        os._exit(1)


def kill_group_when_gone(pid: int) -> None:
    """SIGKILL this process's group once process ``pid`` has exited; returns at once.

    The caller leads its own process group (``setpgid(0, 0)``), or it would kill its parent's.
    """
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        os.killpg(0, signal.SIGKILL)
        return
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3, not Linux): poll instead
        pidfd = None
    thread = threading.Thread(
        target=_kill_group_after, args=(pid, pidfd), name="tuner-lifeline", daemon=True
    )
    thread.start()


def _kill_group_after(pid: int, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the process has exited, reaped or not
    else:
        while _alive(pid):
            time.sleep(_POLL_S)
    os.killpg(0, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel, which counts a zombie as there
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
