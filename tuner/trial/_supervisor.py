"""The trial supervisor: runs one trial in a child process and decides how it ended.

Contract:

* children are forked from a forkserver that has torch and the tuner preloaded (a trial starts
  in milliseconds, not the seconds a fresh interpreter needs), and never from the study process
  itself, whose threads and database connections must not be copied;
* each child leads its own process group; its DataLoader workers are in it. Stopping a trial is
  ``killpg`` SIGTERM, SIGKILL after a short grace, then a sweep of the remembered process tree,
  and the supervisor returns only once none of those processes is left;
* the study process is made a child subreaper, so the workers of a killed child are reparented to
  it and reaped here, not left as zombies;
* every process of the trial dies with the study process itself, within milliseconds: see
  :mod:`tuner._lifeline` for how the forkserver, the child and its workers are tied to it;
* the supervisor runs the guard between messages; the guard never kills, the supervisor does;
* an exception out of the watch (Ctrl-C, SIGTERM: :mod:`tuner._signals`) kills the child at once,
  and a stop signal during the kill waits until it is done.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import psutil

from tuner._lifeline import start_forkserver
from tuner._signals import deferred
from tuner.machine import process_tree
from tuner.trial._guard import Breach, MemoryGuard
from tuner.trial._outcome import TrialOutcome, classify_exit
from tuner.trial._protocol import Failure, Fits, Job, Message, Progress, Result
from tuner.trial._telemetry import TelemetrySampler

__all__ = ["Supervisor", "kill_tree"]

_log = logging.getLogger("tuner.supervisor")

_PR_SET_CHILD_SUBREAPER = 36

ProgressHandler = Callable[[float, float], bool]
"""``handler(elapsed_s, samples_per_sec) -> stop``: reports to Optuna, True to prune."""

MessageHandler = Callable[[Fits], None]

FORKSERVER_PRELOAD = ("tuner._forkserver_preload", "tuner.trial._child", "torch._dynamo")
"""Imported once by the forkserver, so no trial pays for them: ``torch._dynamo`` is what the
first ``torch.optim`` optimizer in a process imports, 2 to 2.5 s on a 2-core machine, which
was most of a 3.5 s trial's overhead before it was preloaded. The first entry ties the
forkserver to the study process before those seconds (:mod:`tuner._lifeline`)."""


def _start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its UserWarnings off, and only it.

    A killed trial cannot unregister its DataLoader's semaphores; the tracker cleans them up,
    and its "leaked semaphore" warning at exit would only alarm users. The tracker takes its
    warning options from ``sys.warnoptions`` when it starts, so the option is there for that
    moment only: the forkserver, the trial children and the caller keep their own warnings.
    """
    from multiprocessing import resource_tracker

    option = "ignore::UserWarning"
    sys.warnoptions.append(option)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(option)


def _become_subreaper() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_tree(pgid: int, known: list[psutil.Process], grace_s: float = 0.5) -> float:
    """Kill a trial's process group and every process remembered in its tree; wait for them.

    Returns the seconds from the first signal until none of the processes is left.
    """
    started = time.monotonic()
    alive = [process for process in known if process.is_running()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for process in alive:
            try:
                process.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace_s if sig == signal.SIGTERM else 5.0)
        _reap([process.pid for process in known])
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
    return time.monotonic() - started


class Supervisor:
    """Starts trial children and watches them until each one ends.

    ``children_started`` counts the children :meth:`run` has started (each a measurement, a
    probe, a ceiling or a pipeline profile): a study's account of where its time went.
    """

    def __init__(self, guard: MemoryGuard, kill_grace_s: float = 0.5) -> None:
        self.guard = guard
        self.kill_grace_s = kill_grace_s
        self.children_started = 0
        self._context: multiprocessing.context.ForkServerContext | None = None
        self._partial: dict[str, float] = {}
        _become_subreaper()

    def _ctx(self) -> multiprocessing.context.ForkServerContext:
        if self._context is None:
            context = multiprocessing.get_context("forkserver")
            _start_quiet_resource_tracker()
            assert isinstance(context, multiprocessing.context.ForkServerContext)
            context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
            start_forkserver()
            self._context = context
        return self._context

    def run(
        self,
        job: Job,
        deadline_s: float,
        on_progress: ProgressHandler | None = None,
        on_message: MessageHandler | None = None,
        telemetry: TelemetrySampler | None = None,
        expected_peak_bytes: int | None = None,
    ) -> TrialOutcome:
        """Run ``job`` in a child; return how it ended, with the guard's peaks in its attrs.

        ``telemetry`` is sampled on the guard's ticks, for the trial's telemetry artifact;
        ``expected_peak_bytes`` is the peak the guard expects the tree to reach
        (:meth:`~tuner.trial._guard.MemoryGuard.start`).
        """
        from tuner.trial._child import run_child

        context = self._ctx()
        receiver, sender = context.Pipe(duplex=False)
        job = job if job.cwd else job.replace(cwd=os.getcwd())
        process = context.Process(target=run_child, args=(sender, job, os.getpid()), daemon=False)
        known: dict[int, psutil.Process] = {}
        watched = False
        try:
            with deferred():  # a child that starts is a child the sweep below knows
                process.start()
            self.children_started += 1
            sender.close()
            assert process.pid is not None
            self.guard.start(process.pid, expected_peak_bytes)
            self._partial = {}
            if telemetry is not None:
                telemetry.start(time.monotonic())
            outcome = self._watch(
                process, receiver, deadline_s, known, on_progress, on_message, telemetry
            )
            watched = True
        finally:
            with deferred():  # no stop signal, first or second, cuts the kill short
                receiver.close()
                sender.close()
                # Stopped by an exception (a signal): the child is mid-trial, kill it at once.
                self._sweep(process, known, join_s=5.0 if watched else 0.0)
        outcome.attrs.update(with_own_peak(self.guard.peaks(), outcome.attrs))
        return outcome

    def _watch(
        self,
        process: multiprocessing.process.BaseProcess,
        receiver: Connection,
        deadline_s: float,
        known: dict[int, psutil.Process],
        on_progress: ProgressHandler | None,
        on_message: MessageHandler | None,
        telemetry: TelemetrySampler | None,
    ) -> TrialOutcome:
        """Guard ticks and the child's messages until an outcome: its result, a breach, the
        deadline, or its end without a result. ``known`` collects every process seen."""
        assert process.pid is not None
        pid = process.pid
        deadline = time.monotonic() + deadline_s
        next_sample = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_sample:
                tree = self.guard.tree()
                for member in tree:
                    known.setdefault(member.pid, member)
                breach = self.guard.check(self.guard.sample(tree))
                if telemetry is not None:
                    telemetry.sample(now)
                next_sample = now + self.guard.next_interval_s()
                if breach is not None:
                    return self._stop(pid, known, breach=breach)
            if now >= deadline:
                outcome = self._stop(pid, known, reason="timeout")
                outcome.error = f"no result within {deadline_s:.0f} s"
                return outcome
            wait = max(0.0, min(next_sample, deadline) - time.monotonic())
            if receiver.poll(wait):
                try:
                    message = receiver.recv()
                except (EOFError, OSError):
                    return self._ended_without_result(process)
                outcome = self._handle(message, pid, known, on_progress, on_message)
                if outcome is not None:
                    return outcome
            elif not process.is_alive() and not receiver.poll(0):
                return self._ended_without_result(process)

    def _sweep(
        self,
        process: multiprocessing.process.BaseProcess,
        known: dict[int, psutil.Process],
        join_s: float,
    ) -> None:
        """Leave nothing behind: give the child ``join_s`` to end, kill what of its tree still
        runs, reap all."""
        pid = process.pid
        if pid is None:  # never started
            self.guard.stop()
            return
        process.join(timeout=join_s)
        for member in process_tree(pid):
            known.setdefault(member.pid, member)
        leftovers = [p for p in known.values() if p.is_running()]
        if process.is_alive() or leftovers:
            kill_tree(pid, leftovers, self.kill_grace_s)
            process.join(timeout=5.0)
        _reap(list(known))
        self.guard.stop()

    def _handle(
        self,
        message: Message,
        pid: int,
        known: dict[int, psutil.Process],
        on_progress: ProgressHandler | None,
        on_message: MessageHandler | None,
    ) -> TrialOutcome | None:
        match message:
            case Progress():
                # A trial stopped early keeps what it had measured so far, for its diagnosis.
                self._partial = {
                    "partial_samples_per_sec": message.samples_per_sec,
                    "partial_window_s": message.elapsed_s,
                    "data_wait_fraction": min(1.0, message.data_wait_fraction),
                }
                if on_progress is not None and on_progress(
                    message.elapsed_s, message.samples_per_sec
                ):
                    return self._stop(pid, known, reason="pruner")
            case Result():
                return TrialOutcome("complete", dict(message.attrs))
            case Failure(reason=None):
                return TrialOutcome("failed", error=message.error)
            case Failure():
                return TrialOutcome("pruned", reason=message.reason, error=message.error)
            case Fits():
                if on_message is not None:
                    on_message(message)
        return None

    def _stop(
        self,
        pid: int,
        known: dict[int, psutil.Process],
        reason: str | None = None,
        breach: Breach | None = None,
    ) -> TrialOutcome:
        for member in process_tree(pid):
            known.setdefault(member.pid, member)
        gone_after_s = kill_tree(pid, list(known.values()), self.kill_grace_s)
        attrs: dict[str, Any] = {**self._partial, "kill_seconds": gone_after_s}
        if breach is not None:
            attrs.update(breach.to_attrs())
            reason = breach.reason
        _log.debug("stopped trial child %d (%s) in %.3f s", pid, reason, gone_after_s)
        return TrialOutcome("pruned", attrs, reason=reason)

    def _ended_without_result(self, process: multiprocessing.process.BaseProcess) -> TrialOutcome:
        process.join(timeout=5.0)
        reason = classify_exit(process.exitcode)
        if reason.startswith("trial_exited"):
            return TrialOutcome(
                "failed", error=f"the trial process ended without a result ({reason})"
            )
        return TrialOutcome("pruned", reason=reason, error=f"the trial process was {reason}")


def with_own_peak(peaks: dict[str, int], attrs: dict[str, Any]) -> dict[str, int]:
    """The guard's peaks, the host's raised to the trial's own estimate where that is higher
    (``own_peak_host_memory_bytes``: a step's transient peak between two readings)."""
    own, read = attrs.get("own_peak_host_memory_bytes"), peaks.get("peak_host_memory_bytes")
    if own is None or read is None or own <= read:
        return peaks
    return {**peaks, "peak_host_memory_bytes": int(own)}
