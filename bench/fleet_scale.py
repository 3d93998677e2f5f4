"""Many workers on one study: 16 against PostgreSQL directly, 16 through the gRPC proxy.

    python -m bench.fleet_scale [--workers 16] [--total-trials 96] [--trial-seconds 0.2]
                                [--admin-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

Each worker is a process doing what a ``tuner.study`` worker does with its storage, with a
sleep where the measurement would be (16 real workers, each with torch and a forkserver, do
not fit on a 2-core machine shared with others): the tuner's own ask under ``--total-trials``
(``tuner.run._study._ask``: the study lock, stale trials failed and re-queued), the heartbeat
thread, the trial's user attrs and constraint, the tell. One worker SIGKILLs itself in the middle
of its third trial, as a preempted machine would.

Reported per route: the database connections the fleet held (``pg_stat_activity``, the most
seen, sampled every 0.2 s), storage seconds per trial (median and 95th percentile, the sleep
excluded), trials finished against ``--total-trials``, the killed worker's trial (failed and
re-queued, or left RUNNING: then the others wait for it, and give up after 30 s), and
settings lost.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import optuna
import sqlalchemy
from optuna.trial import TrialState

from storage import open_storage
from storage.testing import scratch_database, served_proxy
from tuner.insight import format_table

ROOT = Path(__file__).resolve().parents[1]
STUDY = "fleet-scale"
ATTRS_PER_TRIAL = 16
HEARTBEAT_S, GRACE_S = 1, 2
GIVE_UP_WAITING_S = 30.0
"""A worker waiting this long for the others' RUNNING trials reports the fleet stuck."""
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _worker(
    url: str, total: int, trial_s: float, victim: bool, results: multiprocessing.Queue
) -> None:
    from tuner.fleet import StaleTrials, heartbeat
    from tuner.run._study import _ask

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    storage = open_storage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    prepared = SimpleNamespace(
        config=SimpleNamespace(total_trials=total, storage=url), study_name=STUDY
    )
    stale = StaleTrials(HEARTBEAT_S, GRACE_S)
    durations: list[float] = []
    trials = 0
    waiting_since = None
    while True:
        started = time.perf_counter()
        asked = _ask(study, prepared, stale)  # type: ignore[arg-type]
        if asked is None:
            break
        if asked == "wait":
            waiting_since = waiting_since or time.monotonic()
            if time.monotonic() - waiting_since > GIVE_UP_WAITING_S:
                break  # a RUNNING trial nobody will finish: the run is stuck
            time.sleep(0.5)
            continue
        waiting_since = None
        trial = asked
        with heartbeat(study._storage, trial._trial_id, HEARTBEAT_S):
            storage_s = time.perf_counter() - started
            if victim and trials == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(trial_s)  # the measurement
            started = time.perf_counter()
            for index in range(ATTRS_PER_TRIAL):
                trial.set_user_attr(f"attr_{index}", index * 1.5)
            trial.set_constraint("memory", 0.0)
            study.tell(trial, 1.0, skip_if_finished=True)
        durations.append(storage_s + time.perf_counter() - started)
        trials += 1
    results.put(durations)


def _connections(admin_url: str, database: str, stop: threading.Event, seen: list[int]) -> None:
    engine = sqlalchemy.create_engine(admin_url, poolclass=sqlalchemy.pool.NullPool)
    query = sqlalchemy.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name")
    while not stop.is_set():
        try:
            with engine.connect() as connection:
                seen.append(int(connection.execute(query, {"name": database}).scalar() or 0))
        except sqlalchemy.exc.SQLAlchemyError:
            pass
        stop.wait(0.2)
    engine.dispose()


def run_fleet(admin_url: str, route: str, workers: int, total: int, trial_s: float) -> list[object]:
    with scratch_database(admin_url) as url, contextlib.ExitStack() as stack:
        optuna.create_study(
            storage=open_storage(url, heartbeat_interval=None), study_name=STUDY
        ).set_user_attr("route", route)
        worker_url = stack.enter_context(served_proxy(url)) if route == "grpc" else url
        seen: list[int] = []
        stop = threading.Event()
        database = sqlalchemy.engine.make_url(url).database or ""
        sampler = threading.Thread(target=_connections, args=(admin_url, database, stop, seen))
        sampler.start()
        context = multiprocessing.get_context("spawn")
        results: multiprocessing.Queue = context.Queue()
        started = time.monotonic()
        processes = [
            context.Process(target=_worker, args=(worker_url, total, trial_s, i == 0, results))
            for i in range(workers)
        ]
        for process in processes:
            process.start()
        durations: list[float] = []
        for _ in range(workers - 1):  # the victim reports nothing
            durations += results.get(timeout=1800)
        for process in processes:
            process.join(60)
        wall_s = time.monotonic() - started
        time.sleep(2 * GRACE_S)
        stop.set()
        sampler.join()
        trials = optuna.load_study(study_name=STUDY, storage=url).get_trials(deepcopy=False)
    finished = sum(t.state in FINISHED for t in trials)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
    running = sum(t.state == TrialState.RUNNING for t in trials)
    lost = len([t for t in failed if t.number not in retried]) + running
    ordered = sorted(durations)
    p95 = ordered[int(0.95 * (len(ordered) - 1))] if ordered else float("nan")
    return [
        route,
        workers,
        max(seen, default=0),
        f"{statistics.median(durations) * 1000:.0f}" if durations else "-",
        f"{p95 * 1000:.0f}",
        f"{finished} / {total}",
        f"{len(failed)} failed, {len(retried)} re-queued, {running} RUNNING",
        lost,
        f"{wall_s:.0f}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet_scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("TEST_DB_URL", ADMIN_URL),
    )
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--total-trials", type=int, default=96)
    parser.add_argument("--trial-seconds", type=float, default=0.2)
    parser.add_argument("--routes", nargs="+", default=["postgresql", "grpc"])
    args = parser.parse_args(argv)
    rows = []
    for route in args.routes:
        row = run_fleet(args.admin_url, route, args.workers, args.total_trials, args.trial_seconds)
        print(row, file=sys.stderr)
        rows.append(row)
    headers = [
        "route",
        "workers",
        "connections (most)",
        "storage ms/trial (median)",
        "p95",
        "finished / total",
        "killed worker's trial",
        "lost",
        "wall s",
    ]
    print(format_table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
