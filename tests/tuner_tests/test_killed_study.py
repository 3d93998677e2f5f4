"""A study SIGKILLed in any phase leaves no process behind, run as users run it.

Each test starts a real study, waits for one phase (the forkserver importing torch, the
ceiling, which finds the batch edge on this roomy machine, the pipeline profile, a trial with
persistent DataLoader workers, the re-measurement), remembers every process of the study's
tree, SIGKILLs the study process as the OOM killer or a preempted job would, and checks that
none of the remembered processes outlives it: each is polled for until a generous deadline
(:data:`GONE_WITHIN_S`), a bound on a busy machine's scheduling, not a speed the test asserts.
The phase is read from the process tree (a trial child leads its own process group) and the
study's SQLite file (the ceiling and the profile each end by writing a study attr).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import QUICK_TRIALS, ROOT

N_TRIALS = 3
GONE_WITHIN_S = 15.0


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _trial_children(study: psutil.Process) -> list[psutil.Process]:
    """Descendants leading their own process group: the trial children (their workers follow)."""
    found = []
    for process in _descendants(study):
        try:
            if os.getpgid(process.pid) == process.pid:
                found.append(process)
        except ProcessLookupError:
            continue
    return found


def _with_workers(study: psutil.Process) -> bool:
    return any(_descendants(child) for child in _trial_children(study))


def _forkserver_preloading(study: psutil.Process) -> bool:
    for process in _descendants(study):
        try:
            if "multiprocessing.forkserver" in " ".join(process.cmdline()):
                return not _trial_children(study)
        except psutil.NoSuchProcess:
            continue
    return False


class StudyDb:
    """Read-only queries on the study's SQLite file while the study writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _rows(self, query: str) -> list[tuple[object, ...]]:
        if not self.path.exists():
            return []
        try:
            with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5) as db:
                return db.execute(query).fetchall()
        except sqlite3.OperationalError:  # the tables are not created yet
            return []

    def study_attrs(self) -> set[str]:
        return {str(row[0]) for row in self._rows("SELECT key FROM study_user_attributes")}

    def trial_states(self) -> dict[int, str]:
        return {int(n): str(s) for n, s in self._rows("SELECT number, state FROM trials")}


Phase = Callable[[psutil.Process, StudyDb], bool]


def _ceiling(study: psutil.Process, db: StudyDb) -> bool:
    return bool(_trial_children(study)) and "ceiling_samples_per_sec" not in db.study_attrs()


def _profiling(study: psutil.Process, db: StudyDb) -> bool:
    attrs = db.study_attrs()
    return (
        bool(_trial_children(study))
        and "max_batch_size" in attrs
        and "pipeline_profile" not in attrs
    )


def _persistent_workers_trial(study: psutil.Process, db: StudyDb) -> bool:
    # Trial 1 is the rule-of-thumb baseline: workers, persistent_workers=True.
    return db.trial_states().get(1) == "RUNNING" and _with_workers(study)


def _remeasuring(study: psutil.Process, db: StudyDb) -> bool:
    states = db.trial_states()
    finished = [s for s in states.values() if s in ("COMPLETE", "PRUNED", "FAIL")]
    return len(finished) == N_TRIALS and _with_workers(study)


PHASES: dict[str, Phase] = {
    "forkserver-preload": lambda study, db: _forkserver_preloading(study),
    "ceiling": _ceiling,
    "pipeline-profile": _profiling,
    "trial-persistent-workers": _persistent_workers_trial,
    "remeasure": _remeasuring,
}


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {process.status()} {' '.join(process.cmdline())[:120]}"
    except psutil.NoSuchProcess:
        return f"{process.pid} gone"


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running; zombies are dead, and are reaped where they are ours."""
    alive = []
    for process in processes:
        try:
            if not process.is_running():
                continue
            if process.status() == psutil.STATUS_ZOMBIE:
                try:  # reparented to this process if a Supervisor made it a subreaper
                    os.waitpid(process.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                continue
        except psutil.NoSuchProcess:
            continue
        alive.append(process)
    return alive


@dataclasses.dataclass(frozen=True)
class Stopped:
    """A study signalled mid-run: its tree when signalled, what outlived it, how it ended."""

    tree: list[psutil.Process]
    """The study process and every descendant it had when signalled."""
    roles: dict[int, str]
    """Each of their pids, described (status and command line) as they were then."""
    survivors: list[psutil.Process]
    """Those still alive :data:`GONE_WITHIN_S` after the study ended (killed since)."""
    returncode: int
    stdout: str | None
    stderr: str | None


def stop_study(
    study: subprocess.Popen[Any], *signals: signal.Signals, group: bool = False
) -> Stopped:
    """Send ``signals`` to a running study one after the other (with ``group``, to its whole
    process group, as a terminal's Ctrl-C does: the study must lead one), wait for it to end
    and collect the survivors of its tree.

    Each process is polled for until :data:`GONE_WITHIN_S` after the study ended; survivors are
    killed before this returns, so no test leaves them to the next.
    """
    try:
        root = psutil.Process(study.pid)
        tree = [root, *_descendants(root)]
        roles = {p.pid: _describe(p) for p in tree}
        for sig in signals:
            (os.killpg if group else os.kill)(study.pid, sig)
        stdout, stderr = study.communicate(timeout=120)
    finally:
        if study.poll() is None:
            study.kill()
            study.communicate()
    ended_at = time.monotonic()
    while _alive(tree) and time.monotonic() - ended_at < GONE_WITHIN_S:
        time.sleep(0.02)
    survivors = _alive(tree)
    for process in survivors:
        process.kill()
    return Stopped(tree, roles, survivors, study.returncode, stdout, stderr)


def _wait_for(phase: Phase, study: subprocess.Popen[bytes], db: StudyDb, log: Path) -> None:
    process = psutil.Process(study.pid)
    deadline = time.monotonic() + 180
    while not phase(process, db):
        if study.poll() is not None:
            pytest.fail(
                f"the study ended before the phase (rc {study.returncode}):\n"
                f"{log.read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            study.kill()
            pytest.fail("the phase never came")
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(PHASES))
def test_killed_study_leaves_no_process_alive(tmp_path: Path, phase: str) -> None:
    db_path = tmp_path / "tuner.db"
    log = tmp_path / "study.log"
    command = [
        sys.executable, "-m", "tuner.study", "--hardware", "auto",
        "--objective", "tests.tuner_tests.workloads:slow", "--storage", f"sqlite:///{db_path}",
        "--n-trials", str(N_TRIALS), "--seed", "0", "--remeasure-rounds", "2", *QUICK_TRIALS,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as output:
        study = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=output)
    try:
        _wait_for(PHASES[phase], study, StudyDb(db_path), log)
    except BaseException:
        study.kill()
        study.wait()
        raise
    stopped = stop_study(study, signal.SIGKILL)
    assert len(stopped.tree) >= (2 if phase == "forkserver-preload" else 3), stopped.roles
    assert not stopped.survivors, (
        f"alive {GONE_WITHIN_S} s after the kill in phase {phase}: "
        f"{[stopped.roles[p.pid] for p in stopped.survivors]}"
    )
