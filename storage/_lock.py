"""A cross-process, cross-machine lock around the few steps that must happen exactly once.

Creating the tables, creating the study, enqueueing the baselines and asking for a trial under
``--total-trials`` all race when a fleet of workers starts in the same second. Optuna's storage
API has no compare-and-set, so these steps run under a lock held by the database itself
(PostgreSQL advisory locks, MySQL ``GET_LOCK``) or, for an SQLite file, by ``flock`` on a file
beside it: the lock lives exactly as long as the holder's connection or process, so a worker that
dies while holding it never blocks the fleet.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy
import sqlalchemy.engine

from storage._drivers import with_driver
from storage._urls import GRPC_SCHEME

__all__ = ["storage_lock"]

_LOCK_WAIT_SECONDS = 600

_in_process = threading.Lock()


def _lock_id(key: str) -> int:
    """A stable signed 64-bit id for PostgreSQL's advisory lock functions."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _database_lock(url: str, key: str) -> Iterator[None]:
    # A dedicated engine without pooling: the lock is tied to this one connection.
    engine = sqlalchemy.create_engine(with_driver(url), poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            dialect = engine.dialect.name
            if dialect == "postgresql":
                connection.execute(
                    sqlalchemy.text("SELECT pg_advisory_lock(:id)"), {"id": _lock_id(key)}
                )
                connection.commit()
                try:
                    yield
                finally:
                    connection.execute(
                        sqlalchemy.text("SELECT pg_advisory_unlock(:id)"), {"id": _lock_id(key)}
                    )
                    connection.commit()
            elif dialect in ("mysql", "mariadb"):
                name = "tuner-" + hashlib.sha256(key.encode()).hexdigest()[:40]
                got = connection.execute(
                    sqlalchemy.text("SELECT GET_LOCK(:name, :wait)"),
                    {"name": name, "wait": _LOCK_WAIT_SECONDS},
                ).scalar()
                if got != 1:
                    raise TimeoutError(f"could not take the database lock {name} in time")
                try:
                    yield
                finally:
                    connection.execute(
                        sqlalchemy.text("SELECT RELEASE_LOCK(:name)"), {"name": name}
                    )
            else:
                yield
    finally:
        engine.dispose()


@contextlib.contextmanager
def storage_lock(url: str, key: str = "setup") -> Iterator[None]:
    """Hold an exclusive lock named ``key`` on the storage at ``url`` (also within a process)."""
    with _in_process:
        if url.startswith(GRPC_SCHEME):
            # The proxy serialises nothing for us; a fleet behind a proxy relies on its server.
            yield
            return
        parsed = sqlalchemy.engine.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            database = parsed.database
            if not database or database == ":memory:":
                yield
                return
            with _file_lock(Path(database).with_name(Path(database).name + ".lock")):
                yield
            return
        with _database_lock(url, key):
            yield
