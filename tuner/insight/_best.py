"""Asking a storage for a profile's best setting: one code path for the CLI and the Python API."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage import default_storage_url, mask_url, open_storage, sqlite_file_missing
from tuner import machine
from tuner._attrs import remeasured, study_batch_param, trial_settings
from tuner._naming import study_name
from tuner.insight._summary import best_trial, trial_throughput
from tuner.search._settings import LoaderSettings

__all__ = ["BestSetting", "NoResultError", "best_params", "find_best", "resolve_profile_name"]


class NoResultError(LookupError):
    """No study, or no finished trial in it (exit code 1)."""


@dataclasses.dataclass(frozen=True)
class BestSetting:
    study_name: str
    trial: FrozenTrial
    settings: LoaderSettings
    batch_param: str
    samples_per_sec: float
    finished_trials: int

    def dataloader_kwargs(self) -> dict[str, Any]:
        return self.settings.dataloader_kwargs(self.batch_param)


def resolve_profile_name(hardware: str, profiles_file: str | None = None) -> str:
    """``auto`` names this machine; a named profile must be in the catalog (ProfileError)."""
    fingerprint = machine.detect_fingerprint()
    catalog = machine.load_catalog(profiles_file)
    return machine.resolve_profile(hardware, catalog, fingerprint).name


def find_best(
    hardware: str,
    objective: str = "image",
    storage: str | None = None,
    profiles_file: str | None = None,
    study: str | None = None,
) -> BestSetting:
    """The best finished trial of ``<objective>@<hardware>``; NoResultError if there is none."""
    url = storage or default_storage_url()
    name = study or study_name(objective, resolve_profile_name(hardware, profiles_file))
    create = f"python -m tuner.study --hardware {hardware} --objective {objective}"
    if sqlite_file_missing(url):
        raise NoResultError(f"no study {name} in {mask_url(url)}; create it with: {create}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opened = open_storage(url, heartbeat_interval=None)
    try:
        loaded = optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise NoResultError(
            f"no study {name} in {mask_url(url)}; create it with: {create}"
        ) from None
    best = best_trial(loaded)
    if best is None:
        raise NoResultError(f"study {name} has no finished trial yet; run: {create}")
    finished = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        for t in loaded.get_trials(deepcopy=False)
    )
    return BestSetting(
        study_name=name,
        trial=best,
        settings=trial_settings(best),
        batch_param=study_batch_param(loaded),
        samples_per_sec=trial_throughput(best, remeasured(loaded)),
        finished_trials=finished,
    )


def best_params(
    hardware: str, objective: str = "image", storage: str | None = None
) -> dict[str, Any]:
    """The best DataLoader keyword arguments for ``objective`` on ``hardware``.

    Usable as ``DataLoader(dataset, **best_params("g4dn.xlarge"))``. Raises NoResultError when the
    study does not exist or has no finished trial.
    """
    return find_best(hardware, objective, storage).dataloader_kwargs()
