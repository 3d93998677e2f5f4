"""Where studies live: an SQLite file by default, PostgreSQL or MySQL/MariaDB for a fleet.

Open storages with :func:`open_storage`; print URLs only through :func:`mask_url`. The trials'
files live in Optuna's artifact store beside the database (:func:`open_artifact_store`).
"""

from storage._artifacts import (
    ARTIFACT_DIR_NAME,
    artifact_dir_for,
    open_artifact_store,
    read_trial_text,
    upload_trial_csv,
)
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
    "ARTIFACT_DIR_NAME",
    "DEFAULT_STORAGE_URL",
    "LostConnectionFilter",
    "StorageError",
    "artifact_dir_for",
    "default_storage_url",
    "engine_options",
    "is_connection_error",
    "mask_password",
    "mask_url",
    "open_artifact_store",
    "open_storage",
    "read_trial_text",
    "sqlite_file_missing",
    "storage_lock",
    "upload_trial_csv",
    "with_driver",
    "with_retry",
]
