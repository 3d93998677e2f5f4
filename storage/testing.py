"""Scratch databases on a real server, for tests and benchmarks (as ``optuna.testing`` serves
Optuna's own suites): created empty, dropped afterwards with whatever still holds them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy

__all__ = ["scratch_database"]


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
