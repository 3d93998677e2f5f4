"""A study on the real PostgreSQL server stopped by a signal mid-trial, as users and machines stop
one: SIGKILL (the OOM killer), SIGTERM (a scheduler's stop) and Ctrl-C (SIGINT to the terminal's
process group).

Whatever the signal, no process of the study's tree outlives it. What becomes of the trial that
was running is what the code promises: under Ctrl-C the study fails it itself ("interrupted")
and exits 130; SIGKILL and SIGTERM end the process where it stands (no handler runs), so the
trial stays RUNNING until another worker of the fleet sees its heartbeat stop, fails it and
queues its retry, which that worker then runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from optuna.trial import TrialState

from tests.conftest import ROOT
from tests.tuner_tests.test_fleet import FAST, FINISHED, QUICK, _trials, _wait_for
from tests.tuner_tests.test_killed_study import GONE_WITHIN_S, _alive, _descendants
from tests.tuner_tests.test_killed_study import _trial_children as trial_children

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

FLEET = ["--heartbeat-interval", "1", "--grace-period", "3", "--total-trials", "4"]
"""Beats every second, stale after 3 s without one: the retry comes within the test's time."""


def _study(url: str, *extra: str) -> subprocess.Popen[str]:
    """``python -m tuner.study`` in a session of its own, as a terminal runs a job."""
    command = [
        sys.executable, "-m", "tuner.study", "--hardware", "auto", "--sampler", "gp",
        "--objective", FAST, "--storage", url, *QUICK, *FLEET, "--n-trials", "50", *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _running_trial_number(url: str) -> int:
    (number,) = [t.number for t in _trials(url) if t.state == TrialState.RUNNING]
    return number


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name
)
def test_a_signalled_study_leaves_no_process_and_no_running_trial(
    postgres_url: str, sig: signal.Signals
) -> None:
    study = _study(postgres_url, "--trial-seconds", "6")
    try:
        root = psutil.Process(study.pid)
        _wait_for(
            lambda: (
                any(t.state == TrialState.RUNNING for t in _trials(postgres_url))
                and bool(trial_children(root))
            ),
            300,
            "a running trial with its child",
        )
        running = _running_trial_number(postgres_url)
        tree = [root, *_descendants(root)]
        if sig == signal.SIGINT:
            os.killpg(study.pid, sig)  # Ctrl-C: the terminal signals the whole foreground group
        else:
            study.send_signal(sig)
        _, stderr = study.communicate(timeout=120)
    finally:
        if study.poll() is None:
            study.kill()
            study.communicate()
    deadline = time.monotonic() + GONE_WITHIN_S  # a bound on scheduling, not a speed
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = _alive(tree)
    for process in survivors:
        process.kill()
    assert len(tree) >= 3, tree  # the study, its forkserver and the trial child at least
    assert not survivors, [p.pid for p in survivors]

    if sig == signal.SIGINT:
        assert study.returncode == 130, stderr
        assert "interrupted" in stderr and "Traceback" not in stderr
        trials = _trials(postgres_url)
        assert trials[running].state == TrialState.FAIL
        assert trials[running].user_attrs["error"] == "interrupted"
        assert not [t for t in trials if t.state == TrialState.RUNNING]
        return

    assert study.returncode == -sig
    # No handler ran: the trial is left RUNNING, for the fleet's heartbeats to take care of.
    assert _trials(postgres_url)[running].state == TrialState.RUNNING
    second = _study(postgres_url)
    _, stderr = second.communicate(timeout=600)
    assert second.returncode == 0, stderr
    trials = _trials(postgres_url)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert trials[running].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == running]
    assert retries and retries[-1].state in FINISHED
    assert sum(t.state in FINISHED for t in trials) == 4
