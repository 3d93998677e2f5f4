"""Which database driver a storage URL gets: ``mysql://`` and ``mariadb://`` name an installed one.

SQLAlchemy reads a URL without a driver (``mysql://``) as its default DBAPI for that server,
MySQLdb, which this project does not install; its ``mysql`` extra installs PyMySQL. A URL that
names no driver is therefore given the first installed of :data:`MYSQL_DRIVERS`, and a URL whose
driver is not installed fails with one line that names the extra, before any connection is tried.
``postgresql://`` needs nothing here: SQLAlchemy's default for it is psycopg, a dependency.
"""

from __future__ import annotations

import importlib

import sqlalchemy.engine
import sqlalchemy.exc

from storage._urls import GRPC_SCHEME, StorageError, mask_url

__all__ = ["MYSQL_DRIVERS", "MYSQL_INSTALL", "with_driver"]

MYSQL_DRIVERS = (("pymysql", "pymysql"), ("mysqldb", "MySQLdb"), ("mariadbconnector", "mariadb"))
"""(SQLAlchemy driver name, module to import) for MySQL and MariaDB, in order of preference:
PyMySQL first, since it is what ``pip install 'dataloader-tuner[mysql]'`` installs."""

MYSQL_INSTALL = "pip install 'dataloader-tuner[mysql]'"

_MYSQL_BACKENDS = ("mysql", "mariadb")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def with_driver(url: str) -> str:
    """``url`` with an installed driver named: ``mysql://`` becomes ``mysql+pymysql://``.

    Args:
        url: a storage URL as the user gave it.

    Returns:
        The URL to open: unchanged unless it is a MySQL or MariaDB URL without a driver.

    Raises:
        StorageError: a MySQL or MariaDB URL and no driver for it installed (one line, the
            password masked, naming the extra to install and the URL form).
    """
    if url.startswith(GRPC_SCHEME):
        return url
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return url  # open_storage says what is wrong with it
    backend = parsed.get_backend_name()
    if backend not in _MYSQL_BACKENDS:
        return url
    known = dict(MYSQL_DRIVERS)
    if "+" in parsed.drivername:
        driver = parsed.get_driver_name()
        if driver not in known or _importable(known[driver]):
            return url  # an unknown driver is SQLAlchemy's to refuse
        problem = f"its driver's module {known[driver]} is not installed"
    else:
        for driver, module in MYSQL_DRIVERS:
            if _importable(module):
                named = parsed.set(drivername=f"{backend}+{driver}")
                return named.render_as_string(hide_password=False)
        problem = "no MySQL driver is installed"
    # The URL form names no password: every message goes through mask_password.
    raise StorageError(
        f"cannot open storage {mask_url(url)}: {problem}; {MYSQL_INSTALL} (PyMySQL) "
        f"and write {backend}://USER@HOST:3306/DATABASE"
    )
