"""The study's note in optuna-dashboard: what a user needs from the study, on its first page.

Rewritten whole at the end of each worker's run (``save_study_note``), so it always describes
the study as the database holds it, whichever worker wrote last: the best setting, its
throughput, its efficiency against the ceiling and the pipeline model's bound, the speedup over
both baselines, its diagnosis, the pipeline profile and the model's error, the machines that
contributed, and the whole setting as ready code. Where Optuna's own best
trial (its highest single window, which a plain optuna-dashboard shows) is another trial than
the re-measured winner, the note says so under the headline, with both trials' figures.
"""

from __future__ import annotations

import collections
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage import with_retry
from tuner._attrs import remeasured
from tuner._naming import CEILING_ATTR
from tuner.insight._best import BestSetting, optuna_best, study_best
from tuner.insight._pipeline import (
    bound_of,
    kept_defaults_line,
    model_error,
    profile_line,
    stored_profile,
)
from tuner.insight._snippet import extra_settings
from tuner.insight._summary import efficiency, speedups, study_diagnosis

__all__ = ["save_study_note", "study_note"]


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def _machines(trials: list[FrozenTrial]) -> list[str]:
    """One row per machine that ran a trial: host, what it is, its profile, trial count."""
    counts: collections.Counter[str] = collections.Counter()
    described: dict[str, list[Any]] = {}
    for trial in trials:
        machine = trial.user_attrs.get("machine")
        if not isinstance(machine, dict):
            continue
        host = str(machine.get("hostname", "?"))
        counts[host] += 1
        memory = machine.get("memory_bytes")
        gpus = ", ".join(str(gpu.get("name")) for gpu in machine.get("gpus") or []) or "no GPU"
        described[host] = [
            host,
            machine.get("profile", "-"),
            machine.get("logical_cpus", "-"),
            f"{memory / 2**30:.0f} GiB" if memory else "-",
            gpus,
        ]
    if not counts:
        return ["No trial recorded its machine."]
    rows = [[*described[host], count] for host, count in counts.most_common()]
    return _table(["host", "profile", "CPUs", "RAM", "GPUs", "trials"], rows)


def _optuna_differs(study: optuna.Study, chosen: BestSetting) -> list[str]:
    """Why Optuna's own best trial is another one, when it is; nothing when they agree."""
    theirs = optuna_best(study)
    if theirs is None or theirs.number == chosen.trial_number:
        return []
    medians = remeasured(study)
    again = medians.get(theirs.number)
    if again is not None:
        their_rounds = f"re-measured at {again:,.1f} samples/s"
    else:
        their_rounds = "not re-measured"
    return [
        f"> **Optuna's own best trial is trial {theirs.number}, not {chosen.trial_number}.** "
        f"Optuna ranks trials by their single measurement window: trial {theirs.number} ran "
        f"{theirs.value or 0.0:,.1f} samples/s in its window ({their_rounds}), trial "
        f"{chosen.trial_number} {chosen.window_samples_per_sec:,.1f}. The tuner re-measures the "
        "top settings side by side in fresh rounds and picks the winner of those, because the "
        "window a trial was picked for is biased upwards. Finished trials are immutable in "
        "Optuna, so `study.best_trial`, `optuna best-trial` and a plain `optuna-dashboard` keep "
        f"naming trial {theirs.number}; `python -m tuner.dashboard`, `tuner.best`, "
        f"`tuner.loader`, `tuner.profiles` and the report name trial {chosen.trial_number}.",
        "",
    ]


def _best_section(study: optuna.Study, chosen: BestSetting) -> list[str]:
    """The best: its figure, why Optuna's differs, speedups, diagnosis, the setting as code."""
    lines: list[str] = []
    best = chosen.trial
    assert best is not None
    how = chosen.figure.how if chosen.holdout_rounds else None
    how = how or ("re-measured median" if chosen.remeasured else "one window")
    ceiling = study.user_attrs.get(CEILING_ATTR)
    share = efficiency(chosen.samples_per_sec, ceiling)
    lines += [f"## Best: trial {chosen.trial_number}", ""]
    headline = f"**{chosen.samples_per_sec:,.1f} samples/s** ({how})"
    if share is not None:
        headline += (
            f", **{share:.0%} of the ceiling** ({float(ceiling):,.1f} samples/s: the step alone, "
            "with data already on the device)"
        )
    bound = bound_of(study.user_attrs)
    if bound:
        headline += (
            f", **{chosen.samples_per_sec / bound:.0%} of the bound** ({bound:,.1f} samples/s: "
            "the most the pipeline model allows on this machine)"
        )
    lines += [headline, ""]
    lines += _optuna_differs(study, chosen)
    ratios = speedups(study, best)
    if ratios:
        lines.append(
            "Speedup: "
            + ", ".join(f"**{ratio:.2f}x** over `{name}`" for name, ratio in ratios.items())
            + "."
        )
        lines.append("")
    diagnosis = study_diagnosis(study, best)
    if diagnosis is not None:
        advice = diagnosis.advice[:1].upper() + diagnosis.advice[1:]
        lines += [f"**Diagnosis: {diagnosis.bottleneck}.** {advice}.", ""]

    parameters = {
        **chosen.dataloader_kwargs,
        **extra_settings(chosen.settings, chosen.batch_param),
    }
    lines += _table(["parameter", "value"], [[key, value] for key, value in parameters.items()])
    lines += [
        "",
        "Apply all of it: the DataLoader arguments, `torch.set_num_threads` in the training "
        "process (its intra-op threads compete with the workers for the cores) and the "
        "workload's knobs. `tuner.loader(...)` does; so does this code:",
        "",
        "```python",
        chosen.snippet(),
        "```",
        "",
    ]
    kept = kept_defaults_line(study.user_attrs)
    if kept is not None:
        lines += [kept[:1].upper() + kept[1:] + ".", ""]
    return lines


def _pipeline_section(study: optuna.Study, trials: list[FrozenTrial]) -> list[str]:
    """The profile and how far the model's predictions were from the measured trials."""
    profile = stored_profile(study.user_attrs)
    if profile is None:
        return []
    line = profile_line(profile)
    lines = ["## Pipeline", "", line[:1].upper() + line[1:] + "."]
    error = model_error(trials)
    if error is not None:
        lines += [
            "",
            f"The model's median error: {error[0]:.0%} over {error[1]} measured trials "
            "(each trial's `predicted_samples_per_sec` beside its `samples_per_sec`).",
        ]
    return [*lines, ""]


def study_note(study: optuna.Study) -> str:
    """The study's Markdown note, from what the database holds now."""
    trials = study.get_trials(deepcopy=False)
    counts = collections.Counter(trial.state.name.lower() for trial in trials)
    lines = [f"# {study.study_name}", ""]
    lines.append(
        f"{len(trials)} trials: " + ", ".join(f"{n} {state}" for state, n in counts.items())
        if trials
        else "No trial yet."
    )
    lines.append("")
    chosen = study_best(study)
    if chosen is None or chosen.trial is None:
        lines += ["No trial has completed yet; see the trials' `pruned_reason` and `error`."]
        return "\n".join(lines) + "\n"
    lines += _best_section(study, chosen)
    lines += _pipeline_section(study, trials)
    lines += ["## Machines", ""]
    finished = [t for t in trials if t.state != TrialState.RUNNING]
    lines += _machines(finished)
    lines += [
        "",
        "_Rewritten at the end of each worker's run. Each trial's `telemetry.csv` and "
        "`steps.csv` are in its artifacts; `bottleneck` and `advice` in its user attrs._",
    ]
    return "\n".join(lines) + "\n"


def save_study_note(study: optuna.Study) -> str:
    """Rewrite the study's note in the database (optuna-dashboard shows it); returns the text."""
    from optuna_dashboard import save_note

    text = study_note(study)
    with_retry(lambda: save_note(study, text), "saving the study note")
    return text
