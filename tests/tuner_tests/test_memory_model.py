"""The memory model: its terms, and figures fitted back from peaks it generated."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.search._memory_model import MemoryFigures, fit_memory_figures, predicted_peak_bytes
from tuner.search._settings import LoaderSettings

MiB = 2**20
FIGURES = MemoryFigures(main_bytes=200 * MiB, worker_bytes=30 * MiB, sample_bytes=0.15 * MiB)


def setting(
    workers: int,
    batch: int,
    prefetch: int = 2,
    pin: bool = False,
    collate: str | None = None,
    persistent: bool = True,
) -> LoaderSettings:
    return LoaderSettings(
        batch=batch,
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
        persistent_workers=persistent and workers > 0,
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


def test_workers_forked_again_each_epoch_keep_the_steps_memory() -> None:
    persistent = predicted_peak_bytes(setting(2, 64, 4), FIGURES)
    reforked = predicted_peak_bytes(setting(2, 64, 4, persistent=False), FIGURES)
    # Unfitted, they keep the step's whole memory (an upper bound) ...
    assert reforked - persistent == pytest.approx(64 * 0.15 * MiB, abs=1)
    # ... fitted, what the trials that crossed an epoch's start measured.
    fitted = dataclasses.replace(FIGURES, refork_sample_bytes=0.05 * MiB)
    fitted_peak = predicted_peak_bytes(setting(2, 64, 4, persistent=False), fitted)
    assert fitted_peak - persistent == pytest.approx(64 * 0.05 * MiB, abs=1)
    # One copy between them, however many workers share the old pages (text: +351, +270 and
    # +262 MiB at 1, 2 and 3 workers).
    four = predicted_peak_bytes(setting(4, 64, 4, persistent=False), fitted)
    copies = four - predicted_peak_bytes(setting(4, 64, 4), fitted)
    assert copies == pytest.approx(fitted_peak - persistent, abs=1)
    assert setting(2, 64, 4, persistent=False).dominates(setting(2, 64, 4))
    assert not setting(2, 64, 4).dominates(setting(2, 64, 4, persistent=False))


def test_fit_recovers_what_reforked_workers_keep() -> None:
    figures = dataclasses.replace(FIGURES, refork_sample_bytes=0.05 * MiB)
    grid = [setting(w, b) for w, b in ((0, 16), (0, 256), (1, 64), (2, 16), (4, 256))]
    grid += [setting(2, 64, 4), setting(4, 16, 8), setting(1, 128, persistent=False)]
    observations = [(s, float(predicted_peak_bytes(s, figures))) for s in grid]
    fitted = fit_memory_figures(observations)
    assert fitted is not None
    assert fitted.refork_sample_bytes == pytest.approx(0.05 * MiB, rel=1e-6)
    assert fitted.step_bytes_per_sample == pytest.approx(FIGURES.sample_bytes, rel=1e-6)
    # Without such a trial there is no figure: the step's whole memory stands for it.
    persistent_only = fit_memory_figures(observations[:-1])
    assert persistent_only is not None and persistent_only.refork_sample_bytes is None


def test_a_larger_setting_never_needs_less() -> None:
    small, large = setting(2, 32, 2), setting(4, 64, 4, pin=True)
    assert large.dominates(small)
    assert predicted_peak_bytes(large, FIGURES) > predicted_peak_bytes(small, FIGURES)


def test_fit_recovers_the_figures_it_is_given() -> None:
    grid = [setting(w, b) for w, b in ((0, 16), (0, 256), (1, 64), (2, 16), (4, 256))]
    grid += [setting(2, 64, 4), setting(4, 16, 8)]
    observations = [(s, float(predicted_peak_bytes(s, FIGURES))) for s in grid]
    fitted = fit_memory_figures(observations)
    assert fitted is not None
    assert fitted.main_bytes == pytest.approx(FIGURES.main_bytes, rel=1e-6)
    assert fitted.worker_bytes == pytest.approx(FIGURES.worker_bytes, rel=1e-6)
    assert fitted.sample_bytes == pytest.approx(FIGURES.sample_bytes, rel=1e-6)
    assert fitted.step_sample_bytes == pytest.approx(FIGURES.sample_bytes, rel=1e-6)
    assert fitted.max_in_flight == 32  # four workers, prefetch 8


def test_fit_needs_settings_that_separate_the_terms() -> None:
    same_workers = [(setting(2, 32 * k), 300.0 * MiB + k * MiB) for k in range(1, 6)]
    assert fit_memory_figures(same_workers) is None
    assert fit_memory_figures([(setting(0, 32), 200.0 * MiB)]) is None


def test_fit_that_makes_samples_free_is_refused() -> None:
    flat = [(setting(w, b), 300.0 * MiB) for w, b in ((0, 16), (1, 64), (2, 256), (4, 16))]
    flat.append((setting(2, 64, 4), 300.0 * MiB))
    assert fit_memory_figures(flat) is None


def test_the_queue_is_counted_no_deeper_than_the_deepest_measured() -> None:
    capped = dataclasses.replace(FIGURES, max_in_flight=4)
    deep = setting(1, 64, prefetch=8)
    assert predicted_peak_bytes(deep, capped) == predicted_peak_bytes(setting(1, 64, 4), FIGURES)
    assert predicted_peak_bytes(deep, capped) < predicted_peak_bytes(deep, FIGURES)


def test_a_pooled_fit_shares_main_worker_and_step_and_gives_each_knob_value_its_sample() -> None:
    # The step holds what the model makes of a batch, whatever the collate handed it.
    uint8 = dataclasses.replace(
        FIGURES, sample_bytes=FIGURES.sample_bytes / 4, step_sample_bytes=FIGURES.sample_bytes
    )
    observed = [
        (0, 32, 2, "float"),
        (2, 64, 2, "float"),
        (0, 16, 2, "uint8"),
        (1, 16, 2, "uint8"),
        (2, 128, 4, "uint8"),
        (4, 32, 2, "uint8"),
    ]
    observations = [
        (s, float(predicted_peak_bytes(s, FIGURES if s.knobs["collate"] == "float" else uint8)))
        for s in (setting(w, b, p, collate=c) for w, b, p, c in observed)
    ]
    # Two to four observations per knob value: a fit of four figures per value needs five.
    fitted = fit_memory_figures(observations, {"collate": "uint8"})
    assert fitted is not None
    assert fitted.main_bytes == pytest.approx(FIGURES.main_bytes, rel=1e-6)
    assert fitted.worker_bytes == pytest.approx(FIGURES.worker_bytes, rel=1e-6)
    assert fitted.step_sample_bytes == pytest.approx(FIGURES.sample_bytes, rel=1e-6)
    assert fitted.sample_bytes == pytest.approx(uint8.sample_bytes, rel=1e-6)
    assert fit_memory_figures(observations, {"collate": "half"}) is None  # never measured
