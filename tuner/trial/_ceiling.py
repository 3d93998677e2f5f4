"""The ceiling, measured: how fast the workload's step runs when data costs nothing.

Runs in a trial child (mode ``ceiling``): the first batch of a DataLoader with ``num_workers=0`` is
moved to the device once, then the step runs on it again and again for the window, with the device
synchronised at the window's edges. No DataLoader setting can feed the step faster than that on this
machine. It leaves out the host-to-device copy that every real loader pays, so a loader can approach
it but not reach it on a GPU. The study side (when to measure it, when a best is near it) is
:mod:`tuner.run._ceiling`.

Where a batch sampler packs batches of differing samples (a token budget), one batch is no
epoch's rate: text's first batch (seed 0) holds 4, 40 and 14 samples at 1,024, 2,048 and 4,096
tokens where the epoch's mean is 9, 19 and 38, and a stored text profile's ceiling read 2,427
samples/s at 2,048 tokens against 932 at 1,024 and 590 at 4,096 (``c5208cf``, docs/data).
There the step turns through :data:`ROTATED_BATCHES` of the epoch's batches, one from each
equal slice of the plan sorted by samples, whose mean comes within 2-8% of the epoch's.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader

from objectives import Workload, move_to_device
from tuner.machine._process import own_peak_memory_bytes
from tuner.search._settings import LoaderSettings
from tuner.trial._heaviest import fetched_batches, heaviest_batch
from tuner.trial._measure import count_samples, synchronize

__all__ = ["CLIMB_STOP_FRACTION", "StepRates", "measure_step_rates"]


ROTATED_BATCHES = 8
"""Batches the step turns through where a batch sampler makes batches differ."""


def _step_batches(workload: Workload, settings: LoaderSettings, seed: int) -> list[object]:
    """The batches the step is timed on, built once, as the main process builds them: the first
    of a main-process DataLoader, or under a batch sampler one batch from each of
    :data:`ROTATED_BATCHES` equal slices of the epoch's plan sorted by samples (the middle of
    each: a stratified sample of the epoch)."""
    if workload.batch_sampler is not None:
        plan = sorted(workload.batch_sampler(workload.dataset, settings.batch, seed), key=len)
        count = min(ROTATED_BATCHES, len(plan))
        return fetched_batches(
            workload, [plan[int((i + 0.5) * len(plan) / count)] for i in range(count)]
        )
    alone = dataclasses.replace(
        settings,
        num_workers=0,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory=False,
        multiprocessing_context=None,
    )
    loader = DataLoader(workload.dataset, **alone.build_dataloader_kwargs(workload, seed))
    return [next(iter(loader))]


def _step_rate(
    workload: Workload,
    batches: Sequence[object],
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    min_steps: int,
    heaviest: object | None = None,
) -> tuple[float, float]:
    """samples/s of the step turning through ``batches``, and the CPU seconds it spends per
    sample (the epoch's ``heaviest`` batch stepped once first, untimed)."""
    step = workload.train_step(device)
    micro_batches = 0
    turn = itertools.cycle([(batch, count_samples(batch)) for batch in batches])

    def run_one() -> int:
        """One step on the next batch; its samples."""
        batch, samples = next(turn)
        stepped(batch)
        return samples

    def stepped(batch: object) -> None:
        nonlocal micro_batches
        step(batch)
        micro_batches += 1
        if micro_batches % settings.accumulation_steps == 0:
            step.optimizer_step()

    if heaviest is not None:  # untimed: the peak memory read after is the epoch's
        stepped(heaviest)
    warm_from = time.perf_counter()
    warm_steps = 0
    while warm_steps < len(batches) or time.perf_counter() - warm_from < warmup_s:
        run_one()
        warm_steps += 1
    synchronize(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    steps = samples = 0
    while steps < max(min_steps, len(batches)) or time.perf_counter() - started < window_s:
        samples += run_one()
        steps += 1
    synchronize(device)
    cpu_s = time.process_time() - cpu_started
    return samples / (time.perf_counter() - started), cpu_s / max(1, samples)


CLIMB_STOP_FRACTION = 0.5
"""Going up the batch sizes stops at one whose step runs below half the best rate so far: past
that point larger batches only get slower (caches, page faults, memory bandwidth), and each of
their steps takes longest to measure."""


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
    The speed per sample is not monotone in the batch size (a text step measured here ran 798
    samples/s at 8192 tokens and 91 at 32768), so the sizes are tried smallest first until one
    falls below :data:`CLIMB_STOP_FRACTION` of the best.
    """
    torch.manual_seed(seed)
    counts = list(threads or [settings.torch_num_threads])
    rates: dict[int, dict[int, float]] = {count: {} for count in counts}
    cpu: dict[int, dict[int, float]] = {count: {} for count in counts}
    peaks: dict[int, int] = {}
    best = 0.0
    for size in sorted(batches or [settings.batch]):
        sized = dataclasses.replace(settings, batch=size)
        batches = [move_to_device(b, device) for b in _step_batches(workload, sized, seed)]
        heaviest = heaviest_batch(workload, sized, seed)
        if heaviest is not None:
            heaviest = move_to_device(heaviest, device)
        for count in counts:
            torch.set_num_threads(count)
            rates[count][size], cpu[count][size] = _step_rate(
                workload, batches, sized, device, window_s, warmup_s, min_steps, heaviest
            )
        peak = own_peak_memory_bytes()
        if peak is not None:
            peaks[size] = peak
        del batches, heaviest
        if device.type == "cuda":
            torch.cuda.empty_cache()
        here = max(rates[count][size] for count in counts)
        if here < CLIMB_STOP_FRACTION * best:
            break
        best = max(best, here)
    return StepRates(rates, cpu, peaks)
