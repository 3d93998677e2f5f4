"""The two settings every study measures first, so each result has a "compared with what".

``pytorch-default`` is what a DataLoader does when nothing is set (for a workload made from a
user's DataLoader, that DataLoader's own worker settings: what they train with today);
``rule-of-thumb`` is the field guide's starting point (workers at 3/4 of the physical cores,
pinned memory on CUDA, persistent workers, ``prefetch_factor=2``). Both use the workload's
default batch size as it is (a user's ``batch_size=48`` stays 48: the space's batch choices hold
it, :meth:`~tuner.search.SearchSpace.batch_choices`), its sampler (every trial's DataLoader
draws from it) and its base knobs. A value frozen with ``--fix`` binds the baselines as it
binds every trial: it replaces the baseline's own, and two baselines it makes the same setting
are one.
"""

from __future__ import annotations

import optuna

from tuner._naming import BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB, SETTINGS_ATTR
from tuner.search._settings import LoaderSettings
from tuner.search._space import MAX_PREFETCH_FACTOR, SearchSpace

__all__ = ["baseline_settings", "enqueue_baselines", "enqueue_settings", "rule_of_thumb_workers"]


def rule_of_thumb_workers(physical_cores: int, ranks: int = 1) -> int:
    """3/4 of the physical cores, shared out among ``ranks`` training processes; at least one
    worker per rank."""
    return max(1, round(physical_cores * 3 / 4 / ranks))


def baseline_settings(
    space: SearchSpace, physical_cores: int, ranks: int = 1
) -> dict[str, LoaderSettings]:
    """The baselines on this space (one rank's, of ``ranks``): PyTorch's defaults and the rule
    of thumb. Intra-op threads are torch's default: one per usable core of the rank's share,
    and one under several ranks, where torchrun sets ``OMP_NUM_THREADS=1``.

    Args:
        space: the study's space; its ``fixed`` values replace the baselines' own.
        physical_cores: the machine's physical cores (the rule of thumb's worker count).
        ranks: the training processes per node that share them.

    Returns:
        Baseline name -> setting, ``pytorch-default`` first; ``rule-of-thumb`` is left out
        where the fixed values make it the same setting as ``pytorch-default``.
    """
    batch = space.clamp_batch(space.workload.default_batch_size)
    knobs = space.base_knobs
    threads = space.max_threads if ranks == 1 else 1
    workers = min(space.max_workers, rule_of_thumb_workers(physical_cores, ranks))
    default = space.with_fixed(_trained_with_today(space, batch, threads, knobs))
    rule = space.with_fixed(space.settings(workers, batch, 2, True, space.cuda, threads, knobs))
    if rule == default:
        return {BASELINE_PYTORCH_DEFAULT: default}
    return {BASELINE_PYTORCH_DEFAULT: default, BASELINE_RULE_OF_THUMB: rule}


def _trained_with_today(
    space: SearchSpace, batch: int, threads: int, knobs: dict[str, object]
) -> LoaderSettings:
    """PyTorch's defaults, or the worker settings of the DataLoader the workload came from."""
    current = space.workload.current
    workers = min(space.max_workers, int(current.get("num_workers", 0)))
    if workers == 0:
        return space.settings(0, batch, None, False, False, threads, knobs)
    prefetch = min(MAX_PREFETCH_FACTOR, max(1, int(current.get("prefetch_factor") or 2)))
    pin = bool(current.get("pin_memory")) and space.cuda
    persistent = bool(current.get("persistent_workers"))
    return space.settings(workers, batch, prefetch, persistent, pin, threads, knobs)


def enqueue_settings(
    study: optuna.Study, space: SearchSpace, settings: LoaderSettings, **user_attrs: object
) -> None:
    """Queue ``settings`` as the study's next trial; the ``settings`` attr makes it exact."""
    study.enqueue_trial(
        space.params_for(settings),
        user_attrs={SETTINGS_ATTR: settings.to_attrs(), **user_attrs},
        skip_if_exists=False,
    )


def enqueue_baselines(
    study: optuna.Study, space: SearchSpace, physical_cores: int, ranks: int = 1
) -> bool:
    """Queue the baselines unless the study already has them; the caller holds the study lock."""
    trials = study.get_trials(deepcopy=False)
    if any("baseline" in trial.user_attrs for trial in trials):
        return False
    for name, settings in baseline_settings(space, physical_cores, ranks).items():
        enqueue_settings(study, space, settings, baseline=name)
    return True
