"""The memory model: its terms, and figures fitted back from peaks it generated."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.search._memory_model import MemoryFigures, fit_memory_figures, predicted_peak_bytes
from tuner.search._settings import LoaderSettings

MiB = 2**20
FIGURES = MemoryFigures(main_bytes=200 * MiB, worker_bytes=30 * MiB, sample_bytes=0.15 * MiB)


def setting(
    workers: int, batch: int, prefetch: int = 2, pin: bool = False, collate: str | None = None
) -> LoaderSettings:
    return LoaderSettings(
        batch=batch,
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
        pin_memory=pin,
        knobs={"collate": collate} if collate else {},
    )


def test_terms_of_the_model() -> None:
    # No workers: the main process and the batch in the step.
    assert predicted_peak_bytes(setting(0, 32), FIGURES) == round(200 * MiB + 32 * 0.15 * MiB)
    # Two workers, prefetch 4: eight batches in flight plus the step's.
    expected = 200 * MiB + 2 * 30 * MiB + 64 * 9 * 0.15 * MiB
    assert predicted_peak_bytes(setting(2, 64, 4), FIGURES) == round(expected)
    # Pinned: each batch in flight has a page-locked copy too.
    pinned = 200 * MiB + 2 * 30 * MiB + 64 * 17 * 0.15 * MiB
    assert predicted_peak_bytes(setting(2, 64, 4, pin=True), FIGURES) == round(pinned)


def test_a_larger_setting_never_needs_less() -> None:
    small, large = setting(2, 32, 2), setting(4, 64, 4, pin=True)
    assert large.dominates(small)
    assert predicted_peak_bytes(large, FIGURES) > predicted_peak_bytes(small, FIGURES)


def test_fit_recovers_the_figures_it_is_given() -> None:
    grid = [setting(w, b, p) for w in (0, 1, 2, 4) for b in (16, 64, 256) for p in (2, 4)]
    grid = [s for s in grid if s.num_workers or s.prefetch_factor is None]
    observations = [(s, float(predicted_peak_bytes(s, FIGURES))) for s in grid]
    fitted = fit_memory_figures(observations)
    assert fitted is not None
    assert fitted.main_bytes == pytest.approx(FIGURES.main_bytes, rel=1e-6)
    assert fitted.worker_bytes == pytest.approx(FIGURES.worker_bytes, rel=1e-6)
    assert fitted.sample_bytes == pytest.approx(FIGURES.sample_bytes, rel=1e-6)


def test_fit_needs_settings_that_separate_the_terms() -> None:
    same_workers = [(setting(2, 32 * k), 300.0 * MiB + k * MiB) for k in range(1, 6)]
    assert fit_memory_figures(same_workers) is None
    assert fit_memory_figures([(setting(0, 32), 200.0 * MiB)]) is None


def test_fit_that_makes_samples_free_is_refused() -> None:
    flat = [(setting(w, b), 300.0 * MiB) for w, b in ((0, 16), (1, 64), (2, 256), (4, 16))]
    assert fit_memory_figures(flat) is None


def test_a_pooled_fit_shares_main_and_worker_and_gives_each_knob_value_its_sample() -> None:
    uint8 = dataclasses.replace(FIGURES, sample_bytes=FIGURES.sample_bytes / 4)
    observed = [
        (0, 32, "float"),
        (2, 64, "float"),
        (1, 16, "uint8"),
        (2, 128, "uint8"),
        (4, 32, "uint8"),
    ]
    observations = [
        (s, float(predicted_peak_bytes(s, FIGURES if s.knobs["collate"] == "float" else uint8)))
        for s in (setting(w, b, collate=c) for w, b, c in observed)
    ]
    # Two or three observations per knob value: a fit of three figures per value needs four.
    fitted = fit_memory_figures(observations, {"collate": "uint8"})
    assert fitted is not None
    assert fitted.main_bytes == pytest.approx(FIGURES.main_bytes, rel=1e-6)
    assert fitted.worker_bytes == pytest.approx(FIGURES.worker_bytes, rel=1e-6)
    assert fitted.sample_bytes == pytest.approx(uint8.sample_bytes, rel=1e-6)
    assert fit_memory_figures(observations, {"collate": "half"}) is None  # never measured
