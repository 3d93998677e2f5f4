"""Many workers, one study, on each real server (PostgreSQL and MariaDB, ``server_url``): exact
totals, baselines once, a killed worker's trial retried, a database restart ridden out, passwords
never shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from storage.testing import can_restart_local_server, start_local_server, stop_local_server
from tests.conftest import ROOT, free_port, run_cli
from tuner._attrs import stored_settings
from tuner.machine import auto_profile_name, detect_fingerprint
from tuner.pipeline import PROFILE_ATTR
from tuner.run._pipeline import MODEL_SEED_ATTR, WORKER_RANGE_ATTR

FAST = "tests.tuner_tests.workloads:fast"
STUDY = f"{FAST}@{auto_profile_name(detect_fingerprint())}"
QUICK = [
    "--trial-seconds",
    "0.5",
    "--warmup-seconds",
    "0.1",
    "--no-progress",
    "--remeasure-top",
    "0",
]
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def _worker(url: str, *extra: str, sampler: str | None = "gp") -> subprocess.Popen[str]:
    """A fleet worker; ``gp`` unless told, since most tests here count on the fleet's total
    being reached (the default ``model`` strategy ends a study once its best has held, which
    may come first). ``sampler=None`` runs the default."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner.study",
            "--hardware",
            "auto",
            *(["--sampler", sampler] if sampler else []),
            "--objective",
            FAST,
            "--storage",
            url,
            *QUICK,
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=STUDY, storage=url).trials


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except KeyError:
            pass  # the study does not exist yet
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_three_workers_finish_exactly_the_total_with_baselines_once(server_url: str) -> None:
    workers = [_worker(server_url, "--total-trials", "9", "--n-trials", "50") for _ in range(3)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (_, stderr) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, stderr
    trials = _trials(server_url)
    assert sum(t.state in FINISHED for t in trials) == 9
    assert sorted(
        t.user_attrs.get("baseline", "") for t in trials if "baseline" in t.user_attrs
    ) == [
        "pytorch-default",
        "rule-of-thumb",
    ]
    best = run_cli(
        "tuner.best",
        "--hardware",
        "auto",
        "--objective",
        FAST,
        "--storage",
        server_url,
        "--format",
        "json",
    )
    assert best.returncode == 0, best.stderr
    assert "num_workers" in json.loads(best.stdout)["dataloader"]


@pytest.mark.slow
def test_two_workers_under_the_default_strategy_share_one_profile_and_one_seed(
    server_url: str,
) -> None:
    """The pipeline profile and the worker range are stored once; the baselines and the model's
    predicted best are queued once; the model's proposals, read with the other worker's trials
    pending, never repeat a setting."""
    workers = [
        _worker(server_url, "--total-trials", "8", "--n-trials", "50", sampler=None)
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (_, stderr) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, stderr
    study = optuna.load_study(study_name=STUDY, storage=server_url)
    assert PROFILE_ATTR in study.user_attrs
    assert WORKER_RANGE_ATTR in study.user_attrs
    trials = study.trials
    finished = [t for t in trials if t.state in FINISHED]
    assert 3 <= len(finished) <= 8
    baselines = [t.user_attrs["baseline"] for t in trials if "baseline" in t.user_attrs]
    assert sorted(baselines) == ["pytorch-default", "rule-of-thumb"]
    seeded = [t for t in trials if MODEL_SEED_ATTR in t.user_attrs]
    assert [t.user_attrs[MODEL_SEED_ATTR] for t in seeded].count("predicted-best") == 1
    settings = [json.dumps(stored_settings(t), sort_keys=True) for t in seeded]
    assert len(settings) == len(set(settings))


@pytest.mark.slow
def test_a_sigkilled_workers_trial_fails_and_its_retry_completes(server_url: str) -> None:
    fleet = [
        "--heartbeat-interval",
        "1",
        "--grace-period",
        "3",
        "--total-trials",
        "6",
        "--n-trials",
        "50",
    ]
    first = _worker(server_url, *fleet, "--trial-seconds", "4")
    try:
        _wait_for(
            lambda: any(
                t.state == TrialState.RUNNING and t.number >= 2 for t in _trials(server_url)
            ),
            240,
            "a running trial",
        )
        running = next(t for t in _trials(server_url) if t.state == TrialState.RUNNING)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    second = _worker(server_url, *fleet)
    _, stderr = second.communicate(timeout=600)
    assert second.returncode == 0, stderr
    trials = _trials(server_url)
    assert trials[running.number].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert retries and retries[-1].state == TrialState.COMPLETE
    assert retries[-1].params == running.params
    assert sum(t.state in FINISHED for t in trials) == 6


@pytest.mark.slow
def test_a_database_restart_mid_study_loses_nothing(
    server_url_with_password: tuple[str, str],
) -> None:
    url, secret = server_url_with_password
    if not can_restart_local_server(url):
        pytest.skip("needs this machine's own server and its tools")
    worker = _worker(url, "--total-trials", "10", "--n-trials", "50", "--trial-seconds", "1")
    try:
        _wait_for(lambda: sum(t.state in FINISHED for t in _trials(url)) >= 3, 240, "three trials")
        stop_local_server(url)
        time.sleep(4)  # a trial finishes while the database is down
        start_local_server(url)
        _, stderr = worker.communicate(timeout=600)
    finally:
        start_local_server(url)
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, stderr
    assert "database unreachable" in stderr
    assert secret not in stderr
    trials = _trials(url)
    assert sum(t.state in FINISHED for t in trials) == 10
    assert [t.number for t in trials] == list(range(len(trials)))
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.FAIL)]


@pytest.mark.slow
def test_passwords_never_appear(server_url_with_password: tuple[str, str]) -> None:
    url, secret = server_url_with_password
    result = run_cli(
        "tuner.study",
        "--hardware",
        "auto",
        "--objective",
        FAST,
        "--storage",
        url,
        "--n-trials",
        "2",
        *QUICK,
    )
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    assert "***" in result.stderr
    study = optuna.load_study(study_name=STUDY, storage=url)
    dumped = json.dumps(
        [
            study.user_attrs,
            [t.user_attrs for t in study.trials],
            [t.system_attrs for t in study.trials],
        ]
    )
    assert secret not in dumped
    listed = run_cli("tuner.profiles", "list", "--storage", url)
    assert listed.returncode == 0, listed.stderr
    assert secret not in listed.stdout + listed.stderr
    assert STUDY.split("@")[1] in listed.stdout  # it read the study's profile, not nothing
    parsed = sqlalchemy.engine.make_url(url)
    bad_urls = [
        url.rsplit("/", 1)[0] + "/no_such_db",  # a database that is not there
        parsed.set(port=free_port()).render_as_string(hide_password=False),  # no server
    ]
    if parsed.get_backend_name() != "postgresql":  # PostgreSQL here accepts any password
        bad_urls.append(parsed.set(password=secret + "-wrong").render_as_string(False))
    for bad_url in bad_urls:
        bad = run_cli("tuner.study", "--hardware", "auto", "--storage", bad_url, *QUICK)
        assert bad.returncode == 2, bad.stderr
        assert secret not in bad.stderr and "***" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
