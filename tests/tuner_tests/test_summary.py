"""The study's summary as the CLI prints it, read from recorded attrs."""

from __future__ import annotations

import dataclasses
import io

import optuna

from tuner._attrs import (
    record_loader_defaults_kept,
    record_phases,
    record_remeasured,
    settings_attrs,
)
from tuner._naming import CEILING_ATTR
from tuner.insight._pipeline import kept_defaults_line
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
    """A candidate the race dropped can end with the higher median on fewer rounds: the summary
    says so where the table's top row, by median, is another trial (medians of a real image
    study's three candidates)."""
    out = io.StringIO()
    study = _study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=1)
    assert print_summary(study, "batch_size", out).number == 1  # type: ignore[union-attr]
    text = out.getvalue()
    assert "best: trial 1, 2,333.0 samples/s" in text
    assert "picked on the selection's rounds; trial 0's median, over other rounds" in text


def test_a_pick_with_the_highest_median_needs_no_word() -> None:
    out = io.StringIO()
    print_summary(_study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=0), "batch", out)
    assert "best: trial 0" in out.getvalue() and "race" not in out.getvalue()


def _study_of_an_input_bound_best(rivals: list[float]) -> optuna.Study:
    """Trial 6 of a README quick-start study (num_workers 1, re-measured 1,697.6; the loop waited
    28% of the time with the CPUs 82% busy) beside ``rivals``: 2-worker trials' samples/sec."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    best = LoaderSettings(batch=128, num_workers=1, prefetch_factor=2, persistent_workers=True)
    attrs = {**settings_attrs(best), "data_wait_fraction": 0.28, "cpu_percent_mean": 82.0}
    study.add_trial(optuna.trial.create_trial(value=1648.3, user_attrs=attrs))
    for value in rivals:
        more = dataclasses.replace(best, num_workers=2)
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=settings_attrs(more)))
    record_remeasured(study, {0: 1697.6}, best=0)
    return study


def test_advice_to_raise_num_workers_reads_the_studys_slower_trials_with_more() -> None:
    """That study's 2-worker trials 9 and 5 (1,580.5 and 1,546.6; here trials 1 and 2) were
    slower: the summary does not send the user to them."""
    out = io.StringIO()
    print_summary(_study_of_an_input_bound_best([1580.5, 1546.6]), "batch_size", out)
    text = out.getvalue()
    assert "raise num_workers" not in text
    assert "input-bound: the loop waits for data 28% of the time while the CPUs are 82%" in text
    assert "more workers were slower here (trial 1, num_workers 2, the fastest of them: 93%" in text
    assert "keep num_workers 1" in text


def test_advice_to_raise_num_workers_stands_where_more_were_faster() -> None:
    """Its trial 10 (2 workers, re-measured 1,757.7) was faster: raising num_workers stands."""
    study = _study_of_an_input_bound_best([1757.7])
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    assert "raise num_workers (now 1)" in out.getvalue()


def test_the_answer_comes_first_and_the_diagnostics_only_when_verbose() -> None:
    study = _study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=0)
    study.set_user_attr(CEILING_ATTR, 9000.0)
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    text = out.getvalue()
    order = ["best: trial 0", "DataLoader(", "trial  samples/s"]
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    assert "of the ceiling" not in text and "predicted" not in text
    verbose = io.StringIO()
    print_summary(study, "batch_size", verbose, verbose=True)
    assert "26% of the ceiling (9,000 samples/s)" in verbose.getvalue()
    assert "predicted" in verbose.getvalue()


def _study_with_a_hold_out() -> optuna.Study:
    """Trial 0 picked at a selection median of 2,400 (its lucky draw); the hold-out after the
    pick read it at 2,210-2,290 and the pytorch-default baseline (trial 3) at 1,100-1,150."""
    study = _study_with_medians({0: 2400.0, 1: 2300.0}, best=0)
    baseline = LoaderSettings(batch=64, num_workers=0)
    attrs = {**settings_attrs(baseline), "baseline": "pytorch-default"}
    study.add_trial(optuna.trial.create_trial(value=1200.0, user_attrs=attrs))
    held = {0: [2290.0, 2210.0, 2250.0], 3: [1100.0, 1150.0, 1125.0]}
    record_remeasured(study, {0: 2400.0, 1: 2300.0, 3: 1125.0}, best=0, held_out=held)
    return study


def test_the_figure_and_the_speedups_come_from_the_hold_out() -> None:
    study = _study_with_a_hold_out()
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    text = out.getvalue()
    assert "best: trial 0, 2,250 samples/s (median of 3 hold-out rounds, 2,210-2,290)" in text
    assert f"{2250 / 1125:.2f}x over pytorch-default" in text
    assert "2,400" in text  # the selection's median stays in the table's re-measured column


def test_the_phases_time_is_one_line() -> None:
    study = _study_with_a_hold_out()
    record_phases(study, {"set-up": 12.04, "trials": 80.4, "re-measuring": 20.0})
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    assert "time: set-up 12 s, trials 80 s, re-measuring 20 s\n" in out.getvalue()
    children = {"set-up": 2, "trials": 11, "re-measuring": 1}
    record_phases(study, {"set-up": 12.04, "trials": 80.4, "re-measuring": 20.0}, children)
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    line = "time: set-up 12 s (2 runs), trials 80 s (11 runs), re-measuring 20 s (1 run)"
    assert line in out.getvalue()


def test_a_study_without_a_hold_out_reads_as_before() -> None:
    out = io.StringIO()
    print_summary(_study_with_medians({0: 2365.2, 1: 2333.0, 2: 2229.8}, best=0), "batch", out)
    assert "best: trial 0, 2,365.2 samples/s\n" in out.getvalue()
    assert "hold-out" not in out.getvalue() and "time:" not in out.getvalue()


def test_the_summary_prints_the_kept_defaults_in_one_line() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    settings = LoaderSettings(batch=64, num_workers=2, prefetch_factor=2, persistent_workers=True)
    study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs=settings_attrs(settings)))
    record_remeasured(study, {0: 100.0}, 0)
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    assert "left at defaults" not in out.getvalue()  # a study that recorded none
    reasons = {
        "persistent_workers": "epochs take 40 s, 2 workers start in 20 ms",
        "pin_memory": "CPU",
    }
    record_loader_defaults_kept(study, reasons)
    line = (
        "left at defaults: persistent_workers (epochs take 40 s, 2 workers start in 20 ms), "
        "pin_memory (CPU)"
    )
    assert kept_defaults_line(study.user_attrs) == line
    out = io.StringIO()
    print_summary(study, "batch_size", out)
    assert line in out.getvalue().splitlines()
