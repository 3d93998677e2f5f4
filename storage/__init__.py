"""Where studies live: an SQLite file by default, PostgreSQL or MySQL/MariaDB for a fleet.

Open storages with :func:`open_storage`; print URLs only through :func:`mask_url`.
"""

from storage._drivers import with_driver
from storage._lock import storage_lock
from storage._open import engine_options, open_storage
from storage._retry import LostConnectionFilter, is_connection_error, with_retry
from storage._urls import (
    DEFAULT_STORAGE_URL,
    StorageError,
    default_storage_url,
    mask_password,
    mask_url,
    sqlite_file_missing,
)

__all__ = [
    "DEFAULT_STORAGE_URL",
    "LostConnectionFilter",
    "StorageError",
    "default_storage_url",
    "engine_options",
    "is_connection_error",
    "mask_password",
    "mask_url",
    "open_storage",
    "sqlite_file_missing",
    "storage_lock",
    "with_driver",
    "with_retry",
]
