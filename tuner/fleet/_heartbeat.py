"""The running trial's heartbeat, recorded from a thread while the supervisor runs the child.

Optuna records heartbeats only inside ``Study.optimize``; this service drives Optuna with ask and
tell (it must run the supervisor, the guard and the database retries between them), so it beats
itself. A worker that dies stops beating; after the grace period another worker's
:class:`StaleTrials` fails its trial and re-queues a copy.

Optuna counts as stale only a trial that has beaten at least once. A worker that dies, or whose
``ask`` is retried after a database restart, between creating its trial and the first beat
leaves a RUNNING trial with no heartbeat at all, which Optuna never fails: under
``--total-trials`` the whole fleet then waits for it forever (measured in ``bench.chaos``). Such
a trial is failed and re-queued here too (:class:`StaleTrials`).

A storage without Optuna's heartbeats (the gRPC proxy client: Optuna's ``GrpcStorageProxy``
carries none) gets a heartbeat of its own: the worker bumps a counter in the trial's system
attr ``tuner:beat``, and :class:`StaleTrials` fails a RUNNING trial whose counter has not moved
for the grace period (twice that when it never beat). Counting, not clock times: the workers'
clocks need not agree, and each observer times what it saw on its own monotonic clock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages import fail_stale_trials as optuna_fail_stale_trials
from optuna.storages._rdb import models
from optuna.trial import TrialState

from storage import is_connection_error

__all__ = ["BEAT_ATTR", "StaleTrials", "heartbeat"]

_log = logging.getLogger("tuner")

BEAT_ATTR = "tuner:beat"
"""The trial system attr a storage without Optuna's heartbeats is beaten through (a counter)."""


def _has_optuna_heartbeats(storage: BaseStorage) -> bool:
    get_interval = getattr(storage, "get_heartbeat_interval", None)
    return (
        hasattr(storage, "record_heartbeat")
        and get_interval is not None
        and (get_interval() is not None)
    )


def _beater(storage: BaseStorage, trial_id: int) -> Callable[[], None]:
    """One beat: Optuna's heartbeat row where the storage has them, else the counter attr."""
    if _has_optuna_heartbeats(storage):
        return lambda: storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
    count = itertools.count()
    return lambda: storage.set_trial_system_attr(trial_id, BEAT_ATTR, next(count))


@contextlib.contextmanager
def heartbeat(storage: BaseStorage, trial_id: int, interval_s: float) -> Iterator[None]:
    """Record the running trial's heartbeat from a thread; database hiccups are skipped."""
    record = _beater(storage, trial_id)
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                record()
            except optuna.exceptions.UpdateFinishedTrialError:
                return  # told meanwhile, or failed as stale by another worker: nothing to beat
            except Exception as error:
                if not is_connection_error(error):
                    raise  # a bug, not a hiccup: the thread's excepthook reports it
                # The database is restarting: the next beat will do.
                _log.debug("heartbeat not recorded", exc_info=True)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=beat, name="tuner-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


NEVER_BEAT_ERROR = "its worker stopped before the trial's first heartbeat"


class StaleTrials:
    """Fails stale trials: Optuna's, and the RUNNING trials that never beat.

    A trial that never beat carries no time of the database's clock (its start is its worker's,
    whose clock and time zone may differ), so each one is timed from when this process first
    saw it without a heartbeat, and failed once it has stayed so for twice the grace period.
    On a storage without Optuna's heartbeats, the ``tuner:beat`` counters are timed the same
    way: a counter that has not moved for ``grace_s`` (the storage's own setting where it has
    one; else twice ``interval_s``, as Optuna's default) is a dead worker's.

    Args:
        interval_s: the workers' heartbeat interval, where the storage keeps none.
        grace_s: how long a silent counter may stay so; twice ``interval_s`` by default.
        clock: the seconds these timings read (``time.monotonic``); Optuna's own stale rule
            reads the database's clock whatever this is.
    """

    def __init__(
        self,
        interval_s: float = 10.0,
        grace_s: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._first_seen: dict[int, float] = {}
        self._grace_s = grace_s or 2 * interval_s
        self._beats: dict[int, tuple[object, float]] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._retry = RetryHeartbeatStaleTrialCallback()

    def fail(self, study: optuna.Study) -> None:
        # Optuna wraps an RDBStorage in its cache layer; the heartbeat table is the backend's.
        storage = getattr(study._storage, "_backend", study._storage)
        if not isinstance(storage, RDBStorage) or storage.heartbeat_interval is None:
            if not _has_optuna_heartbeats(study._storage):
                self._fail_silent_counters(study)
            return
        optuna_fail_stale_trials(study)
        grace_s = storage.grace_period or 2 * storage.heartbeat_interval
        now = self._clock()
        never_beaten = set(_never_beaten(storage, study._study_id))
        self._first_seen = {
            trial_id: self._first_seen.get(trial_id, now) for trial_id in never_beaten
        }
        callback = storage.get_heartbeat_stale_trial_callback()
        for trial_id, seen in list(self._first_seen.items()):
            if now - seen >= 2 * grace_s:
                _fail(study, storage, trial_id, NEVER_BEAT_ERROR, callback)
                del self._first_seen[trial_id]

    def _fail_silent_counters(self, study: optuna.Study) -> None:
        """Fail the RUNNING trials whose ``tuner:beat`` counter stopped (or never started)."""
        now = self._clock()
        beats: dict[int, tuple[object, float]] = {}
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(BEAT_ATTR)
            last = self._beats.get(trial._trial_id)
            beats[trial._trial_id] = last if last is not None and last[0] == beat else (beat, now)
        self._beats = beats
        for trial_id, (beat, since) in list(beats.items()):
            if now - since >= (self._grace_s if beat is not None else 2 * self._grace_s):
                error = NEVER_BEAT_ERROR if beat is None else STOPPED_BEATING_ERROR
                _fail(study, study._storage, trial_id, error, self._retry)
                del self._beats[trial_id]


STOPPED_BEATING_ERROR = "its worker stopped beating for the grace period"


def _fail(
    study: optuna.Study,
    storage: BaseStorage,
    trial_id: int,
    error: str,
    requeue: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None,
) -> None:
    """FAIL the trial with ``error`` and re-queue it, unless it finished or another worker
    failed it first."""
    try:
        storage.set_trial_user_attr(trial_id, "error", error)
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return
    except optuna.exceptions.UpdateFinishedTrialError:
        return  # it finished, or another worker failed (and re-queued) it first
    failed = storage.get_trial(trial_id)
    _log.warning("trial %d: %s; failed, and re-queued", failed.number, error)
    if requeue is not None:
        requeue(study, failed)


def _never_beaten(storage: RDBStorage, study_id: int) -> list[int]:
    """RUNNING trials of the study without a heartbeat row."""
    trial, beat = models.TrialModel, models.TrialHeartbeatModel
    query = sqlalchemy.select(trial.trial_id).where(
        trial.study_id == study_id,
        trial.state == TrialState.RUNNING,
        ~sqlalchemy.exists().where(beat.trial_id == trial.trial_id),
    )
    with storage.engine.connect() as connection:
        return [row[0] for row in connection.execute(query)]
