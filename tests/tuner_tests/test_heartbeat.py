"""Stale trials on a real SQLite storage: Optuna's rule, and the trials that never beat."""

from __future__ import annotations

import time
import warnings

import optuna
from optuna.trial import TrialState

from storage import open_storage
from tuner.fleet import StaleTrials, heartbeat
from tuner.fleet._heartbeat import NEVER_BEAT_ERROR


def _study(url: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(url, heartbeat_interval=1, grace_period=1)
    return optuna.create_study(storage=storage, study_name="stale")


def test_a_trial_that_never_beat_is_failed_and_requeued_after_twice_the_grace(
    sqlite_url: str,
) -> None:
    study = _study(sqlite_url)
    orphan = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})  # its worker died
    stale = StaleTrials()

    stale.fail(study)  # first seen without a heartbeat: not yet
    assert study.trials[orphan.number].state == TrialState.RUNNING
    time.sleep(2.2)
    stale.fail(study)

    trials = study.trials
    assert trials[orphan.number].state == TrialState.FAIL
    assert trials[orphan.number].user_attrs["error"] == NEVER_BEAT_ERROR
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert retry.state == TrialState.WAITING and retry.params == trials[orphan.number].params


def test_a_beating_trial_is_left_alone(sqlite_url: str) -> None:
    study = _study(sqlite_url)
    trial = study.ask()
    stale = StaleTrials()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with heartbeat(study._storage, trial._trial_id, 1):
            for _ in range(4):
                stale.fail(study)
                time.sleep(0.8)
    assert study.trials[trial.number].state == TrialState.RUNNING
    assert len(study.trials) == 1
