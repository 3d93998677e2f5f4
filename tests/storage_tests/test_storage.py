from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from storage import (
    LostConnectionFilter,
    StorageError,
    default_storage_url,
    engine_options,
    mask_password,
    mask_url,
    open_storage,
    storage_lock,
    with_driver,
    with_retry,
)


def test_default_url_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    assert default_storage_url() == "sqlite:///tuner.db"
    monkeypatch.setenv("TUNER_STORAGE", "postgresql+psycopg://u@h/db")
    assert default_storage_url() == "postgresql+psycopg://u@h/db"


def test_passwords_are_masked() -> None:
    assert (
        mask_url("postgresql+psycopg://bob:s3cret@db:5432/x")
        == "postgresql+psycopg://bob:***@db:5432/x"
    )
    assert "s3cret" not in mask_password('connection to "mysql://bob:s3cret@h/x" refused')
    assert mask_url("sqlite:///tuner.db") == "sqlite:///tuner.db"


def test_engine_options_fit_a_fleet() -> None:
    options = engine_options("postgresql+psycopg://u@h/db")
    assert options["pool_pre_ping"] is True and options["pool_size"] <= 4
    assert "timeout" in engine_options("sqlite:///x.db")["connect_args"]


def test_open_creates_a_real_sqlite_file(sqlite_url: str, tmp_path: Path) -> None:
    storage = open_storage(sqlite_url)
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert (tmp_path / "tuner.db").exists()
    assert len(optuna.load_study(study_name="s", storage=sqlite_url).trials) == 2


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("nonsense", "not a storage URL"),
        ("foo://bar", "cannot open storage"),
        ("postgresql+psycopg://bob:s3cret@127.0.0.1:1/x", "cannot reach storage"),
        ("mysql://bob:s3cret@127.0.0.1:1/x", "cannot reach storage mysql://bob:***@"),
        ("mariadb+pymysql://bob:s3cret@127.0.0.1:1/x", "cannot reach storage"),
        ("mysql+mysqldb://bob:s3cret@127.0.0.1:1/x", "pip install 'dataloader-tuner[mysql]'"),
        ("sqlite:////nonexistent-dir/deeper/x.db", "cannot"),
    ],
)
def test_bad_urls_fail_with_one_masked_line(url: str, fragment: str) -> None:
    with pytest.raises(StorageError) as raised:
        open_storage(url)
    message = str(raised.value)
    assert fragment in message
    assert "s3cret" not in message
    assert "\n" not in message


def _hold(url: str, key: str, hold_s: float, log: str) -> None:
    with storage_lock(url, key):
        with open(log, "a") as handle:
            handle.write(f"in {time.time()}\n")
        time.sleep(hold_s)
        with open(log, "a") as handle:
            handle.write(f"out {time.time()}\n")


def _assert_serialised(log: Path) -> None:
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["in", "out"] * (len(events) // 2), events


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_storage_lock_serialises_processes(
    backend: str, sqlite_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = sqlite_url if backend == "sqlite" else request.getfixturevalue(f"{backend}_url")
    log = tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_hold, args=(url, "k", 0.3, str(log))) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert all(p.exitcode == 0 for p in processes)
    _assert_serialised(log)


def _try_once_held(url: str, key: str, held: str, trying: str, log: str) -> None:
    """Start at once (the interpreter's start overlaps the holder's); try once it holds."""
    while not Path(held).exists():
        time.sleep(0.02)
    Path(trying).touch()
    _hold(url, key, 0.0, log)


def _hold_until_killed(url: str, key: str, held: str) -> None:
    with storage_lock(url, key):
        Path(held).touch()
        time.sleep(600)


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_a_lock_whose_holder_is_sigkilled_is_released(
    backend: str, sqlite_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = sqlite_url if backend == "sqlite" else request.getfixturevalue(f"{backend}_url")
    held = tmp_path / "held"
    context = multiprocessing.get_context("spawn")
    log, trying = tmp_path / "log", tmp_path / "trying"
    holder = context.Process(target=_hold_until_killed, args=(url, "k", str(held)))
    waiter = context.Process(
        target=_try_once_held, args=(url, "k", str(held), str(trying), str(log)), daemon=True
    )
    holder.start()
    waiter.start()
    try:
        deadline = time.monotonic() + 60
        while not trying.exists():
            assert holder.is_alive() and time.monotonic() < deadline, "the holder never held it"
            assert waiter.is_alive(), "the waiter ended before it tried"
            time.sleep(0.02)
        time.sleep(0.5)
        assert not log.exists()  # the lock is held: the waiter, started, waits
        os.kill(holder.pid, signal.SIGKILL)
        waiter.join(60)
        assert waiter.exitcode == 0
        assert log.read_text().split()[::2] == ["in", "out"]
    finally:
        for process in (holder, waiter):
            process.kill()
            process.join(10)


def test_with_retry_rides_out_connection_errors() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlalchemy.exc.OperationalError(
                "SELECT 1", {}, Exception("server closed the connection")
            )
        return "ok"

    assert with_retry(flaky, "testing", retry_seconds=30, sleep=lambda s: None) == "ok"
    assert len(calls) == 3


def test_with_retry_does_not_hide_other_errors() -> None:
    def broken() -> None:
        raise sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(sqlalchemy.exc.IntegrityError):
        with_retry(broken, "testing", retry_seconds=30, sleep=lambda s: None)


def test_mysql_storage_opens_with_fleet_options(mysql_url: str) -> None:
    as_a_user_writes_it = mysql_url.replace("mysql+pymysql://", "mysql://")  # no driver named
    storage = open_storage(as_a_user_writes_it)
    study = optuna.create_study(storage=storage, study_name="m")
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    assert len(optuna.load_study(study_name="m", storage=mysql_url).trials) == 2


@pytest.mark.parametrize(
    ("url", "opened"),
    [
        ("mysql://u:pw@h:3306/db", "mysql+pymysql://u:pw@h:3306/db"),
        ("mariadb://u@h/db?charset=utf8mb4", "mariadb+pymysql://u@h/db?charset=utf8mb4"),
        ("mysql+pymysql://u@h/db", "mysql+pymysql://u@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_a_mysql_url_gets_the_installed_driver(url: str, opened: str) -> None:
    pytest.importorskip("pymysql")
    assert with_driver(url) == opened


def test_without_a_mysql_driver_the_line_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("pymysql", "MySQLdb", "mariadb"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails, as when not installed
    with pytest.raises(StorageError) as raised:
        open_storage("mysql://bob:s3cret@127.0.0.1:3306/x")
    message = str(raised.value)
    assert "pip install 'dataloader-tuner[mysql]'" in message
    assert "mysql://USER@HOST:3306/DATABASE" in message
    assert "s3cret" not in message and "\n" not in message


def test_a_server_shutting_down_is_told_from_a_wrong_url() -> None:
    from storage._open import _server_restarting

    pymysql = pytest.importorskip("pymysql")
    shutting_down = pymysql.err.OperationalError(1053, "Server shutdown in progress")
    denied = pymysql.err.OperationalError(1045, "Access denied for user 'bob'")
    wrapped = sqlalchemy.exc.OperationalError("SELECT 1", {}, shutting_down)
    assert _server_restarting(wrapped)
    assert not _server_restarting(sqlalchemy.exc.OperationalError("SELECT 1", {}, denied))


def test_a_pooled_connection_the_server_dropped_is_one_line_not_a_traceback() -> None:
    pymysql = pytest.importorskip("pymysql")
    lost = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    try:
        raise lost
    except pymysql.err.OperationalError:
        exc_info = sys.exc_info()
    formatter = logging.Formatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "sqlalchemy.pool.impl.QueuePool",
        logging.ERROR,
        "",
        0,
        "Exception during reset",
        (),
        exc_info,
    )
    assert LostConnectionFilter().filter(record)
    text = formatter.format(record)
    assert text.startswith("WARNING a database connection was lost and is replaced")
    assert "Lost connection" in text and "Traceback" not in text and "\n" not in text
    other = logging.LogRecord("tuner", logging.ERROR, "", 0, "kept", (), exc_info)
    assert LostConnectionFilter().filter(other) and other.exc_info is exc_info
