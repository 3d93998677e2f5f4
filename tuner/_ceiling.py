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
from optuna.trial import TrialState
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
    "near_ceiling",
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
    batch: object,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    min_steps: int,
) -> float:
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
    while warm_steps < 1 or time.perf_counter() - warm_from < warmup_s:
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


CLIMB_STOP_FRACTION = 0.5
"""Going up the batch sizes stops at one whose step runs below half the best rate so far: past
that point larger batches only get slower (caches, page faults, memory bandwidth), and each of
their steps takes longest to measure."""


def measure_ceiling(
    workload: Workload,
    settings: LoaderSettings,
    device: torch.device,
    window_s: float,
    warmup_s: float,
    batches: Sequence[int] | None = None,
    threads: Sequence[int] | None = None,
    seed: int = 0,
    min_steps: int = 2,
) -> float:
    """The step's best samples/sec on one prepared batch, over ``batches`` and ``threads``.

    ``settings`` gives the knobs and accumulation; ``batches`` are values of the workload's batch
    parameter (default: ``settings.batch``), ``threads`` intra-op thread counts (default:
    ``settings.torch_num_threads``), which change the step's own speed, a lot on some machines.
    The speed per sample is not monotone in the batch size (a text step measured here ran 798
    samples/s at 8192 tokens and 91 at 32768), so the sizes are tried smallest first until one
    falls below :data:`CLIMB_STOP_FRACTION` of the best.
    """
    torch.manual_seed(seed)
    best = 0.0
    for size in sorted(batches or [settings.batch]):
        sized = dataclasses.replace(settings, batch=size)
        batch = move_to_device(_one_batch(workload, sized, seed), device)
        rates = []
        for count in threads or [settings.torch_num_threads]:
            torch.set_num_threads(count)
            rates.append(_step_rate(workload, batch, sized, device, window_s, warmup_s, min_steps))
        del batch
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if max(rates) < CLIMB_STOP_FRACTION * best:
            break
        best = max(best, *rates)
    return best


def efficiency(samples_per_sec: float | None, ceiling: float | None) -> float | None:
    """A throughput as a fraction of the ceiling (the ``efficiency`` user attr)."""
    if samples_per_sec is None or not ceiling or ceiling <= 0:
        return None
    return float(samples_per_sec) / float(ceiling)


def near_ceiling(
    study: optuna.Study, min_trials: int = 0, fraction: float = CEILING_STOP_FRACTION
) -> optuna.trial.FrozenTrial | None:
    """The best trial once it is within ``fraction`` of the ceiling, after ``min_trials``.

    ``min_trials`` finished trials come first (the baselines and the sampler's random start), so
    one fast first window cannot end a study before it has searched at all.
    """
    ceiling = study.user_attrs.get(CEILING_ATTR)
    if not ceiling:
        return None
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    if len(finished) < min_trials:
        return None
    best = best_trial(study)
    if best is None:
        return None
    share = efficiency(trial_throughput(best, remeasured(study)), ceiling)
    return best if share is not None and share >= fraction else None


def ceiling_stop_message(
    study: optuna.Study, min_trials: int = 0, fraction: float = CEILING_STOP_FRACTION
) -> str | None:
    """Why the study should stop now, or None.

    It stops when its best, re-measured (a single window can be lucky), is within 2% of the
    ceiling: the caller re-measures a best that :func:`near_ceiling` names before asking.
    """
    best = near_ceiling(study, min_trials, fraction)
    if best is None:
        return None
    medians = remeasured(study)
    if best.number not in medians:
        return None
    ceiling = float(study.user_attrs[CEILING_ATTR])
    throughput = medians[best.number]
    return (
        f"stopping early: trial {best.number} reaches {throughput:,.1f} samples/s re-measured, "
        f"{throughput / ceiling:.1%} of the ceiling ({ceiling:,.1f} samples/s with data already "
        "on the device); no DataLoader setting can be meaningfully faster"
    )
