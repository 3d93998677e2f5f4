"""SIGTERM handled as Ctrl-C while a study runs (:mod:`tuner._signals`), against real signals and
real trial children: the stop is raised in the main thread, a deferred block finishes first, the
trial's tree is killed before the stop leaves the supervisor, a second signal ends the process
at once and the lifeline leaves nothing behind, and the caller's handlers are left as they were.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.conftest import ROOT
from tests.tuner_tests.test_killed_study import _alive, stop_study
from tests.tuner_tests.test_supervisor import make_job, trial_children
from tuner import Terminated
from tuner._signals import deferred, stop_exit_code, stop_on_signals, stop_reason
from tuner.machine import process_tree
from tuner.search import LoaderSettings
from tuner.trial import MemoryGuard, Supervisor, default_limits

WORKERS = LoaderSettings(batch=8, num_workers=2, prefetch_factor=2, persistent_workers=True)


pytestmark = pytest.mark.usefixtures("fresh_signal_handlers")


def _signal_self(sig: signal.Signals) -> None:
    """Send ``sig`` to this process and give its handler the next bytecodes to run in."""
    os.kill(os.getpid(), sig)
    time.sleep(0.5)


def test_sigterm_stops_a_study_as_ctrl_c_does_and_the_handlers_come_back() -> None:
    int_handler = signal.getsignal(signal.SIGINT)
    for sig, stop in ((signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)):
        with pytest.raises(stop) as raised, stop_on_signals():
            _signal_self(sig)
        assert isinstance(raised.value, KeyboardInterrupt)  # one clean-up serves both
        assert stop_exit_code(raised.value) == 128 + sig
    assert stop_reason(Terminated()) == "terminated"
    assert stop_reason(KeyboardInterrupt()) == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is int_handler


def test_a_deferred_block_ends_before_the_stop_is_raised() -> None:
    finished = []
    with pytest.raises(Terminated), stop_on_signals():
        with deferred():
            _signal_self(signal.SIGTERM)
            finished.append("the block")
        finished.append("after the block")
    assert finished == ["the block"]


def test_a_callers_own_handler_is_left_alone() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with stop_on_signals(), deferred():
            _signal_self(signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_mid_trial_kills_the_trials_tree_before_it_is_raised() -> None:
    supervisor = Supervisor(MemoryGuard(default_limits()))
    tree: list[psutil.Process] = []

    def on_progress(elapsed_s: float, samples_per_sec: float) -> bool:
        if not tree:
            for child in trial_children():
                tree.extend(process_tree(child.pid))
            if len(tree) >= 3:  # the trial child and its two workers
                _signal_self(signal.SIGTERM)
        return False

    with pytest.raises(Terminated), stop_on_signals():
        supervisor.run(make_job("slow", WORKERS, window_s=60.0), 120.0, on_progress=on_progress)
    assert len(tree) >= 3, tree
    assert _alive(tree) == []  # at once: the supervisor kills before the stop goes on


SECOND_SIGNAL = textwrap.dedent(
    """
    from tests.tuner_tests.test_signals import WORKERS
    from tests.tuner_tests.test_supervisor import make_job
    from tuner._signals import stop_on_signals
    from tuner.trial import MemoryGuard, Supervisor, default_limits

    def on_progress(elapsed_s, samples_per_sec):
        print("measuring", flush=True)
        return False

    supervisor = Supervisor(MemoryGuard(default_limits()), kill_grace_s=60.0)
    job = make_job("deaf_to_sigterm", WORKERS, window_s=60.0)
    try:
        with stop_on_signals():
            supervisor.run(job, 120.0, on_progress=on_progress)
    except KeyboardInterrupt:
        print("cleaned up", flush=True)
    """
)


def test_a_second_signal_ends_the_process_and_the_lifeline_leaves_nothing() -> None:
    """The first signal's kill waits out its grace (the trial child ignores SIGTERM); the second
    ends the process where it stands, and the lifeline kills the trial's tree."""
    script = subprocess.Popen(
        [sys.executable, "-c", SECOND_SIGNAL],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert script.stdout is not None and script.stdout.readline() == "measuring\n"
    except BaseException:
        script.kill()
        script.communicate()
        raise
    stopped = stop_study(script, signal.SIGTERM, signal.SIGINT)
    assert len(stopped.tree) >= 4, stopped.roles  # it, the forkserver, the child, its workers
    assert not stopped.survivors, [stopped.roles[p.pid] for p in stopped.survivors]
    assert stopped.returncode in (-signal.SIGTERM, -signal.SIGINT)
    assert "cleaned up" not in (stopped.stdout or "")
