"""Real servers for tests and benchmarks (as ``optuna.testing`` serves Optuna's own suites):
scratch databases, created empty and dropped afterwards with whatever still holds them, the
local PostgreSQL or MariaDB server stopped and started again, and the gRPC storage proxy served
on a free port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy

from storage._drivers import with_driver

__all__ = [
    "can_restart_local_server",
    "scratch_database",
    "served_proxy",
    "start_local_server",
    "stop_local_server",
]

_CHECKOUT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def scratch_database(admin_url: str, prefix: str = "tuner_scratch") -> Iterator[str]:
    """A fresh database beside ``admin_url``'s (PostgreSQL or MySQL/MariaDB); its URL.

    Raises :class:`sqlalchemy.exc.OperationalError` on entry when the server does not answer.
    No pooling: a test may restart the server, and the drop needs a fresh connection.
    """
    admin = sqlalchemy.create_engine(
        with_driver(admin_url), isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
    )
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    quoted = admin.dialect.identifier_preparer.quote_identifier(name)
    force = " WITH (FORCE)" if admin.dialect.name == "postgresql" else ""
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE {quoted}"))
    except BaseException:
        admin.dispose()
        raise
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            if admin.dialect.name in ("mysql", "mariadb"):
                _end_sessions_on(connection, name)
            connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {quoted}{force}"))
        admin.dispose()


def _end_sessions_on(connection: sqlalchemy.Connection, database: str) -> None:
    """MySQL's stand-in for PostgreSQL's ``WITH (FORCE)``: end the sessions still using
    ``database`` (a stalled or stopped worker's), whose locks would hold the drop."""
    sessions = connection.execute(
        sqlalchemy.text(
            "SELECT id FROM information_schema.processlist WHERE db = :db AND id <> CONNECTION_ID()"
        ),
        {"db": database},
    ).scalars()
    for session in list(sessions):
        with contextlib.suppress(sqlalchemy.exc.DBAPIError):
            connection.execute(sqlalchemy.text(f"KILL {int(session)}"))


_MARIADBD = "/usr/sbin/mariadbd"
_SERVER_START_SECONDS = 60.0


def _backend(url: str) -> str:
    return sqlalchemy.engine.make_url(url).get_backend_name()


def _pg_ctl(action: str) -> subprocess.CompletedProcess[str]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        capture_output=True,
        text=True,
        check=False,
    )


def _mariadb_admin(*args: str) -> subprocess.CompletedProcess[str]:
    # root over the server's unix socket: the local administrator, whatever the URL's user.
    return subprocess.run(
        ["mariadb-admin", "--protocol=socket", "--user=root", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def can_restart_local_server(url: str) -> bool:
    """True when the server of ``url`` (PostgreSQL or MariaDB) is this machine's own, with the
    tools to stop and start it."""
    backend = _backend(url)
    if backend == "postgresql":
        return shutil.which("pg_ctlcluster") is not None and Path("/etc/postgresql").is_dir()
    if backend in ("mysql", "mariadb"):
        tools = ("mariadb-admin", "start-stop-daemon")
        return Path(_MARIADBD).exists() and all(shutil.which(tool) for tool in tools)
    return False


def stop_local_server(url: str) -> None:
    """Stop this machine's server of ``url``; returns once it has stopped."""
    if _backend(url) == "postgresql":
        _pg_ctl("stop").check_returncode()
        return
    _mariadb_admin("shutdown").check_returncode()  # waits until the server has exited


def start_local_server(url: str) -> None:
    """Start this machine's server of ``url`` if it is down; returns once it answers.

    MariaDB starts as this machine's init starts it: ``mariadbd`` with no options, which reads
    /etc/mysql/my.cnf (its user, data directory, socket and port).

    Raises:
        TimeoutError: the server did not answer within a minute.
    """
    if _backend(url) == "postgresql":
        if _pg_ctl("status").returncode != 0:
            _pg_ctl("start").check_returncode()
        return
    subprocess.run(
        ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", _MARIADBD],
        capture_output=True,
        check=True,
    )
    deadline = time.monotonic() + _SERVER_START_SECONDS
    while _mariadb_admin("ping").returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the MariaDB server did not answer within a minute")
        time.sleep(0.5)


@contextlib.contextmanager
def served_proxy(database: str, start_timeout_s: float = 60.0) -> Iterator[str]:
    """``python -m storage.proxy`` serving ``database`` on a free port; its ``grpc://`` URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = os.pathsep.join(filter(None, [str(_CHECKOUT), os.environ.get("PYTHONPATH")]))
    proxy = subprocess.Popen(
        [sys.executable, "-m", "storage.proxy", "--storage", database, "--port", str(port)],
        env={**os.environ, "PYTHONPATH": path},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _listening(port):
            if time.monotonic() > deadline or proxy.poll() is not None:
                raise RuntimeError(f"the gRPC proxy did not start on port {port}")
            time.sleep(0.2)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        proxy.terminate()
        proxy.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
