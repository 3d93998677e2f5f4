"""Shared fixtures: a real SQLite file per test, and the real PostgreSQL server when there is one.

PostgreSQL: ``TEST_DB_URL`` names a server database to create scratch databases beside (default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``). Locally a test may skip when no server
answers; under CI (``CI`` set) a missing server is a failure.

Under CI every skip is a failure (:func:`pytest_runtest_makereport`): CI installs every extra and
runs every server, so a test that cannot run there hides a broken set-up. Only tests marked
``gpu`` (they need, or need the absence of, a GPU that NVML reads) may skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from storage import mask_password
from storage.testing import scratch_database
from tests.cli_runner import CliRunner

ROOT = Path(__file__).resolve().parents[1]

# Bytecode is written, whatever the environment says (PYTHONDONTWRITEBYTECODE is set on this
# project's machines): the suite starts about 140 interpreters, each of which would otherwise
# compile the project's modules again, and pytest would rewrite every test module on each run.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # Hugging Face tests build models from configs
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


_running_test: pytest.Item | None = None
"""The test being set up or run, for :func:`_python`'s check that a study runs only in a
``slow`` test (module-scoped fixtures run during the first test's set-up)."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _running_test
    _running_test = item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Turn a skip into a failure under CI (``CI`` set), but for tests marked ``gpu``."""
    report = yield
    if (
        report.skipped
        and os.environ.get("CI")
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("gpu") is None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {reason}"
    return report


FRESH_SIGNAL_HANDLERS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
"""The handlers a Python process starts with."""


@pytest.fixture
def fresh_signal_handlers() -> Iterator[None]:
    """SIGTERM and SIGINT as a Python process started from a terminal has them, here and in the
    children started from here (a handler is reset to the default across exec, but an ignored
    signal stays ignored): a test runner may have its own, and a suite started as a shell's
    background job (``cmd &`` in a script) starts with SIGINT ignored, so a study it starts
    would rightly ignore Ctrl-C, as a ``nohup`` job does."""
    previous = {sig: signal.signal(sig, handler) for sig, handler in FRESH_SIGNAL_HANDLERS.items()}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


def _admin_url() -> str:
    return os.environ.get("TEST_DB_URL", DEFAULT_ADMIN_URL)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(scratch_database(_admin_url(), "tuner_test"))
        except sqlalchemy.exc.OperationalError as error:
            if os.environ.get("CI"):
                pytest.fail(f"PostgreSQL is required in CI: {error}")
            pytest.skip("no PostgreSQL server reachable")
        yield url


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <args>`` as a user would, from the repository's Python."""
    return _python(["-m", *args], cwd, env, timeout)


@pytest.fixture(scope="session")
def cli_runner() -> Iterator[CliRunner]:
    """One pre-imported interpreter whose forked children run ``python -m`` commands."""
    with CliRunner() as runner:
        yield runner


def forked_cli(
    runner: CliRunner, *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` as :func:`run_cli` runs it, in a child of ``runner``.

    The same argv through the module's ``__main__``, exit code, stdout and stderr; what it
    cannot show (the environment read at interpreter start or import) is in tests/cli_runner.py.
    """
    result = runner.run(list(args), cwd or ROOT, timeout=timeout)
    _no_study_in_the_fast_path(list(args), result.returncode)
    return result


def run_python(
    code: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c <code>`` in a fresh interpreter that imports this checkout."""
    return _python(["-c", code], cwd, env, timeout)


def _python(
    argv: list[str], cwd: Path | None, env: dict[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if argv[0] == "-m":
        _no_study_in_the_fast_path(argv[1:], result.returncode)
    return result


def _no_study_in_the_fast_path(argv: list[str], returncode: int) -> None:
    """Fail a test that ran a study unless it is marked ``slow``.

    A study that got past its flags (exit 2 is a refused input) ran: the fast path
    (-m "not slow") must not hold it.
    """
    if argv[:1] == ["tuner.study"] and returncode != 2:
        test = _running_test
        if test is not None and test.get_closest_marker("slow") is None:
            pytest.fail(f"{test.nodeid} runs a study: mark it @pytest.mark.slow")


QUICK_TRIALS = ("--trial-seconds", "0.4", "--warmup-seconds", "0.1", "--no-progress")
"""Short windows that keep a study of the tests' small workloads to seconds."""


def study_cli(
    storage: str, objective: str, *flags: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m tuner.study --hardware auto`` with short trials on ``storage``."""
    args = ["--hardware", "auto", "--objective", objective, "--storage", storage, *QUICK_TRIALS]
    return run_cli("tuner.study", *args, *flags, cwd=cwd)


def best_cli(storage: str, objective: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m tuner.best --hardware auto`` on ``storage``."""
    args = ["--hardware", "auto", "--objective", objective, "--storage", storage]
    return run_cli("tuner.best", *args, *flags)


# --- MySQL / MariaDB -------------------------------------------------------------------------
# ``TEST_MYSQL_URL`` names a server database to create scratch databases beside, as TEST_DB_URL
# does for PostgreSQL (.ci/run creates one, with a user of its own and a password). Locally a
# test may skip when no server answers; under CI a missing server or driver is a failure.

MYSQL_URL = os.environ.get("TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """A fresh, empty MySQL/MariaDB database for one test; dropped afterwards."""
    try:
        import pymysql  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("PyMySQL is required in CI: pip install -e '.[test]'")
        pytest.skip("PyMySQL is not installed")
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(scratch_database(MYSQL_URL, "tuner_test"))
        except sqlalchemy.exc.OperationalError as error:
            if os.environ.get("CI"):
                pytest.fail(f"MySQL/MariaDB is required in CI: {mask_password(str(error))}")
            pytest.skip("no MySQL/MariaDB server reachable")
        yield url


SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]
"""The fleet's servers, for ``server_url``: the same test runs on each."""


@pytest.fixture(params=SERVERS)
def server_url(request: pytest.FixtureRequest) -> str:
    """A fresh database on each fleet server in turn: PostgreSQL, then MySQL/MariaDB."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def server_url_with_password(server_url: str) -> Iterator[tuple[str, str]]:
    """``server_url`` as a user with a password would write it, and that password.

    PostgreSQL here trusts local connections, so any password is accepted. MySQL checks it: a
    URL that carries one (.ci/run's) is used as it is; otherwise a user with a password is
    created for the test on its database, and dropped afterwards.
    """
    parsed = sqlalchemy.engine.make_url(server_url)
    if parsed.password:
        yield server_url, str(parsed.password)
        return
    secret = f"s3cret-{uuid.uuid4().hex[:10]}"
    if parsed.get_backend_name() == "postgresql":
        yield parsed.set(password=secret).render_as_string(hide_password=False), secret
        return
    user = f"tuner_pw_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(server_url, poolclass=sqlalchemy.pool.NullPool)
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{secret}'"))
        connection.execute(
            sqlalchemy.text(f"GRANT ALL PRIVILEGES ON `{parsed.database}`.* TO '{user}'@'%'")
        )
    try:
        yield (
            parsed.set(username=user, password=secret).render_as_string(hide_password=False),
            secret,
        )
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"DROP USER IF EXISTS '{user}'@'%'"))
        admin.dispose()
