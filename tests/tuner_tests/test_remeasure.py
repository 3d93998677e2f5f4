"""The re-measurement at the end of a study: one fresh round of each contender picks (more
rounds and a race where asked: candidates that fall behind let go, extra rounds only for those
left close), then the hold-out of the pick and the baselines side by side."""

from __future__ import annotations

from collections.abc import Callable

from optuna.trial import FrozenTrial, create_trial

from tuner.run._remeasure import (
    RACE_MARGIN,
    Remeasurement,
    contenders,
    fill_rounds,
    hold_out,
    pick_and_hold_out,
    pick_best,
    race,
    select,
)


def reader(values: dict[int, list[float]]) -> tuple[Callable[[int], float | None], list[int]]:
    """Reads each candidate's next value in turn; remembers who was measured."""
    asked: list[int] = []

    def measure(number: int) -> float | None:
        asked.append(number)
        return values[number].pop(0) if values[number] else None

    return measure, asked


def test_a_clear_leader_is_picked_without_more_rounds() -> None:
    runs = {0: [1000.0, 1010.0], 1: [800.0, 820.0]}
    behind = 810 / 1005  # the medians' ratio
    assert behind < 1 - RACE_MARGIN
    measure, asked = reader({0: [], 1: []})
    assert race(runs, measure, 2) == 0
    assert asked == []


def test_close_candidates_race_and_one_far_behind_is_not_measured_again() -> None:
    # Two fresh rounds put 1 ahead of 0 by luck; 2 is far behind.
    runs = {0: [1500.0, 1580.0], 1: [1700.0, 1690.0], 2: [900.0, 950.0]}
    assert pick_best(runs) == 1
    measure, asked = reader({0: [1790.0, 1800.0], 1: [1450.0, 1500.0], 2: []})
    assert race(runs, measure, 2) == 0  # over four rounds, 0's median is the higher
    assert sorted(asked) == [0, 0, 1, 1]
    assert len(runs[0]) == len(runs[1]) == 4 and len(runs[2]) == 2


def test_a_racer_that_falls_behind_is_dropped_and_cannot_be_picked() -> None:
    runs = {0: [1000.0, 1000.0], 1: [990.0, 995.0], 2: [1000.0, 720.0]}
    measure, asked = reader({0: [1010.0, 1005.0], 1: [1000.0, 1002.0], 2: [600.0]})
    assert race(runs, measure, 2) in (0, 1)
    assert asked.count(2) == 1  # one more round, then its median fell out of the margin
    assert asked.count(0) == asked.count(1) == 2


def test_a_failed_extra_round_is_not_counted() -> None:
    runs = {0: [1000.0], 1: [990.0]}
    measure, _ = reader({0: [], 1: [995.0]})
    race(runs, measure, 1)
    assert runs == {0: [1000.0], 1: [990.0, 995.0]}


def test_rounds_an_early_stop_check_took_are_filled_up_not_repeated() -> None:
    runs: dict[int, list[float]] = {0: [1000.0, 1020.0], 1: [], 2: [950.0]}
    measure, asked = reader({0: [], 1: [990.0, 1000.0], 2: [960.0]})
    fill_rounds(runs, measure, 2)
    assert asked == [1, 1, 2]  # 1 twice, 2 once more: every candidate now has two
    assert all(len(values) == 2 for values in runs.values())


def test_the_rounds_are_interleaved() -> None:
    runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
    measure, asked = reader({0: [1.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 1.0]})
    fill_rounds(runs, measure, 2)
    assert asked == [0, 1, 2, 0, 1, 2]


def test_a_candidate_out_of_the_race_after_one_round_is_not_measured_again() -> None:
    # 2 is 30% behind; 3 is within the margin: it could still be picked.
    runs: dict[int, list[float]] = {0: [], 1: [], 2: [], 3: []}
    measure, asked = reader(
        {0: [1000.0, 1010.0], 1: [900.0, 950.0], 2: [700.0, 710.0], 3: [960.0, 940.0]}
    )
    fill_rounds(runs, measure, 2)
    assert asked == [0, 1, 2, 3, 0, 1, 3]
    assert runs[2] == [700.0]


def test_a_round_that_failed_is_tried_again_in_the_next() -> None:
    runs: dict[int, list[float]] = {0: [], 1: []}
    values = {0: [1000.0, 1010.0], 1: [990.0]}
    asked: list[int] = []
    failed_once: set[int] = set()

    def measure(number: int) -> float | None:
        asked.append(number)
        if number == 1 and number not in failed_once:
            failed_once.add(number)
            return None
        return values[number].pop(0)

    fill_rounds(runs, measure, 2)
    assert asked == [0, 1, 0, 1]
    assert runs == {0: [1000.0, 1010.0], 1: [990.0]}


def test_one_slow_round_does_not_outweigh_a_higher_median() -> None:
    # An image study's two candidates on a machine that dipped for a round (2026-12-06).
    runs = {3: [1834.0, 1902.0, 1298.0], 5: [1471.0, 1480.0, 1460.0]}
    assert pick_best(runs) == 3
    assert pick_best({0: [1000.0, 1000.0], 1: [1000.0, 1000.0, 600.0]}) == 0  # ties: the steadier


def _fake(values: dict[int, float]) -> tuple[Callable[[int], float | None], list[int]]:
    """A steady machine: each candidate reads the same figure every round."""
    asked: list[int] = []

    def measure(number: int) -> float | None:
        asked.append(number)
        return values[number]

    return measure, asked


def _trials(values: dict[int, float], baselines: set[int]) -> list[FrozenTrial]:
    """Complete trials numbered as ``values``' keys, each with its window."""
    trials = [
        create_trial(value=values[n], user_attrs={"baseline": "b"} if n in baselines else {})
        for n in values
    ]
    for number, trial in zip(values, trials, strict=True):
        trial.number = number
    return trials


def _study_remeasure(
    values: dict[int, float], baselines: set[int], rounds: int, *selection: int
) -> tuple[list[int], Remeasurement]:
    """What :func:`tuner.run._remeasure.remeasure` asks for, without a runner, each trial
    reading its window every round: the measured trial numbers in order, and the outcome
    (``selection``: the selection's rounds and race rounds, default the tuner's)."""
    measure, asked = _fake(values)
    taken = pick_and_hold_out(_trials(values, baselines), measure, rounds, None, *selection)
    assert taken is not None
    return asked, taken


def test_one_selection_round_of_each_contender_then_the_hold_out() -> None:
    # Three candidates, the leader 20% and 30% ahead; two baselines far behind.
    values = {0: 1000.0, 1: 800.0, 2: 700.0, 3: 400.0, 4: 300.0}
    for rounds in (2, 3):
        asked, taken = _study_remeasure(values, {3, 4}, rounds)
        # One selection round of the three candidates; the hold-out: the pick's rounds and one
        # round of each baseline, which is far behind after it.
        assert asked == [0, 1, 2] + [0, 3, 4] + [0] * (rounds - 1)
        assert taken.pick == 0 and taken.selection == {0: [1000.0], 1: [800.0], 2: [700.0]}
    # Close candidates take no more rounds by default: more would change which of them is
    # picked more than what the pick is worth (SELECTION_ROUNDS).
    close = {0: 1000.0, 1: 980.0, 2: 950.0, 3: 400.0}
    asked, taken = _study_remeasure(close, {3}, 2)
    assert asked == [0, 1, 2, 0, 3, 0]  # a round of each, then the hold-out
    assert taken.pick == 0


def test_an_open_decision_races_where_asked() -> None:
    # 0 and 1 are within the margin of each other; 2 is out after one round.
    values = {0: 1000.0, 1: 950.0, 2: 600.0, 3: 400.0}
    asked, taken = _study_remeasure(values, {3}, 2, 2, 1)
    selection = asked[: asked.index(3) - 1]  # before the hold-out's first round (the pick)
    assert selection.count(0) == selection.count(1) == 2 + 1
    assert selection.count(2) == 1
    assert asked[len(selection) :] == [0, 3, 0]
    assert taken.held == {0: [1000.0] * 2, 3: [400.0]}


def test_a_baseline_within_the_margin_contends_and_stays_in_the_hold_out() -> None:
    values = {0: 1000.0, 1: 700.0, 2: 950.0}  # 2: a baseline as fast as the best candidate
    trials = _trials(values, {2})
    assert [t.number for t in contenders(trials)] == [0, 1, 2]
    measure, asked = _fake(values)
    held = hold_out(0, [2], measure, 3)
    assert held == {0: [1000.0] * 3, 2: [950.0] * 3}  # close: its speedup needs every round
    assert asked == [0, 2, 0, 2, 0, 2]


def test_a_check_s_rounds_are_filled_up_but_never_the_pick_s_figure() -> None:
    """An early-stop check's rounds of the leader count in the selection, not in its figure:
    the study stopped because they were high."""
    values = {0: 1000.0, 1: 950.0}
    measure, asked = _fake(values)
    taken_before = {0: [1100.0, 1090.0]}
    taken = pick_and_hold_out(_trials(values, set()), measure, 2, taken_before)
    assert taken is not None and taken.pick == 0
    assert asked == [1, 0, 0]  # 1's selection round; 0's two hold-out rounds
    assert taken.held == {0: [1000.0, 1000.0]}
    assert taken_before == {0: [1100.0, 1090.0], 1: [950.0]}


def test_the_study_s_rounds_per_part() -> None:
    """The account of a 12-trial image study's re-measurement, in rounds (each a trial child
    and a window): two baselines far behind, ``--remeasure-rounds 2``; by default, and with
    two selection rounds and a race round, where close candidates take more."""
    cases = {
        "clear leader": ({0: 1000.0, 1: 800.0, 2: 700.0}, (3, 4), (3, 4)),
        "two close": ({0: 1000.0, 1: 950.0, 2: 700.0}, (3, 4), (3 + 2 + 2, 4)),
        "three close": ({0: 1000.0, 1: 950.0, 2: 920.0}, (3, 4), (3 + 3 + 3, 4)),
    }
    for values, by_default, racing in cases.values():
        for (selection, held), plan in ((by_default, ()), (racing, (2, 1))):
            trials = {**values, 3: 500.0, 4: 400.0}
            asked, taken = _study_remeasure(trials, {3, 4}, 2, *plan)
            assert len(asked) == selection + held
        assert sum(len(v) for v in taken.held.values()) == held


def test_a_lone_candidate_is_picked_without_a_selection_round() -> None:
    measure, asked = _fake({5: 1000.0})
    runs: dict[int, list[float]] = {5: []}
    assert select(runs, measure, 3) == 5
    assert asked == []
    assert hold_out(5, [], measure, 3) == {5: [1000.0] * 3}


def test_the_hold_out_keeps_the_pick_through_failed_rounds() -> None:
    runs: dict[int, list[float]] = {0: [], 1: []}
    values = {0: [None, 1000.0, 1010.0], 1: [500.0, 505.0, 510.0]}
    asked: list[int] = []

    def measure(number: int) -> float | None:
        asked.append(number)
        return values[number].pop(0)

    fill_rounds(runs, measure, 3, keep={0})
    # Until the pick has a round there is nothing to be behind; then 1 is far behind and stops.
    assert runs == {0: [1000.0, 1010.0], 1: [500.0, 505.0]}
    assert asked == [0, 1, 0, 1, 0]
