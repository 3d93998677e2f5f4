"""Stale trials on a real SQLite file, PostgreSQL and MariaDB: Optuna's rule, and the trials that
never beat; and through the real gRPC proxy, whose client carries no Optuna heartbeats: the
tuner's own."""

from __future__ import annotations

import time
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from storage import open_storage
from storage.testing import served_proxy
from tuner.fleet import StaleTrials, heartbeat
from tuner.fleet._heartbeat import (
    BEAT_ATTR,
    NEVER_BEAT_ERROR,
    STOPPED_BEATING_ERROR,
    _never_beaten,
)
from tuner.testing import ManualClock


def _study(url: str, grace_s: int = 1) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(url, heartbeat_interval=1, grace_period=grace_s)
    return optuna.create_study(storage=storage, study_name="stale")


# Optuna warns that its heartbeats are meant for Study.optimize: these tests drive ask() and the
# tuner's own StaleTrials by hand, as a study worker does.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize:UserWarning"
)

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=BACKENDS)
def any_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """The SQLite file, then a fresh database on each fleet server."""
    return (
        sqlite_url if request.param == "sqlite" else request.getfixturevalue(f"{request.param}_url")
    )


def test_a_trial_that_never_beat_is_failed_and_requeued_after_twice_the_grace(
    any_url: str,
) -> None:
    study = _study(any_url)  # a grace of 1 s
    orphan = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})  # its worker died
    clock = ManualClock()
    stale = StaleTrials(clock=clock)

    stale.fail(study)  # first seen without a heartbeat: not yet
    clock.now += 1.9
    stale.fail(study)  # under twice the grace: not yet
    assert study.trials[orphan.number].state == TrialState.RUNNING
    clock.now += 0.2
    stale.fail(study)

    trials = study.trials
    assert trials[orphan.number].state == TrialState.FAIL
    assert trials[orphan.number].user_attrs["error"] == NEVER_BEAT_ERROR
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert retry.state == TrialState.WAITING and retry.params == trials[orphan.number].params


def test_a_beating_trial_is_left_alone(any_url: str) -> None:
    """Its heartbeat row is what spares it: the tuner's clock runs on 25 s, far past twice the
    grace, and Optuna's rule reads the database's clock, in which it beat moments ago."""
    study = _study(any_url, grace_s=10)
    trial = study.ask()
    clock = ManualClock()
    stale = StaleTrials(clock=clock)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with heartbeat(study._storage, trial._trial_id, 0.05):
            backend = getattr(study._storage, "_backend", study._storage)
            deadline = time.monotonic() + 30  # a bound on the test, not on the behaviour
            while trial._trial_id in _never_beaten(backend, study._study_id):
                assert time.monotonic() < deadline, "the trial never beat"
                time.sleep(0.02)
            for _ in range(4):
                stale.fail(study)
                clock.now += 25.0
    assert study.trials[trial.number].state == TrialState.RUNNING
    assert len(study.trials) == 1


def test_through_the_grpc_proxy_a_trial_whose_worker_stopped_beating_is_failed_and_requeued(
    sqlite_url: str,
) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with served_proxy(sqlite_url) as url:
        study = optuna.create_study(storage=open_storage(url), study_name="proxied")
        x = {"x": optuna.distributions.IntDistribution(0, 9)}
        dead, alive = study.ask(x), study.ask(x)
        with heartbeat(study._storage, dead._trial_id, 0.2):
            time.sleep(0.3)  # it beat, then its worker died
        clock = ManualClock()
        stale = StaleTrials(interval_s=0.5, grace_s=2.0, clock=clock)
        with heartbeat(study._storage, alive._trial_id, 0.02):  # beats between any two checks
            failed_at_check = None
            for check in range(1, 8):
                stale.fail(study)
                if study.trials[dead.number].state != TrialState.RUNNING:
                    failed_at_check = check
                    break
                beats_before = study.trials[alive.number].system_attrs[BEAT_ATTR]
                clock.now += 0.5
                deadline = time.monotonic() + 30  # a bound on the test, not on the behaviour
                while study.trials[alive.number].system_attrs[BEAT_ATTR] == beats_before:
                    assert time.monotonic() < deadline, "the live trial stopped beating"
                    time.sleep(0.02)
            stale.fail(study)
        trials = study.trials
    assert trials[dead.number].state == TrialState.FAIL
    assert trials[dead.number].user_attrs["error"] == STOPPED_BEATING_ERROR
    assert trials[alive.number].state == TrialState.RUNNING
    # Failed once its counter had stood still for the grace: 2 s on the clock, the 5th check.
    assert failed_at_check == 5
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retry.state == TrialState.WAITING and retry.params == trials[dead.number].params
