"""What the benchmarks share: the workloads and their grids, one yardstick, timed studies, and
the plain loop a user would write.

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
:func:`cli_study` runs it instead as a user types it, ``python -m tuner.study`` in its own process.

The plain loop (:func:`plain_loop`, started by :func:`measure_plain` in a fresh interpreter,
``python -m bench.plain_loop``, or as ``torch.distributed.run``'s ranks) is the other yardstick:
``DataLoader(dataset, shuffle=True, drop_last=True, **setting)``, the tuned
``torch.set_num_threads``, a few warm-up batches, then the workload's step over a window, with
none of the tuner's code in between. It is what a user's training loop sees.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import itertools
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from objectives import Workload, move_to_device
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
    "GRID_BATCHES",
    "PICK_SHARE",
    "PLAIN_WARMUP_BATCHES",
    "ROOT",
    "STORAGE_WORKERS",
    "USER_WORKLOADS",
    "WORKLOADS",
    "BenchWorkload",
    "Harness",
    "TimedStudy",
    "cli_study",
    "describe",
    "grid_share",
    "interleaved",
    "machine_summary",
    "markdown_table",
    "measure_plain",
    "option_flags",
    "output_dir",
    "parse_study_bench_args",
    "plain_grid",
    "plain_loader",
    "plain_loop",
    "prepare_workload",
    "run_module",
    "run_timed_study",
    "settings_key",
    "space_size",
    "spread",
    "study_bench_parser",
    "study_flags",
]

_log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parents[1]

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

USER_WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (w.objective, dict(w.options)) for name, w in WORKLOADS.items()},
    "photos": ("bench.photos_workload:workload", {}),
    "off_cpu": ("bench.photos_workload:off_cpu", {}),
}
"""name -> (objective spec, workload options as ``python -m tuner.study`` flags take them): the
built-in workloads at the benchmarks' sizes; ``photos``, a user-style file workload (JPEG decode
and PIL augmentation in ``__getitem__``, a small CNN step); and ``off_cpu``, the same files with
a step that sleeps, as a CUDA step leaves the host waiting on the device
(``bench/photos_workload.py``)."""


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
        """Each setting measured once per round, the order rotated every round
        (:func:`interleaved`).

        Returns the samples/s of each setting's completed rounds, in the order given.
        """
        return interleaved([functools.partial(self.measure, s) for s in settings], rounds, desc)

    def baselines(self) -> dict[str, LoaderSettings]:
        """``pytorch-default`` and ``rule-of-thumb``, as the study enqueues them."""
        return baseline_settings(self.prepared.space, self.prepared.fingerprint.physical_cores)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def interleaved(
    measures: Sequence[Callable[[], float | None]], rounds: int, desc: str = "rounds"
) -> list[list[float]]:
    """Each measurement taken once per round, the order rotated every round (A B C, B C A, ...),
    so drift in the machine's speed hits every contender alike; a progress bar over the rounds.

    Returns each measurement's completed values (None, a failed one, is left out), in the
    order given.
    """
    values: list[list[float]] = [[] for _ in measures]
    order = list(range(len(measures)))
    with tqdm(total=rounds, desc=desc, unit="round", file=sys.stderr, leave=False) as bar:
        for round_number in range(rounds):
            shift = round_number % len(order) if order else 0
            for done, index in enumerate(order[shift:] + order[:shift]):
                bar.set_postfix_str(f"{done + 1}/{len(order)}")
                value = measures[index]()
                if value is not None:
                    values[index].append(value)
            bar.update()
    return values


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


def spread(values: Sequence[float]) -> str:
    """``1,234 (1,180-1,290)``: the median and the range of ``values``; ``-`` for none."""
    if not values:
        return "-"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def figure_text(figure: float, holdout_rounds: Sequence[float]) -> str:
    """A study's printed figure with its hold-out rounds' range, as :func:`spread` writes it
    (the figure is their median); the figure alone for a study without them."""
    return spread(holdout_rounds) if holdout_rounds else f"{figure:,.0f}"


def option_flags(options: Mapping[str, Any]) -> list[str]:
    """A workload's options as ``python -m tuner.study`` flags: ``{"images": 512}`` ->
    ``["--images", "512"]``."""
    return [
        part
        for key, value in options.items()
        for part in (f"--{key.replace('_', '-')}", str(value))
    ]


def run_module(*args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` in the repository root with this interpreter, the repository first on
    the path; output captured. Past ``timeout_s`` its whole process group is killed (ranks and
    DataLoader workers included) and the result has return code -9."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", *args]
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, so a timeout reaches its children too
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            return subprocess.CompletedProcess(command, -9, stdout, stderr + "\ntimed out")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def cli_study(
    objective: str, options: Mapping[str, Any], storage: str, flags: Sequence[str]
) -> tuple[float, str]:
    """``python -m tuner.study`` as a user types it (``--no-progress``, ``flags`` after the
    workload's); its wall seconds and what it printed on stdout (the summary). A failed study
    ends the benchmark with its last lines."""
    command = ["tuner.study", "--objective", objective, *option_flags(options)]
    command += ["--storage", storage, "--no-progress", *flags]
    started = time.monotonic()
    result = run_module(*command)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"{objective}: the study failed ({' '.join(command)}):\n{tail}")
    return time.monotonic() - started, result.stdout


PLAIN_WARMUP_BATCHES = 3
"""Batches a plain loop runs before its window: the workers' start and the first batches."""


def plain_loader(
    workload: Workload, settings: LoaderSettings, batch_param: str, *, sharded: bool = False
) -> tuple[Workload, DataLoader]:
    """The workload configured with the setting's knobs, and its DataLoader as a user writes it.

    ``DataLoader(dataset, shuffle=True, drop_last=True, **setting)`` with the workload's
    collate and worker init; a token budget goes to the workload's batch sampler instead. With
    ``sharded`` (a rank under torchrun), a ``DistributedSampler`` shard, shuffled and without
    the ragged tail, takes the place of ``shuffle``.

    Raises:
        ValueError: ``sharded`` with a workload that batches through its own batch sampler.
    """
    from torch.utils.data.distributed import DistributedSampler

    workload = workload.with_knobs(settings.knobs)
    kwargs = settings.dataloader_kwargs(batch_param)
    if workload.batch_sampler is not None:
        if sharded:
            raise ValueError(f"workload {workload.name!r} batches through its own batch sampler")
        kwargs.pop("batch_size", None)
        kwargs["batch_sampler"] = workload.batch_sampler(workload.dataset, settings.batch, 0)
    elif sharded:
        sampler = DistributedSampler(workload.dataset, shuffle=True, drop_last=True)
        kwargs.update(sampler=sampler, drop_last=True)
    else:
        kwargs.update(shuffle=True, drop_last=True)
    if workload.collate_fn is not None:
        kwargs["collate_fn"] = workload.collate_fn
    if workload.worker_init_fn is not None:
        kwargs["worker_init_fn"] = workload.worker_init_fn
    return workload, DataLoader(workload.dataset, **kwargs)


def _loop_device() -> torch.device:
    """The first CUDA device, a rank's own (``LOCAL_RANK``) under torchrun; else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def plain_loop(
    loader: Any,
    workload: Any,
    warmup_s: float,
    window_s: float,
    *,
    warmup_batches: int = 0,
    accumulation_steps: int = 1,
) -> dict[str, Any]:
    """samples/s of a plain training loop over ``loader``.

    ``for batch in loader``: the batch moved to the device, the workload's step, the optimizer
    step every ``accumulation_steps`` batches, a new iterator (and ``set_epoch``) at each
    epoch's end. Warm-up: ``warmup_batches`` and at least ``warmup_s``, then ``window_s`` counted.
    Inside an initialised process group (torchrun's ranks) the ranks meet at a barrier after
    their warm-up, and ``samples_per_sec`` is the node's: the sum of the ranks' rates over
    their windows (``rank_samples_per_sec``, in rank order). A workload that hands over its
    model trains it there as a user's script does: ``DistributedDataParallel`` (the workload's
    ``ddp_kwargs``), each phase under ``Join`` since the ranks stop on their own clocks.

    Returns:
        ``samples_per_sec``, ``rank_samples_per_sec``, ``torch_num_threads``, ``num_workers``,
        ``batch_size`` and ``batches`` (counted in this process's window).
    """
    import torch.distributed as dist

    device = _loop_device()
    distributed = dist.is_available() and dist.is_initialized()
    joined: Callable[[], Any] = contextlib.nullcontext
    if distributed and workload.model is not None and workload.make_step is not None:
        from torch.distributed.algorithms import Join
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(
            workload.model.to(device), device_ids=device_ids, **workload.ddp_kwargs
        )
        step = workload.make_step(device, model)
        joined = functools.partial(Join, [model])
    else:
        step = workload.train_step(device)
    epoch, batches = 0, 0
    iterator = iter(loader)

    def one() -> int:
        nonlocal iterator, epoch, batches
        try:
            batch = next(iterator)
        except StopIteration:
            epoch += 1
            for sampler in (loader.sampler, loader.batch_sampler):
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
            iterator = iter(loader)
            batch = next(iterator)
        step(move_to_device(batch, device, non_blocking=loader.pin_memory))
        batches += 1
        if batches % accumulation_steps == 0:
            step.optimizer_step()
        return len(batch[0])

    started = time.perf_counter()
    with joined():
        for _ in range(warmup_batches):
            one()
        while time.perf_counter() - started < warmup_s:
            one()
    if distributed:
        dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples, batches, started = 0, 0, time.perf_counter()
    with joined():
        while time.perf_counter() - started < window_s:
            samples += one()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rates = [samples / (time.perf_counter() - started)]
    if distributed:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rates[0])
        rates = [float(rate) for rate in gathered]
    return {
        "samples_per_sec": sum(rates),
        "rank_samples_per_sec": rates,
        "torch_num_threads": torch.get_num_threads(),
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "batches": batches,
    }


def measure_plain(
    objective: str,
    options: Mapping[str, Any],
    settings: LoaderSettings,
    batch_param: str,
    window_s: float,
    *,
    warmup_batches: int = PLAIN_WARMUP_BATCHES,
    nproc_per_node: int = 1,
) -> dict[str, Any] | None:
    """The plain loop of ``settings`` in a fresh interpreter (``python -m bench.plain_loop``),
    or as ``nproc_per_node`` ranks started by ``python -m torch.distributed.run`` (gloo on the
    CPU; every rank its shard and the setting's DataLoader, the node's samples/s summed).

    Returns:
        :func:`plain_loop`'s result (rank 0's under torchrun), or None when the process failed
        or ran past its timeout (a warning names why).
    """
    loop = ["bench.plain_loop", "--objective", objective, "--options", json.dumps(dict(options))]
    loop += ["--settings", json.dumps(settings.to_attrs()), "--batch-param", batch_param]
    loop += ["--warmup-batches", str(warmup_batches), "--window-s", str(window_s)]
    if nproc_per_node > 1:
        launcher = [
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc_per_node),
        ]
        loop = [*launcher, "-m", *loop]
    result = run_module(*loop, timeout_s=120 + 4 * window_s)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        # torchrun ends with its own banner: the rank's own complaint is the line worth naming.
        said = [line for line in result.stderr.splitlines() if line.strip(" =-")]
        telling = [line for line in said if "Error" in line or "terminate" in line]
        tail = telling[:1] or said[-1:] or ["no output"]
        _log.warning(
            "plain loop %s: exit %s, %s",
            describe(settings, batch_param),
            result.returncode,
            tail[0],
        )
        return None
    return dict(json.loads(lines[-1]))


GRID_BATCHES = (32, 64, 128)
"""The batch sizes of the plain loops' grids: where the benchmarks' workloads have had their
optima (32 for storage, 64-128 for image)."""
PICK_SHARE = 0.95
"""A pick reaches 95% of an independent grid's best (issues 38 and 40)."""


def grid_share(pick: Sequence[float], grid: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The grid's best setting (the index of the highest median), the pick's median over it,
    and whether that reaches :data:`PICK_SHARE`; None for what did not complete."""
    medians = [statistics.median(values) if values else None for values in grid]
    measured = [(median, index) for index, median in enumerate(medians) if median is not None]
    if not measured:
        return {"best_index": None, "share": None, "reached": None}
    best, index = max(measured)
    if not pick:
        return {"best_index": index, "share": None, "reached": None}
    share = statistics.median(pick) / best
    return {"best_index": index, "share": share, "reached": share >= PICK_SHARE}


def plain_grid(
    workers: Iterable[int],
    batches: Iterable[int],
    threads: Iterable[int],
    knobs: Sequence[Mapping[str, Any]] = ({},),
    pin_memory: bool = False,
) -> list[LoaderSettings]:
    """Every combination of ``workers``, ``batches``, ``threads`` and ``knobs`` (repeats
    dropped, order kept): prefetch 2 and persistent workers where there are workers, as the
    rule of thumb has them, since both only move a loop's first batches and its memory."""
    grid: list[LoaderSettings] = []
    seen: set[str] = set()
    for count, batch, thread, knob in itertools.product(workers, batches, threads, knobs):
        settings = LoaderSettings(
            batch=batch,
            num_workers=count,
            prefetch_factor=2 if count else None,
            persistent_workers=count > 0,
            pin_memory=pin_memory,
            torch_num_threads=thread,
            knobs=dict(knob),
        )
        if settings_key(settings) not in seen:
            seen.add(settings_key(settings))
            grid.append(settings)
    return grid


QUICK = {
    "n_trials": 3,
    "trial_seconds": 0.5,
    "warmup_seconds": 0.3,
    "rounds": 1,
    "window_s": 0.5,
    "grid_size": 2,
}
"""``--quick``: studies of 3 short trials, one round of half-second windows, 2 grid settings.
For checking a script end to end; its figures mean nothing."""


def study_bench_parser(
    prog: str, doc: str | None, workloads: Sequence[str]
) -> argparse.ArgumentParser:
    """The flags of a benchmark that runs studies as users type them, then plain loops in
    interleaved rounds (``bench.truth``, ``bench.ranks``)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", default=",".join(workloads), help="comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds after the studies")
    p.add_argument("--window-s", type=float, default=5.0, help="the plain loop's window (5)")
    p.add_argument("--n-trials", type=int, default=None, help="the studies' (default: theirs)")
    p.add_argument("--trial-seconds", type=float, default=StudyConfig.trial_seconds)
    p.add_argument("--warmup-seconds", type=float, default=StudyConfig.warmup_seconds)
    p.add_argument("--grid-size", type=int, default=None, help="measure the grid's first N only")
    p.add_argument(
        "--grid-batches",
        default=",".join(map(str, GRID_BATCHES)),
        help="the grid's batch sizes, comma-separated",
    )
    quick = ", ".join(f"{key}={value}" for key, value in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"check the script end to end: {quick}")
    p.add_argument("--out", default=None, help="folder for the databases and the results JSON")
    return p


def parse_study_bench_args(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, known: Collection[str]
) -> argparse.Namespace:
    """``p``'s arguments, :data:`QUICK`'s values in place of defaults under ``--quick`` and
    ``workloads`` a list of names in ``known``; usage errors exit 2 with one line."""
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    args.workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in args.workloads if name not in known] or [""] * (not args.workloads)
    if unknown:
        p.error(f"unknown workload {unknown[0]!r}; known: {', '.join(known)}")
    if args.rounds < 1 or args.window_s <= 0 or args.trial_seconds <= 0:
        p.error("--rounds must be at least 1, --window-s and --trial-seconds above 0")
    if args.grid_size is not None and args.grid_size < 0:
        p.error("--grid-size must be 0 or more")
    try:
        args.grid_batches = [int(value) for value in args.grid_batches.split(",") if value.strip()]
    except ValueError:
        args.grid_batches = []
    if not args.grid_batches or min(args.grid_batches) < 1:
        p.error("--grid-batches must be positive batch sizes, comma-separated")
    return args


def study_flags(args: argparse.Namespace) -> list[str]:
    """What a benchmark passes on to ``python -m tuner.study``: the window, the warm-up and,
    where given, the trials."""
    flags = ["--trial-seconds", str(args.trial_seconds)]
    flags += ["--warmup-seconds", str(args.warmup_seconds)]
    if args.n_trials is not None:
        flags += ["--n-trials", str(args.n_trials)]
    return flags
