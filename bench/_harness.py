"""What the benchmarks share: the workloads and their grids, one yardstick, timed studies.

The yardstick (:class:`Harness`) measures a :class:`~tuner.search.LoaderSettings` exactly
as a trial does: :class:`~tuner.run.TrialRunner` → :class:`~tuner.trial.Supervisor` → a
forkserver child → :func:`tuner.trial._measure.measure`, with the study's window and warm-up. So
a grid point, the tuner's pick and a peer's pick are compared by one measurement, not by each tool's
own numbers. :meth:`Harness.side_by_side` runs interleaved rounds (A B C, B C A, ...): drift in
the machine's speed (other work on a shared box) then hits every setting alike, and the median
of the rounds drops the odd disturbed window.

:func:`run_timed_study` runs the real tuner (:func:`tuner.run._study.run_study`) and times it with
``time.monotonic``; the trials' own timestamps then split that wall time into the setup before
the first trial (batch probe, ceiling), the trials, and the final re-measurement after the last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import torch
from tqdm import tqdm

from tuner.machine import cpu_model_name
from tuner.run import (
    PreparedStudy,
    StudyConfig,
    StudyResult,
    TrialRunner,
    make_runner,
    prepare,
    run_study,
    trial_tools,
)
from tuner.search import LoaderSettings, baseline_settings
from tuner.search._space import MAX_PREFETCH_FACTOR, SearchSpace

__all__ = [
    "DEFAULT_STRATEGY",
    "WORKLOADS",
    "BenchWorkload",
    "Harness",
    "TimedStudy",
    "describe",
    "machine_summary",
    "markdown_table",
    "output_dir",
    "prepare_workload",
    "run_timed_study",
    "settings_key",
    "space_size",
]

_log = logging.getLogger("bench")

DEFAULT_WINDOW_S = 1.5
DEFAULT_STRATEGY = StudyConfig.sampler
"""The strategy ``python -m tuner.study`` runs without ``--sampler``: the one the goals judge."""
DEFAULT_WARMUP_S = 0.5


def _grid(
    space: SearchSpace, batches: Sequence[int], knobs: Sequence[Mapping[str, Any]]
) -> list[LoaderSettings]:
    """Every worker count and thread count of ``space``, ``batches`` and ``knobs``; with workers,
    ``prefetch_factor`` 2 and 4 and ``persistent_workers`` on.

    The tuner's own ranges at an expert's resolution: persistent workers only ever save the
    per-epoch worker start, and prefetch beyond 4 only holds more memory.
    """
    grid = []
    for workers, batch, knob in itertools.product(range(space.max_workers + 1), batches, knobs):
        for prefetch, threads in itertools.product(
            (2, 4) if workers else (None,), range(1, space.max_threads + 1)
        ):
            grid.append(space.settings(workers, batch, prefetch, workers > 0, False, threads, knob))
    return grid


def _image_grid(space: SearchSpace) -> list[LoaderSettings]:
    """Batch 16..512 and both collates: 216 settings on a 2-CPU machine."""
    batches = [b for b in space.batch_choices() if b >= 16]
    return _grid(space, batches, [{"collate": "float"}, {"collate": "uint8"}])


def _text_grid(space: SearchSpace) -> list[LoaderSettings]:
    """max_tokens 1024..32768: 108 settings on a 2-CPU machine."""
    return _grid(space, [b for b in space.batch_choices() if b <= 32768], [{}])


STORAGE_WORKERS = (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192)
"""Far enough past the cores to hold the optimum of samples that wait 8 ms each: the issue's
plain-PyTorch harness measured it near 32 workers on a loaded 2-core machine; on a quiet one a
plain harness measured 6,800 samples/s at 64 workers and 9,400 at 128 (batch 32), and a
``--sampler model`` study picked 128."""


def _storage_grid(space: SearchSpace) -> list[LoaderSettings]:
    """Workers 0..192 at batch 16..128, one intra-op thread, prefetch 2, persistent: 48 settings.

    The step is a small MLP, so threads change little; the loader is everything.
    """
    batches = [b for b in space.batch_choices() if 16 <= b <= 128]
    return [
        space.settings(workers, batch, 2 if workers else None, workers > 0, False, 1, {})
        for workers in STORAGE_WORKERS
        for batch in batches
    ]


@dataclasses.dataclass(frozen=True)
class BenchWorkload:
    """A built-in workload at a size where one measurement takes a few seconds on a small box."""

    name: str
    objective: str
    options: Mapping[str, Any]
    grid: Callable[[SearchSpace], list[LoaderSettings]]
    typical: Callable[[SearchSpace], LoaderSettings]
    """A sensible hand-picked setting, for benchmarks that need one fixed setting."""


WORKLOADS: dict[str, BenchWorkload] = {
    "image": BenchWorkload(
        name="image",
        objective="image",
        options={"images": 512, "resolution": 96},
        grid=_image_grid,
        typical=lambda space: space.settings(2, 64, 2, True, False, 1, {"collate": "uint8"}),
    ),
    "text": BenchWorkload(
        name="text",
        objective="text",
        # A 1024-token vocabulary and 256-token sequences keep one step near a tenth of a second
        # on one core; the default sizes make a 1.5 s window hold a handful of steps.
        options={"sequences": 2048, "vocab_size": 1024, "max_length": 256},
        grid=_text_grid,
        typical=lambda space: space.settings(1, 4096, 2, True, False, 1, {}),
    ),
    "storage": BenchWorkload(
        name="storage",
        objective="storage",
        options={"samples": 4096, "latency_ms": 8},
        grid=_storage_grid,
        typical=lambda space: space.settings(16, 32, 2, True, False, 1, {}),
    ),
}


def output_dir(requested: str | None, prefix: str) -> Path:
    """``--out`` when given (created), else a fresh temporary folder; printed by the caller."""
    if requested:
        path = Path(requested)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))


def study_config(
    workload: BenchWorkload,
    storage: str,
    window_s: float,
    warmup_s: float,
    study_name: str | None = None,
    **overrides: Any,
) -> StudyConfig:
    """The study as ``python -m tuner.study --hardware auto`` would run it, progress off."""
    return StudyConfig(
        hardware="auto",
        objective=workload.objective,
        objective_options=dict(workload.options),
        storage=storage,
        study_name=study_name or f"bench-{workload.name}",
        trial_seconds=window_s,
        warmup_seconds=warmup_s,
        progress=False,
        **overrides,
    )


def prepare_workload(
    workload: BenchWorkload, storage: str, window_s: float, warmup_s: float
) -> PreparedStudy:
    """The validated study for ``workload``: its search space, device, limits (writes nothing)."""
    return prepare(study_config(workload, storage, window_s, warmup_s))


def settings_key(settings: LoaderSettings) -> str:
    """A hashable identity for a setting (its ``knobs`` dict makes the dataclass unhashable)."""
    return json.dumps(settings.to_attrs(), sort_keys=True)


def describe(settings: LoaderSettings, batch_param: str = "batch_size") -> str:
    """A short label, e.g. ``w2 b64 pf4 persist t1 uint8``."""
    batch = "tok" if batch_param != "batch_size" else "b"
    parts = [f"w{settings.num_workers}", f"{batch}{settings.batch}"]
    if settings.num_workers:
        parts.append(f"pf{settings.prefetch_factor}")
        if settings.persistent_workers:
            parts.append("persist")
    if settings.pin_memory:
        parts.append("pin")
    parts.append(f"t{settings.torch_num_threads}")
    parts += [str(value) for value in settings.knobs.values()]
    return " ".join(parts)


def space_size(space: SearchSpace) -> int:
    """How many distinct settings the tuner's own search space holds (fixed values aside)."""
    knobs = 1
    for choices in space.workload.knobs.values():
        knobs *= len(choices)
    batches = len(space.batch_choices())
    per_worker_count = MAX_PREFETCH_FACTOR * 2  # prefetch 1..8, persistent or not
    pin = 2 if space.cuda else 1
    with_workers = space.max_workers * per_worker_count
    return (1 + with_workers) * batches * pin * space.max_threads * knobs


class Harness:
    """The independent yardstick: one setting measured as a trial measures it, in a child."""

    def __init__(self, prepared: PreparedStudy) -> None:
        # The guard and runner as run_study builds them, through the same factory; the GPU
        # reader stays open for the harness's life (closed with the process).
        self._tools = contextlib.ExitStack()
        tools = self._tools.enter_context(trial_tools(prepared))
        self.prepared = prepared
        self.runner: TrialRunner = make_runner(prepared, tools)

    @property
    def window_s(self) -> float:
        return self.runner.window_s

    def measure(self, settings: LoaderSettings) -> float | None:
        """samples/s of one window, or None when the trial did not complete."""
        outcome = self.runner.measure(settings)
        if outcome.state != "complete":
            _log.warning("%s: %s %s", describe(settings), outcome.state, outcome.reason or "")
            return None
        return float(outcome.attrs["samples_per_sec"])

    def side_by_side(
        self, settings: Sequence[LoaderSettings], rounds: int, desc: str = "side by side"
    ) -> list[list[float]]:
        """Each setting measured once per round, the order rotated every round.

        Returns the samples/s of each setting's completed rounds, in the order given.
        """
        values: list[list[float]] = [[] for _ in settings]
        order = list(range(len(settings)))
        with tqdm(total=rounds * len(settings), desc=desc, file=sys.stderr, leave=False) as bar:
            for round_number in range(rounds):
                shift = round_number % len(order)
                for index in order[shift:] + order[:shift]:
                    value = self.measure(settings[index])
                    if value is not None:
                        values[index].append(value)
                    bar.update()
        return values

    def baselines(self) -> dict[str, LoaderSettings]:
        """``pytorch-default`` and ``rule-of-thumb``, as the study enqueues them."""
        return baseline_settings(self.prepared.space, self.prepared.fingerprint.physical_cores)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclasses.dataclass
class TimedStudy:
    """One ``run_study`` call and where its wall time went."""

    result: StudyResult
    wall_s: float
    started_at: float
    """``time.time()`` at the start, to place the trials' own timestamps on this run's clock."""
    trial_numbers: list[int]
    """The trials this call ran."""
    setup_s: float
    """Until the first trial started: study creation, batch probe, ceiling, baselines queued."""
    trials_end_s: float
    """When the last trial ended; the rest of ``wall_s`` is the final re-measurement."""

    @property
    def remeasure_s(self) -> float:
        return self.wall_s - self.trials_end_s


def run_timed_study(config: StudyConfig) -> TimedStudy:
    """Run the tuner as its CLI does (its lines go to logging; no summary is printed)."""
    with contextlib.redirect_stdout(io.StringIO()):
        before = _trial_count(config)
        started_at = time.time()
        started = time.monotonic()
        result = run_study(config)
        wall_s = time.monotonic() - started
    trials = [t for t in result.study.get_trials(deepcopy=False) if t.number >= before]
    starts = [t.datetime_start.timestamp() for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete.timestamp() for t in trials if t.datetime_complete is not None]
    setup_s = (min(starts) - started_at) if starts else wall_s
    trials_end_s = (max(ends) - started_at) if ends else wall_s
    return TimedStudy(result, wall_s, started_at, [t.number for t in trials], setup_s, trials_end_s)


def _trial_count(config: StudyConfig) -> int:
    """Trials already in the study (0 when it does not exist yet), before a resumed run."""
    try:
        study = optuna.load_study(study_name=config.study_name, storage=config.storage)
    except KeyError:
        return 0
    return len(study.get_trials(deepcopy=False))


def machine_summary() -> dict[str, Any]:
    """What the numbers were measured on, for the report's header."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model_name(),
        "memory_gib": round(memory_gib, 1),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }


def print_machine(machine: Mapping[str, Any]) -> None:
    print(
        f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), {machine['memory_gib']} GiB,"
        f" torch {machine['torch']}, CUDA {'yes' if machine['cuda'] else 'no'};"
        f" load average {machine['load_average']} at {machine['date']}"
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub table: readable in a terminal, pasted as is into docs/benchmarks.md."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
