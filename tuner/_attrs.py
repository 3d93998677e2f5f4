"""One accessor per recorded fact: every writer and every reader of a study or trial attr goes
through here, so a key is spelled once and a value is parsed one way.

Trial user attr ``settings``: the complete setting a trial measured (sampled, fixed and derived
values alike). Study user attrs: ``batch_param`` (the workload's batch parameter),
``remeasured_samples_per_sec`` (trial number, as text, -> the median of its fresh selection
rounds), ``best_trial_number`` (the re-measured winner), ``holdout_samples_per_sec`` (trial
number, as text, -> the rounds of the hold-out after the pick: the pick's and the baselines',
side by side, none of which chose it), ``phase_seconds`` (the last run's wall time per
phase), ``phase_children`` (the trial children each phase started) and
``loader_defaults_kept`` (loader knob -> why the pick keeps the model's default). Readers take
Optuna's ``FrozenTrial`` or a live ``Trial`` alike: both expose ``user_attrs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import optuna

from tuner._naming import LOADER_DEFAULTS_KEPT_ATTR, REMEASURED_ATTR, SETTINGS_ATTR
from tuner.search import LoaderSettings

__all__ = [
    "BATCH_PARAM_ATTR",
    "BEST_TRIAL_ATTR",
    "HOLDOUT_ATTR",
    "PHASES_ATTR",
    "PHASE_CHILDREN_ATTR",
    "SETTINGS_ATTR",
    "has_settings",
    "holdout",
    "loader_defaults_kept",
    "phase_children",
    "phase_seconds",
    "record_loader_defaults_kept",
    "record_phases",
    "record_remeasured",
    "remeasured",
    "settings_attrs",
    "stored_best_number",
    "stored_settings",
    "study_batch_param",
    "trial_settings",
]

BATCH_PARAM_ATTR = "batch_param"
BEST_TRIAL_ATTR = "best_trial_number"
HOLDOUT_ATTR = "holdout_samples_per_sec"
PHASES_ATTR = "phase_seconds"
PHASE_CHILDREN_ATTR = "phase_children"


class _HasUserAttrs(Protocol):
    @property
    def user_attrs(self) -> dict[str, Any]: ...


def settings_attrs(settings: LoaderSettings) -> dict[str, Any]:
    """The ``settings`` user attr of a trial that measures ``settings``, as a one-key mapping."""
    return {SETTINGS_ATTR: settings.to_attrs()}


def has_settings(trial: _HasUserAttrs) -> bool:
    """Whether a trial carries its setting (every trial the tuner records or enqueues does)."""
    return SETTINGS_ATTR in trial.user_attrs


def stored_settings(trial: _HasUserAttrs) -> dict[str, Any] | None:
    """The ``settings`` attr as stored, for comparing settings without parsing them."""
    return trial.user_attrs.get(SETTINGS_ATTR)


def trial_settings(trial: _HasUserAttrs) -> LoaderSettings:
    """The setting a trial measured (or was enqueued with)."""
    return LoaderSettings.from_attrs(trial.user_attrs[SETTINGS_ATTR])


def study_batch_param(study: optuna.Study | Mapping[str, Any]) -> str:
    """The workload's batch parameter (``batch_size``, or a token budget such as ``max_tokens``)."""
    attrs = study if isinstance(study, Mapping) else study.user_attrs
    return str(attrs.get(BATCH_PARAM_ATTR, "batch_size"))


def remeasured(study: optuna.Study) -> dict[int, float]:
    """Trial number -> median re-measured samples/sec."""
    stored = study.user_attrs.get(REMEASURED_ATTR, {})
    return {int(number): float(value) for number, value in stored.items()}


def stored_best_number(study: optuna.Study) -> int | None:
    """The re-measured winner's trial number, where the study has been re-measured."""
    number = study.user_attrs.get(BEST_TRIAL_ATTR)
    return None if number is None else int(number)


def holdout(study: optuna.Study) -> dict[int, list[float]]:
    """Trial number -> its hold-out rounds' samples/sec (empty where the study has none: studies
    recorded before the hold-out, or run with ``--remeasure-rounds 0``)."""
    stored = study.user_attrs.get(HOLDOUT_ATTR, {})
    return {int(number): [float(v) for v in values] for number, values in stored.items()}


def record_remeasured(
    study: optuna.Study,
    medians: Mapping[int, float],
    best: int,
    held_out: Mapping[int, Sequence[float]] | None = None,
) -> None:
    """Merge ``medians`` and the hold-out's rounds (``held_out``) into the stored ones and name
    ``best`` the winner.

    The caller holds the study lock: concurrent workers of a fleet would otherwise overwrite
    each other's medians.
    """
    stored = dict(study.user_attrs.get(REMEASURED_ATTR, {}))
    stored.update({str(number): value for number, value in medians.items()})
    study.set_user_attr(REMEASURED_ATTR, stored)
    if held_out:
        rounds = dict(study.user_attrs.get(HOLDOUT_ATTR, {}))
        rounds.update({str(number): list(values) for number, values in held_out.items()})
        study.set_user_attr(HOLDOUT_ATTR, rounds)
    study.set_user_attr(BEST_TRIAL_ATTR, best)


def record_phases(
    study: optuna.Study, seconds: Mapping[str, float], children: Mapping[str, int] | None = None
) -> None:
    """Record this run's wall time per phase (``set-up``, ``trials``, ``re-measuring``) and the
    trial children each started (``children``: each a measurement window, a ceiling, a probe
    or a pipeline profile; a trial answered from the study starts none)."""
    study.set_user_attr(PHASES_ATTR, {name: round(float(s), 1) for name, s in seconds.items()})
    if children is not None:
        study.set_user_attr(PHASE_CHILDREN_ATTR, {name: int(n) for name, n in children.items()})


def phase_seconds(study: optuna.Study) -> dict[str, float]:
    """The last run's wall time per phase, in the order it ran them (empty where not recorded)."""
    stored = study.user_attrs.get(PHASES_ATTR) or {}
    return {str(name): float(s) for name, s in stored.items()}


def record_loader_defaults_kept(study: optuna.Study, reasons: Mapping[str, str]) -> None:
    """Record which loader knobs the pick keeps at the model's default, and why (see
    :data:`~tuner._naming.LOADER_DEFAULTS_KEPT_ATTR`); empty where none or not the model's."""
    study.set_user_attr(LOADER_DEFAULTS_KEPT_ATTR, {str(k): str(v) for k, v in reasons.items()})


def loader_defaults_kept(user_attrs: Mapping[str, Any]) -> dict[str, str]:
    """Knob -> why the pick keeps its default (empty where the study recorded none)."""
    stored = user_attrs.get(LOADER_DEFAULTS_KEPT_ATTR) or {}
    return {str(name): str(why) for name, why in stored.items()}


def phase_children(study: optuna.Study) -> dict[str, int]:
    """The last run's trial children started per phase (empty where not recorded)."""
    stored = study.user_attrs.get(PHASE_CHILDREN_ATTR) or {}
    return {str(name): int(n) for name, n in stored.items()}
