"""The strategies ``--sampler`` names, and the pruner each one runs with.

Shared by the tuner and ``bench.replay``, so the replay judges exactly what the tuner runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from tuner._naming import is_skipped_for_memory
from tuner.search import BelowBestPruner

__all__ = [
    "MODEL_STRATEGY",
    "N_STARTUP_TRIALS",
    "SAMPLERS",
    "UnstuckGPSampler",
    "answered_unrun",
    "make_pruner",
    "make_sampler",
    "repeats_a_measurement",
    "resumed_seed",
]

N_STARTUP_TRIALS = 6
"""The samplers' random start; with the baselines, the trials before the study may stop early."""

SAMPLERS = ("model", "gp", "tpe", "random")
MODEL_STRATEGY = "model"
"""``--sampler model``, the default: the pipeline model's predicted best, then its picks
corrected by each measurement and the best's neighbours, the loader knobs the profile says can
change the result among them (:func:`tuner.pipeline.next_setting`), stopping once the best is
near the bound or held against all its neighbours; ``gp`` asks only if the study goes on after
that (a re-measured best that moved), or throughout where no model was built."""


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
        gp = optuna.samplers.GPSampler(
            seed=seed,
            n_startup_trials=N_STARTUP_TRIALS,
            independent_sampler=tpe,
            warn_independent_sampling=False,
        )
        return UnstuckGPSampler(gp, tpe)


def answered_unrun(trial: optuna.trial.FrozenTrial) -> bool:
    """Pruned without running: beyond a memory wall, over the limit by the memory model, or
    a repeat of a setting that was stopped before."""
    attrs = trial.user_attrs
    return trial.state == TrialState.PRUNED and (
        "repeat_of" in attrs or is_skipped_for_memory(attrs.get("pruned_reason"))
    )


def repeats_a_measurement(trial: optuna.trial.FrozenTrial, proposal: dict[str, Any]) -> bool:
    """Whether a trial holding ``proposal``'s values is a setting ``proposal`` can only repeat:
    a repeat itself, or a complete trial with no parameter beyond the proposal's (the
    conditional ones, prefetch and persistence, only exist with workers)."""
    if "repeat_of" in trial.user_attrs:
        return True
    return trial.state == TrialState.COMPLETE and set(trial.params) <= set(proposal)


class UnstuckGPSampler(optuna.samplers.BaseSampler):
    """The Gaussian process, except where its proposal would only repeat what the study holds:
    a setting it answered without running (:func:`answered_unrun`), or one measured already
    (:func:`repeats_a_measurement`). That trial is TPE's.

    The Gaussian process learns from complete trials only, so a setting pruned without running
    changes nothing it sees and it proposes the same setting again, trial after trial. TPE
    counts pruned trials and the memory constraint, so its
    trial goes elsewhere; the Gaussian process proposes again on the next one. A measured
    setting proposed again is answered from its twin: a trial spent on no new number, and the
    Gaussian process, seeing that number once more, proposes it again.
    """

    def __init__(self, gp: optuna.samplers.GPSampler, tpe: optuna.samplers.TPESampler) -> None:
        self._gp = gp
        self._tpe = tpe
        self._chosen: dict[int, tuple[optuna.samplers.BaseSampler, dict[str, Any]]] = {}

    def _choose(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> tuple[optuna.samplers.BaseSampler, dict[str, Any]]:
        """The sampler of ``trial`` and, for the Gaussian process, its proposal."""
        if trial._trial_id not in self._chosen:
            space = self._gp.infer_relative_search_space(study, trial)
            proposal = self._gp.sample_relative(study, trial, space) if space else {}
            again = bool(proposal) and any(
                (answered_unrun(t) or repeats_a_measurement(t, proposal))
                and all(t.params.get(name) == value for name, value in proposal.items())
                for t in study.get_trials(deepcopy=False)
            )
            self._chosen[trial._trial_id] = (self._tpe, {}) if again else (self._gp, proposal)
        return self._chosen[trial._trial_id]

    def reseed_rng(self) -> None:
        self._gp.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        sampler, _ = self._choose(study, trial)
        return sampler.infer_relative_search_space(study, trial)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        sampler, proposal = self._choose(study, trial)
        return (
            proposal if sampler is self._gp else sampler.sample_relative(study, trial, search_space)
        )

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        sampler, _ = self._choose(study, trial)
        return sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._gp.before_trial(study, trial)  # and TPE's, its independent sampler

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._chosen.pop(trial._trial_id, None)
        self._gp.after_trial(study, trial, state, values)


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
