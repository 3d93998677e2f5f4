"""The race at the end of a study: extra rounds only for candidates the fresh rounds left close."""

from __future__ import annotations

from collections.abc import Callable

from tuner.run._remeasure import RACE_MARGIN, pick_best, race


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
    assert race(runs, measure, 2) == 0  # over four rounds, 0's slowest is the fastest
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
