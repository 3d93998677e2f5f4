"""The re-measurement at the end of a study: rounds filled up, baselines that fall behind let go,
extra rounds only for candidates the fresh rounds left close."""

from __future__ import annotations

from collections.abc import Callable

from tuner.run._remeasure import RACE_MARGIN, fill_rounds, pick_best, race


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


def test_a_baseline_out_of_the_race_after_one_round_is_not_measured_again() -> None:
    # 2 is a baseline 30% behind; 3 is a baseline within the margin: it could still be picked.
    runs: dict[int, list[float]] = {0: [], 1: [], 2: [], 3: []}
    measure, asked = reader(
        {0: [1000.0, 1010.0], 1: [900.0, 950.0], 2: [700.0, 710.0], 3: [960.0, 940.0]}
    )
    fill_rounds(runs, measure, 2, followers={2, 3})
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
