"""What a storage holds per hardware profile: its studies, their trial counts, their best.

Used by ``python -m tuner.profiles`` and by the warm start of a new profile's study.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.insight import study_best
from tuner.machine import Profile

__all__ = ["StoredStudy", "stored_studies"]


@dataclasses.dataclass(frozen=True)
class StoredStudy:
    name: str
    objective: str
    profile: Profile | None
    finished_trials: int
    best_samples_per_sec: float | None
    best_settings: dict[str, Any] | None
    best_trial_number: int | None = None

    @property
    def profile_name(self) -> str:
        return self.profile.name if self.profile else self.name.rpartition("@")[2]


def _profile(attrs: dict[str, Any]) -> Profile | None:
    stored = attrs.get("profile")
    if not isinstance(stored, dict):
        return None
    fields = {field.name for field in dataclasses.fields(Profile)}
    try:
        return Profile(**{key: value for key, value in stored.items() if key in fields})
    except TypeError:
        return None


def stored_studies(storage: optuna.storages.BaseStorage) -> list[StoredStudy]:
    """Every tuner study in ``storage`` (studies without a profile attr are someone else's)."""
    result = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = summary.user_attrs
        profile = _profile(attrs)
        if profile is None:
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        best = study_best(study)
        result.append(
            StoredStudy(
                name=summary.study_name,
                objective=attrs.get("objective", summary.study_name.rpartition("@")[0]),
                profile=profile,
                finished_trials=len(trials),
                best_samples_per_sec=best.samples_per_sec if best else None,
                best_settings=best.settings.to_attrs() if best else None,
                best_trial_number=best.trial_number if best else None,
            )
        )
    return result
