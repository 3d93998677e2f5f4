"""Stopping a study by a signal as cleanly as by Ctrl-C.

Contract:

* while a study runs in the main thread (:func:`stop_on_signals`, around ``run_study``), SIGTERM
  (what ``docker stop``, Kubernetes, SLURM and systemd send) raises :class:`Terminated` there, as
  SIGINT raises ``KeyboardInterrupt``; ``Terminated`` is a ``KeyboardInterrupt``, so one clean-up
  serves both: the running trial's processes are killed and the trial is failed with
  :func:`stop_reason`, and the CLI exits :func:`stop_exit_code` (128 + the signal's number).
  A caller's own SIGTERM or SIGINT handler, or one that ignores them, is left alone; the
  previous handlers are back once the study returns;
* a stop signal that comes inside :func:`deferred` (the kill of a trial's process tree, a write
  of several study attrs under the study lock) is raised when that block ends, so no kill and no
  such write is left half done;
* a second signal during the clean-up ends the process at once, by the signal's own default
  action, as SIGKILL would: :mod:`tuner._lifeline` kills whatever of the study's tree is left,
  and the trial may stay RUNNING until a fleet's heartbeat fails it. So a stuck clean-up (a
  database that does not answer) never holds a process that was asked twice to stop;
* outside a study, in another thread, or where the handlers are the caller's, :func:`deferred`
  does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "deferred", "stop_exit_code", "stop_on_signals", "stop_reason"]


class Terminated(KeyboardInterrupt):
    """SIGTERM during a study: a ``KeyboardInterrupt``, so whatever Ctrl-C cleans up it does too."""


class _Stopper:
    """The signal handler while a study runs: raises the stop, or holds it during a deferral;
    ends the process on a second signal."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        self.stopping = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.stopping = True
        if self.depth:
            self.pending = signum
            return
        raise _stop(signum)


_active: _Stopper | None = None


def _stop(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def stop_reason(stop: KeyboardInterrupt) -> str:
    """``"terminated"`` for SIGTERM, ``"interrupted"`` for Ctrl-C: a stopped trial's error."""
    return "terminated" if isinstance(stop, Terminated) else "interrupted"


def stop_exit_code(stop: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process the signal ended: 143 or 130."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def _taken_over(signum: int, previous: object) -> bool:
    """Whether the study may handle ``signum``: its handler is still Python's default."""
    if signum == signal.SIGINT:
        return previous is signal.default_int_handler
    return previous == signal.SIG_DFL


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (and let :func:`deferred` hold SIGINT) in this
    block; the previous handlers are restored at its end. Outside the main thread, or nested,
    it does nothing."""
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    stopper = _Stopper()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    taken = [sig for sig, handler in previous.items() if _taken_over(sig, handler)]
    for sig in taken:
        signal.signal(sig, stopper)
    _active = stopper
    try:
        yield
    finally:
        _active = None
        for sig in taken:
            signal.signal(sig, previous[sig])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a stop signal until this block ends, then raise it (see the module docstring)."""
    stopper = _active
    if stopper is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    stopper.depth += 1
    try:
        yield
    finally:
        stopper.depth -= 1
        if stopper.depth == 0 and stopper.pending is not None:
            signum, stopper.pending = stopper.pending, None
            raise _stop(signum)
