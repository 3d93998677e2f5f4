"""The guard's growth rules on readings given by hand (the real processes: test_supervisor)."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.trial._guard import (
    EXACT_CPU_SHARE,
    EXACT_EVERY_NEAR_S,
    EXACT_EVERY_S,
    FAST_INTERVAL_S,
    SUSTAINED_S,
    MemoryGuard,
    _Series,
    default_limits,
)

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


LIMIT_MIB = 690


def first_breach(
    points: list[tuple[float, float]], expected_mib: float | None = None
) -> tuple[float, bool] | None:
    """Replay exact host readings (MiB) through the guard's rules, the tree's peak expected at
    ``expected_mib``: (reading, predicted) of the first breach under :data:`LIMIT_MIB`, or None."""
    limits = dataclasses.replace(default_limits(), host_bytes=LIMIT_MIB * MiB)
    expected = None if expected_mib is None else expected_mib * MiB
    readings = _Series()
    with MemoryGuard(limits) as guard:
        for at, value in points:
            readings.add(at, value * MiB)
            breach = guard._check("host", value * MiB, readings, limits.host_bytes, expected)
            if breach is not None:
                return breach.reading_bytes / MiB, breach.predicted
    return None


def test_a_ramp_that_slows_down_and_holds_below_the_limit_is_not_stopped() -> None:
    # A first large batch being built: each reading adds less than the one before (80, 70, 55,
    # 40 MiB ...), then it holds at 88% of the limit. At 505 MiB the slowest recent speed
    # (275 MiB/s) over the look-ahead would reach 697 MiB, past the limit; the increments
    # shrinking by 0.875 or faster reach 649 MiB.
    values = [300, 380, 450, 505, 545, 573, 591, 601, 606, 608] + [608] * 10
    ramp = [(0.2 * k, value) for k, value in enumerate(values)]
    assert first_breach(ramp) is None
    settling = series(ramp[:4])
    assert settling.sustained_rate_per_s() == pytest.approx(275 * MiB)
    assert 505 * MiB + settling.growth_within(0.7, 275 * MiB) < LIMIT_MIB * MiB
    assert LIMIT_MIB < 505 + 275 * 0.7  # the linear projection would have stopped it


def test_a_steady_leak_is_stopped_before_the_limit() -> None:
    leak = [(0.2 * k, 300 + 80 * k) for k in range(10)]
    breach = first_breach(leak)
    assert breach is not None
    reading, predicted = breach
    assert predicted and reading < LIMIT_MIB


def test_a_leak_that_speeds_up_keeps_its_speed() -> None:
    speeding = series([(0.2 * k, 300 + 10 * k * k) for k in range(6)])
    assert speeding.growth_within(0.7, 400 * MiB) == pytest.approx(0.7 * 400 * MiB)


def test_the_guard_samples_faster_only_while_the_tree_moves_near_its_limit() -> None:
    limits = dataclasses.replace(default_limits(), host_bytes=1000 * MiB)
    with MemoryGuard(limits) as guard:
        for mib in (500, 600):  # moving, but far from the limit
            guard._pace(mib * MiB, mib * MiB)
        assert guard.next_interval_s() == guard.interval_s
        guard._pace(870 * MiB, 870 * MiB)  # moving within 15% of it
        assert guard.next_interval_s() == FAST_INTERVAL_S < guard.interval_s
        assert guard._lookahead_s() < 2 * guard.interval_s + guard._kill_time_s
        guard._pace(871 * MiB, 871 * MiB)  # near, at rest: an exact reading a tick costs
        assert guard.next_interval_s() == guard.interval_s


def test_timed_exact_readings_are_spaced_by_their_own_cost_not_other_reasons() -> None:
    limits = dataclasses.replace(default_limits(), host_bytes=1000 * MiB)
    pids = frozenset({1, 2, 3})
    with MemoryGuard(limits) as guard:
        # The last exact reading: 400 MiB of PSS, 900 MiB of summed RSS (near the limit), at 0.
        guard._pss_base = (400 * MiB, 900 * MiB, pids, 0.0)
        guard._exact_cost_s = 0.001  # a few processes: the usual pace
        assert not guard._exact_due(900 * MiB, pids, EXACT_EVERY_NEAR_S - 0.01)
        assert guard._exact_due(900 * MiB, pids, EXACT_EVERY_NEAR_S)
        guard._exact_cost_s = 0.3  # 200 processes at 1.5 ms each
        spaced = guard._exact_cost_s / EXACT_CPU_SHARE
        assert EXACT_EVERY_NEAR_S < spaced < EXACT_EVERY_S
        assert not guard._exact_due(900 * MiB, pids, spaced - 0.01)
        assert guard._exact_due(900 * MiB, pids, spaced)
        # What calls for one at once still does, however costly.
        assert guard._exact_due(900 * MiB, pids | {4}, 0.1)  # a changed tree
        assert guard._exact_due(930 * MiB, pids, 0.1)  # RSS moved by 2% of the limit
        guard._pss_base = (840 * MiB, 900 * MiB, pids, 0.0)
        assert guard._exact_due(915 * MiB, pids, 0.1)  # the estimate near the limit


# A first batch decoded in the main process: steady growth for 0.6 s, then it holds at 72% of
# the limit (image's w0 b256 grew so and was stopped at 77% of its limit, 2026-12-05).
DECODING = [(0.2 * k, value) for k, value in enumerate([300, 365, 430, 495] + [500] * 8)]


def test_steady_growth_to_a_peak_that_fits_is_projected_without_an_expectation() -> None:
    assert first_breach(DECODING) == (495, True)  # 495 + 325 MiB/s x 0.7 s is past the limit


def test_growth_towards_the_expected_peak_is_the_ramp_not_a_breach() -> None:
    assert first_breach(DECODING, expected_mib=520) is None


def test_growth_past_the_expected_peak_is_projected_again() -> None:
    leak = [(0.2 * k, 300 + 80 * k) for k in range(10)]
    reading, predicted = first_breach(leak, expected_mib=400) or (None, None)
    assert predicted and reading is not None and 400 < reading < LIMIT_MIB
    assert first_breach(leak) == (reading, predicted)  # the leak was past 400 MiB when projected


def test_an_expected_peak_over_the_limit_leaves_every_projection_on() -> None:
    assert first_breach(DECODING, expected_mib=LIMIT_MIB + 10) == first_breach(DECODING)


def test_rising_near_the_limit_toward_a_peak_the_model_puts_past_it_is_a_breach() -> None:
    # Within 10% of the limit (621 MiB) and rising slowly: 632 + 22 MiB/s x 0.7 s stays under
    # it, so alone it runs on; the model's peak past the limit makes the rise a breach.
    creeping = [(0.2 * k, value) for k, value in enumerate([610, 615, 620, 624, 628, 632])]
    assert first_breach(creeping) is None
    assert first_breach(creeping, expected_mib=LIMIT_MIB + 40) == (624, True)
    holding = [(0.2 * k, value) for k, value in enumerate([610, 615, 630, 630, 629, 630])]
    assert first_breach(holding, expected_mib=LIMIT_MIB + 40) == (630, True)  # it rose to it
    resting = [(0.2 * k, 630) for k in range(6)]
    assert first_breach(resting, expected_mib=LIMIT_MIB + 40) is None  # the model is wrong here
    # A peak past the limit by less than the model's error margin leaves it to the readings.
    assert first_breach(creeping, expected_mib=LIMIT_MIB + 10) is None
