"""A model of one DataLoader pipeline: producers and a consumer over shared cores.

Pure functions of a :class:`~tuner.pipeline.PipelineProfile` and a setting, so every number
can be recomputed from stored attrs and checked against the trials (``predicted_samples_per_sec``
beside each measured one). For ``w`` workers, batch value ``b`` (``n`` samples) and ``t``
intra-op threads on ``c`` usable cores, per sample:

* the workers produce at most ``w / (fetch_wall + collate + ipc_dump)`` (a worker waiting on
  storage holds no core, so ``w`` may exceed ``c``); an epoch of ``B`` batches takes
  ``ceil(B / w)`` batch fetches, so workers beyond an epoch's batches add nothing;
* the main process consumes at most ``1 / (1 / step_rate(t, b) + ipc_load + transfer)``;
* everything shares the cores: ``rate * (fetch_cpu + collate + ipc_dump + ipc_load + transfer
  + step_cpu(t, b)) <= c``, with the CPU a real DataLoader spends per sample where it exceeds
  the parts timed one by one;
* the prediction is the smooth minimum ``(producer**-k + main**-k) ** (-1/k)`` with ``k`` =
  :data:`OVERLAP_POWER` and ``main = min(consumer, cpu)`` (the cores are a limit both sides
  share, not a third stage), because the stages never overlap perfectly; their plain minimum is
  the ideal overlap, from which the bound and the worker range are built;
* where busy workers and step threads outnumber the cores (:attr:`Prediction.contended`), the
  step pays :data:`THREAD_STALL_S` per batch when multi-threaded, or runs with its workers on
  :data:`ONE_THREAD_SHARE` of the cores with one thread.

Each setting is predicted from its own knobs' costs (:meth:`PipelineProfile.for_knobs`). With
``num_workers=0`` everything is serial in the main process; without ``persistent_workers`` each
epoch starts every worker again; ``prefetch_factor`` costs memory only
(:func:`memory_max_workers`). The bound is the best ideal rate with as many workers as memory
allows: no setting of this machine does better, as far as the profile is right. docs/design.md
describes the model and what its constants rest on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.pipeline._profile import PipelineProfile, RateTable
from tuner.search._settings import LoaderSettings
from tuner.search._space import MAX_WORKERS, SearchSpace

__all__ = [
    "HARD_MAX_WORKERS",
    "PipelineModel",
    "Prediction",
    "candidate_setting",
    "cores_demanded",
    "memory_max_workers",
    "model_seeds",
    "predict",
    "predicted_best",
    "worker_range",
    "workers_needed",
]

OVERLAP_POWER = 2.0
"""The smooth minimum's power: how far the producer and the consumer fall short of perfect
overlap. 2 gives a median error within a point of the best power on the stored ``bench.search``
grids (``python -m bench.overlap_fit``)."""

CROWD_SHARE = 0.2
"""The share of the cores the step, and the workers, must each hold before crowding costs the
step (:attr:`Prediction.contended`): workers that mostly wait on storage, or a small step beside
them, crowd nothing, and the model predicts them well without the crowd's terms."""

THREAD_STALL_S = 0.012
"""What a multi-threaded step loses per batch when crowded: each parallel region waits for its
slowest thread, and one descheduled by a busy worker comes back a time slice later: a fixed
cost per batch, not per sample. 12 ms is the fit on the stored image grids
(``python -m bench.overlap_fit``), about the scheduler's period on 2 CPUs (CFS's
``sched_latency`` is 6 ms x (1 + log2 CPUs))."""

ONE_THREAD_SHARE = 0.8
"""The share of the cores a crowded one-thread step and its workers get to use: the step cannot
take the second core while workers wait on a full queue, nor keep its own while they decode.
Fitted on the stored image grids, where crowded one-thread settings measured 0.75-0.87 of the
uncrowded model."""

HARD_MAX_WORKERS = MAX_WORKERS
"""No space goes beyond this many workers, whatever the model says (process-table sanity)."""

MEMORY_SHARE = 0.5
"""The share of the guard's host limit the workers' own memory and prefetched batches may use."""

ENOUGH_FRACTION = 0.97
"""Workers reach "enough" once the prediction is within 3% of what unlimited workers give."""


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted samples/sec and each stage's limit (``inf`` where a stage does not apply)."""

    samples_per_sec: float
    producer: float
    consumer: float
    cpu: float
    ideal_samples_per_sec: float
    """The rate were the stages to overlap perfectly (their plain minimum)."""
    contended: bool
    """Busy workers and step threads outnumber the cores, and both the step and the workers hold
    a material share of them (:data:`CROWD_SHARE`): the step loses what
    :data:`THREAD_STALL_S` and :data:`ONE_THREAD_SHARE` say."""

    @property
    def limit(self) -> str:
        """Which stage binds: ``workers``, ``step`` or ``cpu``."""
        stages = {"workers": self.producer, "step": self.consumer, "cpu": self.cpu}
        return min(stages, key=lambda name: stages[name])


def _nearest(row: Mapping[int, float], key: int) -> float | None:
    """The value at ``key``, else at the nearest key below it, else the nearest above."""
    if not row:
        return None
    if key in row:
        return row[key]
    below = [k for k in row if k < key]
    return row[max(below)] if below else row[min(row)]


def _step(table: RateTable, threads: int, batch: int) -> float | None:
    row = table.get(threads)
    if row is None:
        fewer = [t for t in table if t <= threads]
        row = table[max(fewer)] if fewer else table.get(min(table)) if table else None
    return None if row is None else _nearest(row, batch)


def _samples(profile: PipelineProfile, batch: int) -> float:
    return _nearest(profile.samples_per_batch, batch) or float(batch)


def _overlap(*stages: float) -> float:
    """The stages' smooth minimum (:data:`OVERLAP_POWER`); infinite stages do not count."""
    finite = [stage for stage in stages if math.isfinite(stage)]
    if not finite:
        return math.inf
    return sum(max(stage, 1e-12) ** -OVERLAP_POWER for stage in finite) ** (-1 / OVERLAP_POWER)


def _costs(profile: PipelineProfile) -> tuple[float, float, float]:
    """Per sample: a worker's wall time, its CPU time, the main process's loader CPU time.

    The real DataLoader's CPU counts (queues, shared memory, bookkeeping) replace the parts
    timed one by one where they are larger, as they are with many small batches.
    """
    produce_s = profile.fetch_alone_s + profile.collate_s + profile.ipc_dump_s
    worker_cpu = max(
        profile.fetch_cpu_s + profile.collate_s + profile.ipc_dump_s, profile.loader_worker_cpu_s
    )
    main_cpu = max(profile.ipc_load_s, profile.loader_main_cpu_s) + profile.transfer_s
    return produce_s, worker_cpu, main_cpu


def predict(profile: PipelineProfile, settings: LoaderSettings) -> Prediction:
    """Predicted samples/sec of ``settings``, from the profile alone (rates over one epoch),
    with its knobs' own costs where they were profiled."""
    profile = profile.for_knobs(settings.knobs)
    batch, threads, workers = settings.batch, settings.torch_num_threads, settings.num_workers
    step_rate = _step(profile.step_rates, threads, batch) or math.inf
    step_cpu = _step(profile.step_cpu_s, threads, batch) or 0.0
    samples = _samples(profile, batch)
    epoch = max(1.0, float(profile.dataset_samples))
    if workers == 0:
        per_sample = profile.fetch_alone_s + profile.collate_s + profile.transfer_s + 1 / step_rate
        rate = 1 / per_sample
        return Prediction(rate, math.inf, rate, math.inf, rate, contended=False)
    produce_s, worker_cpu, main_cpu = _costs(profile)
    # A worker fetches whole batches, and an epoch's batches are shared out among the workers:
    # ceil(batches / workers) rounds of one batch each, so workers beyond an epoch's batches
    # wait idle, and the first batch of each epoch is fetched before anything flows.
    batches = max(1, math.ceil(epoch / samples))
    producer = epoch / (math.ceil(batches / workers) * samples * produce_s)

    def consumer_and_cpu(contended: bool) -> tuple[float, float]:
        stall = THREAD_STALL_S / samples if contended and threads > 1 else 0.0
        share = ONE_THREAD_SHARE if contended and threads == 1 else 1.0
        consumer = 1 / (1 / step_rate + stall + main_cpu)
        cpu = share * profile.usable_cores / max(1e-12, worker_cpu + main_cpu + step_cpu)
        return consumer, cpu

    consumer, cpu = consumer_and_cpu(contended=False)
    rate = _overlap(producer, min(consumer, cpu))
    material = CROWD_SHARE * profile.usable_cores
    contended = (
        not _within_cores(profile, settings)
        and rate * step_cpu >= material
        and rate * worker_cpu >= material
    )
    if contended:
        consumer, cpu = consumer_and_cpu(contended=True)

    def epoch_rate(steady: float) -> float:
        epoch_s = epoch / steady
        if not settings.persistent_workers:
            epoch_s += workers * profile.worker_start_s  # the main process starts each one again
        return epoch / epoch_s

    ideal = epoch_rate(min(producer, consumer, cpu))
    overlapped = _overlap(producer, min(consumer, cpu))
    return Prediction(epoch_rate(overlapped), producer, consumer, cpu, ideal, contended)


def memory_max_workers(
    profile: PipelineProfile,
    host_limit_bytes: int | None,
    batch: int,
    prefetch: int = 2,
    knobs: Mapping[str, Any] | None = None,
) -> int:
    """The most workers whose own memory and prefetched batches fit in half the host limit
    (``knobs``' sample bytes where profiled)."""
    profile = profile.for_knobs(knobs or {})
    if not host_limit_bytes:
        return HARD_MAX_WORKERS
    per_worker = profile.worker_uss_bytes + prefetch * _samples(profile, batch) * max(
        0.0, profile.sample_bytes
    )
    if per_worker <= 0:
        return HARD_MAX_WORKERS
    return max(0, min(HARD_MAX_WORKERS, int(MEMORY_SHARE * host_limit_bytes // per_worker)))


def _best_at(
    profile: PipelineProfile, settings: Iterable[LoaderSettings], ideal: bool = False
) -> tuple[float, LoaderSettings | None]:
    """The fastest of ``settings`` by the prediction (or, ``ideal``, by the perfect overlap)."""
    best_rate, best = -1.0, None
    for candidate in settings:
        prediction = predict(profile, candidate)
        rate = prediction.ideal_samples_per_sec if ideal else prediction.samples_per_sec
        # Ties (within 1%) go to the cheaper setting: fewer workers, then less prefetch.
        if best is None or rate > 1.01 * best_rate:
            best_rate, best = rate, candidate
        elif rate >= best_rate / 1.01 and candidate.memory_footprint() < best.memory_footprint():
            best_rate, best = max(rate, best_rate), candidate
    return best_rate, best


def workers_needed(
    profile: PipelineProfile,
    space: SearchSpace,
    batch: int,
    threads: int,
    knobs: Mapping[str, Any] | None = None,
) -> int:
    """The fewest workers whose ideal rate is within 3% of unlimited workers' (at ``batch``,
    ``knobs``, default the base ones): the smooth minimum approaches the step's rate only
    slowly, and would stretch the range."""
    knobs = space.base_knobs if knobs is None else knobs

    def rate(workers: int) -> float:
        settings = space.settings(
            workers, batch, 2 if workers else None, workers > 0, False, threads, knobs
        )
        return predict(profile, settings).ideal_samples_per_sec

    most = rate(HARD_MAX_WORKERS)
    for workers in range(HARD_MAX_WORKERS + 1):
        if rate(workers) >= ENOUGH_FRACTION * most:
            return workers
    return HARD_MAX_WORKERS


def _fixed_or(space: SearchSpace, name: str, values: Sequence[Any]) -> Sequence[Any]:
    return [space.fixed[name]] if name in space.fixed else values


def candidate_setting(
    space: SearchSpace, workers: int, batch: int, threads: int, knobs: Mapping[str, Any]
) -> LoaderSettings:
    """A setting the model proposes: prefetch 2 and persistent workers unless the user fixed
    them (neither changes the steady rate; persistence saves each epoch's worker starts)."""
    prefetch = space.fixed.get("prefetch_factor", 2) if workers else None
    persistent = bool(space.fixed.get("persistent_workers", True)) and workers > 0
    pin = bool(space.fixed.get("pin_memory", space.cuda))
    return space.settings(workers, batch, prefetch, persistent, pin, threads, knobs)


def _thread_choices(space: SearchSpace) -> list[int]:
    """The thread counts the model strategy tries: 1 and all (or the user's fixed one)."""
    return list(_fixed_or(space, "torch_num_threads", sorted({1, space.max_threads})))


def _candidates(space: SearchSpace) -> list[LoaderSettings]:
    """Every worker, batch, thread count and knob set of ``space``."""
    return [
        candidate_setting(space, workers, batch, threads, knobs)
        for knobs in space.knob_sets()
        for workers in _fixed_or(space, "num_workers", range(space.max_workers + 1))
        for batch in _fixed_or(space, space.batch_param, space.batch_choices())
        for threads in _fixed_or(space, "torch_num_threads", range(1, space.max_threads + 1))
    ]


def predicted_best(profile: PipelineProfile, space: SearchSpace) -> LoaderSettings:
    """The setting of ``space`` the model rates fastest (the cheapest among near-ties)."""
    _, best = _best_at(profile, _candidates(space))
    assert best is not None  # a space always holds at least one setting
    return best


def model_seeds(profile: PipelineProfile, space: SearchSpace) -> list[tuple[str, LoaderSettings]]:
    """What the model strategy measures first, each with why.

    The crowd's costs are fitted constants, the rest of the model is measured, so where the
    predicted best pays them, the setting that pays none is the other answer worth a trial.

    Args:
        profile: the study's pipeline profile.
        space: the search space the seeds must lie in.

    Returns:
        ``("predicted-best", setting)`` first, then, where that setting's step is crowded
        (:attr:`Prediction.contended`), ``("within-cores", setting)``: the best setting whose
        busy workers and step threads fit within the cores, with at least one worker.
    """
    best = predicted_best(profile, space)
    seeds = [("predicted-best", best)]
    if predict(profile, best).contended:
        within = [
            candidate
            for candidate in _candidates(space)
            if candidate.num_workers > 0 and _within_cores(profile, candidate)
        ]
        _, calm = _best_at(profile, within)
        if calm is not None:
            seeds.append(("within-cores", calm))
    return seeds


def cores_demanded(profile: PipelineProfile, settings: LoaderSettings) -> float:
    """The cores ``settings`` keeps busy at once: the step's threads, and each worker's share of
    its time spent on a core rather than waiting on storage (its CPU over its wall time)."""
    produce_s, worker_cpu, _ = _costs(profile.for_knobs(settings.knobs))
    busy = min(1.0, worker_cpu / produce_s) if produce_s > 0 else 1.0
    return settings.num_workers * busy + settings.torch_num_threads


def _within_cores(profile: PipelineProfile, settings: LoaderSettings) -> bool:
    """Whether ``settings``' busy workers and step threads fit in the usable cores."""
    return cores_demanded(profile, settings) <= profile.usable_cores + 1e-9


def worker_range(profile: PipelineProfile, space: SearchSpace, host_limit_bytes: int | None) -> int:
    """The ``num_workers`` upper bound for ``space``: twice the workers the model needs at its
    predicted best or twice the usable cores, whichever is more, within memory and
    :data:`HARD_MAX_WORKERS`.

    A CPU-bound fetch needs about the cores; one that waits on storage needs the cores over
    its CPU share, which can be many times more. The floor of twice the cores is for the
    CPU-bound case, where the ideal rate says one or two workers are enough but measured optima
    sit up to twice the cores: more workers than cores keep batches queued while one is
    descheduled.

    Args:
        profile: the study's pipeline profile.
        space: the search space; its own ``max_workers`` is ignored.
        host_limit_bytes: the guard's host limit, or None for no memory bound.

    Returns:
        The largest ``num_workers`` to search, at least 1.
    """
    wide = dataclasses.replace(space, max_workers=HARD_MAX_WORKERS)
    best = predicted_best(profile, wide)
    needed = workers_needed(profile, space, best.batch, best.torch_num_threads, best.knobs)
    cores = max(1, math.ceil(profile.usable_cores))
    memory = memory_max_workers(profile, host_limit_bytes, best.batch, 2, best.knobs)
    return max(1, min(2 * max(cores, needed), memory, HARD_MAX_WORKERS))


@dataclasses.dataclass(frozen=True)
class PipelineModel:
    """The model bound to one study's profile and space: what a trial's attrs are judged by."""

    profile: PipelineProfile
    bound: float
    """The most this machine can deliver for the workload (samples/s)."""
    best: LoaderSettings

    @classmethod
    def build(
        cls, profile: PipelineProfile, space: SearchSpace, host_limit_bytes: int | None
    ) -> PipelineModel:
        """The bound (the best ideal rate) over ``space`` with as many workers as memory
        allows; the predicted best of ``space`` itself."""
        widest = max(
            (
                memory_max_workers(profile, host_limit_bytes, batch, 2, knobs)
                for batch in space.batch_choices()
                for knobs in space.knob_sets()
            ),
            default=space.max_workers,
        )
        wide = dataclasses.replace(space, max_workers=max(space.max_workers, widest))
        bound, _ = _best_at(profile, _candidates(wide), ideal=True)
        return cls(profile, bound, predicted_best(profile, space))

    def predict(self, settings: LoaderSettings) -> float:
        return predict(self.profile, settings).samples_per_sec


def model_attrs(
    model: PipelineModel | None, settings: LoaderSettings, throughput: float | None
) -> dict[str, float]:
    """A trial's ``predicted_samples_per_sec`` and ``bound_efficiency`` (empty without a model)."""
    if model is None:
        return {}
    attrs = {"predicted_samples_per_sec": model.predict(settings)}
    if throughput is not None and model.bound > 0:
        attrs["bound_efficiency"] = float(throughput) / model.bound
    return attrs
