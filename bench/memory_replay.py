"""The memory model replayed over finished ``bench.guard_precision`` studies: what it would prune.

    python -m bench.memory_replay /tmp/guard-precision-A /tmp/guard-precision-B

For each study of each folder (its SQLite file and ``results.json``), every trial in order is
judged as the runner judges it before it runs (:func:`tuner.run._walls.wall_verdict`), from the
trials before it only: the model's predicted peak, and whether it prunes the setting unrun
(``memory_model``). Against each setting's real peak (the folder's reference peaks, else the
trial's own recorded peak where it completed): a prune whose real peak is under 90% of the limit
is a false alarm, one at or over the limit a catch; a setting at or over the limit the model
lets run is left to the guard. The studies' histories are the ones their run made, so this
judges the model on realistic trial sequences without re-running them; a study run with the
model replayed here would have gone differently after its first prune.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.trial import TrialState

from bench._harness import settings_key
from bench.guard_precision import FALSE_ALARM_FRACTION
from tuner._attrs import has_settings, trial_settings
from tuner.pipeline import stored_profile
from tuner.run._walls import prior_memory_figures, wall_verdict
from tuner.search import LoaderSettings


def replay_folder(folder: Path) -> tuple[collections.Counter[str], list[float]]:
    """Counts (``false_alarm``, ``caught``, ``left_to_guard``) and the model's relative errors."""
    results = json.loads((folder / "results.json").read_text())
    counts: collections.Counter[str] = collections.Counter()
    errors: list[float] = []
    for name, workload in results.items():
        if not isinstance(workload, dict) or "limits" not in workload:
            continue
        real = {
            settings_key(LoaderSettings.from_attrs(p["settings"])): p["peak_bytes"]
            for p in workload["peaks"]
        }
        for limit in workload["limits"]:
            study = optuna.load_study(
                study_name=f"precision-{name}-{limit}",
                storage=f"sqlite:///{folder / f'{name}-{limit}.db'}",
            )
            trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
            for number, trial in enumerate(trials):
                if not has_settings(trial):
                    continue
                settings = trial_settings(trial)
                truth = real.get(settings_key(settings))
                recorded = trial.user_attrs.get("peak_host_memory_bytes")
                if truth is None and trial.state == TrialState.COMPLETE:
                    truth = recorded
                if truth is None:
                    continue
                prior = prior_memory_figures(stored_profile(study.user_attrs), settings.knobs)
                verdict = wall_verdict(trials[:number], settings, limit, prior)
                if verdict.predicted_peak_bytes is not None:
                    errors.append(abs(verdict.predicted_peak_bytes / truth - 1))
                if verdict.over_limit:
                    counts["false_alarm" if truth < FALSE_ALARM_FRACTION * limit else "caught"] += 1
                elif truth >= limit:
                    counts["left_to_guard"] += 1
    return counts, errors


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_replay", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="bench.guard_precision --out folders")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    total: collections.Counter[str] = collections.Counter()
    errors: list[float] = []
    for folder in args.folders:
        counts, folder_errors = replay_folder(folder)
        total.update(counts)
        errors.extend(folder_errors)
        print(f"{folder}: {dict(counts)}")
    median = f"{statistics.median(errors):.1%}" if errors else "none"
    print(
        f"all: model prunes {total['caught'] + total['false_alarm']}"
        f" ({total['false_alarm']} false alarms, {total['caught']} caught),"
        f" {total['left_to_guard']} over the limit left to the guard;"
        f" median |error| of {len(errors)} predictions {median}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
