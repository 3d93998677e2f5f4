"""Strategies replayed on a measured grid: how often each finds the top within a budget.

    python -m bench.replay --from-search $D/search-image/search-image.json --seeds 40

A real search run (``bench.search``) costs minutes per study, so it can afford 2 seeds; this
replays 40 or more in seconds on the landscape that run measured. Each grid point's window is
taken as the truth; a trial "measures" it with multiplicative Gaussian noise (``--noise``, 10%
by default: about the machine floor ``bench.repeatability`` reports for a 1.5 s window here).
The study runs as the tuner's does where it matters for the pick: the two baselines first, the
strategy's sampler (``tuner.run.make_sampler``), its pruner (``make_pruner``: for ``tpe`` it
is shown a noisier reading, as half a second into the window), a repeated setting answered with
its twin's outcome, then the tuner's final re-measurement
(``tuner.run._remeasure.pick_and_hold_out``) in fresh noisy rounds: the top candidates and
baselines (``final_candidates``), the selection among them (the tuner's fresh rounds and race,
or ``--selection-rounds`` and ``--race-rounds``), then the hold-out of the pick and the
baselines. The score is the pick's true value over the grid's best; "selection reads" and
"hold-out reads" count the final re-measurement's rounds per study (a trial window each in the
tuner), and "figure" is the pick's hold-out median over its true value (the printed figure's
error: above 100% is the winner's curse).

``model`` (``--sampler model``), so a change to it is judged over 40 seeds in seconds rather
than 2 in half an hour, runs the tuner's own steps on the profile the search run stored
(``results["model"]``): the predicted best after the baselines (``_pipeline.enqueue_model_seed``),
the model's next setting before each trial (``_pipeline.enqueue_next_setting``; ``gp`` asks
when it has none), the stop near the bound or on a held best after it
(``tuner.run._study._stop_near_bound``, its candidate re-measured in noisy rounds). A stopped
study keeps its pick for the larger budgets; the table gives the trials run. Its workers are
the tuner's range (``worker_range``, without a host limit) capped at the grid's top
(``--model-range grid``: the grid's); the range never grows (``_grown`` needs each trial's
diagnosis, which a grid does not hold).

A setting off the grid (a model proposal on its worker ladder, a sampled worker count between
the grid's, a baseline at a thread count the grid lacks) is valued as the grid point nearest it
by the model's distance (``tuner.pipeline._refine._distance``); the trials and picks that were
are counted and printed.

What it leaves out, so read its numbers as a comparison between strategies, not as the
tuner's quality: the space is the grid's (its worker, batch, prefetch, thread and knob values;
persistent workers only where the grid has them), smaller than the tuner's; no early stop
near the ceiling (the profiled step alone runs over twice the grids' best: it would not fire);
noise independent between measurements, where the machine's drifts in levels.

``--strategies`` takes what ``--sampler`` takes (``tuner.run.SAMPLERS``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import optuna
import torch.utils.data
from tqdm import tqdm

from bench._harness import describe, markdown_table, settings_key
from objectives import Workload
from tuner._attrs import has_settings, trial_settings
from tuner.pipeline import PipelineModel, PipelineProfile, worker_range
from tuner.pipeline._refine import _distance
from tuner.run import SAMPLERS, StudyConfig, TrialRunner, _pipeline, make_pruner, make_sampler
from tuner.run._remeasure import (
    RACE_ROUNDS,
    SELECTION_ROUNDS,
    final_candidates,
    pick_and_hold_out,
)
from tuner.run._samplers import MODEL_STRATEGY
from tuner.run._study import _stop_near_bound
from tuner.search import BelowBestPruner, LoaderSettings, SearchSpace, optuna_params
from tuner.trial import TrialOutcome

GOAL_FRACTION = 0.95
PRUNING: dict[str, Callable[[str], optuna.pruners.BasePruner]] = {
    "strategy": make_pruner,
    "off": lambda strategy: optuna.pruners.NopPruner(),
    "on": lambda strategy: BelowBestPruner(),
}
MODEL_RANGES = ("tuner", "grid")
REPLAY_STORAGE = "sqlite:///:memory:"
"""The storage URL the tuner's steps are given: its study lock is a no-op in memory."""


class Landscape:
    """A grid's measured values, and the space of the values it covers."""

    def __init__(self, points: Sequence[tuple[LoaderSettings, float]], batch_param: str) -> None:
        self.values = {settings_key(settings): value for settings, value in points}
        self.batch_param = batch_param
        self.best = max(self.values.values())
        settings = [s for s, _ in points]
        self.points = settings
        with_workers = [s for s in settings if s.num_workers > 0]
        self.workers = sorted({s.num_workers for s in settings})
        self.batches = sorted({s.batch for s in settings})
        self.prefetch = sorted({s.prefetch_factor or 0 for s in with_workers})
        self.persistent = sorted({s.persistent_workers for s in with_workers})
        self.threads = sorted({s.torch_num_threads for s in settings})
        self.knobs = {name: sorted({s.knobs[name] for s in settings}) for name in settings[0].knobs}
        self.template = settings[0]
        self.context = next((s.multiprocessing_context for s in with_workers), None)

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
            multiprocessing_context=self.context if workers else None,
        )

    def params_for(self, settings: LoaderSettings) -> dict[str, Any]:
        """The params :meth:`suggest` would record for ``settings`` (to enqueue the baselines)."""
        unsampled = () if len(self.persistent) > 1 else ("persistent_workers",)
        return optuna_params(settings, self.batch_param, cuda=False, fixed=unsampled)

    def on_grid(self, settings: LoaderSettings) -> bool:
        return settings_key(settings) in self.values

    def nearest(self, settings: LoaderSettings) -> LoaderSettings:
        """``settings`` where it is a grid point, else the grid point nearest it by the model's
        distance (``_refine._distance``); ties go to the same prefetch and persistence, then
        to the cheaper setting."""
        if self.on_grid(settings):
            return settings
        return min(
            self.points,
            key=lambda point: (
                _distance(settings, point),
                point.prefetch_factor != settings.prefetch_factor,
                point.persistent_workers != settings.persistent_workers,
                point.memory_footprint(),
            ),
        )

    def true_value(self, settings: LoaderSettings) -> float:
        """The grid's value of ``settings``, or of the nearest grid point (:meth:`nearest`)."""
        return self.values[settings_key(self.nearest(settings))]


class _NoSamples(torch.utils.data.Dataset[Any]):
    """The replay's workload has no data: its space needs only its batches and knobs."""

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)

    def __len__(self) -> int:
        return 0


def _unused_batch_sampler(dataset: Any, value: int, seed: int) -> torch.utils.data.Sampler[Any]:
    raise NotImplementedError("the replay loads no data")


def _unused_configure(**knobs: Any) -> Workload:
    raise NotImplementedError("the replay loads no data")


def grid_space(
    landscape: Landscape, max_workers: int, base_knobs: Mapping[str, Any] | None = None
) -> SearchSpace:
    """A ``SearchSpace`` of the grid's values as far as it can hold them: the batch range and
    thread count, the knobs (``base_knobs``, the baselines', first), workers ``0..max_workers``.
    """
    base = base_knobs or {}
    knobs = {
        name: sorted(values, key=lambda value, name=name: value != base.get(name, values[0]))
        for name, values in landscape.knobs.items()
    }
    token_budget = landscape.batch_param != "batch_size"
    workload = Workload(
        name="replay",
        dataset=_NoSamples(),
        batch_size_range=(landscape.batches[0], landscape.batches[-1]),
        batch_sampler=_unused_batch_sampler if token_budget else None,
        batch_param=landscape.batch_param,
        knobs=knobs,
        configure=_unused_configure if knobs else None,
    )
    return SearchSpace(
        workload=workload,
        max_workers=max_workers,
        max_threads=landscape.threads[-1],
        cuda=False,
        multiprocessing_context=landscape.context,
    )


@dataclasses.dataclass(frozen=True)
class ModelSetup:
    """The model strategy's space and model on one grid."""

    space: SearchSpace
    model: PipelineModel


def model_setup(
    landscape: Landscape,
    profile: PipelineProfile,
    baselines: Mapping[str, LoaderSettings],
    bound: float | None = None,
    workers: str = "tuner",
) -> ModelSetup:
    """The space the tuner would give the model on this grid and the model over it.

    ``workers``: ``tuner``, the tuner's range (:func:`tuner.pipeline.worker_range`, no host
    limit) capped at the grid's top, or ``grid``, the grid's. ``bound``: the stored one (the
    search run's host limit), else the model's without a limit.
    """
    base = next(iter(baselines.values())).knobs if baselines else None
    top = landscape.workers[-1]
    space = grid_space(landscape, top, base)
    if workers == "tuner":
        space = dataclasses.replace(space, max_workers=min(top, worker_range(profile, space, None)))
    model = PipelineModel.build(profile, space, None)
    if bound is not None:
        model = dataclasses.replace(model, bound=bound)
    return ModelSetup(space, model)


class _Readings:
    """One study's noisy measurements of the landscape: a trial's window, a re-measurement."""

    def __init__(self, landscape: Landscape, noise: float, seed: int) -> None:
        self.landscape = landscape
        self.noise = noise
        self.rng = random.Random(seed)

    def __call__(self, settings: LoaderSettings, window_share: float = 1.0) -> float:
        spread = self.noise / window_share**0.5  # a shorter window reads noisier
        value = self.landscape.true_value(settings)
        return value * max(0.05, 1.0 + self.rng.gauss(0.0, spread))


@dataclasses.dataclass
class _GridRunner:
    """What the tuner's stop step needs of a ``TrialRunner``: the space, the model, and a
    measurement (a noisy reading of the grid)."""

    space: SearchSpace
    model: PipelineModel
    read: _Readings
    rounds: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    """The re-measured rounds this study took (``TrialRunner.rounds``)."""

    def measure(
        self, settings: LoaderSettings, expected_peak_bytes: int | None = None
    ) -> TrialOutcome:
        """A re-measurement, read off the grid (``expected_peak_bytes``: the guard's, unused)."""
        return TrialOutcome("complete", {"samples_per_sec": self.read(settings)})


@dataclasses.dataclass
class StudyReplay:
    """One replayed study: per budget the pick's score and the trials run by then."""

    scores: dict[int, float]
    trials: dict[int, int]
    snapped_trials: int = 0
    """Trials whose setting is not a grid point (measured as the nearest one)."""
    snapped_picks: int = 0
    """Budgets whose pick is not a grid point."""
    selection_reads: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per budget, the final selection's measurements."""
    holdout_reads: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per budget, the hold-out's measurements (the pick's and the baselines')."""
    figures: dict[int, float] = dataclasses.field(default_factory=dict)
    """Per budget, the pick's hold-out median over its true value."""


@dataclasses.dataclass(frozen=True)
class _FinalPick:
    """The final re-measurement of one replayed study: the pick and what it cost."""

    settings: LoaderSettings
    figure: float
    selection_reads: int
    holdout_reads: int


def _final_pick(
    study: optuna.Study,
    read: _Readings,
    config: StudyConfig,
    taken: Mapping[int, list[float]],
    selection: tuple[int, int],
) -> _FinalPick:
    """The tuner's final re-measurement (``pick_and_hold_out``) on noisy readings; ``taken``:
    the rounds the study's early-stop checks took, filled up as the tuner's runner does (copied:
    each budget ends its own run)."""
    candidates = final_candidates(study, config.remeasure_top)
    by_number = {trial.number: trial for trial in candidates}
    reads = 0

    def measure(number: int) -> float:
        nonlocal reads
        reads += 1
        return read(trial_settings(by_number[number]))

    rounds = {number: list(values) for number, values in taken.items()}
    outcome = pick_and_hold_out(candidates, measure, config.remeasure_rounds, rounds, *selection)
    assert outcome is not None  # a noisy reading never fails
    pick = trial_settings(by_number[outcome.pick])
    held = outcome.held[outcome.pick]
    holdout_reads = sum(len(values) for values in outcome.held.values())
    return _FinalPick(
        pick,
        statistics.median(held) / read.landscape.true_value(pick),
        reads - holdout_reads,
        holdout_reads,
    )


def replay_study(
    landscape: Landscape,
    baselines: Mapping[str, LoaderSettings],
    strategy: str,
    seed: int,
    budgets: Sequence[int],
    noise: float,
    pruning: str = "strategy",
    setup: ModelSetup | None = None,
    selection: tuple[int, int] = (SELECTION_ROUNDS, RACE_ROUNDS),
) -> StudyReplay:
    """One study to the largest budget (or, under ``model``, its stop); see the module docstring.

    ``pruning``: ``strategy`` (the strategy's own pruner, as the tuner runs it), ``off``, ``on``.
    ``setup``: the model's space and model, required by ``model``. ``selection``: the final
    selection's fresh rounds and race rounds (default the tuner's).
    """
    if strategy == MODEL_STRATEGY and setup is None:
        raise ValueError("the model strategy needs the model's setup (a profiled grid)")
    read = _Readings(landscape, noise, seed)
    study = optuna.create_study(
        direction="maximize",
        sampler=make_sampler(strategy, seed),
        pruner=PRUNING[pruning](strategy),
    )
    for name, settings in baselines.items():
        study.enqueue_trial(
            landscape.params_for(landscape.nearest(settings)),  # what the samplers can hold
            user_attrs={"settings": settings.to_attrs(), "baseline": name},
        )
    config = StudyConfig(hardware="replay", storage=REPLAY_STORAGE, sampler=strategy)
    modelled = setup if strategy == MODEL_STRATEGY else None
    if modelled is not None:
        _pipeline.enqueue_model_seed(study, modelled.space, modelled.model)
        runner = cast(TrialRunner, _GridRunner(modelled.space, modelled.model, read))
    measured: dict[str, tuple[int, float | None]] = {}  # first trial, value (None: pruned)
    result = StudyReplay({}, {})

    def objective(trial: optuna.Trial) -> float:
        sampled = landscape.suggest(trial)
        # Queued trials (baselines, the model's) carry their exact setting, as the tuner's do.
        settings = trial_settings(trial) if has_settings(trial) else sampled
        trial.set_user_attr("settings", settings.to_attrs())
        result.snapped_trials += not landscape.on_grid(settings)
        key = settings_key(settings)
        if key in measured:  # a repeat is answered from the study, and marked, as the tuner does
            trial.set_user_attr("repeat_of", measured[key][0])
        else:
            # The pruner's look half a second into a 1.5 s window, then the whole window.
            trial.report(read(settings, window_share=1 / 3), step=1)
            measured[key] = (trial.number, None if trial.should_prune() else read(settings))
        value = measured[key][1]
        if value is None:
            raise optuna.TrialPruned()
        return value

    done, stopped, final = 0, False, None
    for budget in sorted(budgets):
        start = done
        if modelled is None:
            study.optimize(objective, n_trials=budget - done)
            done = budget
        while modelled is not None and not stopped and done < budget:
            # The tuner's loop (``_run_trials``): propose, run one trial, stop near the bound.
            _pipeline.enqueue_next_setting(study, REPLAY_STORAGE, modelled.space, modelled.model)
            study.optimize(objective, n_trials=1)
            done += 1
            stopped = _stop_near_bound(study, runner, config) is not None
        if done > start or final is None:  # a stopped study keeps its pick
            taken = runner.rounds if modelled is not None else {}
            final = _final_pick(study, read, config, taken, selection)
        result.scores[budget] = landscape.true_value(final.settings) / landscape.best
        result.trials[budget] = done
        result.selection_reads[budget] = final.selection_reads
        result.holdout_reads[budget] = final.holdout_reads
        result.figures[budget] = final.figure
        result.snapped_picks += not landscape.on_grid(final.settings)
    return result


def load(path: Path) -> tuple[Landscape, dict[str, LoaderSettings], str]:
    """The landscape and baselines of a ``bench.search`` results file (a baseline off the grid
    is valued as its nearest point, as any setting off it is)."""
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
        for name in sorted(set(entry["labels"]) & set(results["baselines"])):
            baselines[name] = LoaderSettings.from_attrs(entry["settings"])
    return landscape, baselines, results["workload"]["name"]


def load_profile(path: Path) -> tuple[PipelineProfile, float | None] | None:
    """The pipeline profile and bound a ``bench.search`` results file stored (``model``), or
    None where its studies had no profile."""
    model = json.loads(path.read_text()).get("model")
    if not model:
        return None
    return PipelineProfile.from_attrs(model["profile"]), model.get("bound")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--from-search", required=True, metavar="JSON", help="bench.search results")
    parser.add_argument(
        "--strategies",
        help=f"of {','.join(SAMPLERS)} (default: all the file allows; {MODEL_STRATEGY} needs "
        "a profile)",
    )
    parser.add_argument("--budgets", default="10,20,40", help="trial budgets (default 10,20,40)")
    parser.add_argument("--seeds", type=int, default=40, help="studies per strategy (default 40)")
    parser.add_argument("--noise", type=float, default=0.10, help="relative noise (default 0.10)")
    parser.add_argument(
        "--pruning",
        choices=sorted(PRUNING),
        default="strategy",
        help="each strategy's own pruner as the tuner runs it (default), or off or on for all",
    )
    parser.add_argument(
        "--selection-rounds",
        type=int,
        default=SELECTION_ROUNDS,
        help="the final selection's fresh rounds of each contender (default: the tuner's)",
    )
    parser.add_argument(
        "--race-rounds",
        type=int,
        default=RACE_ROUNDS,
        help="the race's extra rounds after them (default: the tuner's)",
    )
    parser.add_argument(
        "--model-range",
        choices=MODEL_RANGES,
        default="tuner",
        help="the model's workers: the tuner's range capped at the grid's (default), or the grid's",
    )
    args = parser.parse_args(argv)
    path = Path(args.from_search)
    if not path.is_file():
        print(f"bench.replay: no such file: {path}", file=sys.stderr)
        return 2
    profiled = load_profile(path)
    if args.strategies is None:
        strategies = [s for s in SAMPLERS if s != MODEL_STRATEGY or profiled is not None]
    else:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = sorted(set(strategies) - set(SAMPLERS))
    if unknown:
        print(f"bench.replay: unknown strategy {', '.join(unknown)}", file=sys.stderr)
        return 2
    if MODEL_STRATEGY in strategies and profiled is None:
        print(f"bench.replay: no pipeline profile in {path} (model)", file=sys.stderr)
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
    setup = None
    if MODEL_STRATEGY in strategies and profiled is not None:
        profile, bound = profiled
        setup = model_setup(landscape, profile, baselines, bound, args.model_range)
        print(
            f"{MODEL_STRATEGY}: workers 0..{setup.space.max_workers} ({args.model_range} range;"
            f" grid 0..{landscape.workers[-1]}), bound {setup.model.bound:,.1f} samples/s,"
            f" predicted best {describe(setup.model.best, landscape.batch_param)}"
        )
    rows, notes = [], []
    for strategy in strategies:
        scores: dict[int, list[float]] = {budget: [] for budget in budgets}
        trials: dict[int, list[int]] = {budget: [] for budget in budgets}
        reads: dict[str, dict[int, list[float]]] = {
            name: {budget: [] for budget in budgets} for name in ("selection", "holdout", "figure")
        }
        snapped_trials = snapped_picks = 0
        for seed in tqdm(range(args.seeds), desc=strategy, file=sys.stderr, leave=False):
            study = replay_study(
                landscape,
                baselines,
                strategy,
                seed,
                budgets,
                args.noise,
                args.pruning,
                setup,
                (args.selection_rounds, args.race_rounds),
            )
            for budget in budgets:
                scores[budget].append(study.scores[budget])
                trials[budget].append(study.trials[budget])
                reads["selection"][budget].append(study.selection_reads[budget])
                reads["holdout"][budget].append(study.holdout_reads[budget])
                reads["figure"][budget].append(study.figures[budget])
            snapped_trials += study.snapped_trials
            snapped_picks += study.snapped_picks
        for budget in budgets:
            values = scores[budget]
            rows.append(
                [
                    strategy,
                    budget,
                    f"{statistics.mean(trials[budget]):.1f}",
                    f"{sum(v >= GOAL_FRACTION for v in values)}/{len(values)}",
                    f"{statistics.median(values):.1%}",
                    f"{statistics.quantiles(values, n=10)[0]:.1%}" if len(values) > 1 else "-",
                    f"{min(values):.1%}",
                    f"{statistics.mean(reads['selection'][budget]):.1f}",
                    f"{statistics.mean(reads['holdout'][budget]):.1f}",
                    f"{statistics.median(reads['figure'][budget]):.1%}",
                ]
            )
        if snapped_trials or snapped_picks:
            notes.append(
                f"{strategy}: {snapped_trials} of {sum(trials[budgets[-1]])} trials and"
                f" {snapped_picks} of {len(budgets) * args.seeds} picks were off the grid,"
                " valued as its nearest point"
            )
    print(
        markdown_table(
            [
                "strategy",
                "trials",
                "mean run",
                f"runs ≥ {GOAL_FRACTION:.0%}",
                "median",
                "10th pct",
                "worst",
                "selection reads",
                "hold-out reads",
                "figure",
            ],
            rows,
        )
    )
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
