"""A fleet under faults: workers SIGKILLed mid-trial, a server restart, a stalled network.

    python -m bench.chaos [--workers 3] [--total-trials 40] [--kills 6] [--stall-seconds 8]
                          [--admin-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
    python -m bench.chaos --admin-url mysql://root@127.0.0.1:3306/test      # MariaDB

Real ``tuner.study`` workers share one study in a scratch database on this machine's PostgreSQL
or MariaDB server (beside ``--admin-url``'s database: ``TEST_DB_URL`` or the local PostgreSQL
server by default, as :mod:`bench.fleet` makes them) until ``--total-trials``.
Worker 0 reaches the database through a small TCP proxy on 127.0.0.1 that this script pauses
once for ``--stall-seconds`` while that worker runs a trial (longer than the grace period, so
its trial is failed as stale and retried elsewhere while it still holds it). Meanwhile:

* ``--kills`` times, a random worker that is running a trial is SIGKILLed and started again; its
  process tree, walked just before the kill, is checked 2 s later;
* once, the server is stopped and started again (``pg_ctlcluster``, or ``mariadb-admin
  shutdown`` and ``mariadbd`` started as this machine's init starts it; it is shared, so one
  short restart per run, and the script checks that it is up when it exits).

Reported from the study once every worker has exited: trials finished; lost (a setting that
never finished: a failed trial whose retries never finished, a baseline that never finished, a
trial still WAITING); duplicated (a baseline, or a failed trial's setting, finished more than
once); left RUNNING; retries (re-queued copies, and the workers' "database unreachable" waits);
the time from the server being back to the next finished trial; leftover processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import optuna
import psutil
import sqlalchemy
from optuna.trial import TrialState

from storage import mask_url
from storage._open import DEFAULT_MAX_RETRY
from storage.testing import (
    can_restart_local_server,
    scratch_database,
    start_local_server,
    stop_local_server,
)
from tuner.insight._table import format_table

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = "tests.tuner_tests.workloads:fast"
HEARTBEAT_S, GRACE_S = 1, 3
MAX_RETRY = DEFAULT_MAX_RETRY  # a setting whose worker died this many times more is given up
GONE_WITHIN_S = 2.0
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class StallProxy:
    """A TCP forwarder on 127.0.0.1 whose forwarding can be paused: a network that stalls."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-proxy", daemon=True)

    def start(self) -> StallProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open = asyncio.Event()
        self._open.set()
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while data := await reader.read(65536):
                await self._open.wait()  # paused: bytes wait here, the connection stays open
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def pause(self) -> None:
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.clear)

    def resume(self) -> None:
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)


@dataclass
class Worker:
    slot: int
    url: str
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        log = self.log_dir / f"worker{self.slot}-{self.starts}.log"
        self.starts += 1
        self.logs.append(log)
        command = [
            sys.executable, "-m", "tuner.study", "--hardware", "auto", "--objective", OBJECTIVE,
            "--storage", self.url, "--total-trials", str(ARGS.total_trials), "--n-trials", "1000",
            # GP, not the default model strategy, which may end the study early once its best
            # has held: the faults are injected at fractions of --total-trials.
            "--sampler", "gp",
            "--trial-seconds", "0.5", "--warmup-seconds", "0.1", "--remeasure-top", "0",
            "--heartbeat-interval", str(HEARTBEAT_S), "--grace-period", str(GRACE_S),
            "--no-progress",
        ]  # fmt: skip
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=output,
                stderr=output,
            )

    def tree(self) -> list[psutil.Process]:
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def in_trial(self) -> bool:
        """A trial child (a descendant leading its own process group) is running."""
        for process in self.tree()[1:]:
            try:
                if os.getpgid(process.pid) == process.pid:
                    return True
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        return False


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


@contextlib.contextmanager
def server_left_up(url: str) -> Iterator[None]:
    """Whatever happens here, the shared server of ``url`` is running when this exits."""
    try:
        yield
    finally:
        start_local_server(url)


def _finished_count(engine: sqlalchemy.Engine) -> int | None:
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    sqlalchemy.text(
                        "SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED')"
                    )
                ).scalar()
                or 0
            )
    except sqlalchemy.exc.SQLAlchemyError:
        return None  # the tables are not there yet, or the server is restarting


@dataclass
class Chaos:
    workers: list[Worker]
    proxy: StallProxy
    engine: sqlalchemy.Engine
    url: str
    kills: list[tuple[float, list[psutil.Process]]] = field(default_factory=list)
    leftovers_after_kill: list[str] = field(default_factory=list)
    restart: tuple[float, float] | None = None  # wall clock: asked, back up
    restart_s: float | None = None
    stalled: bool = False
    seen: dict[tuple[int, float], psutil.Process] = field(default_factory=dict)

    def remember_trees(self) -> None:
        for worker in self.workers:
            for process in worker.tree():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.seen.setdefault((process.pid, process.create_time()), process)

    def kill_one(self, rng: random.Random) -> bool:
        candidates = [
            w for w in self.workers if w.in_trial() and not (w.slot == 0 and self.stalled)
        ]
        if not candidates:
            return False
        worker = rng.choice(candidates)
        tree = worker.tree()
        assert worker.process is not None
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        self.kills.append((time.monotonic(), tree))
        print(f"killed worker {worker.slot} ({len(tree)} processes)", file=sys.stderr)
        worker.start()
        return True

    def check_kills(self) -> None:
        due = [k for k in self.kills if time.monotonic() - k[0] >= GONE_WITHIN_S and k[1]]
        for _, tree in due:
            self.leftovers_after_kill += [f"{p.pid} {p.name()}" for p in _alive(tree)]
            tree.clear()

    def restart_server(self) -> None:
        asked = time.time()
        started = time.monotonic()
        stop_local_server(self.url)
        start_local_server(self.url)
        self.restart_s = time.monotonic() - started
        self.restart = (asked, time.time())
        print(f"restarted the {self.engine.dialect.name} server in {self.restart_s:.1f} s",
              file=sys.stderr)  # fmt: skip

    def stall(self, seconds: float) -> None:
        self.stalled = True
        self.proxy.pause()
        print(f"stalled worker 0's network for {seconds:.0f} s", file=sys.stderr)

        def resume() -> None:
            time.sleep(seconds)
            self.proxy.resume()
            self.stalled = False

        threading.Thread(target=resume, daemon=True).start()


def drive(chaos: Chaos, rng: random.Random) -> float:
    """Inject the faults while the fleet runs; return the seconds until every worker exited."""
    total = ARGS.total_trials
    started = time.monotonic()
    next_kill = started + rng.uniform(6, 10)
    stall_done = restart_done = False
    while True:
        chaos.remember_trees()
        chaos.check_kills()
        finished = _finished_count(chaos.engine)
        running = [w for w in chaos.workers if w.process and w.process.poll() is None]
        if not running:
            break
        if time.monotonic() - started > ARGS.timeout:
            print("timed out; stopping the fleet", file=sys.stderr)
            for worker in running:
                assert worker.process is not None
                worker.process.kill()
            break
        if finished is not None:
            if not stall_done and finished >= total * 0.25 and chaos.workers[0].in_trial():
                chaos.stall(ARGS.stall_seconds)
                stall_done = True
            elif not restart_done and finished >= total * 0.5:
                chaos.restart_server()
                restart_done = True
            elif (
                len(chaos.kills) < ARGS.kills
                and time.monotonic() >= next_kill
                and 3 <= finished < total * 0.9  # during trials, not the probe or ceiling
                and chaos.kill_one(rng)
            ):
                next_kill = time.monotonic() + rng.uniform(4, 9)
        time.sleep(0.1)
    time.sleep(GONE_WITHIN_S)
    chaos.check_kills()
    return time.monotonic() - started


def _chains(trials: list[optuna.trial.FrozenTrial]) -> dict[int, list[optuna.trial.FrozenTrial]]:
    """Each trial that was failed and retried, with its retries (Optuna's ``failed_trial``)."""
    by_number = {t.number: t for t in trials}
    chains: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for trial in trials:
        origin = trial.system_attrs.get("failed_trial")
        if origin is None:
            continue
        while by_number[origin].system_attrs.get("failed_trial") is not None:
            origin = by_number[origin].system_attrs["failed_trial"]
        chains.setdefault(origin, [by_number[origin]]).append(trial)
    return chains


def report(url: str, chaos: Chaos, wall_s: float) -> list[list[object]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(url)
    study = optuna.load_study(study_name=summaries[0].study_name, storage=url)
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials)
    finished = [t for t in trials if t.state in FINISHED]
    chains = _chains(trials)
    lost = [n for n, chain in chains.items() if not any(t.state in FINISHED for t in chain)]
    exhausted = [n for n in lost if len(chains[n]) > MAX_RETRY]
    duplicated = sum(max(0, sum(t.state in FINISHED for t in c) - 1) for c in chains.values())
    baselines = Counter(t.user_attrs["baseline"] for t in finished if "baseline" in t.user_attrs)
    lost += [
        f"baseline {name}" for name in ("pytorch-default", "rule-of-thumb") if not baselines[name]
    ]
    lost += [t.number for t in trials if t.state == TrialState.WAITING]
    duplicated += sum(count - 1 for count in baselines.values() if count > 1)
    unreachable = sum(
        log.read_text(errors="replace").count("database unreachable")
        for worker in chaos.workers
        for log in worker.logs
    )
    crashed, exited = [], []
    for worker in chaos.workers:
        for log in worker.logs:
            text = log.read_text(errors="replace")
            if "Traceback" in text:
                crashed.append(f"{log.name}: {text.strip().splitlines()[-1][:160]}")
            elif "error:" in text:
                exited.append(f"{log.name}: {text.strip().splitlines()[-1][:160]}")
    recovery = None
    if chaos.restart is not None:
        back = datetime.fromtimestamp(chaos.restart[1], tz=UTC)
        after = [
            t.datetime_complete.replace(tzinfo=UTC)
            for t in finished
            if t.datetime_complete is not None and t.datetime_complete.replace(tzinfo=UTC) > back
        ]
        # Optuna stores naive local datetimes; this machine runs in UTC.
        recovery = (min(after) - back).total_seconds() if after else None
    leftover_end = [f"{p.pid} {p.name()}" for p in _alive(list(chaos.seen.values()))]
    for number in lost:
        for trial in chains.get(number, []) if isinstance(number, int) else []:
            baseline = trial.user_attrs.get("baseline", "")
            print(f"  lost chain {number}: trial {trial.number} {trial.state.name} {baseline}",
                  file=sys.stderr)  # fmt: skip
    print(f"lost: {lost}; crashes: {crashed}; exited with an error: {exited}", file=sys.stderr)
    print(f"leftovers after kills: {chaos.leftovers_after_kill}; at the end: {leftover_end}",
          file=sys.stderr)  # fmt: skip
    return [
        ["workers (worker 0 through the stalling proxy)", len(chaos.workers)],
        ["--total-trials", ARGS.total_trials],
        ["worker kills (SIGKILL mid-trial, restarted)", len(chaos.kills)],
        ["network stall of worker 0", f"{ARGS.stall_seconds:.0f} s"],
        [
            f"{chaos.engine.dialect.name} server stopped and started",
            f"{chaos.restart_s:.1f} s" if chaos.restart_s else "not done",
        ],
        ["trials finished (complete + pruned)", len(finished)],
        ["trials failed (stale, retried)", states[TrialState.FAIL]],
        ["lost (a setting never finished)", len(lost)],
        [f"  of which retried {MAX_RETRY} times and given up", len(exhausted)],
        ["duplicated (a baseline or retried setting finished twice)", duplicated],
        ["left RUNNING", states[TrialState.RUNNING]],
        ["retries: re-queued copies", sum(len(c) - 1 for c in chains.values())],
        ["retries: database-unreachable waits (worker log lines)", unreachable],
        [
            "server back to next finished trial",
            f"{recovery:.1f} s" if recovery is not None else "-",
        ],
        ["processes alive 2 s after a kill", len(chaos.leftovers_after_kill)],
        ["processes alive after the fleet exited", len(leftover_end)],
        ["workers that crashed (a traceback)", len(crashed)],
        ["workers that exited with an error line", len(exited)],
        ["wall time", f"{wall_s:.0f} s"],
    ]


def main(argv: Sequence[str] | None = None) -> int:
    global ARGS
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "TEST_DB_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--total-trials", type=int, default=40)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--stall-seconds", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--log-dir", default=None, help="keep the workers' logs here")
    ARGS = parser.parse_args(argv)
    if not can_restart_local_server(ARGS.admin_url):
        print(f"bench.chaos: error: {mask_url(ARGS.admin_url)} is not this machine's PostgreSQL or "
              "MariaDB server with its tools (pg_ctlcluster; mariadb-admin, start-stop-daemon)",
              file=sys.stderr)  # fmt: skip
        return 2
    rng = random.Random(ARGS.seed)
    log_dir = Path(ARGS.log_dir or f"/tmp/bench-chaos-{os.getpid()}")
    log_dir.mkdir(parents=True, exist_ok=True)
    with server_left_up(ARGS.admin_url), scratch_database(ARGS.admin_url) as url:
        parsed = sqlalchemy.engine.make_url(url)
        default_port = 5432 if parsed.get_backend_name() == "postgresql" else 3306
        proxy = StallProxy(parsed.host or "127.0.0.1", parsed.port or default_port).start()
        stalled_url = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(
            hide_password=False
        )
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        workers = [
            Worker(slot, stalled_url if slot == 0 else url, log_dir) for slot in range(ARGS.workers)
        ]
        for worker in workers:
            worker.start()
        chaos = Chaos(workers, proxy, engine, url)
        try:
            wall_s = drive(chaos, rng)
        finally:
            for worker in workers:
                if worker.process is not None and worker.process.poll() is None:
                    worker.process.kill()
        time.sleep(GRACE_S)
        rows = report(url, chaos, wall_s)
        engine.dispose()
    print(format_table(["chaos", "value"], rows))
    print(f"worker logs in {log_dir}", file=sys.stderr)
    return 0


ARGS: argparse.Namespace


if __name__ == "__main__":
    raise SystemExit(main())
