"""The study's summary as the CLI prints it, read from recorded attrs."""

from __future__ import annotations

import io

import optuna

from tuner._attrs import record_remeasured, settings_attrs
from tuner.insight._summary import print_summary
from tuner.search._settings import LoaderSettings


def _study_with_medians(medians: dict[int, float], best: int) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for number, value in enumerate((2412.8, 2367.7, 2257.9)):
        settings = LoaderSettings(batch=64, num_workers=number + 1, prefetch_factor=2)
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=settings_attrs(settings)))
    record_remeasured(study, medians, best)
    return study


def test_a_pick_below_another_trials_median_says_why() -> None:
    """The race picks by the slowest round: the summary says so where the table's top row, by
    median, is another trial (medians of a real image study's three candidates)."""
    out = io.StringIO()
    study = _study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=1)
    assert print_summary(study, "batch_size", out).number == 1  # type: ignore[union-attr]
    text = out.getvalue()
    assert "best: trial 1, 2,333.0 samples/s" in text
    assert "picked by its slowest re-measured round" in text and "trial 0's median" in text


def test_a_pick_with_the_highest_median_needs_no_word() -> None:
    out = io.StringIO()
    print_summary(_study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=0), "batch", out)
    assert "best: trial 0" in out.getvalue() and "slowest" not in out.getvalue()
