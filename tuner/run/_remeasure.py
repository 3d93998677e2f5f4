"""Re-measuring candidates side by side, so one lucky window does not win: interleaved rounds
(A B C A B C ...) of the same measurement, medians recorded.

Only fresh rounds count: a candidate's own trial window is where it was picked for being fast,
so it is biased upwards, where a baseline's is not. The runner keeps the rounds this run has
taken, so a candidate an early-stop check already re-measured is only filled up to ``rounds`` at
the study's end. A baseline is there for the speedups, not to be picked: after its
first round it goes on only while that round keeps it within :data:`RACE_MARGIN` of the
leader. The best is the candidate with the highest median. Candidates the fresh rounds
leave within :data:`RACE_MARGIN` of the leader race on: up to half as many rounds again
(:func:`race_rounds`), each dropping those that fall behind, and the pick is made among those
still in it (so every compared candidate has as many rounds). Finished trials are immutable in
Optuna, so the figures live in the study's user attrs (``remeasured_samples_per_sec``: trial
number -> median) with ``best_trial_number``; the merge runs under the study lock so concurrent
workers of a fleet do not overwrite each other's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Sequence
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState
from tqdm import tqdm

from storage import storage_lock, with_retry
from tuner._attrs import record_remeasured, stored_settings, trial_settings
from tuner.run._runner import TrialRunner

__all__ = [
    "RACE_MARGIN",
    "fill_rounds",
    "final_candidates",
    "pick_best",
    "race",
    "race_rounds",
    "remeasure",
]

RACE_MARGIN = 0.15
"""Candidates whose median is within this share of the leader's race on: one window's spread on
2 busy cores reaches 10-15% on the image workload, so a smaller gap may be noise."""


def race_rounds(rounds: int) -> int:
    """The race's rounds after ``rounds`` fresh ones: half as many, at least one.

    Half picks as well as as many again in ``bench.replay``, at half the extra measurements.

    Args:
        rounds: the fresh rounds each candidate was measured.

    Returns:
        The race's further rounds.
    """
    return max(1, rounds // 2)


def final_candidates(study: optuna.Study, top: int) -> list[FrozenTrial]:
    """The ``top`` best distinct settings, and every baseline (for the speedups)."""
    if top <= 0:
        return []
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ranked = sorted(complete, key=lambda t: t.value or 0.0, reverse=True)
    chosen: list[FrozenTrial] = []
    seen: list[dict[str, Any]] = []
    for trial in ranked:
        settings = stored_settings(trial)
        is_baseline = "baseline" in trial.user_attrs
        if settings in seen and not is_baseline:
            continue
        if len(chosen) < top or is_baseline:
            chosen.append(trial)
            seen.append(settings)
    return chosen


def pick_best(runs: dict[int, list[float]]) -> int:
    """The candidate with the highest median (ties: the faster slowest round).

    The median, not the slowest round, decides: a setting quick only while the machine is quiet
    has a low median too, while on a machine whose speed dips for a round at a time the slowest
    round would let one dip decide.

    Args:
        runs: each candidate's trial number to its rounds' samples/sec (none empty).

    Returns:
        The trial number of the pick.
    """
    return max(runs, key=lambda n: (statistics.median(runs[n]), min(runs[n])))


def _in_the_race(runs: dict[int, list[float]]) -> list[int]:
    """The candidates of ``runs`` (none empty) whose median is within :data:`RACE_MARGIN` of
    the leader's."""
    leader = pick_best(runs)
    floor = (1 - RACE_MARGIN) * statistics.median(runs[leader])
    return [number for number in runs if statistics.median(runs[number]) >= floor]


def fill_rounds(
    runs: dict[int, list[float]],
    measure: Callable[[int], float | None],
    rounds: int,
    followers: Collection[int] = (),
) -> None:
    """Measure each candidate of ``runs`` (candidate -> the rounds it has) up to ``rounds``
    fresh rounds, interleaved; ``measure`` reads one (None: failed, tried again next round).
    A follower (a baseline) stops after a round that leaves it out of :func:`_in_the_race`."""
    for index in range(rounds):
        for number in runs:
            if len(runs[number]) > index:
                continue
            if index > 0 and number in followers and runs[number]:
                measured = {n: values for n, values in runs.items() if values}
                if number not in _in_the_race(measured):
                    continue
            value = measure(number)
            if value is not None:
                runs[number].append(value)


def race(
    runs: dict[int, list[float]],
    measure: Callable[[int], float | None],
    extra_rounds: int,
) -> int:
    """The pick after racing: ``runs`` (candidate -> its rounds, none empty) gains a round per
    candidate still within :data:`RACE_MARGIN` of the leader's median, at most
    ``extra_rounds`` times; ``measure`` reads one more round of a candidate (None: failed)."""
    racing = list(runs)
    for _ in range(extra_rounds):
        racing = _in_the_race({number: runs[number] for number in racing})
        if len(racing) < 2:
            break
        for number in racing:
            value = measure(number)
            if value is not None:
                runs[number].append(value)
    return pick_best({number: runs[number] for number in racing})


def remeasure(
    study: optuna.Study,
    runner: TrialRunner,
    trials: Sequence[FrozenTrial],
    rounds: int,
    storage_url: str,
    out: TextIO,
    progress: bool = True,
) -> dict[int, float]:
    """Re-measure ``trials`` (complete ones) up to ``rounds`` each, race the close ones, and
    record; returns trial number -> median."""
    if rounds <= 0 or not trials:
        return {}
    runs = {trial.number: runner.rounds.setdefault(trial.number, []) for trial in trials}
    by_number = {trial.number: trial for trial in trials}
    baselines = {trial.number for trial in trials if "baseline" in trial.user_attrs}
    owed = sum(max(0, rounds - len(values)) for values in runs.values())
    with tqdm(total=owed, desc="re-measuring", file=out, disable=not progress, leave=False) as bar:

        def measure(number: int) -> float | None:
            trial = by_number[number]
            peak = trial.user_attrs.get("peak_host_memory_bytes")
            outcome = runner.measure(trial_settings(trial), expected_peak_bytes=peak)
            if bar.total is not None and bar.n >= bar.total:  # a race's round
                bar.total += 1
            bar.update()
            if outcome.state != "complete":
                return None
            return float(outcome.attrs["samples_per_sec"])

        fill_rounds(runs, measure, rounds, baselines)
        measured = {number: values for number, values in runs.items() if values}
        if not measured:
            return {}
        best_number = race(measured, measure, race_rounds(rounds))

    medians = {number: statistics.median(values) for number, values in measured.items()}

    def record() -> None:
        with storage_lock(storage_url, study.study_name):
            record_remeasured(study, medians, best_number)

    with_retry(record, "recording re-measurements")
    return medians
