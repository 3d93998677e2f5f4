"""Opening a storage from a URL with engine options fit for a fleet of workers.

Every worker process opens its own storage. Which calls are safe from several processes is
Optuna's contract (``optuna.storages.RDBStorage``); what this module adds:

* the tables are created under :func:`storage.storage_lock`, so workers starting together do not
  race on ``CREATE TABLE`` ("already exists");
* a small pool with ``pool_pre_ping``, so a restarted server costs a reconnect, not the worker;
* heartbeats with a retry of stale trials: a worker killed mid-trial leaves that trial FAIL and a
  WAITING copy with the same parameters that another worker picks up;
* any password in the URL is masked in every message.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

from storage._drivers import with_driver
from storage._lock import storage_lock
from storage._retry import DEFAULT_RETRY_SECONDS, is_connection_error, with_retry
from storage._urls import GRPC_SCHEME, StorageError, mask_password, mask_url

__all__ = ["engine_options", "open_storage"]

DEFAULT_HEARTBEAT_INTERVAL = 10
DEFAULT_MAX_RETRY = 3


def engine_options(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: a few connections per worker, each checked before use."""
    backend = sqlalchemy.engine.make_url(url).get_backend_name()
    if backend == "sqlite":
        # SQLite serialises writers; wait for the file lock instead of failing at once, but no
        # longer than for a database that is down (TUNER_DB_RETRY_SECONDS).
        return {"connect_args": {"timeout": min(60.0, DEFAULT_RETRY_SECONDS)}}
    return {"pool_pre_ping": True, "pool_size": 2, "max_overflow": 2, "pool_recycle": 1800}


def _parse(url: str) -> str:
    """The URL to open, with its driver named (:func:`storage._drivers.with_driver`)."""
    try:
        sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise StorageError(f"not a storage URL: {mask_url(url)!r}") from None
    opened = with_driver(url)
    try:
        sqlalchemy.engine.make_url(opened).get_dialect()
    except (sqlalchemy.exc.NoSuchModuleError, ImportError) as error:
        raise StorageError(
            f"cannot open storage {mask_url(url)}: {mask_password(str(error))}"
        ) from None
    return opened


def _open_grpc(url: str) -> BaseStorage:
    host_port = url[len(GRPC_SCHEME) :].rstrip("/")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise StorageError(f"a gRPC storage URL is grpc://HOST:PORT, got {url!r}")
    try:
        from optuna.storages import GrpcStorageProxy
    except ImportError:
        raise StorageError(
            "the gRPC proxy needs grpcio: pip install 'dataloader-tuner[grpc]'"
        ) from None
    try:
        return GrpcStorageProxy(host=host, port=int(port))
    except ImportError:
        raise StorageError(
            "the gRPC proxy needs grpcio: pip install 'dataloader-tuner[grpc]'"
        ) from None


_SERVER_RESTARTING = ("57P01", "57P02", "57P03")
"""PostgreSQL SQLSTATEs of a server that answered and is shutting down or starting up:
admin_shutdown, crash_shutdown, cannot_connect_now."""

_MYSQL_SERVER_SHUTDOWN = 1053
"""MySQL's and MariaDB's error code for "Server shutdown in progress" (ER_SERVER_SHUTDOWN)."""


def _says_restarting(error: object) -> bool:
    if getattr(error, "sqlstate", None) in _SERVER_RESTARTING:
        return True
    args = getattr(error, "args", ())  # a MySQL driver's error: (code, message)
    return bool(args) and args[0] == _MYSQL_SERVER_SHUTDOWN


def _server_restarting(error: BaseException) -> bool:
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _says_restarting(getattr(current, "orig", None)) or _says_restarting(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _open_riding_out_a_restart(
    create: Callable[[], RDBStorage], connect_retry_seconds: float | None
) -> RDBStorage:
    """A wrong URL fails at once, but a server that answered "shutting down" or "starting up"
    is the right one, restarting: a fleet worker started at that moment waits for it, as every
    later call does, rather than exiting."""
    try:
        return with_retry(create, "opening the storage", retry_seconds=connect_retry_seconds)
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
        if not _server_restarting(error):
            raise
    return with_retry(create, "opening the storage")


def open_storage(
    url: str,
    *,
    heartbeat_interval: int | None = DEFAULT_HEARTBEAT_INTERVAL,
    grace_period: int | None = None,
    max_retry: int | None = DEFAULT_MAX_RETRY,
    connect_retry_seconds: float | None = 0.0,
    storage_class: type[RDBStorage] = RDBStorage,
) -> BaseStorage:
    """Open (and create, if new) the storage at ``url``; raise :class:`StorageError` if it can't.

    ``connect_retry_seconds`` is how long to wait for an unreachable server: 0 for the CLI's
    first contact (a wrong URL should fail at once), longer for workers riding out a restart.
    ``storage_class`` is the RDBStorage (sub)class to build. ``grpc://host:port`` opens
    Optuna's gRPC proxy client, which has no heartbeats (and is never ``storage_class``).
    """
    if url.startswith(GRPC_SCHEME):
        return _open_grpc(url)
    opened = _parse(url)
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        heartbeat = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": grace_period,
            "heartbeat_stale_trial_callback": retry,
        }

    def create() -> RDBStorage:
        with storage_lock(url), warnings.catch_warnings():
            # Heartbeats are experimental in Optuna 5; we rely on them knowingly.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return storage_class(opened, engine_kwargs=engine_options(opened), **heartbeat)

    try:
        return _open_riding_out_a_restart(create, connect_retry_seconds)
    except (
        sqlalchemy.exc.SQLAlchemyError,
        optuna.exceptions.StorageInternalError,
        OSError,
    ) as error:
        cause = error.__cause__ or error
        reason = str(getattr(cause, "orig", None) or cause).strip().splitlines()
        detail = reason[0] if reason else type(cause).__name__
        kind = "cannot reach" if is_connection_error(error) else "cannot open"
        raise StorageError(f"{kind} storage {mask_url(url)}: {mask_password(detail)}") from None
    except RuntimeError as error:
        # Optuna raises RuntimeError for a database schema of another Optuna version.
        raise StorageError(
            f"cannot open storage {mask_url(url)}: {mask_password(str(error))}"
        ) from None
