"""One Optuna trial: pick the setting, run it under the supervisor, record what happened.

The study process owns every database write; the child only measures. A result measured while
the database is down is held here and written once the database is back (``with_retry``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from storage import is_connection_error, upload_trial_csv, with_retry
from tuner._attrs import has_settings, settings_attrs, stored_settings, trial_settings
from tuner._naming import SETTINGS_ATTR, is_memory_prune
from tuner.insight import diagnose, efficiency
from tuner.machine import GpuReader
from tuner.pipeline import PipelineModel, model_attrs
from tuner.run._walls import (
    MODEL_RETEST_ATTR,
    PREDICTED_PEAK_ATTR,
    RETEST_ATTR,
    WallVerdict,
    prior_memory_figures,
    wall_verdict,
)
from tuner.search import LoaderSettings, SearchSpace
from tuner.trial import Job, Supervisor, TelemetrySampler, TrialOutcome, collect_trial_telemetry

__all__ = ["SearchSpaceChanged", "TrialRunner", "measured_twin"]

_log = logging.getLogger("tuner.trial")

MEMORY_CONSTRAINT = "memory"
"""Optuna constraint: > 0 for settings that did not fit, so the sampler learns the wall."""


class SearchSpaceChanged(ValueError):
    """Optuna refused a parameter's distribution: the study was tuned with other flags."""


REPEAT_ATTRS_SKIPPED = (SETTINGS_ATTR, "machine", "baseline", "warm_start_from", "repeat_of")
"""What a repeat does not copy from its twin: who ran it and why, rather than what was measured."""


def measured_twin(
    trials: list[optuna.trial.FrozenTrial], settings: LoaderSettings
) -> optuna.trial.FrozenTrial | None:
    """An earlier trial of exactly ``settings`` that completed, or that the pruner stopped, or
    the latest of two the guard stopped on a prediction.

    Samplers propose a setting again once they close in on it; measuring it again would spend a
    whole trial on a number the study already holds. Trials that failed or timed out are not
    twins: their cause may have passed. One prediction may be wrong, so a setting stopped on
    one runs again; stopped twice, it is not run a third time (nor does it make a wall).
    """
    wanted = settings.to_attrs()
    predicted = []
    for trial in trials:
        if stored_settings(trial) != wanted:
            continue
        if trial.state == TrialState.COMPLETE or (
            trial.state == TrialState.PRUNED and trial.user_attrs.get("pruned_reason") == "pruner"
        ):
            return trial
        if trial.state == TrialState.PRUNED and trial.user_attrs.get("guard_predicted"):
            predicted.append(trial)
    return predicted[-1] if len(predicted) >= 2 else None


def _answer_from_storage(
    trials: list[optuna.trial.FrozenTrial],
    settings: LoaderSettings,
    walls: WallVerdict,
    baseline: bool = False,
) -> TrialOutcome | None:
    """The outcome of ``settings`` known without running it: a repeat (what was measured comes
    before any prediction), beyond a memory wall, or over the limit by the memory model. A
    ``baseline`` is measured again rather than repeated (the speedups are over its own
    measurement), but not run past the memory limit: the user's own setting that does not fit
    is reported so, as any other (run anyway, workers forking can cross the limit between two
    of the guard's readings)."""
    twin = None if baseline else measured_twin(trials, settings)
    if twin is None:
        if walls.dominated_by is not None:
            return TrialOutcome(
                "pruned", {"dominated_by": walls.dominated_by}, reason="memory_wall"
            )
        if walls.over_limit:
            return TrialOutcome("pruned", _wall_attrs(walls), reason="memory_model")
        return None
    attrs = {k: v for k, v in twin.user_attrs.items() if k not in REPEAT_ATTRS_SKIPPED}
    attrs["repeat_of"] = twin.number
    if twin.state == TrialState.COMPLETE:
        return TrialOutcome("complete", {**attrs, "samples_per_sec": twin.value})
    return TrialOutcome("pruned", attrs, reason=str(attrs.pop("pruned_reason", "pruner")))


def _wall_attrs(walls: WallVerdict) -> dict[str, int]:
    """The model's peak beside the measured one, and the wall a trial re-tests."""
    attrs = {}
    if walls.predicted_peak_bytes is not None:
        attrs[PREDICTED_PEAK_ATTR] = walls.predicted_peak_bytes
    if walls.retest_of is not None:
        attrs[RETEST_ATTR] = walls.retest_of
    if walls.model_retest_of is not None:
        attrs[MODEL_RETEST_ATTR] = walls.model_retest_of
    return attrs


@dataclasses.dataclass
class TrialRunner:
    """Everything needed to run trials of one study on this machine."""

    supervisor: Supervisor
    space: SearchSpace
    job_template: Job
    """Every trial's job but its setting: objective, device, window, seed, paths."""
    deadline_s: float
    machine_attrs: dict[str, Any]
    gpu: GpuReader | None = None
    gpu_index: int | None = None
    artifact_store: FileSystemArtifactStore | None = None
    ceiling: float | None = None
    model: PipelineModel | None = None
    rounds: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    """Trial number -> the fresh re-measured rounds this run has taken (an early-stop check's),
    which the study's final re-measurement fills up rather than repeats. Shared by the copies
    ``dataclasses.replace`` makes (a grown space); a run's own, never read from the study, whose
    rounds may come from another time or another machine of the fleet."""

    @property
    def window_s(self) -> float:
        return self.job_template.window_s

    def job(self, settings: LoaderSettings) -> Job:
        return self.job_template.replace(settings=settings)

    def measure(
        self,
        settings: LoaderSettings,
        on_progress: Any = None,
        expected_peak_bytes: int | None = None,
    ) -> TrialOutcome:
        """Run one measurement of ``settings`` in a supervised child, with its telemetry;
        ``expected_peak_bytes``: the host peak the guard expects (the memory model's, or one
        measured before), growth towards which it does not project."""
        sampler = TelemetrySampler(self.gpu, self.gpu_index)
        outcome = self.supervisor.run(
            self.job(settings),
            self.deadline_s,
            on_progress=on_progress,
            telemetry=sampler,
            expected_peak_bytes=expected_peak_bytes,
        )
        telemetry = collect_trial_telemetry(sampler, outcome.attrs)
        outcome.attrs.update(telemetry.attrs)
        outcome.artifacts.update(telemetry.artifacts())
        return outcome

    def settings_for(self, trial: optuna.Trial) -> LoaderSettings:
        """Enqueued trials (baselines, warm starts, retries) carry their exact setting."""
        sampled = self.space.suggest(trial)
        return trial_settings(trial) if has_settings(trial) else sampled

    def run(self, study: optuna.Study, trial: optuna.Trial) -> TrialOutcome:
        """Run ``trial`` to its end and tell the study; never raises for the trial's own failure."""
        try:
            settings = with_retry(lambda: self.settings_for(trial), "sampling a trial")
        except ValueError as error:  # "Cannot set different distribution kind ..." and kin
            raise SearchSpaceChanged(str(error)) from None
        trials = with_retry(lambda: study.get_trials(deepcopy=False), "reading trials")
        profile = self.model.profile if self.model is not None else None
        prior = prior_memory_figures(profile, settings.knobs)
        walls = wall_verdict(trials, settings, self.supervisor.guard.limits.host_bytes, prior)
        answered = _answer_from_storage(
            trials, settings, walls, baseline="baseline" in trial.user_attrs
        )
        if answered is not None:
            self._finish(study, trial, settings, answered)
            return answered
        step = 0

        def on_progress(elapsed_s: float, samples_per_sec: float) -> bool:
            nonlocal step
            step += 1
            try:
                trial.report(samples_per_sec, step)
                return trial.should_prune()
            except optuna.exceptions.UpdateFinishedTrialError:
                return True  # failed as stale meanwhile: its retry measures it (see _finish)
            except Exception as error:  # a database hiccup must not cost the measurement
                if not is_connection_error(error):
                    raise
                return False

        outcome = self.measure(settings, on_progress, walls.predicted_peak_bytes)
        outcome.attrs.update(_wall_attrs(walls))
        self._finish(study, trial, settings, outcome)
        return outcome

    def _finish(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        settings: LoaderSettings,
        outcome: TrialOutcome,
    ) -> None:
        """Record ``outcome``, unless another worker failed the trial as stale meanwhile.

        That happens when this worker's heartbeats did not reach the database for the grace
        period (a stalled network, a long restart) while it measured: the trial is FAIL and a
        re-queued copy holds its setting, so this result is dropped rather than written twice.
        """
        attrs = self._trial_attrs(settings, outcome)
        try:
            self._write(study, trial, attrs, outcome)
        except optuna.exceptions.UpdateFinishedTrialError:
            _log.warning(
                "trial %d was failed as stale by another worker while this one measured it; "
                "its re-queued copy measures it again",
                trial.number,
            )

    def _trial_attrs(self, settings: LoaderSettings, outcome: TrialOutcome) -> dict[str, Any]:
        """Every user attr the trial records: its setting, the outcome's facts, the diagnosis."""
        attrs: dict[str, Any] = {**settings_attrs(settings), "machine": self.machine_attrs}
        attrs.update(outcome.attrs)
        if outcome.reason is not None:
            attrs["pruned_reason"] = outcome.reason
        if outcome.error is not None:
            attrs["error"] = outcome.error
        throughput = attrs.get("samples_per_sec", attrs.get("partial_samples_per_sec"))
        share = efficiency(throughput, self.ceiling)
        if share is not None:
            attrs["efficiency"] = share
        attrs.update(model_attrs(self.model, settings, throughput))
        diagnosis = diagnose(attrs, outcome.reason, self.supervisor.guard.limits)
        if diagnosis is not None:
            attrs.update(diagnosis.to_attrs())
        return attrs

    def _write(
        self, study: optuna.Study, trial: optuna.Trial, attrs: dict[str, Any], outcome: TrialOutcome
    ) -> None:
        """The attrs, the memory constraint, the artifacts, then the tell (each retried)."""
        for key, value in attrs.items():
            with_retry(
                lambda key=key, value=value: trial.set_user_attr(key, value), "recording a trial"
            )
        constraint = 1.0 if is_memory_prune(outcome.reason) else 0.0
        with_retry(lambda: trial.set_constraint(MEMORY_CONSTRAINT, constraint), "recording a trial")
        if self.artifact_store is not None:
            # Artifacts hang off trial system attrs, which Optuna refuses once a trial is told.
            for name, text in outcome.artifacts.items():
                upload_trial_csv(self.artifact_store, study, trial, name, text)
        if outcome.state == "complete":
            value = float(outcome.attrs["samples_per_sec"])
            tell: dict[str, Any] = (
                {"values": value} if math.isfinite(value) else {"state": TrialState.FAIL}
            )
        elif outcome.state == "pruned":
            tell = {"state": TrialState.PRUNED}
        else:
            tell = {"state": TrialState.FAIL}

        # skip_if_finished: a retried tell whose first attempt reached the database after all.
        with_retry(lambda: study.tell(trial, skip_if_finished=True, **tell), "recording a trial")
