"""What the memory guard costs a trial, and how fast it stops a leak.

    python -m bench.guard_cost --rounds 5

Cost: the same setting of the built-in image workload measured through the real
:class:`~tuner.trial._supervisor.Supervisor` with the guard sampling every 0.2 s (A) and with a
3600 s interval (B: one sample at the start, then none), interleaved A B B A A B ... so drift in
the machine's speed hits both alike and neither always goes first. Reported: the ratio of the
arms' medians, the median of the rounds' own A/B ratios with a bootstrap 90% interval (a cost
smaller than that interval is not measured either way), and the guard's own time: its ticks'
seconds over arm A's trials' seconds and the machine's cores, the most of the machine's CPU it
can have taken. Goal: the median of A within 1% of B's.

Reaction: the leaky test workload (each worker keeps 64 MiB more per batch) under a 1.5 GiB host
limit. Per run: ``kill_seconds`` (first signal until the supervisor has seen the tree gone and
reaped, as it records it); "trip→gone", from the start of the guard's tripping sample until a
watcher thread polling every 5 ms sees no trial process running (an exited zombie counts as gone:
its memory is freed; so this can be shorter than ``kill_seconds``, which includes
``psutil.wait_procs``' polling); and "trip→return", until ``Supervisor.run`` returned. Goal:
trip→gone under 0.5 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import psutil

from tuner.machine import format_bytes, process_tree
from tuner.search import LoaderSettings
from tuner.trial import GuardReading, Job, MemoryGuard, Mode, Supervisor, default_limits

GiB = 2**30

COST_OBJECTIVE = "image"
COST_OPTIONS = {"images": 256, "resolution": 64, "crop": 56}
COST_SETTINGS = LoaderSettings(batch=32, num_workers=2, prefetch_factor=2, persistent_workers=True)
LEAK_OBJECTIVE = "tests.tuner_tests.workloads:leaky"
LEAK_SETTINGS = LoaderSettings(batch=16, num_workers=2, prefetch_factor=2)
LEAK_LIMIT_BYTES = int(1.5 * GiB)


def job(
    objective: str,
    options: dict[str, Any],
    settings: LoaderSettings,
    window_s: float,
    warmup_s: float,
) -> Job:
    """A measurement job as ``TrialRunner.job`` builds it."""
    return Job(
        mode=Mode.MEASURE,
        objective=objective,
        options=options,
        settings=settings,
        device="cpu",
        window_s=window_s,
        warmup_s=warmup_s,
        sys_path=tuple(sys.path),
    )


class RecordingGuard(MemoryGuard):
    """The real guard; it also keeps its last reading (the trip's) and times its ticks (the
    tree's listing, which the supervisor asks for first, and the sample)."""

    last_reading: GuardReading | None = None
    samples: int = 0
    exact_samples: int = 0
    sample_seconds: float = 0.0

    def tree(self) -> list[psutil.Process]:
        started = time.perf_counter()
        members = super().tree()
        self.sample_seconds += time.perf_counter() - started
        return members

    def sample(self, tree: list[psutil.Process] | None = None) -> GuardReading:
        started = time.perf_counter()
        reading = super().sample(tree)
        self.sample_seconds += time.perf_counter() - started
        self.samples += 1
        self.exact_samples += reading.tree_exact
        self.last_reading = reading
        return reading


class GoneWatcher:
    """Polls every 5 ms: remembers each trial process, notes when none of them is left.

    A trial child leads its own process group (its workers inherit it), which tells it from the
    forkserver. An exited process counts as gone once it is a zombie: its memory is freed.
    """

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.gone_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gone-watcher", daemon=True)

    def _alive(self) -> bool:
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.NoSuchProcess:
                continue
        return False

    def _discover(self) -> None:
        for child in psutil.Process().children(recursive=True):
            try:
                if os.getpgid(child.pid) != child.pid:
                    continue
                for member in process_tree(child.pid):
                    self.seen.setdefault((member.pid, member.create_time()), member)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue

    def _loop(self) -> None:
        polls = 0
        while not self._stop.is_set():
            if polls % 10 == 0:  # scanning /proc costs; checking known processes does not
                self._discover()
            polls += 1
            if self._alive():
                self.gone_at = None
            elif self.seen and self.gone_at is None:
                self.gone_at = time.monotonic()
            self._stop.wait(0.005)

    def __enter__(self) -> GoneWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclasses.dataclass
class CostRun:
    """Per arm, samples/s per round (in round order); the sampling guard; arm A's seconds."""

    results: dict[str, list[float]]
    sampling: RecordingGuard
    guarded_s: float


def cost(rounds: int, window_s: float, interval_s: float) -> CostRun:
    """samples/s per round with the guard sampling (A) and without (B), interleaved ABBA."""
    limits = default_limits()
    sampling = RecordingGuard(limits, interval_s=interval_s)
    arms = {
        f"guard every {interval_s:g} s": Supervisor(sampling),
        "guard every 3600 s": Supervisor(MemoryGuard(limits, interval_s=3600.0)),
    }
    trial = job(COST_OBJECTIVE, COST_OPTIONS, COST_SETTINGS, window_s, warmup_s=0.5)
    deadline_s = 60.0 + 3 * window_s
    next(iter(arms.values())).run(trial, deadline_s)  # forkserver start and JPEG cache: unmeasured
    sampling.samples, sampling.exact_samples, sampling.sample_seconds = 0, 0, 0.0
    results: dict[str, list[float]] = {name: [] for name in arms}
    guarded_name = next(iter(arms))
    guarded_s = 0.0
    for number in range(rounds):
        order = list(arms.items()) if number % 2 == 0 else list(reversed(arms.items()))
        for name, supervisor in order:
            started = time.perf_counter()
            outcome = supervisor.run(trial, deadline_s)
            if name == guarded_name:
                guarded_s += time.perf_counter() - started
            if outcome.state != "complete":
                raise SystemExit(f"{name}: the trial did not complete: {outcome}")
            results[name].append(float(outcome.attrs["samples_per_sec"]))
    return CostRun(results, sampling, guarded_s)


def paired_ratio(
    guarded: Sequence[float], unguarded: Sequence[float]
) -> tuple[float, float, float]:
    """The median of the rounds' A/B ratios and a bootstrap 90% interval of that median."""
    ratios = [a / b for a, b in zip(guarded, unguarded, strict=True)]
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(2000))
    return statistics.median(ratios), medians[len(medians) // 20], medians[-len(medians) // 20]


@dataclasses.dataclass
class LeakRun:
    reason: str | None
    reading_bytes: float
    predicted: bool
    kill_s: float
    trip_to_gone_s: float
    trip_to_return_s: float


def reaction(runs: int) -> list[LeakRun]:
    """Stop the leaky workload ``runs`` times under the 1.5 GiB host limit."""
    limits = dataclasses.replace(default_limits(), host_bytes=LEAK_LIMIT_BYTES)
    guard = RecordingGuard(limits)
    supervisor = Supervisor(guard)
    trial = job(LEAK_OBJECTIVE, {}, LEAK_SETTINGS, window_s=20.0, warmup_s=0.0)
    measured = []
    for _ in range(runs):
        with GoneWatcher() as watcher:
            outcome = supervisor.run(trial, 60.0)
            returned_at = time.monotonic()
            time.sleep(0.02)  # a last poll or two, should the tree outlive run()
        attrs = outcome.attrs
        tripped_at = guard.last_reading.at if guard.last_reading is not None else float("nan")
        gone_at = watcher.gone_at if watcher.gone_at is not None else float("nan")
        measured.append(
            LeakRun(
                reason=outcome.reason,
                reading_bytes=float(attrs.get("guard_reading_bytes", float("nan"))),
                predicted=bool(attrs.get("guard_predicted", False)),
                kill_s=float(attrs.get("kill_seconds", float("nan"))),
                trip_to_gone_s=gone_at - tripped_at,
                trip_to_return_s=returned_at - tripped_at,
            )
        )
    return measured


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.guard_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (default 5)")
    parser.add_argument("--leak-runs", type=int, default=5, help="leaky runs (default 5)")
    parser.add_argument("--window", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--interval", type=float, default=0.2, help="guard interval of arm A")
    args = parser.parse_args(argv)

    print(f"cost: {COST_OBJECTIVE} {COST_OPTIONS}, {COST_SETTINGS.dataloader_kwargs()}")
    print(f"      {args.rounds} interleaved rounds of {args.window:g} s windows", flush=True)
    run = cost(args.rounds, args.window, args.interval)
    results, sampling = run.results, run.sampling
    rows = []
    for name, values in results.items():
        rows.append(
            [
                name,
                f"{statistics.median(values):,.1f}",
                f"{min(values):,.1f}",
                f"{max(values):,.1f}",
            ]
        )
    print(_table(["arm", "median samples/s", "min", "max"], rows))
    guarded, unguarded = results.values()
    ratio = statistics.median(guarded) / statistics.median(unguarded)
    verdict = "ok" if ratio >= 0.99 else "over 1%"
    print(
        f"ratio of medians guarded/unguarded: {ratio:.4f}"
        f" (cost {100 * (1 - ratio):+.2f}%; {verdict})"
    )
    paired, low, high = paired_ratio(guarded, unguarded)
    print(
        f"median of the rounds' ratios: {paired:.4f} (cost {100 * (1 - paired):+.2f}%),"
        f" 90% interval {low:.4f}-{high:.4f}"
    )
    if sampling.samples:
        mean_s = sampling.sample_seconds / sampling.samples
        cores = os.cpu_count() or 1
        share = sampling.sample_seconds / (run.guarded_s * cores) if run.guarded_s else 0.0
        print(
            f"guard tick (tree + sample): {sampling.samples} ticks, {1000 * mean_s:.2f} ms each,"
            f" {100 * mean_s / args.interval:.1f}% of one core at {args.interval:g} s"
            f" ({cores} cores here); PSS read exactly at {sampling.exact_samples}"
        )
        print(
            f"guard time: {sampling.sample_seconds:.2f} s over {run.guarded_s:.1f} s of guarded"
            f" trials, {100 * share:.2f}% of the machine's CPU at most\n"
        )

    print(
        f"reaction: {LEAK_OBJECTIVE} under a {format_bytes(LEAK_LIMIT_BYTES)} host limit,"
        f" {args.leak_runs} runs",
        flush=True,
    )
    runs = reaction(args.leak_runs)
    rows = [
        [
            str(number),
            str(run.reason),
            format_bytes(run.reading_bytes),
            "yes" if run.predicted else "no",
            f"{run.kill_s:.3f}",
            f"{run.trip_to_gone_s:.3f}",
            f"{run.trip_to_return_s:.3f}",
        ]
        for number, run in enumerate(runs, start=1)
    ]
    header = ["run", "reason", "reading", "predicted", "kill s", "trip→gone s", "trip→return s"]
    print(_table(header, rows))
    kills = [run.kill_s for run in runs]
    trips = [run.trip_to_gone_s for run in runs]
    print(f"kill_seconds: median {statistics.median(kills):.3f} s, max {max(kills):.3f} s")
    print(
        f"trip→gone:    median {statistics.median(trips):.3f} s, max {max(trips):.3f} s"
        f" ({'ok' if max(trips) < 0.5 else 'over 0.5 s'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
