"""Every kind of bad input, as a user meets it: ``python -m tuner.<verb>`` with the user's argv, one
line, the exit code, and the database as it was. Each case is a row of docs/bad-input.md.

Each command runs as ``__main__`` in a child forked from one pre-imported interpreter
(:class:`tests.cli_runner.CliRunner`: the same argv, exit code and stderr, without an interpreter
start per row). Rows that set an environment of their own, and one row of each verb (``fresh``),
run in a real ``python -m`` subprocess, so the path from interpreter start stays covered.

Refused inputs (``REFUSED``) stop before anything is written: exactly one line on stderr, no
traceback, exit code 2 (usage) or 1 (nothing to show, and the line says how to make it), and the
SQLite file holds the same rows as before (no file, where there was none). Workloads that are
wrong in the trial rather than in their spec (``FAILING``) cost their trials: each trial is FAIL
with its ``error``, the study goes on to the end, and the run exits 1 with one last line saying
that no trial finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from tqdm import tqdm

from tests.cli_runner import CliRunner
from tests.conftest import QUICK_TRIALS, ROOT, forked_cli, free_port, run_cli

W = "tests.tuner_tests.workloads"
PG = "postgresql+psycopg://{user}@127.0.0.1:5432/{database}"
WITHOUT_MYSQL_DRIVER = os.pathsep.join([str(ROOT / "tests" / "without_mysql_driver"), str(ROOT)])
"""A PYTHONPATH on which every MySQL driver fails to import, as on a machine without one."""
WITH_ONE_CUDA_GPU = os.pathsep.join([str(ROOT / "tests" / "with_one_cuda_gpu"), str(ROOT)])
"""A PYTHONPATH on which torch reports one CUDA GPU, as on a 1-GPU machine."""
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:{free_port}/tuner"


@dataclass(frozen=True)
class Case:
    """One row: the arguments after ``python -m``, what the one line says, the exit code."""

    id: str
    argv: tuple[str, ...]
    says: str
    exit_code: int = 2
    setup: Callable[[Path], object] | None = None
    needs_postgres: bool = False
    env: tuple[tuple[str, str], ...] = ()
    locked: bool = False
    """Another process holds a write lock on the SQLite file while the CLI runs."""
    fresh: bool = False
    """Run in a fresh interpreter (a real ``python -m`` subprocess): the verb's row for the path
    from interpreter start. A row with ``env`` always is: what it sets may be read at start or
    at import (``PYTHONPATH``, ``TUNER_DB_RETRY_SECONDS``), which the runner did before it."""

    @property
    def in_fresh_interpreter(self) -> bool:
        return self.fresh or bool(self.env)


def study(*flags: str) -> tuple[str, ...]:
    return ("tuner.study", "--hardware", "auto", "--storage", "{db}", *QUICK_TRIALS, *flags)


def best(*flags: str) -> tuple[str, ...]:
    return ("tuner.best", "--hardware", "auto", "--storage", "{db}", *flags)


def report(*flags: str) -> tuple[str, ...]:
    return ("tuner.report", "--hardware", "auto", "--storage", "{db}", *flags)


def dashboard(port: str) -> tuple[str, ...]:
    return ("tuner.dashboard", "--storage", "{db}", "--port", port)


def _write(name: str, text: str) -> Callable[[Path], object]:
    return lambda tmp: (tmp / name).write_text(text)


def _study_of_another_objective(tmp: Path) -> None:
    """A study named ``shared`` that the text workload created, as a first run would leave it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    created = optuna.create_study(
        study_name="shared", storage=f"sqlite:///{tmp / 'tuner.db'}", direction="maximize"
    )
    created.set_user_attr("objective", "text")
    created.set_user_attr("profile", {"name": "auto"})
    created.set_user_attr("workload_options", {})


def _sqlite_file_of_another_tool(tmp: Path) -> None:
    sqlite3.connect(tmp / "tuner.db").execute("CREATE TABLE other_tool (x)").connection.commit()


@contextlib.contextmanager
def _write_lock_held(path: Path) -> Iterator[None]:
    """Another process's write transaction on the file (a thread here), for the block."""
    ready, done = threading.Event(), threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, check_same_thread=False)
        connection.execute("BEGIN EXCLUSIVE")
        ready.set()
        done.wait(120)
        connection.rollback()
        connection.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    ready.wait(10)
    try:
        yield
    finally:
        done.set()
        holder.join(10)


REFUSED = [
    Case("unknown-flag", study("--n-trails", "5"), "unrecognized arguments: --n-trails"),
    Case("n-trials-not-a-number", study("--n-trials", "many"), "invalid int value: 'many'"),
    Case("n-trials-zero", study("--n-trials", "0"), "--n-trials must be positive, got 0"),
    Case("total-trials-negative", study("--total-trials", "-3"), "--total-trials must be positive"),
    Case("timeout-negative", study("--timeout", "-5"), "--timeout must be positive"),
    Case("trial-seconds-zero", study("--trial-seconds", "0"), "--trial-seconds must be positive"),
    Case("memory-limit-not-a-size", study("--memory-limit", "lots"), "memory limit"),
    Case("memory-limit-above-100%", study("--memory-limit", "150%"), "memory limit"),
    Case("shm-limit-zero", study("--shm-limit", "0"), "memory limit"),
    Case("heartbeat-interval-zero", study("--heartbeat-interval", "0"), "--heartbeat-interval"),
    Case("remeasure-top-negative", study("--remeasure-top", "-1"), "--remeasure-top"),
    Case("unknown-profile", study("--hardware", "no-such-box"), "no-such-box"),
    Case("profile-of-another-machine", study("--hardware", "p4d.24xlarge"), "does not match"),
    Case(
        "profiles-file-missing",
        study("--profiles", "{tmp}/missing.json"),
        "missing.json",
    ),
    Case(
        "profiles-file-not-json",
        study("--profiles", "{tmp}/profiles.json"),
        "profiles.json",
        setup=_write("profiles.json", '{"box": {"vcpus": 4,'),
    ),
    Case(
        "profiles-file-bad-profile",
        study("--profiles", "{tmp}/profiles.json", "--hardware", "box"),
        "box",
        setup=_write("profiles.json", json.dumps({"box": {"vcpus": "four"}})),
    ),
    Case("storage-not-a-url", study("--storage", "nonsense"), "not a storage URL"),
    Case(
        "storage-driver-not-installed",
        study("--storage", "mysql+nosuchdriver://u@127.0.0.1/db"),
        "cannot open storage",
    ),
    Case(
        "storage-mysql-driver-missing",
        study("--storage", "mysql://tuner:s3cret@127.0.0.1:3306/tuner"),
        "no MySQL driver is installed; pip install 'dataloader-tuner[mysql]'",
        env=(("PYTHONPATH", WITHOUT_MYSQL_DRIVER),),
    ),
    Case(
        "storage-mysql-unreachable",
        study("--storage", "mysql://tuner:s3cret@127.0.0.1:{free_port}/tuner"),
        "cannot reach storage mysql://tuner:***@127.0.0.1:",
    ),
    Case(
        "storage-unreachable",
        study("--storage", "postgresql+psycopg://postgres@127.0.0.1:{free_port}/tuner"),
        "cannot reach storage",
    ),
    Case(
        "storage-unreachable-with-a-password",
        study("--storage", "postgresql+psycopg://bob:s3cret@127.0.0.1:{free_port}/tuner"),
        "postgresql+psycopg://bob:***@127.0.0.1",
    ),
    Case(
        "storage-unknown-user-and-password",
        study("--storage", PG.format(user="nobody:s3cret", database="postgres")),
        'role "nobody" does not exist',
        needs_postgres=True,
    ),
    Case(
        "storage-no-such-database",
        study("--storage", PG.format(user="postgres", database="no_such_tuner_db")),
        'database "no_such_tuner_db" does not exist',
        needs_postgres=True,
    ),
    Case(
        "sqlite-folder-missing",
        study("--storage", "sqlite:///{tmp}/no/such/folder/tuner.db"),
        "folder",
    ),
    Case(
        "sqlite-file-locked",
        study("--objective", f"{W}:fast"),
        "database is locked",
        setup=_sqlite_file_of_another_tool,
        env=(("TUNER_DB_RETRY_SECONDS", "2"),),
        locked=True,
    ),
    Case("grpc-url-without-port", study("--storage", "grpc://proxyhost"), "grpc://HOST:PORT"),
    Case("objective-not-a-spec", study("--objective", "imagenet"), "is not a built-in"),
    Case(
        "objective-module-missing",
        study("--objective", "no_such_pkg.data:workload"),
        "no module named 'no_such_pkg.data'",
    ),
    Case("objective-attr-missing", study("--objective", f"{W}:nope"), "has no attribute 'nope'"),
    Case(
        "objective-file-missing",
        study("--objective", "{tmp}/train_data.py:make_workload"),
        "does not exist",
    ),
    Case(
        "objective-raises-at-import",
        study("--objective", "{tmp}/broken_data.py:make_workload"),
        "importing 'broken_data' failed: RuntimeError: no data mounted",
        setup=_write("broken_data.py", "raise RuntimeError('no data mounted at /data')\n"),
    ),
    Case(
        "objective-returns-no-workload",
        study("--objective", f"{W}:not_a_workload"),
        "returned a value of type NoneType",
    ),
    Case("dataset-of-length-0", study("--objective", f"{W}:empty"), "is empty (length 0)"),
    Case(
        "dataloader-with-its-own-batch-sampler",
        study("--objective", "tests.objectives_tests.dataloader_script:own_batch_sampler"),
        "has a batch_sampler of its own, which the tuner cannot size",
    ),
    Case(
        "lightning-combined-loaders",
        study("--objective", "tests.objectives_tests.lightning_script:combined_pair"),
        "returned a CombinedLoader of loaders",
    ),
    Case(
        "lightning-no-optimizer",
        study("--objective", "tests.objectives_tests.lightning_script:no_optimizer_pair"),
        "NoOptimizer.configure_optimizers() returned no optimizer",
    ),
    Case(
        "hf-trainer-without-train-dataset",
        study("--objective", "tests.objectives_tests.hf_script:no_dataset"),
        "the Trainer has no train_dataset",
    ),
    Case(
        "hf-streaming-dataset",
        study("--objective", "tests.objectives_tests.hf_script:streaming"),
        "iterable",
    ),
    Case("fix-unknown-parameter", study("--fix", "workers=2"), "workers"),
    Case("fix-bad-value", study("--fix", "num_workers=many"), "num_workers"),
    Case(
        "effective-batch-indivisible",
        study("--objective", f"{W}:fast", "--effective-batch", "7"),
        "no power of two",
    ),
    Case("device-cuda-without-gpu", study("--device", "cuda"), "CUDA is not available"),
    Case("device-unknown", study("--device", "tpu"), "--device must be auto, cpu or cuda"),
    Case(
        "nproc-per-node-zero",
        study("--nproc-per-node", "0"),
        "--nproc-per-node must be a positive count or auto, got '0'",
    ),
    Case(
        "nproc-per-node-more-than-the-gpus",
        study("--device", "cuda", "--nproc-per-node", "2"),
        "--nproc-per-node 2: this machine has 1 CUDA GPUs (one per rank)",
        env=(("PYTHONPATH", WITH_ONE_CUDA_GPU),),
    ),
    Case(
        "nproc-per-node-more-than-the-profiles-gpus",
        study("--hardware", "g4dn.xlarge", "--nproc-per-node", "2"),
        "--nproc-per-node 2: profile g4dn.xlarge has 1 GPU(s) (one per rank)",
    ),
    Case(
        "nproc-per-node-with-an-unshardable-sampler",
        study("--objective", f"{W}:own_sampler", "--nproc-per-node", "2"),
        "has its own sampler, which cannot be sharded",
    ),
    Case(
        "image-flag-for-text",
        study("--objective", "text", "--arch", "resnet50"),
        "--arch applies to --objective image only",
    ),
    Case(
        "text-flag-for-image",
        study("--objective", "image", "--vocab-size", "100"),
        "--vocab-size applies to --objective text only",
    ),
    Case(
        "text-vocab-too-small",
        study("--objective", "text", "--vocab-size", "1"),
        "vocab_size must be at least 2",
    ),
    Case("image-dir-missing", study("--image-dir", "{tmp}/no-images"), "no-images"),
    Case(
        "study-of-another-objective",
        study("--objective", f"{W}:fast", "--study-name", "shared"),
        "study shared was created for objective text",
        setup=_study_of_another_objective,
    ),
    Case(
        "best-without-a-study",
        ("tuner.best", "--hardware", "auto", "--storage", "{db}"),
        "no study",
        exit_code=1,
        fresh=True,
    ),
    Case(
        "best-unknown-profile",
        ("tuner.best", "--hardware", "no-such-box", "--storage", "{db}"),
        "no-such-box",
    ),
    Case("best-unknown-format", best("--format", "yaml"), "invalid choice: 'yaml'"),
    Case(
        "best-storage-unreachable",
        ("tuner.best", "--hardware", "auto", "--storage", UNREACHABLE),
        "cannot reach storage",
    ),
    Case(
        "report-without-a-study",
        report("--out", "{tmp}/r.html"),
        "no study",
        exit_code=1,
        fresh=True,
    ),
    Case("report-without-out", report(), "the following arguments are required: --out"),
    Case(
        "report-out-folder-missing",
        report("--out", "{tmp}/no/such/folder/r.html"),
        "not a file in an existing directory",
    ),
    Case(
        "report-unknown-profile",
        ("tuner.report", "--hardware", "nope", "--storage", "{db}", "--out", "r.html"),
        "nope",
    ),
    Case("dashboard-port-not-a-number", dashboard("web"), "invalid int value: 'web'"),
    Case("dashboard-port-out-of-range", dashboard("70000"), "--port must be 1..65535"),
    Case(
        "dashboard-storage-not-a-url",
        ("tuner.dashboard", "--storage", "nonsense"),
        "not a storage URL",
    ),
    Case(
        "dashboard-storage-unreachable",
        ("tuner.dashboard", "--storage", UNREACHABLE),
        "cannot reach storage",
        fresh=True,
    ),
    Case("profiles-without-a-verb", ("tuner.profiles",), "required: verb"),
    Case("profiles-unknown-verb", ("tuner.profiles", "remove"), "invalid choice: 'remove'"),
    Case("profiles-show-unknown", ("tuner.profiles", "show", "no-such-box"), "no-such-box"),
    Case(
        "profiles-list-storage-not-a-url",
        ("tuner.profiles", "list", "--storage", "nonsense"),
        "not a storage URL",
    ),
    Case(
        "profiles-catalog-missing",
        ("tuner.profiles", "detect", "--profiles", "{tmp}/missing.json"),
        "missing.json",
    ),
    Case(
        "profiles-catalog-not-json",
        ("tuner.profiles", "detect", "--profiles", "{tmp}/profiles.json"),
        "not valid JSON",
        setup=_write("profiles.json", '{"box": {"vcpus": 4,'),
        fresh=True,
    ),
]


def _expand(argv: tuple[str, ...], tmp: Path) -> list[str]:
    values = {"db": f"sqlite:///{tmp / 'tuner.db'}", "tmp": str(tmp), "free_port": free_port()}
    return [arg.format(**values) for arg in argv]


def _rows(path: Path) -> list[tuple[object, ...]] | None:
    """Every row of every table of the SQLite file, or None when there is no file."""
    if not path.exists():
        return None
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return sorted(
            (table, *row)
            for table in tables
            if table not in ("alembic_version", "version_info")
            for row in db.execute(f'SELECT * FROM "{table}"')
        )


def _postgres_up() -> bool:
    url = os.environ.get("TEST_DB_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    try:
        sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool).connect().close()
    except sqlalchemy.exc.OperationalError:
        return False
    return True


def _run_case(case: Case, tmp: Path, runner: CliRunner) -> subprocess.CompletedProcess[str]:
    """The case's command as a user types it, in ``tmp``, while its lock (if any) is held."""
    argv = _expand(case.argv, tmp)
    with _write_lock_held(tmp / "tuner.db") if case.locked else contextlib.nullcontext():
        if case.in_fresh_interpreter:
            return run_cli(*argv, cwd=tmp, env=dict(case.env), timeout=300)
        return forked_cli(runner, *argv, cwd=tmp)


@pytest.mark.parametrize("case", REFUSED, ids=[case.id for case in REFUSED])
def test_bad_input_is_one_line_an_exit_code_and_nothing_written(
    case: Case, tmp_path: Path, cli_runner: CliRunner
) -> None:
    if case.needs_postgres and not _postgres_up():
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is required in CI")
        pytest.skip("no PostgreSQL server reachable")
    if case.setup is not None:
        case.setup(tmp_path)
    db = tmp_path / "tuner.db"
    before = _rows(db)

    result = _run_case(case, tmp_path, cli_runner)

    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert case.says in lines[0], lines[0]
    assert result.returncode == case.exit_code, result.stderr
    if case.exit_code == 1:  # nothing to show: the line says how to make it
        assert "create it with: dataloader-tuner study" in lines[0], lines[0]
    assert "s3cret" not in result.stderr
    assert _rows(db) == before, "the database changed (or a file was created where none was)"


@dataclass(frozen=True)
class Failing:
    """A workload that loads, whose trials fail: the trial's recorded error says why."""

    id: str
    objective: str
    error: str


FAILING = [
    Failing("step-raises", f"{W}:raising_step", "RuntimeError: loss is NaN at step 1"),
    Failing("dataset-raises", f"{W}:raising", "OSError: cannot read sample"),
    Failing("batch-without-tensors", f"{W}:not_tensors", "holds no tensor"),
    Failing("no-batch-in-an-epoch", f"{W}:no_batch", "yields no batch in an epoch"),
]


def test_every_verb_keeps_a_row_run_in_a_fresh_interpreter() -> None:
    """The runner stands in for interpreter start; a real ``python -m`` of each verb checks it."""
    verbs = {case.argv[0] for case in REFUSED}
    assert {case.argv[0] for case in REFUSED if case.in_fresh_interpreter} == verbs


def test_every_case_is_a_row_of_the_documented_table() -> None:
    table = (ROOT / "docs" / "bad-input.md").read_text()
    rows = {line.split("|")[1].strip(" `") for line in table.splitlines() if line.startswith("| `")}
    assert rows == {case.id for case in [*REFUSED, *FAILING]}


@pytest.mark.slow
@pytest.mark.parametrize("case", FAILING, ids=[case.id for case in FAILING])
def test_a_failing_workload_fails_its_trials_and_the_study_goes_on(
    case: Failing, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    argv = _expand(study("--objective", case.objective, "--n-trials", "3"), tmp_path)

    result = run_cli(*argv, cwd=tmp_path, timeout=300)

    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "no trial completed" in last and case.error in last, last
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (summary,) = optuna.get_all_study_summaries(url)
    trials = optuna.load_study(study_name=summary.study_name, storage=url).trials
    assert len(trials) == 3  # the study went on after the first failure
    for trial in trials:
        assert trial.state == optuna.trial.TrialState.FAIL
        assert case.error in trial.user_attrs["error"], trial.user_attrs


# --- the documented table: python -m tests.test_bad_input rewrites docs/bad-input.md ----------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _shown(case: Case) -> str:
    """The command as the table shows it: the fixed study flags left out, placeholders named."""
    flags = case.argv[5 + len(QUICK_TRIALS) :] if case.argv[0] == "tuner.study" else case.argv[1:]
    text = " ".join(flags).replace("{tmp}", "$TMP").replace("{db}", "sqlite:///$TMP/tuner.db")
    return text.replace("{free_port}", "PORT")


def _printed(case: Case, runner: CliRunner) -> tuple[str, int]:
    """The last line the case prints and its exit code, run as the test runs it."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if case.setup is not None:
            case.setup(tmp)
        result = _run_case(case, tmp, runner)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        return lines[-1].replace(str(tmp), "$TMP"), result.returncode


def write_table(path: Path) -> None:
    """Run every case and write the table of what each printed."""
    refused = []
    with CliRunner() as runner:
        printed = [_printed(case, runner) for case in tqdm(REFUSED, desc="bad input")]
    for case, (line, code) in zip(REFUSED, printed, strict=True):
        refused.append(f"| `{case.id}` | `python -m {case.argv[0]} {_cell(_shown(case))}` | ")
        refused[-1] += f"{_cell(line)} | {code} |"
    failing = [
        f"| `{case.id}` | `--objective {case.objective}` | every trial FAIL with `error` "
        f"containing “{_cell(case.error)}”; last line: `no trial completed ...` | 1 |"
        for case in FAILING
    ]
    path.write_text(
        DOC_HEAD
        + "\n".join(refused)
        + "\n\n## Workloads whose trials fail: recorded, and the study goes on\n\n"
        + "| case | objective | what happens | exit |\n| --- | --- | --- | --- |\n"
        + "\n".join(failing)
        + "\n"
    )


DOC_HEAD = """# Bad input: what each mistake prints

Every row is a case of `tests/test_bad_input.py`, run as a user runs the CLI: one line on stderr,
no traceback, the exit code shown (2: a usage error; 1: nothing to show), and the database as it
was before. The lines are what a machine of this project printed (`$TMP` stands for the test's
folder; `python -m tuner.study` rows leave out `--hardware auto --storage
sqlite:///$TMP/tuner.db` and the short-trial flags). `python -m tests.test_bad_input` runs the
cases and rewrites this file; the tests check that every case is a row here.

## Refused before anything is written

| case | command | what it prints | exit |
| --- | --- | --- | --- |
"""


if __name__ == "__main__":
    write_table(ROOT / "docs" / "bad-input.md")
