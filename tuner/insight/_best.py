"""The best setting a storage holds for a profile: one typed answer that every reader shares.

:func:`best_setting` (the Python API and ``python -m tuner.best`` in every format),
``tuner.loader``, the dashboard note, the HTML report and ``tuner.profiles`` all name the best
through :func:`study_best`: the re-measured winner (``best_trial``) with its figure
(:func:`~tuner.insight._figure.trial_figure`: the hold-out's median where the study took one).
A :class:`BestSetting` carries the whole setting, not only the DataLoader arguments: the main
process's intra-op threads (on 2 busy cores, 2 threads instead of 1 cost a third of the
throughput) and the workload's knobs.

Optuna's own ``study.best_trial`` is the highest single window, which after re-measurement can
be another trial: finished trials are immutable in Optuna, so the medians live in study attrs
that Optuna does not rank by. :func:`optuna_best` names Optuna's pick so the note can say so.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from objectives import Workload, load_workload
from storage import default_storage_url, mask_url, open_storage, sqlite_file_missing
from tuner import machine
from tuner._attrs import remeasured, stored_best_number, study_batch_param, trial_settings
from tuner._naming import study_name as study_name_for
from tuner.insight._figure import Figure, trial_figure
from tuner.insight._snippet import dataloader_snippet
from tuner.search import LoaderSettings

__all__ = [
    "BestSetting",
    "NoResultError",
    "best_params",
    "best_setting",
    "best_trial",
    "optuna_best",
    "resolve_profile_name",
    "study_best",
    "trial_throughput",
    "tune_command",
]

_log = logging.getLogger("tuner.best")


class NoResultError(LookupError):
    """No study, or no finished trial in it (exit code 1)."""


@dataclasses.dataclass(frozen=True)
class BestSetting:
    """The best setting of one study and what it was measured at.

    ``samples_per_sec`` is the median of the hold-out rounds after the pick where the study took
    them (``holdout_rounds``: rounds that did not choose it, so no winner's curse), else the
    re-measured median where the study re-measured the trial (``remeasured``), else its own
    window; ``window_samples_per_sec`` is always the trial's own window (Optuna's value).
    ``batch`` is the tuned value of ``batch_param`` (``batch_size``, or a token budget such as
    ``max_tokens`` that the workload's batch sampler takes).
    """

    study_name: str
    trial_number: int
    settings: LoaderSettings
    batch_param: str
    samples_per_sec: float
    remeasured: bool
    window_samples_per_sec: float
    finished_trials: int
    objective: str | None = None
    workload_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    holdout_rounds: tuple[float, ...] = ()
    trial: FrozenTrial | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def figure(self) -> Figure:
        """``samples_per_sec`` and where it comes from, with the hold-out's spread."""
        if self.holdout_rounds:
            return Figure(self.samples_per_sec, "hold-out", self.holdout_rounds)
        return Figure(self.samples_per_sec, "re-measured" if self.remeasured else "window")

    @property
    def dataloader_kwargs(self) -> dict[str, Any]:
        """``DataLoader(dataset, **kwargs)`` as tuned (a batch sampler aside, see ``batch``)."""
        return self.settings.dataloader_kwargs(self.batch_param)

    @property
    def torch_num_threads(self) -> int:
        """The main process's intra-op threads the setting was measured with."""
        return self.settings.torch_num_threads

    @property
    def knobs(self) -> dict[str, Any]:
        """The workload's own knobs (``Workload.configure`` applies them)."""
        return dict(self.settings.knobs)

    @property
    def batch(self) -> int:
        return self.settings.batch

    @property
    def accumulation_steps(self) -> int:
        return self.settings.accumulation_steps

    @property
    def effective_batch(self) -> int:
        """``batch`` times ``accumulation_steps``: what one optimizer step sees."""
        return self.settings.batch * self.settings.accumulation_steps

    def apply(self, log: logging.Logger | None = None) -> int:
        """Set the main process's intra-op threads as tuned (logged); returns the previous count.

        The main process runs the training step while the workers decode and augment on the
        same cores: more intra-op threads than tuned make them compete.
        """
        log = log or _log
        before = torch.get_num_threads()
        torch.set_num_threads(self.torch_num_threads)
        level = logging.WARNING if before != self.torch_num_threads else logging.INFO
        log.log(
            level,
            "torch.set_num_threads(%d) (was %d): the main process's intra-op threads as tuned "
            "in %s trial %d",
            self.torch_num_threads,
            before,
            self.study_name,
            self.trial_number,
        )
        return before

    def workload(self) -> Workload:
        """The study's workload, loaded from its objective and options, with the tuned knobs."""
        if self.objective is None:
            raise ValueError(f"study {self.study_name} does not record its objective")
        return load_workload(self.objective, self.workload_options).with_knobs(self.knobs)

    def summary(self) -> str:
        """``<study>: trial N, <figure> (<how>), best of M finished trials``."""
        figure = self.figure
        text = figure.text() if figure.source == "hold-out" else f"{figure.text()} ({figure.how})"
        return (
            f"{self.study_name}: trial {self.trial_number}, {text}, "
            f"best of {self.finished_trials} finished trials"
        )

    def to_json(self) -> dict[str, Any]:
        """The documented ``--format json`` shape: the whole setting, then the figures; the
        hold-out's rounds and their min-max last (empty and null without a hold-out)."""
        return {
            "dataloader": self.dataloader_kwargs,
            "torch_num_threads": self.torch_num_threads,
            "knobs": self.knobs,
            "batch_param": self.batch_param,
            "batch": self.batch,
            "accumulation_steps": self.accumulation_steps,
            "objective": self.objective,
            "workload_options": dict(self.workload_options),
            "study": self.study_name,
            "trial": self.trial_number,
            "samples_per_sec": self.samples_per_sec,
            "remeasured": self.remeasured,
            "window_samples_per_sec": self.window_samples_per_sec,
            "finished_trials": self.finished_trials,
            "holdout_rounds": list(self.holdout_rounds),
            "holdout_range": (
                [min(self.holdout_rounds), max(self.holdout_rounds)]
                if self.holdout_rounds
                else None
            ),
        }

    def snippet(self) -> str:
        """The ``--format python`` code: threads, knobs and DataLoader, as the study measured."""
        return dataloader_snippet(
            self.settings, self.batch_param, self.objective, self.workload_options
        )


def trial_throughput(trial: FrozenTrial, medians: Mapping[int, float]) -> float:
    """The re-measured median when there is one, else the trial's own window."""
    return float(medians.get(trial.number, trial.value or 0.0))


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The re-measured winner when the study has one, else Optuna's best trial.

    A trial finished after the last re-measurement wins only if its own window beats the
    re-measured winner by more than the noise of one window (5%).
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return None
    medians = remeasured(study)
    by_number = {trial.number: trial for trial in complete}
    number = stored_best_number(study)
    newest = max(complete, key=lambda t: t.value or 0.0)
    if number not in by_number:
        return newest
    chosen = by_number[number]
    if newest.number not in medians and (newest.value or 0.0) > 1.05 * trial_throughput(
        chosen, medians
    ):
        return newest
    return chosen


def study_best(study: optuna.Study) -> BestSetting | None:
    """The study's best as every reader names it; None without a completed trial."""
    best = best_trial(study)
    if best is None:
        return None
    figure = trial_figure(study, best)
    finished = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        for t in study.get_trials(deepcopy=False)
    )
    attrs = study.user_attrs
    return BestSetting(
        study_name=study.study_name,
        trial_number=best.number,
        settings=trial_settings(best),
        batch_param=study_batch_param(study),
        samples_per_sec=figure.samples_per_sec,
        remeasured=figure.source != "window",
        window_samples_per_sec=float(best.value or 0.0),
        finished_trials=finished,
        objective=attrs.get("objective"),
        workload_options=dict(attrs.get("workload_options") or {}),
        holdout_rounds=figure.rounds,
        trial=best,
    )


def optuna_best(study: optuna.Study) -> FrozenTrial | None:
    """Optuna's own best trial (its highest single window), as ``optuna best-trial`` names it."""
    try:
        return study.best_trial
    except ValueError:
        return None


def resolve_profile_name(hardware: str, profiles_file: str | None = None) -> str:
    """``auto`` names the catalog profile this machine matches, else this machine's fingerprint
    (:func:`tuner.machine.resolve_profile`); a named profile must be in the catalog
    (ProfileError)."""
    fingerprint = machine.detect_fingerprint()
    catalog = machine.load_catalog(profiles_file)
    return machine.resolve_profile(hardware, catalog, fingerprint).name


def tune_command(hardware: str, objective: str, nproc_per_node: int = 1) -> str:
    """The command that creates the study :func:`best_setting` looks for."""
    ranks = f" --nproc-per-node {nproc_per_node}" if nproc_per_node != 1 else ""
    return f"dataloader-tuner study --hardware {hardware} --objective {objective}{ranks}"


def best_setting(
    hardware: str = "auto",
    *,
    objective: str,
    storage: str | None = None,
    study_name: str | None = None,
    profiles_file: str | None = None,
    nproc_per_node: int = 1,
) -> BestSetting:
    """The best setting stored for ``objective`` on ``hardware``: the whole of it (DataLoader
    arguments, the main process's intra-op threads, the workload's knobs) and its figures.

    Args:
        hardware: the profile the study was run for, or ``"auto"`` for this machine's.
        objective: the study's objective, as it was tuned (``"image"``, ``"mypkg.data:workload"``,
            ...); required, so no study of another workload is applied by mistake.
        storage: a database URL; None is ``$TUNER_STORAGE``, else ``sqlite:///tuner.db``.
        study_name: the study's name; None is ``<objective>@<profile>``.
        profiles_file: a JSON catalog of more hardware profiles.
        nproc_per_node: the ranks per node the study was tuned for (its name says so where
            it is not 1); each rank applies the setting to its own DataLoader.

    Returns:
        The study's best (:class:`BestSetting`): the re-measured winner where the study
        re-measured, else the highest single window.

    Raises:
        NoResultError: no such study, or no finished trial in it.
        ValueError: an unknown profile or a storage URL that cannot be opened.

    Example::

        best = tuner.best_setting(objective="mypkg.data:workload")
        best.apply()  # torch.set_num_threads as tuned
        loader = DataLoader(dataset, **best.dataloader_kwargs)
    """
    url = storage or default_storage_url()
    profile = resolve_profile_name(hardware, profiles_file)
    name = study_name or study_name_for(objective, profile, nproc_per_node)
    create = tune_command(hardware, objective, nproc_per_node)
    if sqlite_file_missing(url):
        raise NoResultError(f"no study {name} in {mask_url(url)}; create it with: {create}")
    opened = open_storage(url, heartbeat_interval=None)
    try:
        loaded = optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise NoResultError(
            f"no study {name} in {mask_url(url)}; create it with: {create}"
        ) from None
    best = study_best(loaded)
    if best is None:
        raise NoResultError(f"study {name} has no finished trial yet; run: {create}")
    return best


def best_params(
    hardware: str = "auto",
    *,
    objective: str,
    storage: str | None = None,
    study_name: str | None = None,
    profiles_file: str | None = None,
) -> dict[str, Any]:
    """The best DataLoader keyword arguments stored for ``objective`` on ``hardware``.

    The rest of the setting (intra-op threads, the workload's knobs) is :func:`best_setting`'s,
    which takes the same arguments.

    Args:
        hardware: the profile the study was run for, or ``"auto"`` for this machine's.
        objective: the study's objective, as it was tuned; required.
        storage: a database URL; None is ``$TUNER_STORAGE``, else ``sqlite:///tuner.db``.
        study_name: the study's name; None is ``<objective>@<profile>``.
        profiles_file: a JSON catalog of more hardware profiles.

    Returns:
        ``num_workers``, ``batch_size``, ``prefetch_factor``, ``pin_memory`` and
        ``persistent_workers``, to pass as ``DataLoader(dataset, **kwargs)``.

    Raises:
        NoResultError: no such study, or no finished trial in it.

    Example::

        loader = DataLoader(dataset, **tuner.best_params("g4dn.xlarge", objective="image"))
    """
    return best_setting(
        hardware,
        objective=objective,
        storage=storage,
        study_name=study_name,
        profiles_file=profiles_file,
    ).dataloader_kwargs
