"""The running trial's heartbeat, recorded from a thread while the supervisor runs the child.

Optuna records heartbeats only inside ``Study.optimize``; this service drives Optuna with ask and
tell (it must run the supervisor, the guard and the database retries between them), so it beats
itself. A worker that dies stops beating; after the grace period another worker's
``fail_stale_trials`` fails its trial and re-queues a copy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from optuna.storages import BaseStorage

from storage import is_connection_error

__all__ = ["heartbeat"]

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
