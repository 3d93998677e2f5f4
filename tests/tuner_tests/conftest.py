"""Measured studies that several modules use, each built once per session.

Building one measures its trials for real (seconds each). The tests that only read one share
its file; a test that writes takes a copy (:func:`copy_of_sqlite_study`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy

from storage import artifact_dir_for
from tests.tuner_tests.test_note import remeasured_the_other_way
from tests.tuner_tests.test_report import build_measured_study


@pytest.fixture(scope="session")
def measured_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The storage of study ``starving@local-test``: both baselines and three tuned settings."""
    url = f"sqlite:///{tmp_path_factory.mktemp('measured') / 'tuner.db'}"
    build_measured_study(url)
    return url


@pytest.fixture(scope="session")
def remeasured_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The storage of study ``remeasured@local-test``, whose re-measurement picked another
    trial than Optuna's highest window."""
    url = f"sqlite:///{tmp_path_factory.mktemp('remeasured') / 'tuner.db'}"
    remeasured_the_other_way(url)
    return url


def copy_of_sqlite_study(url: str, folder: Path) -> str:
    """A copy in ``folder`` of the SQLite file at ``url`` and its artifacts; the copy's URL."""
    database = Path(str(sqlalchemy.engine.make_url(url).database))
    copy = folder / database.name
    shutil.copyfile(database, copy)
    copy_url = f"sqlite:///{copy}"
    shutil.copytree(artifact_dir_for(url), artifact_dir_for(copy_url))
    return copy_url
