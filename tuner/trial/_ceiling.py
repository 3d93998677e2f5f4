"""The ceiling, measured: how fast the workload's step runs when data costs nothing.

Runs in a trial child (mode ``ceiling``): the first batch of a DataLoader with ``num_workers=0`` is
moved to the device once, then the step runs on it again and again for the window, with the device
synchronised at the window's edges. No DataLoader setting can feed the step faster than that on this
machine. It leaves out the host-to-device copy that every real loader pays, so a loader can approach
it but not reach it on a GPU. The study side (when to measure it, when a best is near it) is
:mod:`tuner.run._ceiling`.

Where a batch sampler packs batches of differing samples (a token budget), one batch is no
epoch's rate (text's first batch can hold a fifth or twice the epoch's mean samples). There the
step warms up on the batch nearest the epoch's mean, then turns through up to
:data:`ROTATED_BATCHES` of the epoch's batches (:func:`strata`), as many as the window holds
steps, in whole turns, so a window of slow large-batch steps is not stretched to hold all of
them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, IterableDataset

from objectives import Workload, move_to_device
from tuner.machine import own_peak_memory_bytes
from tuner.search import LoaderSettings
from tuner.trial._fetch import fetched_batches
from tuner.trial._heaviest import heaviest_batch
from tuner.trial._measure import count_samples, synchronize

__all__ = ["CLIMB_STOP_FRACTION", "StepRates", "measure_step_rates", "step_batch", "strata"]


ROTATED_BATCHES = 8
"""At most this many batches the step turns through where a batch sampler makes batches differ."""


def strata(plan: Sequence[Sequence[int]], count: int) -> list[Sequence[int]]:
    """One batch from each of ``count`` equal slices of ``plan`` sorted by samples, each chosen
    to keep the running mean of the chosen on the epoch's: a slice's middle batch would not (a
    token budget's batches are skewed, a few hold many short samples), nor, where a slice holds
    only two or three batches, the one nearest its own mean."""
    ordered = sorted(plan, key=len)
    count = max(1, min(count, len(ordered)))
    mean = sum(map(len, ordered)) / len(ordered)
    chosen: list[Sequence[int]] = []
    total = 0
    for number in range(count):
        part = ordered[number * len(ordered) // count : (number + 1) * len(ordered) // count]
        pick = min(part, key=lambda batch: abs(total + len(batch) - mean * (number + 1)))
        chosen.append(pick)
        total += len(pick)
    return chosen


class _StepBatches:
    """The batches the step is timed on, built as the main process builds them, on the device:
    a main-process DataLoader's first, or under a batch sampler :func:`strata` of the epoch's
    plan, as many as the window has steps for (built once per count)."""

    def __init__(
        self, workload: Workload, settings: LoaderSettings, seed: int, device: torch.device
    ) -> None:
        self._workload = workload
        self._device = device
        self._built: dict[int, list[object]] = {}
        self._plan: list[list[int]] | None = None
        if workload.batch_sampler is not None:
            self._plan = [
                list(batch)
                for batch in workload.batch_sampler(workload.dataset, settings.batch, seed)
            ]
            return
        alone = dataclasses.replace(
            settings,
            num_workers=0,
            prefetch_factor=None,
            persistent_workers=False,
            pin_memory=False,
            multiprocessing_context=None,
        )
        loader = DataLoader(workload.dataset, **alone.build_dataloader_kwargs(workload, seed))
        if isinstance(workload.dataset, IterableDataset):
            first = next(iter(loader))
        else:  # a batch of the loader's own sampler, fetched in parallel where samples wait
            first = fetched_batches(workload, [next(iter(loader.batch_sampler))])[0]
        self._built[1] = [move_to_device(first, device)]

    def take(self, count: int) -> list[object]:
        """``count`` batches (at most :data:`ROTATED_BATCHES`; one without a batch sampler);
        one alone is the batch nearest the epoch's mean."""
        if self._plan is None:
            return self._built[1]
        count = max(1, min(count, ROTATED_BATCHES, len(self._plan)))
        if count not in self._built:
            for built in [key for key in self._built if key != 1]:
                del self._built[built]  # one set on the device at a time, beside the warm-up's
            fetched = fetched_batches(self._workload, strata(self._plan, count))
            self._built[count] = [move_to_device(batch, self._device) for batch in fetched]
        return self._built[count]


def step_batch(
    workload: Workload, settings: LoaderSettings, seed: int, device: torch.device
) -> object:
    """The batch the step is timed on where one is (:class:`_StepBatches`), on ``device``."""
    return _StepBatches(workload, settings, seed, device).take(1)[0]


def _step_rate(
    workload: Workload,
    batches: _StepBatches,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    min_steps: int,
    heaviest: object | None = None,
) -> tuple[float, float, float]:
    """samples/s of the step turning through ``batches`` (as many as the window holds steps of
    the warm-up's), the CPU seconds it spends per sample and the seconds per step (the epoch's
    ``heaviest`` batch stepped once first, untimed)."""
    step = workload.train_step(device)
    micro_batches = 0

    def stepped(batch: object) -> None:
        nonlocal micro_batches
        step(batch)
        micro_batches += 1
        if micro_batches % settings.accumulation_steps == 0:
            step.optimizer_step()

    if heaviest is not None:  # untimed: the peak memory read after is the epoch's
        stepped(heaviest)
    typical = batches.take(1)[0]
    warm_from = time.perf_counter()
    warm_steps = 0
    while warm_steps < 1 or time.perf_counter() - warm_from < warmup_s:
        stepped(typical)
        warm_steps += 1
    synchronize(device)
    step_s = (time.perf_counter() - warm_from) / warm_steps
    chosen = batches.take(int(window_s / max(step_s, 1e-9)))
    samples_of = [count_samples(batch) for batch in chosen]
    started, cpu_started = time.perf_counter(), time.process_time()
    steps = samples = 0
    # Whole turns only, so that every chosen batch weighs the same.
    while (
        steps < max(min_steps, len(chosen))
        or steps % len(chosen)
        or time.perf_counter() - started < window_s
    ):
        stepped(chosen[steps % len(chosen)])
        samples += samples_of[steps % len(chosen)]
        steps += 1
    synchronize(device)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    return samples / elapsed_s, cpu_s / max(1, samples), elapsed_s / steps


CLIMB_STOP_FRACTION = 0.5
"""Going up the batch sizes stops at one whose step runs below half the best rate so far: past
that point larger batches only get slower (caches, page faults, memory bandwidth), and each of
their steps takes longest to measure."""

SLOW_STEP_S = 0.5
"""...and at one already slower than the best whose step takes this long at its fastest thread
count: the next size's steps take a second or more each, and each is measured warm, twice, at
every thread count, which would make the set-up take most of a study. A size before the best is
measured however slow its step."""


@dataclasses.dataclass(frozen=True)
class StepRates:
    """The step alone per thread count and batch value: samples/s and CPU seconds per sample.

    Batch values above the climb's stop (:data:`CLIMB_STOP_FRACTION`) are absent.
    """

    rates: dict[int, dict[int, float]]
    cpu_s: dict[int, dict[int, float]]
    peak_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per batch value: the process's peak memory once its steps ran (PSS, estimated by
    :func:`~tuner.machine._process.own_peak_memory_bytes`): the main process with the step's
    batch and activations, no workers, the epoch's heaviest batch stepped once
    (:mod:`tuner.trial._heaviest`). What the memory model starts from."""

    @property
    def ceiling(self) -> float:
        """The best rate of all: the study's ``ceiling_samples_per_sec``."""
        return max((r for row in self.rates.values() for r in row.values()), default=0.0)


def measure_step_rates(
    workload: Workload,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    batches: Sequence[int] | None = None,
    threads: Sequence[int] | None = None,
    seed: int = 0,
    min_steps: int = 2,
) -> StepRates:
    """The step's samples/sec on prepared batches, per value of ``batches`` and ``threads``.

    ``settings`` gives the knobs and accumulation; ``batches`` are values of the workload's batch
    parameter (default: ``settings.batch``), ``threads`` intra-op thread counts (default:
    ``settings.torch_num_threads``), which change the step's own speed, a lot on some machines.
    The speed per sample is not monotone in the batch size (a large token budget's step can run
    several times slower per sample), so the sizes are tried smallest first until one
    falls below :data:`CLIMB_STOP_FRACTION` of the best, or below the best with steps of
    :data:`SLOW_STEP_S` or more.
    """
    torch.manual_seed(seed)
    counts = list(threads or [settings.torch_num_threads])
    rates: dict[int, dict[int, float]] = {count: {} for count in counts}
    cpu: dict[int, dict[int, float]] = {count: {} for count in counts}
    peaks: dict[int, int] = {}
    best = 0.0
    for size in sorted(batches or [settings.batch]):
        sized = dataclasses.replace(settings, batch=size)
        prepared = _StepBatches(workload, sized, seed, device)
        heaviest = heaviest_batch(workload, sized, seed)
        if heaviest is not None:
            heaviest = move_to_device(heaviest, device)
        step_s = math.inf
        for count in counts:
            torch.set_num_threads(count)
            rates[count][size], cpu[count][size], seconds = _step_rate(
                workload, prepared, sized, device, window_s, warmup_s, min_steps, heaviest
            )
            step_s = min(step_s, seconds)
        peak = own_peak_memory_bytes()
        if peak is not None:
            peaks[size] = peak
        del prepared, heaviest
        if device.type == "cuda":
            torch.cuda.empty_cache()
        here = max(rates[count][size] for count in counts)
        if here < CLIMB_STOP_FRACTION * best or (here < best and step_s >= SLOW_STEP_S):
            break
        best = max(best, here)
    return StepRates(rates, cpu, peaks)
