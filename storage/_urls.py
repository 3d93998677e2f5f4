"""Storage URLs: the default, validation, and masking of passwords wherever a URL is shown."""

from __future__ import annotations

import os
import re
from pathlib import Path

import sqlalchemy.engine
import sqlalchemy.exc

__all__ = [
    "DEFAULT_STORAGE_URL",
    "StorageError",
    "default_storage_url",
    "mask_password",
    "mask_url",
]

DEFAULT_STORAGE_URL = "sqlite:///tuner.db"
"""An SQLite file in the working directory: embedded, nothing to start."""

GRPC_SCHEME = "grpc://"

# user:password@ inside anything that looks like a URL, for text we cannot parse (error messages).
_PASSWORD_IN_TEXT = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*):(?P<pw>[^@\s]+)@")


class StorageError(ValueError):
    """A storage URL that cannot be used; its message is one line with the password masked."""


def default_storage_url() -> str:
    """``TUNER_STORAGE`` when set, else the SQLite file beside the user."""
    return os.environ.get("TUNER_STORAGE") or DEFAULT_STORAGE_URL


def mask_url(url: str) -> str:
    """The URL as it may be printed or stored: any password becomes ``***``."""
    if url.startswith(GRPC_SCHEME):
        return url
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return mask_password(url)


def mask_password(text: str) -> str:
    """Mask ``scheme://user:password@`` wherever it appears in free text, such as a driver error."""
    return _PASSWORD_IN_TEXT.sub(r"\g<scheme>:***@", text)


def sqlite_file_missing(url: str) -> bool:
    """True for an SQLite URL whose file does not exist: reading it must not create it."""
    if url.startswith(GRPC_SCHEME):
        return False
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return False
    database = parsed.database
    return (
        parsed.get_backend_name() == "sqlite"
        and bool(database)
        and database != ":memory:"
        and not Path(database).exists()
    )
