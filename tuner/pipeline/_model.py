"""A model of one DataLoader pipeline: producers and a consumer over shared cores.

Pure functions of a :class:`~tuner.pipeline.PipelineProfile` and a setting, so every number
can be recomputed from stored attrs and checked against the trials (``predicted_samples_per_sec``
beside each measured one). For ``w`` workers, batch value ``b`` (``n`` samples) and ``t``
intra-op threads on ``c`` cores (the usable cores over the ranks that share them,
:attr:`~tuner.pipeline.PipelineProfile.cores_per_rank`), per sample:

* the workers produce at most ``w / (fetch_wall + collate + ipc_dump)`` (a worker waiting on
  storage holds no core, so ``w`` may exceed ``c``); an epoch of ``B`` batches takes
  ``ceil(B / w)`` batch fetches, so workers beyond an epoch's batches add nothing;
* nor faster than the cores they hold allow their CPU (:func:`_worker_rate`): at most ``c``,
  less what the scheduler's fair share gives the main process while it runs, so past the
  cores a worker adds time-slicing, not throughput;
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tuner.pipeline._profile import PipelineProfile, RateTable
from tuner.search import MAX_WORKERS, LoaderSettings, SearchSpace

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
    "setting_key",
    "worker_ladder",
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


def _main_busy(step_rate: float, step_cpu: float, main_cpu: float) -> float:
    """The cores the main process keeps busy while it steps flat out: its CPU per sample over
    its wall per sample (next to nothing for a step off the CPU)."""
    wall = 1 / step_rate + main_cpu
    return (step_cpu + main_cpu) / wall if wall > 0 else 0.0


def _worker_rate(
    cores: float, workers: float, produce_s: float, worker_cpu: float, main: tuple[float, float]
) -> float:
    """The most samples/s ``workers`` compute on the cores they hold beside the main process.

    ``main`` is the main process's (CPU per sample, cores busy while it runs). Each worker is
    runnable for its CPU share of its wall time. While the main process runs, and the runnable
    workers and it outnumber the cores, the scheduler shares the cores out in proportion (CFS's
    fair share), so the workers give up ``lost`` of the ``held`` cores they hold otherwise. At
    rate ``r`` the main process runs ``r x main_cpu / main_busy`` of the time (at most all of
    it), so the workers hold ``held - lost x`` that share; the ``r`` those cores make is the
    answer. Past the cores a worker adds time-slicing, not throughput: it only takes a larger
    share from a main process that runs, and one whose step is off the CPU seldom does.
    """
    main_cpu, main_busy = main
    demand = workers * (min(1.0, worker_cpu / produce_s) if produce_s > 0 else 1.0)
    held = min(demand, cores)
    worker_cpu = max(1e-12, worker_cpu)
    if demand + main_busy <= cores or main_busy <= 0:
        return held / worker_cpu
    lost = held - cores * demand / (demand + main_busy)
    part_time = held / (worker_cpu + main_cpu * lost / main_busy)  # the main runs part of it
    return max(part_time, (held - lost) / worker_cpu)  # the main runs all the time


def predict(profile: PipelineProfile, settings: LoaderSettings) -> Prediction:
    """Predicted samples/sec of ``settings`` for the node, from the profile alone (rates over
    one epoch), with its knobs' own costs where they were profiled: under
    :attr:`~tuner.pipeline.PipelineProfile.ranks` ranks, one rank's rate on its share of the
    cores and its shard of the epoch, times the ranks (they run the same setting side by side,
    as a multi-rank trial measures them)."""
    rank = _rank_prediction(profile, settings)
    ranks = max(1, profile.ranks)
    if ranks == 1:
        return rank
    return dataclasses.replace(
        rank,
        samples_per_sec=rank.samples_per_sec * ranks,
        producer=rank.producer * ranks,
        consumer=rank.consumer * ranks,
        cpu=rank.cpu * ranks,
        ideal_samples_per_sec=rank.ideal_samples_per_sec * ranks,
    )


def _rank_prediction(profile: PipelineProfile, settings: LoaderSettings) -> Prediction:
    """One rank's samples/sec of ``settings``."""
    profile = profile.for_knobs(settings.knobs)
    batch, threads, workers = settings.batch, settings.torch_num_threads, settings.num_workers
    step_rate = _step(profile.step_rates, threads, batch) or math.inf
    step_cpu = _step(profile.step_cpu_s, threads, batch) or 0.0
    samples = _samples(profile, batch)
    epoch = max(1.0, float(profile.dataset_samples) / max(1, profile.ranks))  # the rank's shard
    if workers == 0:
        per_sample = profile.fetch_alone_s + profile.collate_s + profile.transfer_s + 1 / step_rate
        rate = 1 / per_sample
        return Prediction(rate, math.inf, rate, math.inf, rate, contended=False)
    produce_s, worker_cpu, main_cpu = _costs(profile)
    # A worker fetches whole batches, and an epoch's batches are shared out among the workers:
    # ceil(batches / workers) rounds of one batch each, so workers beyond an epoch's batches
    # wait idle, and the first batch of each epoch is fetched before anything flows.
    batches = max(1, math.ceil(epoch / samples))
    rounds = math.ceil(batches / workers)
    producer = epoch / (rounds * samples * produce_s)
    # Nor faster than the cores they hold: past the cores a worker adds time-slicing, not
    # throughput (``batches / rounds``: the workers fetching at once, on average over an epoch).
    main = (step_cpu + main_cpu, _main_busy(step_rate, step_cpu, main_cpu))
    held_rate = _worker_rate(profile.cores_per_rank, batches / rounds, produce_s, worker_cpu, main)
    producer = min(producer, held_rate)

    def consumer_and_cpu(contended: bool) -> tuple[float, float]:
        stall = THREAD_STALL_S / samples if contended and threads > 1 else 0.0
        share = ONE_THREAD_SHARE if contended and threads == 1 else 1.0
        consumer = 1 / (1 / step_rate + stall + main_cpu)
        cpu = share * profile.cores_per_rank / max(1e-12, worker_cpu + main_cpu + step_cpu)
        return consumer, cpu

    consumer, cpu = consumer_and_cpu(contended=False)
    rate = _overlap(producer, min(consumer, cpu))
    material = CROWD_SHARE * profile.cores_per_rank
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


def _rate(profile: PipelineProfile, settings: LoaderSettings, ideal: bool) -> float:
    prediction = predict(profile, settings)
    return prediction.ideal_samples_per_sec if ideal else prediction.samples_per_sec


def _pick(rated: Iterable[tuple[float, LoaderSettings]]) -> tuple[float, LoaderSettings | None]:
    """The fastest of ``rated``, in their order; ties (within 1%) go to the cheaper setting:
    fewer workers, then less prefetch, then fewer intra-op threads (a thread that gains nothing,
    as with a step off the CPU, would only take a core from the workers when it does run)."""

    def cost(settings: LoaderSettings) -> tuple[tuple[int, ...], int]:
        return settings.memory_footprint(), settings.torch_num_threads

    best_rate, best = -1.0, None
    for rate, candidate in rated:
        if best is None or rate > 1.01 * best_rate:
            best_rate, best = rate, candidate
        elif rate >= best_rate / 1.01 and cost(candidate) < cost(best):
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
    slowly, and would stretch the range.

    The first :func:`worker_ladder` value that gets there, then every count between it and the
    ladder value below (the ideal rate climbs with the workers until the cores crowd the step,
    so a count the ladder skipped does not get there before the ladder does).
    """
    knobs = space.base_knobs if knobs is None else knobs

    def rate(workers: int) -> float:
        settings = candidate_setting(space, workers, batch, threads, knobs)
        return predict(profile, settings).ideal_samples_per_sec

    most = rate(HARD_MAX_WORKERS)

    def enough(workers: int) -> bool:
        return rate(workers) >= ENOUGH_FRACTION * most

    below = 0
    for rung in worker_ladder(HARD_MAX_WORKERS):
        if enough(rung):
            return next((w for w in range(below + 1, rung) if enough(w)), rung)
        below = rung
    return HARD_MAX_WORKERS


def worker_ladder(max_workers: int) -> list[int]:
    """0, 1, 2, 3, 4, 6, 8, 12, ...: powers of two and the halfway steps between them, up to
    ``max_workers`` (included): steps of 1.3-1.5x, fine where the rate turns, cheap to climb."""
    values = {0, max_workers}
    power = 1
    while power <= max_workers:
        values.add(power)
        if power >= 2 and power * 3 // 2 <= max_workers:
            values.add(power * 3 // 2)
        power *= 2
    return sorted(value for value in values if 0 <= value <= max_workers)


def _fixed_or(space: SearchSpace, name: str, values: Sequence[Any]) -> Sequence[Any]:
    return [space.fixed[name]] if name in space.fixed else values


def _proposed_prefetch(space: SearchSpace) -> int:
    """The ``prefetch_factor`` the model proposes: PyTorch's 2, or the user's fixed one."""
    return int(space.fixed.get("prefetch_factor", 2))


def candidate_setting(
    space: SearchSpace, workers: int, batch: int, threads: int, knobs: Mapping[str, Any]
) -> LoaderSettings:
    """A setting the model proposes: prefetch 2, persistent workers and pinning on CUDA unless
    the user fixed them (none changes the steady rate; persistence saves each epoch's worker
    starts). Where the profile says one can change the result, the strategy measures the other
    value beside the best (:mod:`tuner.pipeline._knobs`)."""
    prefetch = _proposed_prefetch(space) if workers else None
    persistent = bool(space.fixed.get("persistent_workers", True)) and workers > 0
    pin = bool(space.fixed.get("pin_memory", space.cuda))
    return space.settings(workers, batch, prefetch, persistent, pin, threads, knobs)


def _thread_choices(space: SearchSpace) -> list[int]:
    """The thread counts the model strategy tries: 1 and all (or the user's fixed one)."""
    return list(_fixed_or(space, "torch_num_threads", sorted({1, space.max_threads})))


def _model_threads(profile: PipelineProfile, space: SearchSpace) -> list[int]:
    """The thread counts the model's search starts from: 1, one rank's cores, all, and those
    the step was measured at (where its rates change; or the user's fixed one); :func:`_search`
    refines between them."""
    per_rank = max(1, min(space.max_threads, math.floor(profile.cores_per_rank + 1e-9)))
    measured = {t for t in profile.step_rates if 1 <= t <= space.max_threads}
    choices = sorted({1, per_rank, space.max_threads} | measured)
    return list(_fixed_or(space, "torch_num_threads", choices))


def _coarse(profile: PipelineProfile, space: SearchSpace) -> list[LoaderSettings]:
    """Every ladder worker count (:func:`worker_ladder`), batch value, starting thread count
    (:func:`_model_threads`) and knob set of ``space``: a few hundred settings on any machine."""
    return [
        candidate_setting(space, workers, batch, threads, knobs)
        for knobs in space.knob_sets()
        for workers in _fixed_or(space, "num_workers", worker_ladder(space.max_workers))
        for batch in _fixed_or(space, space.batch_param, space.batch_choices())
        for threads in _model_threads(profile, space)
    ]


Admit = Callable[[LoaderSettings], bool]


def _search(
    profile: PipelineProfile, space: SearchSpace, ideal: bool = False, admit: Admit | None = None
) -> tuple[float, LoaderSettings | None]:
    """The best setting of ``space`` the model finds (by :func:`_pick`'s rule, ``admit``'s
    settings only), without rating every worker count x thread count.

    The coarse grid (:func:`_coarse`) is rated, then each of its :data:`REFINE_STARTS` best is
    climbed along the workers and the threads (a step of half the gap to the next ladder rung,
    halved until 1, moving while the rate rises) with every batch value and knob set at each
    stop. What :func:`_pick` chooses among everything rated is the answer. On the stored
    2-core profiles, and on them at 4 cores, it is the best of every setting of the space
    (``tests/tuner_tests/pipeline/test_search.py``); a 96-core space takes a few thousand
    predictions, not a million.
    """
    rated: dict[SettingKey, tuple[float, LoaderSettings]] = {}

    def rate(candidate: LoaderSettings) -> float | None:
        if admit is not None and not admit(candidate):
            return None
        key = setting_key(candidate)
        if key not in rated:
            rated[key] = (_rate(profile, candidate, ideal), candidate)
        return rated[key][0]

    coarse = [(r, c) for c in _coarse(profile, space) if (r := rate(c)) is not None]
    starts = sorted(coarse, key=lambda pair: -pair[0])[:REFINE_STARTS]
    for _, start in starts:
        _climb(space, start, rate)
    return _pick(_canonical(space, rated.values()))


REFINE_STARTS = 3
"""How many of the coarse grid's best settings the search climbs from: a contended space has
two peaks (within the cores, and past them), and the ladder may rate either one first."""

SettingKey = tuple[int, int, int, tuple[tuple[str, str], ...]]


def setting_key(settings: LoaderSettings) -> SettingKey:
    """What the model tells settings apart by: workers, batch, threads and knobs (prefetch and
    persistence only cost memory or each epoch's starts)."""
    knobs = tuple(sorted((name, repr(value)) for name, value in settings.knobs.items()))
    return settings.num_workers, settings.batch, settings.torch_num_threads, knobs


def _canonical(
    space: SearchSpace, rated: Iterable[tuple[float, LoaderSettings]]
) -> list[tuple[float, LoaderSettings]]:
    """``rated`` in the space's own order (knob set, workers, batch, threads): the order
    :func:`_pick` breaks ties in, whichever order the search rated them in."""
    knob_order = {repr(sorted(k.items())): i for i, k in enumerate(space.knob_sets())}

    def position(pair: tuple[float, LoaderSettings]) -> tuple[int, int, int, int]:
        s = pair[1]
        knobs = knob_order.get(repr(sorted(s.knobs.items())), len(knob_order))
        return knobs, s.num_workers, s.batch, s.torch_num_threads

    return sorted(rated, key=position)


def _climb(
    space: SearchSpace, start: LoaderSettings, rate: Callable[[LoaderSettings], float | None]
) -> None:
    """Climb from ``start`` along the workers and the threads (see :func:`_search`), rating
    every batch value and knob set at each setting reached."""

    def best_of_row(workers: int, threads: int) -> tuple[float, LoaderSettings] | None:
        row = [
            candidate_setting(space, workers, batch, threads, knobs)
            for knobs in space.knob_sets()
            for batch in _fixed_or(space, space.batch_param, space.batch_choices())
        ]
        rated = [(r, c) for c in row if (r := rate(c)) is not None]
        return max(rated, key=lambda pair: pair[0]) if rated else None

    current = best_of_row(start.num_workers, start.torch_num_threads)
    if current is None:
        return
    bounds = {"num_workers": (0, space.max_workers), "torch_num_threads": (1, space.max_threads)}
    moved = True
    while moved:
        moved = False
        for name, (low, high) in bounds.items():
            if name in space.fixed:
                continue
            step = max(1, _gap(getattr(current[1], name), high) // 2)
            while step >= 1:
                value = getattr(current[1], name)
                tried = [
                    best_of_row(*_along(current[1], name, v))
                    for v in (value - step, value + step)
                    if low <= v <= high
                ]
                better = [pair for pair in tried if pair is not None and pair[0] > current[0]]
                if better:
                    current, moved = max(better, key=lambda pair: pair[0]), True
                else:
                    step //= 2


def _gap(value: int, high: int) -> int:
    """The distance from ``value`` to the next rung of its ladder above it (within ``high``)."""
    above = [rung for rung in worker_ladder(high) if rung > value]
    return (above[0] - value) if above else 1


def _along(settings: LoaderSettings, name: str, value: int) -> tuple[int, int]:
    """(workers, threads) of ``settings`` with ``name`` set to ``value``."""
    if name == "num_workers":
        return value, settings.torch_num_threads
    return settings.num_workers, value


def predicted_best(profile: PipelineProfile, space: SearchSpace) -> LoaderSettings:
    """The setting of ``space`` the model rates fastest (the cheapest among near-ties)."""
    _, best = _search(profile, space)
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

        def within(candidate: LoaderSettings) -> bool:
            return candidate.num_workers > 0 and _within_cores(profile, candidate)

        _, calm = _search(profile, space, admit=within)
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
    """Whether ``settings``' busy workers and step threads fit in one rank's cores."""
    return cores_demanded(profile, settings) <= profile.cores_per_rank + 1e-9


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
    cores = max(1, math.ceil(profile.cores_per_rank))
    prefetch = best.prefetch_factor or _proposed_prefetch(space)
    memory = memory_max_workers(profile, host_limit_bytes, best.batch, prefetch, best.knobs)
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
                memory_max_workers(
                    profile, host_limit_bytes, batch, _proposed_prefetch(space), knobs
                )
                for batch in space.batch_choices()
                for knobs in space.knob_sets()
            ),
            default=space.max_workers,
        )
        wide = dataclasses.replace(space, max_workers=max(space.max_workers, widest))
        bound, _ = _search(profile, wide, ideal=True)
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
