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
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages import fail_stale_trials as optuna_fail_stale_trials
from optuna.storages._rdb import models
from optuna.trial import TrialState

from storage import is_connection_error

__all__ = ["StaleTrials", "heartbeat"]

_log = logging.getLogger("tuner")


@contextlib.contextmanager
def heartbeat(storage: BaseStorage, trial_id: int, interval_s: int) -> Iterator[None]:
    """Record the running trial's heartbeat from a thread; database hiccups are skipped."""
    record = getattr(storage, "record_heartbeat", None)
    if record is None or getattr(storage, "get_heartbeat_interval", lambda: None)() is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                record(trial_id)
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
    """

    def __init__(self) -> None:
        self._first_seen: dict[int, float] = {}

    def fail(self, study: optuna.Study) -> None:
        optuna_fail_stale_trials(study)
        # Optuna wraps an RDBStorage in its cache layer; the heartbeat table is the backend's.
        storage = getattr(study._storage, "_backend", study._storage)
        if not isinstance(storage, RDBStorage) or storage.heartbeat_interval is None:
            return
        grace_s = storage.grace_period or 2 * storage.heartbeat_interval
        now = time.monotonic()
        never_beaten = set(_never_beaten(storage, study._study_id))
        self._first_seen = {
            trial_id: self._first_seen.get(trial_id, now) for trial_id in never_beaten
        }
        for trial_id, seen in list(self._first_seen.items()):
            if now - seen >= 2 * grace_s:
                self._fail(study, storage, trial_id)
                del self._first_seen[trial_id]

    @staticmethod
    def _fail(study: optuna.Study, storage: RDBStorage, trial_id: int) -> None:
        try:
            storage.set_trial_user_attr(trial_id, "error", NEVER_BEAT_ERROR)
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                return
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # it finished, or another worker failed (and re-queued) it first
        failed = storage.get_trial(trial_id)
        _log.warning("trial %d never beat: failed, and re-queued", failed.number)
        callback = storage.get_heartbeat_stale_trial_callback()
        if callback is not None:
            callback(study, failed)


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
