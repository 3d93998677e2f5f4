"""Riding out a database restart: retry storage calls that failed because the connection did.

Only connection-level failures are retried (the server went away, refused, or restarted);
anything else, such as a constraint violation, is a bug or a race that retrying would hide.
SQLAlchemy's ``pool_pre_ping`` then hands out a fresh connection once the server is back.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import optuna
import sqlalchemy.exc

from storage._urls import mask_password

__all__ = ["DEFAULT_RETRY_SECONDS", "LostConnectionFilter", "is_connection_error", "with_retry"]

T = TypeVar("T")

DEFAULT_RETRY_SECONDS = float(os.environ.get("TUNER_DB_RETRY_SECONDS", "900"))
"""How long a worker waits for its database before giving up (a restart takes seconds)."""

_log = logging.getLogger("storage")

_CONNECTION_ERRORS = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
)


def is_connection_error(error: BaseException) -> bool:
    """True when ``error`` (or what Optuna wrapped in it) says the database connection failed."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _CONNECTION_ERRORS):
            return True
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return True
        current = current.__cause__ or current.__context__
    return False


def with_retry(
    call: Callable[[], T],
    what: str,
    retry_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call``; on a connection failure wait and retry for up to ``retry_seconds``."""
    budget = DEFAULT_RETRY_SECONDS if retry_seconds is None else retry_seconds
    deadline = time.monotonic() + budget
    delay = 0.5
    warned = False
    while True:
        try:
            result = call()
        except (optuna.exceptions.StorageInternalError, *_CONNECTION_ERRORS) as error:
            if not is_connection_error(error) or time.monotonic() + delay > deadline:
                raise
            if not warned:
                reason = mask_password(str(error.__cause__ or error).splitlines()[0])
                _log.warning("database unreachable while %s (%s); retrying", what, reason)
                warned = True
            sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        if warned:
            _log.warning("database reachable again; %s done", what)
        return result


_DBAPI_CONNECTION_ERRORS = ("OperationalError", "InterfaceError")
"""PEP 249's names for a driver's errors of the connection (every driver defines both)."""


class LostConnectionFilter(logging.Filter):
    """A logging filter (for a CLI's handlers) that turns SQLAlchemy's traceback for a pooled
    connection the server dropped into one line.

    When a server restarts, SQLAlchemy's pool cannot roll back a connection it is handed back,
    logs "Exception during reset or similar" with the driver's traceback, and discards the
    connection; the next checkout connects afresh, so nothing is lost and a warning says all.
    Every other record passes unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if (
            record.name.startswith("sqlalchemy.pool")
            and error is not None
            and type(error).__name__ in _DBAPI_CONNECTION_ERRORS
        ):
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            record.msg = "a database connection was lost and is replaced (%s)"
            record.args = (mask_password(reason),)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
