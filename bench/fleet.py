"""Fleet throughput on PostgreSQL: storage time per trial and trials per minute for 1, 2, 4 workers.

    python -m bench.fleet [--admin-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                          [--workers 1 2 4] [--trials 24]

Two measurements for each worker count, each in a fresh scratch database:

* storage: each process writes what one trial writes (ask, the user attrs, the constraint, tell)
  with no measurement in between, so the time per trial is the database's share alone;
* trials/min: real ``tuner.study`` workers with short trials (0.3 s windows) sharing one study
  until ``--total-trials`` is reached.

On one 2-core machine, more workers also compete for the CPU, so trials/min measures the
storage and the coordination (locks, heartbeats) under load, not a fleet's scaling.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna

from storage import open_storage
from storage.testing import scratch_database
from tuner.insight import format_table

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = "tests.tuner_tests.workloads:fast"
ATTRS_PER_TRIAL = 16


def _storage_worker(url: str, trials: int, results: multiprocessing.Queue) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The tuner beats around ask/tell itself (tuner.fleet._heartbeat), as this loop stands in for.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    study = optuna.load_study(study_name="bench", storage=open_storage(url, heartbeat_interval=10))
    durations = []
    for _ in range(trials):
        started = time.perf_counter()
        trial = study.ask()
        for index in range(ATTRS_PER_TRIAL):
            trial.set_user_attr(f"attr_{index}", index * 1.5)
        trial.set_constraint("memory", 0.0)
        study.tell(trial, 1.0)
        durations.append(time.perf_counter() - started)
    results.put(durations)


def storage_seconds_per_trial(url: str, workers: int, trials: int) -> float:
    optuna.create_study(storage=open_storage(url, heartbeat_interval=None), study_name="bench")
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    processes = [
        context.Process(target=_storage_worker, args=(url, trials, results)) for _ in range(workers)
    ]
    for process in processes:
        process.start()
    durations = [d for _ in processes for d in results.get(timeout=600)]
    for process in processes:
        process.join()
    return statistics.median(durations)


def trials_per_minute(url: str, workers: int, total: int) -> float:
    command = [
        sys.executable,
        "-m",
        "tuner.study",
        "--hardware",
        "auto",
        "--objective",
        OBJECTIVE,
        "--storage",
        url,
        "--total-trials",
        str(total),
        "--n-trials",
        "1000",
        "--trial-seconds",
        "0.3",
        "--warmup-seconds",
        "0.1",
        "--remeasure-top",
        "0",
        "--no-probe-batch",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    processes = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(workers)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise RuntimeError(f"a worker failed: {stderr.strip().splitlines()[-1:]}")
    return total / (time.monotonic() - started) * 60


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "TEST_DB_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trials", type=int, default=24, help="finished trials per fleet run")
    args = parser.parse_args(argv)
    rows = []
    for workers in args.workers:
        with scratch_database(args.admin_url) as url:
            storage_s = storage_seconds_per_trial(url, workers, max(5, args.trials // workers))
        with scratch_database(args.admin_url) as url:
            rate = trials_per_minute(url, workers, args.trials)
        rows.append([workers, f"{storage_s * 1000:.1f}", f"{rate:.1f}"])
        print(
            f"{workers} workers: {storage_s * 1000:.1f} ms storage per trial, "
            f"{rate:.1f} trials/min",
            file=sys.stderr,
        )
    print(format_table(["workers", "storage ms/trial (median)", "trials/min"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
