"""The guard's growth rules on readings given by hand (the real processes: test_supervisor)."""

from __future__ import annotations

import pytest

from tuner.trial._guard import SUSTAINED_S, _Series

MiB = 2**20


def series(points: list[tuple[float, float]]) -> _Series:
    readings = _Series()
    for at, value in points:
        readings.add(at, value * MiB)
    return readings


def test_steady_growth_for_long_enough_is_sustained_at_its_slowest_recent_speed() -> None:
    leak = series([(0.2 * k, 100 + 50 * k + (10 if k == 3 else 0)) for k in range(5)])
    # Intervals of 50, 60, 40, 50 MiB per 0.2 s: the slowest of the last three is 200 MiB/s.
    assert leak.sustained_rate_per_s() == pytest.approx(200 * MiB)


def test_a_jump_then_a_hold_is_not_sustained() -> None:
    assert (
        series([(0.0, 100), (0.2, 400), (0.4, 420), (0.6, 420), (0.8, 421)]).sustained_rate_per_s()
        is None
    )


def test_rising_for_less_than_the_sustained_span_is_not_sustained() -> None:
    short = series([(0.0, 100), (0.1, 150), (0.2, 200), (0.3, 250)])
    assert SUSTAINED_S > 0.3
    assert short.sustained_rate_per_s() is None
    assert short.rate_per_s() == pytest.approx(500 * MiB)


def test_restart_forgets_growth_and_keeps_the_peak() -> None:
    readings = series([(0.0, 100), (0.2, 300)])
    readings.restart()
    assert readings.rate_per_s() == 0.0
    assert readings.peak == 300 * MiB
