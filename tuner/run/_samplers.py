"""The strategies ``--sampler`` names, and the pruner each one runs with.

Shared by the tuner and ``bench.replay``, so the replay judges exactly what the tuner runs.
"""

from __future__ import annotations

import warnings

import optuna

from tuner.search._pruner import BelowBestPruner

__all__ = [
    "MODEL_STRATEGY",
    "N_STARTUP_TRIALS",
    "SAMPLERS",
    "make_pruner",
    "make_sampler",
    "resumed_seed",
]

N_STARTUP_TRIALS = 6
"""The samplers' random start; with the baselines, the trials before the study may stop early."""

SAMPLERS = ("gp", "tpe", "random", "model")
MODEL_STRATEGY = "model"
"""``--sampler model``: the pipeline model's predicted best, then its picks corrected by each
measurement and the best's neighbours (:func:`tuner.pipeline.next_setting`), stopping once the
best is near the bound or held against all its neighbours; ``gp`` asks only if the study goes
on after that (a re-measured best that moved)."""


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The sampler ``--sampler name`` runs: ``gp`` (also under ``model``), ``tpe`` or ``random``."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # group=True: the space is conditional (prefetch only with workers); constant_liar (on by
        # default in Optuna 5) keeps concurrent workers of a fleet from sampling the same point.
        tpe = optuna.samplers.TPESampler(seed=seed, group=True, n_startup_trials=N_STARTUP_TRIALS)
        if name == "tpe":
            return tpe
        # The Gaussian process models the parameters every trial has (workers, batch, threads,
        # knobs); TPE learns the conditional ones (prefetch, persistent workers) from the trials
        # that have them. Running trials of a fleet enter its acquisition as pending points.
        return optuna.samplers.GPSampler(
            seed=seed,
            n_startup_trials=N_STARTUP_TRIALS,
            independent_sampler=tpe,
            warn_independent_sampling=False,
        )


def make_pruner(sampler: str) -> optuna.pruners.BasePruner:
    """No early stopping under ``gp``: the Gaussian process learns from complete trials only,
    so a stopped trial would teach it nothing and leave the region open to be proposed again
    (replayed on measured grids, ``bench.replay``: ``gp`` unpruned found the top more often than
    ``tpe`` pruned or unpruned). TPE learns from stopped trials, so ``tpe`` keeps the pruner."""
    if sampler in ("gp", MODEL_STRATEGY):
        return optuna.pruners.NopPruner()
    return BelowBestPruner()


def resumed_seed(seed: int | None, trials_before: int) -> int | None:
    """A resumed run with the same ``--seed`` would replay the first run's draws (the random
    sampler exactly, TPE in its start and candidates): the seed moves on with the study."""
    return None if seed is None else seed + trials_before
