"""Re-measuring candidates side by side, so one lucky window does not win, then a hold-out that
gives the pick its figure: interleaved rounds (A B C A B C ...) of the same measurement.

Selection: only fresh rounds count (a candidate's own trial window is where it was picked for
being fast, so it is biased upwards). Every contender (:func:`contenders`: the top candidates,
and a baseline only where its own window is within :data:`RACE_MARGIN` of theirs) takes
:data:`SELECTION_ROUNDS` fresh rounds, interleaved; with more than one, a contender more than
:data:`RACE_MARGIN` behind the leader stops after a round, and the rounds stop once one is left
(:func:`fill_rounds`), and those still close can race on (:func:`race`, :data:`RACE_ROUNDS`
more rounds) before the pick is made among them. The runner keeps the rounds this run has
taken, so a candidate an early-stop check already measured is only filled up.

Hold-out (:func:`hold_out`): the pick's median over the rounds that chose it is the highest of
several noisy medians, so it runs above what a training loop gets (the winner's curse). After
the pick, ``rounds`` fresh interleaved rounds of the pick and each baseline give the pick's
figure and the speedups; a baseline stops after a round that leaves it more than
:data:`RACE_MARGIN` from the leader (its speedup is then not in doubt). No round taken before
the pick counts towards its figure, not even an early-stop check's of a lone candidate: the
study stopped because those rounds were high. :func:`pick_and_hold_out` runs both, for the
study and for ``bench.replay``. Finished trials are immutable in Optuna, so the figures live
in the study's user attrs (``tuner._attrs``: the selection medians, the hold-out's rounds and
``best_trial_number``); the merge runs under the study lock so concurrent workers of a fleet do
not overwrite each other's, and a stop signal waits until it is written whole (a stop during
the rounds leaves the attrs as they were).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Sequence
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState
from tqdm import tqdm

from storage import storage_lock, with_retry
from tuner._attrs import record_remeasured, stored_settings, trial_settings
from tuner._signals import deferred
from tuner.run._runner import TrialRunner

__all__ = [
    "RACE_MARGIN",
    "RACE_ROUNDS",
    "SELECTION_ROUNDS",
    "Remeasurement",
    "contenders",
    "fill_rounds",
    "final_candidates",
    "hold_out",
    "pick_and_hold_out",
    "pick_best",
    "race",
    "remeasure",
    "select",
]

RACE_MARGIN = 0.15
"""Candidates whose median is within this share of the leader's race on: one window's spread on
2 busy cores reaches 10-15% on the image workload, so a smaller gap may be noise."""


SELECTION_ROUNDS = 1
"""Fresh rounds each contender takes in the selection. More rounds change which of the close
top candidates is picked more than what the pick is worth: ``bench.replay`` (the three stored
grids, 10% and 15% noise, 40 seeds each, ``--sampler model``, 10 trials) put 190 of 240 picks
within 95% of the grid's best with one round and no race, and 187 with two rounds and one
race round, at 1.7 selection rounds a study instead of 4.3 (docs/benchmarks.md). The hold-out
gives the figure either way."""

RACE_ROUNDS = 0
"""The race's rounds after the selection's (see :data:`SELECTION_ROUNDS`)."""


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
    keep: Collection[int] = (),
) -> None:
    """Measure the candidates of ``runs`` (candidate -> the rounds it has) up to ``rounds``
    fresh rounds each, interleaved; ``measure`` reads one (None: failed, tried again next round).

    After the first round, a candidate not in ``keep`` stops once a round leaves it out of
    :func:`_in_the_race`; without ``keep``, the rounds stop when no more than one candidate is
    left in it (the decision is made). A candidate without a round yet counts as in the race.

    Args:
        runs: each candidate's rounds so far (an early-stop check's are filled up, not repeated);
            extended in place.
        measure: one more round of a candidate.
        rounds: the fresh rounds each candidate still in the race ends with.
        keep: candidates measured every round regardless (the hold-out's pick).
    """
    for index in range(rounds):
        going = list(runs)
        measured = {number: values for number, values in runs.items() if values}
        if index > 0 and measured:
            close = set(_in_the_race(measured)) | {n for n in runs if not runs[n]}
            going = [n for n in runs if n in close or n in keep]
            if not keep and len(going) < 2:
                return
        for number in going:
            if len(runs[number]) > index:
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


def contenders(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials the selection measures: every candidate, and a baseline only where its own
    window is within :data:`RACE_MARGIN` of the best candidate's (it could be the pick); the
    other baselines are measured in the hold-out only. Without candidates, every baseline.

    Every candidate takes a round, however far its window is behind: one window is too noisy
    to decide on (``bench.replay`` on the stored image grid, ``--sampler model``, 12 trials,
    40 seeds: leaving out candidates more than the margin behind the leader's window saved 0.9
    of 7 rounds a study and put 34 picks within 95% of the grid's best instead of 38)."""
    candidates = [trial for trial in trials if "baseline" not in trial.user_attrs]
    if not candidates:
        return list(trials)
    floor = (1 - RACE_MARGIN) * max(trial.value or 0.0 for trial in candidates)
    return [
        trial
        for trial in trials
        if "baseline" not in trial.user_attrs or (trial.value or 0) >= floor
    ]


def select(
    runs: dict[int, list[float]],
    measure: Callable[[int], float | None],
    rounds: int = SELECTION_ROUNDS,
    extra_rounds: int = RACE_ROUNDS,
) -> int | None:
    """The pick among ``runs``' candidates (each with the rounds it has): up to ``rounds`` fresh
    rounds each (:func:`fill_rounds`), then ``extra_rounds`` of the race (:func:`race`); a lone
    candidate is the pick without a round. None when every round failed."""
    if len(runs) == 1:
        return next(iter(runs))
    fill_rounds(runs, measure, rounds)
    measured = {number: values for number, values in runs.items() if values}
    if not measured:
        return None
    return race(measured, measure, extra_rounds)


def hold_out(
    pick: int,
    baselines: Collection[int],
    measure: Callable[[int], float | None],
    rounds: int,
) -> dict[int, list[float]]:
    """``rounds`` fresh interleaved rounds of ``pick`` and each baseline (pick first); a
    baseline stops after a round that leaves it out of the race (see :func:`fill_rounds`).

    Returns:
        Each measured trial's hold-out rounds (a trial whose every round failed is left out).
    """
    runs: dict[int, list[float]] = {pick: []}
    runs.update({number: [] for number in baselines if number != pick})
    fill_rounds(runs, measure, rounds, keep={pick})
    return {number: values for number, values in runs.items() if values}


@dataclasses.dataclass(frozen=True)
class Remeasurement:
    """What the re-measurement took: the pick, the selection's rounds of each contender
    measured, and the hold-out's rounds of the pick and the baselines."""

    pick: int
    selection: dict[int, list[float]]
    held: dict[int, list[float]]


def pick_and_hold_out(
    trials: Sequence[FrozenTrial],
    measure: Callable[[int], float | None],
    rounds: int,
    taken: dict[int, list[float]] | None = None,
    selection_rounds: int = SELECTION_ROUNDS,
    extra_rounds: int = RACE_ROUNDS,
) -> Remeasurement | None:
    """The selection among :func:`contenders`, then the hold-out of the pick and the baselines
    (see the module docstring); the study's re-measurement and ``bench.replay`` both run this.

    Args:
        trials: the candidates and baselines (:func:`final_candidates`).
        measure: one fresh round of a trial by number (None: it failed).
        rounds: the hold-out's rounds.
        taken: rounds this run has taken by trial number, filled up rather than repeated and
            extended in place (the runner's).
        selection_rounds: the selection's fresh rounds.
        extra_rounds: the race's rounds.

    Returns:
        The pick and the rounds; None when every selection round failed.
    """
    taken = {} if taken is None else taken
    runs = {trial.number: taken.setdefault(trial.number, []) for trial in contenders(trials)}
    pick = select(runs, measure, selection_rounds, extra_rounds)
    if pick is None:
        return None
    baselines = [trial.number for trial in trials if "baseline" in trial.user_attrs]
    held = hold_out(pick, baselines, measure, rounds)
    selection = {number: values for number, values in runs.items() if values}
    return Remeasurement(pick, selection, held)


def remeasure(
    study: optuna.Study,
    runner: TrialRunner,
    trials: Sequence[FrozenTrial],
    rounds: int,
    storage_url: str,
    out: TextIO,
    progress: bool = True,
) -> dict[int, float]:
    """Pick among ``trials`` (complete ones) by fresh rounds, take the hold-out of the pick and
    the baselines, and record both (see the module docstring).

    Returns:
        Trial number -> median: over the selection's rounds, or the hold-out's for a trial the
        selection did not measure (a baseline, a lone candidate). Empty when ``rounds`` is 0.
    """
    if rounds <= 0 or not trials:
        return {}
    chosen = contenders(trials)
    baselines = [trial for trial in trials if "baseline" in trial.user_attrs]
    owed = (len(chosen) * SELECTION_ROUNDS if len(chosen) > 1 else 0) + rounds + len(baselines)
    with tqdm(total=owed, desc="re-measuring", file=out, disable=not progress, leave=False) as bar:
        taken = pick_and_hold_out(trials, _measurer(runner, trials, bar), rounds, runner.rounds)
    if taken is None:
        return {}
    medians = {number: statistics.median(values) for number, values in taken.selection.items()}
    for number, values in taken.held.items():
        medians.setdefault(number, statistics.median(values))
    if not medians:  # every round failed: nothing to record
        return {}
    pick, held = taken.pick, taken.held
    # Fresh rounds a later selection of this run may count (an early-stop check's pick).
    runner.rounds.setdefault(pick, []).extend(held.get(pick, []))

    def record() -> None:
        with storage_lock(storage_url, study.study_name), deferred():  # all three attrs or none
            record_remeasured(study, medians, pick, held)

    with_retry(record, "recording re-measurements")
    return medians


def _measurer(
    runner: TrialRunner, trials: Sequence[FrozenTrial], bar: tqdm
) -> Callable[[int], float | None]:
    """One fresh round of a trial's setting (None: it did not complete), counted on ``bar``."""
    by_number = {trial.number: trial for trial in trials}

    def measure(number: int) -> float | None:
        trial = by_number[number]
        peak = trial.user_attrs.get("peak_host_memory_bytes")
        outcome = runner.measure(trial_settings(trial), expected_peak_bytes=peak)
        if bar.total is not None and bar.n >= bar.total:  # a round more than foreseen
            bar.total += 1
        bar.update()
        if outcome.state != "complete":
            return None
        return float(outcome.attrs["samples_per_sec"])

    return measure
