"""A study stopped by a signal mid-trial, as users and machines stop one: SIGKILL (the OOM
killer), SIGTERM (``docker stop``, Kubernetes, SLURM, systemd) and Ctrl-C (SIGINT to the
terminal's process group).

Whatever the signal, no process of the study's tree outlives it. What becomes of the trial that
was running is what the code promises: under SIGTERM and Ctrl-C the study kills the trial's
processes, fails the trial itself ("terminated", "interrupted") and exits 143 or 130 with one
line on stderr, on PostgreSQL as on SQLite, where no fleet would ever fail it; a re-measurement
it was taking is abandoned with no study attr written. SIGKILL ends the process where it stands
(no handler runs), so the trial stays RUNNING until another worker of the fleet sees its
heartbeat stop, fails it and queues its retry, which that worker then runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from tests.conftest import ROOT
from tests.tuner_tests.test_fleet import FAST, FINISHED, QUICK, _wait_for
from tests.tuner_tests.test_killed_study import Stopped, StudyDb, stop_study
from tests.tuner_tests.test_killed_study import _trial_children as trial_children
from tests.tuner_tests.test_ranks import _ranks_running
from tuner._attrs import BEST_TRIAL_ATTR, HOLDOUT_ATTR, PHASES_ATTR
from tuner._naming import REMEASURED_ATTR

# Stopped with Ctrl-C as from a terminal, however the suite was started.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_signal_handlers")]

FLEET = ["--heartbeat-interval", "1", "--grace-period", "3", "--total-trials", "4"]
"""Beats every second, stale after 3 s without one: the retry comes within the test's time."""

STOPS = {signal.SIGTERM: ("terminated", 143), signal.SIGINT: ("interrupted", 130)}
"""What a stopped study fails its trial with, and its exit code (128 + the signal)."""


def _study(url: str, *extra: str) -> subprocess.Popen[str]:
    """``python -m tuner.study`` in a session of its own, as a terminal runs a job."""
    command = [
        sys.executable, "-m", "tuner.study", "--hardware", "auto", "--sampler", "gp",
        "--objective", FAST, "--storage", url, *QUICK, "--n-trials", "50", *extra,
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


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    """The trials of the storage's one study (its name carries the rank count); none before
    it is created."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = [summary.study_name for summary in optuna.get_all_study_summaries(url)]
    return optuna.load_study(study_name=names[0], storage=url).trials if names else []


def _stop_mid_trial(url: str, sig: signal.Signals, *extra: str, ranks: int = 1) -> Stopped:
    """Start a study, signal it while a trial runs (with its ``ranks``), collect what is left."""
    study = _study(url, "--trial-seconds", "6", *extra)
    try:
        root = psutil.Process(study.pid)
        _wait_for(
            lambda: (
                any(t.state == TrialState.RUNNING for t in _trials(url))
                and bool(trial_children(root) if ranks == 1 else _ranks_running(root))
            ),
            300,
            "a running trial with its child (and its ranks)",
        )
    except BaseException:
        study.kill()
        study.communicate()
        raise
    # Ctrl-C: the terminal signals the whole foreground group.
    stopped = stop_study(study, sig, group=sig == signal.SIGINT)
    # the study, the forkserver, the trial child and, where it starts them, its ranks
    assert len(stopped.tree) >= 3 + (ranks if ranks > 1 else 0), stopped.roles
    assert not stopped.survivors, [stopped.roles[p.pid] for p in stopped.survivors]
    return stopped


def _check_failed_by_the_study(url: str, stopped: Stopped, sig: signal.Signals) -> None:
    """The trial that ran is FAIL with the stop's reason, by the study itself: no heartbeat of
    a peer failed it (none queued its retry); exit 128 + the signal, one line, no traceback."""
    reason, code = STOPS[sig]
    assert stopped.returncode == code, stopped.stderr
    assert stopped.stderr is not None and "Traceback" not in stopped.stderr
    assert stopped.stderr.splitlines()[-1] == f"tuner.study: {reason}"
    trials = _trials(url)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    (stopped_trial,) = [t for t in trials if t.user_attrs.get("error") == reason]
    assert stopped_trial.state == TrialState.FAIL
    assert not [t for t in trials if "failed_trial" in t.system_attrs]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name
)
def test_a_signalled_study_leaves_no_process_and_no_running_trial(
    postgres_url: str, sig: signal.Signals
) -> None:
    stopped = _stop_mid_trial(postgres_url, sig, *FLEET)
    if sig != signal.SIGKILL:
        _check_failed_by_the_study(postgres_url, stopped, sig)
        return

    assert stopped.returncode == -sig
    # No handler ran: the trial is left RUNNING, for the fleet's heartbeats to take care of.
    (running,) = [t.number for t in _trials(postgres_url) if t.state == TrialState.RUNNING]
    second = _study(postgres_url, *FLEET)
    _, stderr = second.communicate(timeout=600)
    assert second.returncode == 0, stderr
    trials = _trials(postgres_url)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert trials[running].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == running]
    assert retries and retries[-1].state in FINISHED
    assert sum(t.state in FINISHED for t in trials) == 4


def test_a_sigtermed_study_on_sqlite_fails_its_trial_and_stops_every_rank(
    sqlite_url: str,
) -> None:
    """No fleet, no heartbeat: were the trial left RUNNING, nothing would ever fail it."""
    stopped = _stop_mid_trial(sqlite_url, signal.SIGTERM, "--nproc-per-node", "2", ranks=2)
    _check_failed_by_the_study(sqlite_url, stopped, signal.SIGTERM)


def test_a_sigterm_during_the_remeasurement_writes_none_of_its_attrs(tmp_path: Path) -> None:
    db = StudyDb(tmp_path / "tuner.db")
    study = _study(f"sqlite:///{db.path}", "--n-trials", "3", "--remeasure-top", "3")
    try:
        root = psutil.Process(study.pid)
        _wait_for(
            lambda: (
                sum(s in ("COMPLETE", "PRUNED", "FAIL") for s in db.trial_states().values()) >= 3
                and bool(trial_children(root))
            ),
            300,
            "a re-measuring round",
        )
    except BaseException:
        study.kill()
        study.communicate()
        raise
    stopped = stop_study(study, signal.SIGTERM)
    assert not stopped.survivors, [stopped.roles[p.pid] for p in stopped.survivors]
    assert stopped.returncode == 143, stopped.stderr
    assert "RUNNING" not in db.trial_states().values()
    written = db.study_attrs() & {REMEASURED_ATTR, HOLDOUT_ATTR, BEST_TRIAL_ATTR, PHASES_ATTR}
    assert not written
