"""The ceiling: how fast the workload's step runs when data costs nothing.

Measured once per study, in a trial child (mode ``ceiling``): one batch from a DataLoader with
``num_workers=0`` is moved to the device once, then the step runs on it again and again for the
window, with the device synchronised at the window's edges. No DataLoader setting can feed the
step faster than that on this machine, so it is the yardstick for every trial (``efficiency``)
and the point where searching further is pointless (:func:`ceiling_stop_message`). It leaves out
the host-to-device copy that every real loader pays, so a loader can approach it but not reach
it on a GPU.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import optuna
import torch
from torch.utils.data import DataLoader

from objectives import Workload, move_to_device
from tuner._measure import count_samples, synchronize
from tuner._naming import CEILING_ATTR
from tuner._settings import LoaderSettings
from tuner._summary import best_trial, remeasured, trial_throughput

__all__ = [
    "CEILING_ATTR",
    "CEILING_STOP_FRACTION",
    "ceiling_stop_message",
    "efficiency",
    "measure_ceiling",
]


CEILING_STOP_FRACTION = 0.98
"""A best within 2% of the ceiling ends the study: no setting can be meaningfully faster."""


def _one_batch(workload: Workload, settings: LoaderSettings, seed: int) -> object:
    """The first batch of a main-process DataLoader: what the step sees, built once."""
    alone = dataclasses.replace(
        settings,
        num_workers=0,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory=False,
        multiprocessing_context=None,
    )
    loader = DataLoader(workload.dataset, **alone.build_dataloader_kwargs(workload, seed))
    return next(iter(loader))


def _step_rate(
    workload: Workload,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    seed: int,
    min_steps: int,
) -> float:
    batch = move_to_device(_one_batch(workload, settings, seed), device)
    samples_per_step = count_samples(batch)
    step = workload.train_step(device)
    micro_batches = 0

    def run_one() -> None:
        nonlocal micro_batches
        step(batch)
        micro_batches += 1
        if micro_batches % settings.accumulation_steps == 0:
            step.optimizer_step()

    warm_from = time.perf_counter()
    warm_steps = 0
    while warm_steps < 2 or time.perf_counter() - warm_from < warmup_s:
        run_one()
        warm_steps += 1
    synchronize(device)
    started = time.perf_counter()
    steps = 0
    while steps < min_steps or time.perf_counter() - started < window_s:
        run_one()
        steps += 1
    synchronize(device)
    return samples_per_step * steps / (time.perf_counter() - started)


def measure_ceiling(
    workload: Workload,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    batches: Sequence[int] | None = None,
    seed: int = 0,
    min_steps: int = 3,
) -> float:
    """The step's samples/sec on one prepared batch; the best over ``batches`` when given.

    ``settings`` gives the knobs, threads and accumulation; ``batches`` are values of the
    workload's batch parameter to try (default: ``settings.batch``), because a larger batch
    usually makes the step itself faster per sample.
    """
    torch.manual_seed(seed)
    torch.set_num_threads(settings.torch_num_threads)
    rates = []
    for batch in batches or [settings.batch]:
        sized = dataclasses.replace(settings, batch=batch)
        rates.append(_step_rate(workload, sized, device, window_s, warmup_s, seed, min_steps))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return max(rates)


def efficiency(samples_per_sec: float | None, ceiling: float | None) -> float | None:
    """A throughput as a fraction of the ceiling (the ``efficiency`` user attr)."""
    if samples_per_sec is None or not ceiling or ceiling <= 0:
        return None
    return float(samples_per_sec) / float(ceiling)


def ceiling_stop_message(
    study: optuna.Study, fraction: float = CEILING_STOP_FRACTION
) -> str | None:
    """Why the study should stop now (its best is within 2% of the ceiling), or None."""
    ceiling = study.user_attrs.get(CEILING_ATTR)
    best = best_trial(study)
    if not ceiling or best is None:
        return None
    throughput = trial_throughput(best, remeasured(study))
    share = efficiency(throughput, ceiling)
    if share is None or share < fraction:
        return None
    return (
        f"stopping early: trial {best.number} reaches {throughput:,.1f} samples/s, "
        f"{share:.1%} of the ceiling ({float(ceiling):,.1f} samples/s with data already on the "
        "device); no DataLoader setting can be meaningfully faster"
    )
