"""Real servers for tests and benchmarks (as ``optuna.testing`` serves Optuna's own suites):
scratch databases, created empty and dropped afterwards with whatever still holds them, and the
gRPC storage proxy served on a free port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy

__all__ = ["scratch_database", "served_proxy"]

_CHECKOUT = Path(__file__).resolve().parents[1]


@contextmanager
def scratch_database(admin_url: str, prefix: str = "tuner_scratch") -> Iterator[str]:
    """A fresh database beside ``admin_url``'s (PostgreSQL or MySQL/MariaDB); its URL.

    Raises :class:`sqlalchemy.exc.OperationalError` on entry when the server does not answer.
    No pooling: a test may restart the server, and the drop needs a fresh connection.
    """
    admin = sqlalchemy.create_engine(
        admin_url, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
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
            connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {quoted}{force}"))
        admin.dispose()


@contextmanager
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
