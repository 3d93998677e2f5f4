"""Early stopping for throughput trials: stop a trial that is clearly slower than the best.

A trial reports its samples/sec so far every half second of its window. Throughput is a rate
that settles within a window, so a setting running at 70% of the best after half a second will
not end within the 5% that matters. Percentile pruners judge a trial against the typical
earlier trial instead; on a flat landscape, where most settings are within the noise of each
other, that stopped the eventual optimum on an unlucky half second and saved little trial
time.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["BelowBestPruner"]


class BelowBestPruner(optuna.pruners.BasePruner):
    """Prune when the latest report is below ``fraction`` of the best complete trial's value.

    Args:
        fraction: how far below the best a trial may run and go on.
        n_startup_trials: complete trials needed before anything is pruned.
        n_warmup_steps: reports to wait for; the first comes half a second into the window.
    """

    def __init__(
        self, fraction: float = 0.7, n_startup_trials: int = 2, n_warmup_steps: int = 1
    ) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if len(complete) < self.n_startup_trials:
            return False
        best = max(t.value for t in complete if t.value is not None)
        return trial.intermediate_values[step] < self.fraction * best
