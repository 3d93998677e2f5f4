"""The cores' load since a last look: exact on given counters, real on this machine."""

from __future__ import annotations

import time
from collections import namedtuple

import pytest

from tuner._loader import read_machine
from tuner.machine import CpuLoad
from tuner.machine._cpu_load import busy_and_iowait

Times = namedtuple("Times", "user nice system idle iowait guest")


def test_busy_and_iowait_from_counter_deltas_guest_counted_once() -> None:
    before = Times(10, 0, 5, 100, 1, 0)
    after = Times(40, 0, 15, 150, 11, 30)  # guest time is already in user time
    busy, iowait = busy_and_iowait(before, after)  # type: ignore[misc]
    assert busy == pytest.approx(100 * 40 / 100)
    assert iowait == pytest.approx(100 * 10 / 100)
    assert busy_and_iowait(before, before) is None  # no clock tick between the two


def test_a_spinning_loop_shows_as_load_and_each_reading_covers_only_its_own_span() -> None:
    meter = CpuLoad()
    spin_until = time.perf_counter() + 0.5
    while time.perf_counter() < spin_until:
        pass
    shares = meter.read()
    assert shares is not None
    assert 0 < shares.busy_percent <= 100 and 0 <= shares.iowait_percent <= 100
    assert all(0 <= core <= 100 for core in shares.busy_per_core)
    assert max(shares.busy_per_core) >= 100 / len(shares.busy_per_core) * 0.5  # one core spun


def test_reading_the_machine_without_a_meter_has_no_load_figure_rather_than_waiting() -> None:
    state = read_machine()
    assert state.cpu_percent is None
    assert 0 < state.available_memory_bytes <= state.total_memory_bytes
