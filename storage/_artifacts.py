"""Where trials' files live: Optuna's artifact store, a directory beside the database.

The store is a :class:`optuna.artifacts.FileSystemArtifactStore`; the database holds only each
artifact's meta (a trial system attr), so ``tuner.dashboard`` lists the files in the trial view
and ``tuner.report`` reads them back. The directory defaults to ``tuner-artifacts/`` beside an
SQLite file, else ``./tuner-artifacts``; ``--artifact-dir`` overrides it. A fleet on a server
database must give every worker and the dashboard the same directory (a shared mount), or each
machine keeps its own trials' files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial

from storage._retry import with_retry

__all__ = [
    "ARTIFACT_DIR_NAME",
    "artifact_dir_for",
    "open_artifact_store",
    "read_trial_text",
    "upload_trial_csv",
]

ARTIFACT_DIR_NAME = "tuner-artifacts"


def artifact_dir_for(storage_url: str, override: str | Path | None = None) -> Path:
    """The artifact directory for a storage: ``override``, else beside an SQLite file, else ./."""
    if override is not None:
        return Path(override).expanduser().resolve()
    try:
        parsed = sqlalchemy.engine.make_url(storage_url)
    except sqlalchemy.exc.ArgumentError:
        parsed = None
    if (
        parsed is not None
        and parsed.get_backend_name() == "sqlite"
        and parsed.database
        and parsed.database != ":memory:"
    ):
        return Path(parsed.database).expanduser().resolve().parent / ARTIFACT_DIR_NAME
    return Path.cwd() / ARTIFACT_DIR_NAME


def open_artifact_store(
    storage_url: str, override: str | Path | None = None
) -> FileSystemArtifactStore:
    """The store for ``storage_url``, its directory created if new."""
    directory = artifact_dir_for(storage_url, override)
    directory.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(directory)


def _frozen(study: optuna.Study, trial: optuna.Trial | FrozenTrial | int) -> FrozenTrial:
    if isinstance(trial, FrozenTrial):
        return trial
    trial_id = trial if isinstance(trial, int) else trial._trial_id
    return study._storage.get_trial(trial_id)


def upload_trial_csv(
    store: FileSystemArtifactStore,
    study: optuna.Study,
    trial: optuna.Trial | FrozenTrial | int,
    name: str,
    text: str,
) -> str:
    """Attach ``text`` to a running trial (a Trial, a FrozenTrial or a trial id) as ``name``.

    Returns the artifact id. The trial must not be finished yet: the artifact's meta is a trial
    system attr, which Optuna refuses on a finished trial, so upload before ``study.tell``. The
    database write is retried through a restart; a retry after a lost reply leaves one
    unreferenced file in the store.
    """
    frozen = _frozen(study, trial)
    with tempfile.TemporaryDirectory(prefix="tuner-artifact-") as scratch:
        path = Path(scratch) / name
        path.write_text(text, encoding="utf-8")
        return with_retry(
            lambda: upload_artifact(
                artifact_store=store,
                file_path=str(path),
                study_or_trial=frozen,
                storage=study._storage,
                mimetype="text/csv" if name.endswith(".csv") else None,
            ),
            "recording a trial's artifact",
        )


def read_trial_text(
    store: FileSystemArtifactStore, study: optuna.Study, trial: FrozenTrial, name: str
) -> str | None:
    """The text of the trial's artifact called ``name``, or None (not uploaded, or file gone)."""
    metas = [
        meta
        for meta in get_all_artifact_meta(trial, storage=study._storage)
        if meta.filename == name
    ]
    if not metas:
        return None
    try:
        with store.open_reader(metas[0].artifact_id) as reader:
            return reader.read().decode("utf-8")
    except ArtifactNotFound:
        return None
