"""Samplers replayed on a measured grid: how often each finds the top within a budget.

    python -m bench.replay --from-search $D/search-image/search-image.json --seeds 40

A real search run (``bench.search``) costs minutes per study, so it can afford 2 seeds; this
replays 40 or more in seconds on the landscape that run measured. Each grid point's window is
taken as the truth; a trial "measures" it with multiplicative Gaussian noise (``--noise``, 10%
by default: about the machine floor ``bench.repeatability`` reports for a 1.5 s window here).
The study runs as the tuner's does where it matters for the pick: the two baselines first, the
strategy's sampler (``tuner.run.make_sampler``), its pruner (``make_pruner``: for ``tpe`` it
is shown a noisier reading, as half a second into the window), a repeated setting answered with
its twin's outcome, then the top candidates (``tuner.run._remeasure.final_candidates``)
re-measured in fresh noisy rounds and picked by ``tuner.run._remeasure.pick_best``. The score
is the pick's true value over the grid's best.

What it leaves out, so read its numbers as a comparison between strategies, not as the
tuner's quality: the space is the grid's (its worker, batch, prefetch, thread and knob values;
persistent workers only where the grid has them), smaller than the tuner's; no early stop
near the ceiling; noise independent between measurements, where the machine's
drifts in levels.

``--strategies`` takes what ``--sampler`` takes (``tuner.run.SAMPLERS``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from tqdm import tqdm

from bench._harness import describe, markdown_table, settings_key
from tuner.run import SAMPLERS, StudyConfig, make_pruner, make_sampler
from tuner.run._remeasure import final_candidates, pick_best
from tuner.search._pruner import BelowBestPruner
from tuner.search._settings import LoaderSettings
from tuner.search._space import optuna_params

GOAL_FRACTION = 0.95
PRUNING: dict[str, Callable[[str], optuna.pruners.BasePruner]] = {
    "strategy": make_pruner,
    "off": lambda strategy: optuna.pruners.NopPruner(),
    "on": lambda strategy: BelowBestPruner(),
}


def _default(field: str) -> Any:
    return StudyConfig.__dataclass_fields__[field].default


class Landscape:
    """A grid's measured values, and the space of the values it covers."""

    def __init__(self, points: Sequence[tuple[LoaderSettings, float]], batch_param: str) -> None:
        self.values = {settings_key(settings): value for settings, value in points}
        self.batch_param = batch_param
        self.best = max(self.values.values())
        settings = [s for s, _ in points]
        with_workers = [s for s in settings if s.num_workers > 0]
        self.workers = sorted({s.num_workers for s in settings})
        self.batches = sorted({s.batch for s in settings})
        self.prefetch = sorted({s.prefetch_factor or 0 for s in with_workers})
        self.persistent = sorted({s.persistent_workers for s in with_workers})
        self.threads = sorted({s.torch_num_threads for s in settings})
        self.knobs = {name: sorted({s.knobs[name] for s in settings}) for name in settings[0].knobs}
        self.template = settings[0]

    def suggest(self, trial: optuna.Trial) -> LoaderSettings:
        """The tuner's distributions (``tuner.search.SearchSpace.suggest``) on the grid's values."""
        workers = trial.suggest_int("num_workers", self.workers[0], self.workers[-1])
        batch = trial.suggest_categorical(self.batch_param, self.batches)
        prefetch, persistent = None, False
        if workers > 0:
            low, high = self.prefetch[0], self.prefetch[-1]
            step = self.prefetch[1] - low if len(self.prefetch) > 1 else 1
            prefetch = trial.suggest_int("prefetch_factor", low, high, step=step)
            persistent = self.persistent[0]
            if len(self.persistent) > 1:
                persistent = trial.suggest_categorical("persistent_workers", self.persistent)
        threads = trial.suggest_int("torch_num_threads", self.threads[0], self.threads[-1])
        knobs = {name: trial.suggest_categorical(name, list(c)) for name, c in self.knobs.items()}
        return LoaderSettings(
            batch=batch,
            num_workers=workers,
            prefetch_factor=prefetch,
            persistent_workers=persistent,
            pin_memory=False,
            torch_num_threads=threads,
            knobs=knobs,
            accumulation_steps=self.template.accumulation_steps,
            multiprocessing_context=self.template.multiprocessing_context if workers else None,
        )

    def params_for(self, settings: LoaderSettings) -> dict[str, Any]:
        """The params :meth:`suggest` would record for ``settings`` (to enqueue the baselines)."""
        unsampled = () if len(self.persistent) > 1 else ("persistent_workers",)
        return optuna_params(settings, self.batch_param, cuda=False, fixed=unsampled)

    def true_value(self, settings: LoaderSettings) -> float:
        return self.values[settings_key(settings)]


def replay(
    landscape: Landscape,
    baselines: Mapping[str, LoaderSettings],
    strategy: str,
    seed: int,
    budgets: Sequence[int],
    noise: float,
    pruning: str = "strategy",
) -> dict[int, float]:
    """One study to the largest budget; the pick's true value over the best, per budget.

    ``pruning``: ``strategy`` (the strategy's own pruner, as the tuner runs it), ``off``, ``on``.
    """
    rng = random.Random(seed)

    def noisy(settings: LoaderSettings, window_share: float = 1.0) -> float:
        spread = noise / window_share**0.5  # a shorter window reads noisier
        return landscape.true_value(settings) * max(0.05, 1.0 + rng.gauss(0.0, spread))

    study = optuna.create_study(
        direction="maximize",
        sampler=make_sampler(strategy, seed),
        pruner=PRUNING[pruning](strategy),
    )
    for name, settings in baselines.items():
        study.enqueue_trial(
            landscape.params_for(settings),
            user_attrs={"settings": settings.to_attrs(), "baseline": name},
        )
    measured: dict[str, float | None] = {}  # None: the pruner stopped it

    def objective(trial: optuna.Trial) -> float:
        settings = landscape.suggest(trial)
        trial.set_user_attr("settings", settings.to_attrs())
        key = settings_key(settings)
        if key not in measured:  # a repeat is answered from the study, as the tuner does
            # The pruner's look half a second into a 1.5 s window, then the whole window.
            trial.report(noisy(settings, window_share=1 / 3), step=1)
            measured[key] = None if trial.should_prune() else noisy(settings)
        value = measured[key]
        if value is None:
            raise optuna.TrialPruned()
        return value

    scores: dict[int, float] = {}
    done = 0
    for budget in sorted(budgets):
        study.optimize(objective, n_trials=budget - done)
        done = budget
        candidates = final_candidates(study, _default("remeasure_top"))
        runs = {
            trial.number: [
                noisy(LoaderSettings.from_attrs(trial.user_attrs["settings"]))
                for _ in range(_default("remeasure_rounds"))
            ]
            for trial in candidates
        }
        picked = next(t for t in candidates if t.number == pick_best(runs))
        pick = LoaderSettings.from_attrs(picked.user_attrs["settings"])
        scores[budget] = landscape.true_value(pick) / landscape.best
    return scores


def load(path: Path) -> tuple[Landscape, dict[str, LoaderSettings], str]:
    """The landscape and baselines of a ``bench.search`` results file."""
    results = json.loads(path.read_text())
    batch_param = results["workload"]["batch_param"]
    points = [
        (LoaderSettings.from_attrs(p["settings"]), float(p["samples_per_sec"]))
        for p in results["grid"]["points"]
        if p["samples_per_sec"]
    ]
    landscape = Landscape(points, batch_param)
    baselines = {}
    for entry in results["side_by_side"]:
        for name in set(entry["labels"]) & set(results["baselines"]):
            settings = LoaderSettings.from_attrs(entry["settings"])
            if settings_key(settings) in landscape.values:
                baselines[name] = settings
    return landscape, baselines, results["workload"]["name"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--from-search", required=True, metavar="JSON", help="bench.search results")
    parser.add_argument("--strategies", default=",".join(SAMPLERS), help=f"of {','.join(SAMPLERS)}")
    parser.add_argument("--budgets", default="10,20,40", help="trial budgets (default 10,20,40)")
    parser.add_argument("--seeds", type=int, default=40, help="studies per strategy (default 40)")
    parser.add_argument("--noise", type=float, default=0.10, help="relative noise (default 0.10)")
    parser.add_argument(
        "--pruning",
        choices=sorted(PRUNING),
        default="strategy",
        help="each strategy's own pruner as the tuner runs it (default), or off or on for all",
    )
    args = parser.parse_args(argv)
    path = Path(args.from_search)
    if not path.is_file():
        print(f"bench.replay: no such file: {path}", file=sys.stderr)
        return 2
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = sorted(set(strategies) - set(SAMPLERS))
    if unknown:
        print(f"bench.replay: unknown strategy {', '.join(unknown)}", file=sys.stderr)
        return 2
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    landscape, baselines, name = load(path)
    top = sorted(landscape.values.values(), reverse=True)
    within = sum(value >= GOAL_FRACTION * landscape.best for value in top)
    print(
        f"{name}: {len(landscape.values)} grid settings, best {landscape.best:,.1f} samples/s;"
        f" {within} within {GOAL_FRACTION:.0%} of it; baselines"
        f" {', '.join(f'{n} {describe(s, landscape.batch_param)}' for n, s in baselines.items())};"
        f" noise {args.noise:.0%} per measurement, {args.seeds} seeds, pruning {args.pruning}"
    )
    rows = []
    for strategy in strategies:
        scores: dict[int, list[float]] = {budget: [] for budget in budgets}
        for seed in tqdm(range(args.seeds), desc=strategy, file=sys.stderr, leave=False):
            for budget, score in replay(
                landscape, baselines, strategy, seed, budgets, args.noise, args.pruning
            ).items():
                scores[budget].append(score)
        for budget in budgets:
            values = scores[budget]
            rows.append(
                [
                    strategy,
                    budget,
                    f"{sum(v >= GOAL_FRACTION for v in values)}/{len(values)}",
                    f"{statistics.median(values):.1%}",
                    f"{statistics.quantiles(values, n=10)[0]:.1%}" if len(values) > 1 else "-",
                    f"{min(values):.1%}",
                ]
            )
    print(
        markdown_table(
            ["strategy", "trials", f"runs ≥ {GOAL_FRACTION:.0%}", "median", "10th pct", "worst"],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
