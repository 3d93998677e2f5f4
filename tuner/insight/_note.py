"""The study's note in optuna-dashboard: what a user needs from the study, on its first page.

Rewritten whole at the end of each worker's run (``save_study_note``), so it always describes
the study as the database holds it, whichever worker wrote last: the best setting, its
throughput, its efficiency against the ceiling and the pipeline model's bound, the speedup over
both baselines, its diagnosis, the pipeline profile and the model's error, the machines that
contributed, and a ready ``DataLoader(...)`` snippet.
"""

from __future__ import annotations

import collections
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage import with_retry
from tuner._naming import CEILING_ATTR
from tuner.insight._diagnosis import diagnose_trial
from tuner.insight._pipeline import bound_of, model_error, profile_line, stored_profile
from tuner.insight._snippet import dataloader_snippet, extra_settings
from tuner.insight._summary import best_trial, efficiency, remeasured, speedups, trial_throughput
from tuner.search._settings import LoaderSettings

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


def _pipeline_section(study: optuna.Study, trials: list[FrozenTrial]) -> list[str]:
    """The profile and how far the model's predictions were from the measured trials."""
    profile = stored_profile(study.user_attrs)
    if profile is None:
        return []
    lines = ["## Pipeline", "", profile_line(profile)[:1].upper() + profile_line(profile)[1:] + "."]
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
    best = best_trial(study)
    if best is None:
        lines += ["No trial has completed yet; see the trials' `pruned_reason` and `error`."]
        return "\n".join(lines) + "\n"

    medians = remeasured(study)
    throughput = trial_throughput(best, medians)
    how = "re-measured median" if best.number in medians else "one window"
    ceiling = study.user_attrs.get(CEILING_ATTR)
    share = efficiency(throughput, ceiling)
    lines += [f"## Best: trial {best.number}", ""]
    headline = f"**{throughput:,.1f} samples/s** ({how})"
    if share is not None:
        headline += (
            f", **{share:.0%} of the ceiling** ({float(ceiling):,.1f} samples/s: the step alone, "
            "with data already on the device)"
        )
    bound = bound_of(study.user_attrs)
    if bound:
        headline += (
            f", **{throughput / bound:.0%} of the bound** ({bound:,.1f} samples/s: the most the "
            "pipeline model allows on this machine)"
        )
    lines += [headline, ""]
    ratios = speedups(study, best)
    if ratios:
        lines.append(
            "Speedup: "
            + ", ".join(f"**{ratio:.2f}x** over `{name}`" for name, ratio in ratios.items())
            + "."
        )
        lines.append("")
    diagnosis = diagnose_trial(best)
    if diagnosis is not None:
        advice = diagnosis.advice[:1].upper() + diagnosis.advice[1:]
        lines += [f"**Diagnosis: {diagnosis.bottleneck}.** {advice}.", ""]

    batch_param = study.user_attrs.get("batch_param", "batch_size")
    settings = LoaderSettings.from_attrs(best.user_attrs["settings"])
    parameters = {
        **settings.dataloader_kwargs(batch_param),
        **extra_settings(settings, batch_param),
    }
    lines += _table(["parameter", "value"], [[key, value] for key, value in parameters.items()])
    lines += ["", "```python", dataloader_snippet(settings, batch_param), "```", ""]
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
