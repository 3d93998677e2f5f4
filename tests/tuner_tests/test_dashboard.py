"""``tuner.dashboard`` names the tuner's best as the dashboard's best trial, over HTTP.

optuna-dashboard's study page shows ``best_trials`` from its storage's ``get_best_trial``; on a
study whose re-measurement picked another trial than the highest window, the real server
started by ``python -m tuner.dashboard`` must answer with the trial ``tuner.best`` names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.conftest import ROOT, free_port
from tuner.dashboard import TunerBestStorage
from tuner.insight._best import optuna_best, study_best


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def served(remeasured_url: str) -> Iterator[tuple[str, optuna.Study]]:
    """The real dashboard server on a study where Optuna's best and the tuner's differ."""
    url = remeasured_url
    study = optuna.load_study(study_name="remeasured@local-test", storage=url)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tuner.dashboard", "--storage", url, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                _get(f"{base}/api/studies")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "tuner.dashboard did not answer within 30 s"
                time.sleep(0.2)
        yield base, study
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_the_dashboards_best_is_the_tuners(served: tuple[str, optuna.Study]) -> None:
    base, study = served
    chosen, theirs = study_best(study), optuna_best(study)
    assert chosen is not None and theirs is not None and chosen.trial_number != theirs.number
    (listed,) = _get(f"{base}/api/studies")["study_summaries"]
    detail = _get(f"{base}/api/studies/{listed['study_id']}")
    assert [trial["number"] for trial in detail["best_trials"]] == [chosen.trial_number]


def test_a_study_the_tuner_did_not_write_gets_optunas_best(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    study = optuna.create_study(storage=url, study_name="other", direction="maximize")
    for value in (1.0, 3.0, 2.0):
        study.add_trial(optuna.trial.create_trial(value=value))
    storage = TunerBestStorage(url)
    best = storage.get_best_trial(storage.get_study_id_from_name("other"))
    assert best.number == study.best_trial.number == 1
