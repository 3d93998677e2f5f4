"""The end of a run in the terminal: the best, its speedups and the setting to use first, then
the top trials; the tuner's diagnostics (ceiling, bound, model, profile) only when verbose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner._attrs import (
    has_settings,
    phase_children,
    phase_seconds,
    remeasured,
    trial_settings,
)
from tuner._naming import (
    BASELINE_PYTORCH_DEFAULT,
    BASELINE_RULE_OF_THUMB,
    CEILING_ATTR,
    NPROC_ATTR,
)
from tuner.insight._best import best_trial, trial_throughput
from tuner.insight._diagnosis import Diagnosis, diagnose_trial, more_workers_were_slower
from tuner.insight._figure import trial_figure
from tuner.insight._pipeline import (
    bound_of,
    kept_defaults_line,
    model_error,
    profile_line,
    stored_profile,
)
from tuner.insight._snippet import dataloader_snippet
from tuner.insight._table import format_table

__all__ = [
    "efficiency",
    "print_summary",
    "speedups",
    "study_diagnosis",
]


def efficiency(samples_per_sec: float | None, ceiling: float | None) -> float | None:
    """A throughput as a fraction of the ceiling (the ``efficiency`` user attr)."""
    if samples_per_sec is None or not ceiling or ceiling <= 0:
        return None
    return float(samples_per_sec) / float(ceiling)


def speedups(study: optuna.Study, best: FrozenTrial) -> dict[str, float]:
    """The best's figure over each baseline's (:func:`~tuner.insight._figure.trial_figure`:
    the hold-out's medians, side by side, where the study took one)."""
    result = {}
    mine = trial_figure(study, best).samples_per_sec
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        name = trial.user_attrs.get("baseline")
        if name not in (BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB):
            continue
        baseline = trial_figure(study, trial).samples_per_sec
        if baseline > 0:
            result[name] = mine / baseline
    return result


def _row(trial: FrozenTrial, medians: Mapping[int, float]) -> list[Any]:
    settings = trial_settings(trial)
    again = medians.get(trial.number)
    knobs = ",".join(f"{k}={v}" for k, v in settings.knobs.items())
    return [
        trial.number,
        f"{trial.value:,.1f}" if trial.value is not None else "-",
        f"{again:,.1f}" if again is not None else "-",
        settings.num_workers,
        settings.batch,
        settings.prefetch_factor if settings.prefetch_factor is not None else "-",
        settings.persistent_workers,
        settings.pin_memory,
        settings.torch_num_threads,
        knobs or "-",
        _format(trial.user_attrs.get("predicted_samples_per_sec"), ",.0f"),
        _format(trial.user_attrs.get("bound_efficiency"), ".0%"),
        trial.user_attrs.get("baseline", ""),
    ]


def _higher_median(best: FrozenTrial, medians: Mapping[int, float]) -> int | None:
    """A re-measured trial whose median beats the best's, or None: the pick is the selection's
    highest median, and a trial measured on other rounds (a baseline in the hold-out only, a
    candidate a race dropped on fewer rounds) can end with a higher one and top the table."""
    if best.number not in medians:
        return None
    rivals = [number for number, median in medians.items() if median > medians[best.number]]
    return max(rivals, key=lambda number: medians[number]) if rivals else None


def _format(value: Any, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)


def _print_pipeline(
    study: optuna.Study,
    trials: list[FrozenTrial],
    best: FrozenTrial,
    throughput: float,
    out: TextIO,
) -> None:
    """The bound, the model's error and the profile, when the study has a pipeline model."""
    bound = bound_of(study.user_attrs)
    if bound:
        print(
            f"  {throughput / bound:.0%} of the bound ({bound:,.0f} samples/s: the most the "
            "pipeline model allows on this machine)",
            file=out,
        )
    predicted = best.user_attrs.get("predicted_samples_per_sec")
    error = model_error(trials)
    if predicted is not None and error is not None:
        print(
            f"  model: {float(predicted):,.0f} samples/s predicted for it; median error "
            f"{error[0]:.0%} over {error[1]} trials",
            file=out,
        )
    profile = stored_profile(study.user_attrs)
    if profile is not None:
        print(f"  pipeline: {profile_line(profile)}", file=out)


def study_diagnosis(study: optuna.Study, best: FrozenTrial) -> Diagnosis | None:
    """``best``'s diagnosis, read against the study: advice to raise num_workers says so where
    every trial with more workers measured slower (see :func:`more_workers_were_slower`)."""
    diagnosis = diagnose_trial(best)
    if diagnosis is None or not has_settings(best):
        return diagnosis
    workers = trial_settings(best).num_workers
    more = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if has_settings(trial) and trial_settings(trial).num_workers > workers
    ]
    if not more:
        return diagnosis
    medians = remeasured(study)
    rival = max(more, key=lambda trial: trial_throughput(trial, medians))
    mine, theirs = trial_throughput(best, medians), trial_throughput(rival, medians)
    if not mine or theirs >= mine:
        return diagnosis
    return more_workers_were_slower(best, diagnosis, rival, theirs / mine)


def print_summary(
    study: optuna.Study,
    batch_param: str,
    out: TextIO,
    top: int = 5,
    verbose: bool = False,
) -> FrozenTrial | None:
    """Print the answer first (the best, its speedups, the code that applies it, the advice),
    then the top trials; return the best.

    With ``verbose`` the tuner's own diagnostics follow: the share of the ceiling and of the
    bound, the model's error and the pipeline profile (the dashboard note and the report carry
    them always).
    """
    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    print(
        f"\nstudy {study.study_name}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        file=out,
    )
    best = best_trial(study)
    if best is None:
        print("no trial completed; see the trials' pruned_reason and error attrs", file=out)
        return None
    medians = remeasured(study)
    _print_best(study, best, medians, out)
    settings = trial_settings(best)
    objective, options = study.user_attrs.get("objective"), study.user_attrs.get("workload_options")
    print("\n" + dataloader_snippet(settings, batch_param, objective, options), file=out)
    kept = kept_defaults_line(study.user_attrs)
    if kept is not None:
        print(kept, file=out)
    diagnosis = study_diagnosis(study, best)
    if diagnosis is not None:
        print(f"\n{diagnosis.bottleneck}: {diagnosis.advice}", file=out)
    _print_table(trials, medians, batch_param, top, verbose, out)
    phases = _phases_line(study)
    if phases:
        print(f"\ntime: {phases}", file=out)
    if verbose:
        throughput = trial_figure(study, best).samples_per_sec
        ceiling = study.user_attrs.get(CEILING_ATTR)
        print(f"\ntrial {best.number}:", file=out)
        if ceiling:
            share = throughput / float(ceiling)
            print(f"  {share:.0%} of the ceiling ({float(ceiling):,.0f} samples/s)", file=out)
        _print_pipeline(study, trials, best, throughput, out)
    return best


def _print_best(
    study: optuna.Study, best: FrozenTrial, medians: Mapping[int, float], out: TextIO
) -> None:
    """The best trial, its figure and its speedups over the baselines."""
    ranks = int(study.user_attrs.get(NPROC_ATTR, 1))
    node = f" for the node ({ranks} ranks, each its own DataLoader as below)" if ranks > 1 else ""
    print(f"\nbest: trial {best.number}, {trial_figure(study, best).text()}{node}", file=out)
    rival = _higher_median(best, medians)
    if rival is not None:
        print(
            f"  picked on the selection's rounds; trial {rival}'s median, over other rounds, "
            "is higher",
            file=out,
        )
    for name, ratio in speedups(study, best).items():
        print(f"  {ratio:.2f}x over {name}", file=out)


def _phases_line(study: optuna.Study) -> str | None:
    """Each phase's wall time, and the trial children it started where recorded
    (``set-up 13 s (2 runs), trials 65 s (12 runs), re-measuring 22 s (4 runs)``)."""
    seconds, children = phase_seconds(study), phase_children(study)
    if not seconds:
        return None
    parts = []
    for name, spent in seconds.items():
        count = children.get(name)
        runs = "" if count is None else f" ({count} run{'' if count == 1 else 's'})"
        parts.append(f"{name} {spent:,.0f} s{runs}")
    return ", ".join(parts)


def _print_table(
    trials: list[FrozenTrial],
    medians: Mapping[int, float],
    batch_param: str,
    top: int,
    verbose: bool,
    out: TextIO,
) -> None:
    """The ``top`` trials by throughput and the baselines; the model's columns when verbose."""
    complete = sorted(
        # A repeat carries its twin's result: one row per setting.
        (t for t in trials if t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs),
        key=lambda t: trial_throughput(t, medians),
        reverse=True,
    )
    rows = [_row(trial, medians) for trial in complete[:top]]
    rows += [_row(t, medians) for t in complete[top:] if "baseline" in t.user_attrs]
    headers = [
        "trial",
        "samples/s",
        "re-measured",
        "num_workers",
        batch_param,
        "prefetch",
        "persistent",
        "pin_memory",
        "threads",
        "knobs",
        "predicted",
        "of bound",
        "baseline",
    ]
    if not verbose:  # the model's columns are the tuner's diagnostics
        keep = [i for i, h in enumerate(headers) if h not in ("predicted", "of bound")]
        headers = [headers[i] for i in keep]
        rows = [[row[i] for i in keep] for row in rows]
    print("\n" + format_table(headers, rows), file=out)
