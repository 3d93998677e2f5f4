"""The figure printed for a trial: the hold-out's median where the study took one, with its
spread; else the re-measured median; else the trial's own window.

The pick's re-measured median is the highest of several noisy medians, the one that made it win,
so it runs above what a training loop gets; the hold-out's rounds came after the pick and did
not choose it (``tuner.run._remeasure``). Studies without a hold-out (recorded before it, or run
with ``--remeasure-rounds 0``) read as before.
"""

from __future__ import annotations

import dataclasses
import statistics

import optuna
from optuna.trial import FrozenTrial

from tuner._attrs import holdout, remeasured

__all__ = ["Figure", "trial_figure"]


@dataclasses.dataclass(frozen=True)
class Figure:
    """A trial's samples/sec and where it comes from.

    ``source`` is ``hold-out`` (``rounds`` holds the hold-out's rounds), ``re-measured`` (the
    median of the fresh rounds that selected it) or ``window`` (the trial's own window).
    """

    samples_per_sec: float
    source: str
    rounds: tuple[float, ...] = ()

    @property
    def how(self) -> str:
        """Where the figure comes from, as the summary prints it in parentheses."""
        if self.source == "hold-out":
            low, high = min(self.rounds), max(self.rounds)
            count = len(self.rounds)
            return f"median of {count} hold-out round{'s' * (count != 1)}, {low:,.0f}-{high:,.0f}"
        return "re-measured median" if self.source == "re-measured" else "its own window"

    def text(self) -> str:
        """``1,234 samples/s (median of 3 hold-out rounds, 1,180-1,290)`` after a hold-out;
        ``1,234.5 samples/s`` otherwise, as studies without one always read."""
        if self.source == "hold-out":
            return f"{self.samples_per_sec:,.0f} samples/s ({self.how})"
        return f"{self.samples_per_sec:,.1f} samples/s"


def trial_figure(study: optuna.Study, trial: FrozenTrial) -> Figure:
    """``trial``'s figure in ``study`` (see the module docstring)."""
    rounds = holdout(study).get(trial.number)
    if rounds:
        return Figure(float(statistics.median(rounds)), "hold-out", tuple(rounds))
    medians = remeasured(study)
    if trial.number in medians:
        return Figure(medians[trial.number], "re-measured")
    return Figure(float(trial.value or 0.0), "window")
