"""Search efficiency: the tuner against an exhaustive grid, and what pruning and baselines say.

    python -m bench.search --workload image
    python -m bench.search --workload text --budgets 10,20 --seeds 2 --rounds 3

1. The grid: every setting of a reduced, reasonable space (``bench._harness.WORKLOADS``),
   each measured once, exactly as a trial measures it; its wall time is what an exhaustive
   search costs on this machine.
2. The tuner: ``run_study`` as the CLI runs it (default strategy ``tpe`` and plain ``random``),
   one SQLite file per strategy and seed so no study warm-starts another. The budgets are
   reached by resuming the same study (10, then +10, then +20 trials): a resumed study samples
   from the same history a straight run would have, and the wall time for budget B counts the
   trial phases up to B plus B's own final re-measurement (the earlier stages' re-measurements
   would not have happened in a straight run of B trials). The tuner's pick at each budget is
   what ``tuner.best`` would return then: the re-measured winner.
3. One side-by-side session (interleaved rounds, medians) re-measures the grid's top settings,
   every pick, both baselines and the pruned settings that came nearest, so "fraction of the
   grid's optimum" and "speedup over the baselines" use one yardstick.
4. Pruning: trial time saved by the pruner (each pruned trial against the median length of a
   completed trial) and whether a pruned setting re-measures above the tuner's pick.

Goal: at least 95% of the grid's optimum within 20 trials, in at most 15% of the grid's wall.
The results are also written as JSON under ``--out`` (default: a new temporary folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tqdm import tqdm

from bench._harness import (
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    WORKLOADS,
    BenchWorkload,
    Harness,
    TimedStudy,
    describe,
    machine_summary,
    markdown_table,
    median_or_none,
    output_dir,
    prepare_workload,
    print_machine,
    run_timed_study,
    settings_key,
    space_size,
    study_config,
    write_json,
)
from tuner._settings import LoaderSettings
from tuner._summary import best_trial

GOAL_FRACTION = 0.95
GOAL_WALL_FRACTION = 0.15
GOAL_BUDGET = 20


@dataclasses.dataclass
class GridPoint:
    settings: LoaderSettings
    samples_per_sec: float | None


@dataclasses.dataclass
class Pick:
    """The tuner's answer after one budget."""

    strategy: str
    seed: int
    budget: int
    wall_s: float
    settings: LoaderSettings
    trial_number: int
    found_after_s: float
    """Equivalent wall time at which the picked trial had completed."""

    @property
    def label(self) -> str:
        return f"{self.strategy} seed {self.seed} @{self.budget}"


@dataclasses.dataclass
class PrunedTrial:
    label: str
    settings: LoaderSettings
    best_intermediate: float
    duration_s: float


@dataclasses.dataclass
class PruningStats:
    chain: str
    trials: int
    pruned_by_pruner: int
    pruned_other: dict[str, int]
    median_complete_s: float | None
    trial_time_s: float
    saved_s: float
    pruned: list[PrunedTrial]

    @property
    def saved_share(self) -> float:
        total = self.trial_time_s + self.saved_s
        return self.saved_s / total if total else 0.0


def measure_grid(harness: Harness, grid: list[LoaderSettings]) -> tuple[list[GridPoint], float]:
    """Every grid setting once; returns the points and the grid's wall time."""
    points = []
    started = time.monotonic()
    for settings in tqdm(grid, desc="grid", file=sys.stderr, leave=False):
        points.append(GridPoint(settings, harness.measure(settings)))
    return points, time.monotonic() - started


def _duration_s(trial: FrozenTrial) -> float | None:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def run_chain(
    workload: BenchWorkload,
    folder: Path,
    strategy: str,
    seed: int,
    budgets: Sequence[int],
    window_s: float,
    warmup_s: float,
) -> tuple[list[Pick], optuna.Study]:
    """One study resumed up to each budget in turn; the pick and its equivalent wall per budget."""
    storage = f"sqlite:///{folder / f'{workload.name}-{strategy}-seed{seed}.db'}"
    picks: list[Pick] = []
    trial_phases_s = 0.0  # the earlier stages' wall time, without their re-measurement
    done = 0
    stage_of: dict[int, tuple[TimedStudy, float]] = {}
    study: optuna.Study | None = None
    for budget in budgets:
        config = study_config(
            workload,
            storage,
            window_s,
            warmup_s,
            study_name=f"{workload.name}-{strategy}-seed{seed}",
            n_trials=budget - done,
            seed=seed,
            sampler=strategy,
        )
        timed = run_timed_study(config)
        study = timed.result.study
        for trial in study.get_trials(deepcopy=False):
            stage_of.setdefault(trial.number, (timed, trial_phases_s))
        best = best_trial(study)
        if best is None:
            raise SystemExit(f"{strategy} seed {seed}: no trial completed by budget {budget}")
        stage, offset_s = stage_of[best.number]
        assert best.datetime_complete is not None
        found_after_s = offset_s + best.datetime_complete.timestamp() - stage.started_at
        picks.append(
            Pick(
                strategy,
                seed,
                budget,
                wall_s=trial_phases_s + timed.wall_s,
                settings=LoaderSettings.from_attrs(best.user_attrs["settings"]),
                trial_number=best.number,
                found_after_s=found_after_s,
            )
        )
        print(
            f"  {strategy} seed {seed} @{budget}: {timed.wall_s:.0f} s this stage"
            f" (probe {timed.probe_s:.0f} s, re-measure {timed.remeasure_s:.0f} s),"
            f" pick #{best.number} {describe(picks[-1].settings, workload_batch_param(workload))}",
            file=sys.stderr,
            flush=True,
        )
        trial_phases_s += timed.trials_s
        done = budget
    assert study is not None
    return picks, study


def workload_batch_param(workload: BenchWorkload) -> str:
    return "max_tokens" if workload.objective == "text" else "batch_size"


def pruning_stats(chain: str, study: optuna.Study) -> PruningStats:
    """What the pruner cut in one study and how much trial time that saved."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    complete = [
        d
        for t in trials
        if t.state == TrialState.COMPLETE and "baseline" not in t.user_attrs
        for d in [_duration_s(t)]
        if d is not None
    ]
    typical = statistics.median(complete) if complete else None
    pruned, other, saved = [], {}, 0.0
    for trial in trials:
        if trial.state != TrialState.PRUNED:
            continue
        reason = str(trial.user_attrs.get("pruned_reason"))
        if reason != "pruner":
            other[reason] = other.get(reason, 0) + 1
            continue
        duration = _duration_s(trial) or 0.0
        if typical is not None:
            saved += max(0.0, typical - duration)
        values = list(trial.intermediate_values.values())
        pruned.append(
            PrunedTrial(
                f"{chain} #{trial.number}",
                LoaderSettings.from_attrs(trial.user_attrs["settings"]),
                max(values) if values else 0.0,
                duration,
            )
        )
    total = sum(_duration_s(t) or 0.0 for t in trials)
    return PruningStats(chain, len(trials), len(pruned), other, typical, total, saved, pruned)


def _fraction(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    parser.add_argument("--budgets", default="10,20,40", help="trial budgets (default 10,20,40)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per strategy (default 2)")
    parser.add_argument("--strategies", default="tpe,random", help="default tpe,random")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="seconds (1.5)")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds (0.5)")
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds (default 3)")
    parser.add_argument("--grid-top", type=int, default=3, help="grid settings re-measured (3)")
    parser.add_argument(
        "--pruned-check", type=int, default=2, help="nearest pruned settings re-measured (2)"
    )
    parser.add_argument("--out", help="folder for the studies and results JSON")
    args = parser.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not budgets or budgets[0] < 1 or args.seeds < 1 or args.rounds < 1:
        parser.error("budgets, seeds and rounds must be positive")
    for strategy in strategies:
        if strategy not in ("tpe", "random"):
            parser.error(f"--strategies: {strategy!r} is not tpe or random")

    workload = WORKLOADS[args.workload]
    batch_param = workload_batch_param(workload)
    folder = output_dir(args.out, f"search-{workload.name}")
    machine = machine_summary()
    print_machine(machine)
    print(f"output in {folder}")
    prepared = prepare_workload(
        workload, f"sqlite:///{folder / 'prepare.db'}", args.window, args.warmup
    )
    harness = Harness(prepared)
    grid = workload.grid(prepared.space)
    print(
        f"workload {workload.name} {dict(workload.options)}: grid of {len(grid)} settings"
        f" (the tuner's space holds {space_size(prepared.space):,}); windows {args.window:g} s"
        f" after {args.warmup:g} s warm-up",
        flush=True,
    )
    harness.measure(grid[0])  # forkserver start and data caches: not part of the grid's time
    points, grid_wall_s = measure_grid(harness, grid)
    measured = [p for p in points if p.samples_per_sec is not None]
    measured.sort(key=lambda p: p.samples_per_sec or 0.0, reverse=True)
    print(f"grid: {grid_wall_s:.0f} s for {len(grid)} settings", flush=True)

    picks: list[Pick] = []
    pruning: list[PruningStats] = []
    for strategy in strategies:
        for seed in range(args.seeds):
            chain_picks, study = run_chain(
                workload, folder, strategy, seed, budgets, args.window, args.warmup
            )
            picks += chain_picks
            pruning.append(pruning_stats(f"{strategy} seed {seed}", study))

    # One pool, each distinct setting measured once per round under every label it carries.
    pool: dict[str, tuple[LoaderSettings, list[str]]] = {}

    def add(label: str, settings: LoaderSettings) -> None:
        pool.setdefault(settings_key(settings), (settings, []))[1].append(label)

    grid_labels = [f"grid #{rank}" for rank in range(1, min(args.grid_top, len(measured)) + 1)]
    for label, point in zip(grid_labels, measured, strict=False):
        add(label, point.settings)
    for pick in picks:
        add(pick.label, pick.settings)
    for name, settings in harness.baselines().items():
        add(name, settings)
    nearest = sorted(
        (p for stats in pruning for p in stats.pruned),
        key=lambda p: p.best_intermediate,
        reverse=True,
    )[: args.pruned_check]
    for pruned in nearest:
        add(f"pruned {pruned.label}", pruned.settings)
    entries = list(pool.values())
    values = harness.side_by_side([s for s, _ in entries], args.rounds)
    median_of: dict[str, float | None] = {}
    for (_, labels), runs in zip(entries, values, strict=True):
        for label in labels:
            median_of[label] = median_or_none(runs)
    grid_optimum = max((median_of[label] or 0.0 for label in grid_labels), default=0.0) or None
    optimum_label = max(grid_labels, key=lambda label: median_of[label] or 0.0)

    print(f"\n## {workload.name}: grid\n")
    rows = []
    for label, point in zip(grid_labels, measured, strict=False):
        rows.append(
            [
                label,
                describe(point.settings, batch_param),
                _fmt(point.samples_per_sec),
                _fmt(median_of[label]),
            ]
        )
    print(
        f"{len(grid)} settings in {grid_wall_s:.0f} s ({grid_wall_s / len(grid):.1f} s each);"
        f" {len(grid) - len(measured)} did not complete. Optimum (re-measured): {optimum_label},"
        f" {_fmt(grid_optimum)} samples/s\n"
    )
    print(markdown_table(["grid rank", "setting", "grid window", "re-measured median"], rows))

    print(f"\n## {workload.name}: tuner picks ({args.rounds} interleaved rounds)\n")
    rows = []
    for pick in picks:
        rows.append(
            [
                pick.strategy,
                pick.seed,
                pick.budget,
                f"{pick.wall_s:.0f}",
                f"{pick.wall_s / grid_wall_s:.0%}",
                f"{pick.found_after_s:.0f}",
                describe(pick.settings, batch_param),
                _fmt(median_of[pick.label]),
                _fmt(_fraction(median_of[pick.label], grid_optimum), ".1%"),
            ]
        )
    headers = [
        "strategy",
        "seed",
        "trials",
        "wall s",
        "wall / grid",
        "pick found at s",
        "pick",
        "median samples/s",
        "of grid optimum",
    ]
    print(markdown_table(headers, rows))

    print(f"\n## {workload.name}: by strategy and budget\n")
    rows = []
    for strategy in strategies:
        for budget in budgets:
            group = [p for p in picks if p.strategy == strategy and p.budget == budget]
            fractions = [_fraction(median_of[p.label], grid_optimum) or 0.0 for p in group]
            walls = [p.wall_s / grid_wall_s for p in group]
            reached = sum(f >= GOAL_FRACTION for f in fractions)
            rows.append(
                [
                    strategy,
                    budget,
                    f"{statistics.median(fractions):.1%}",
                    f"{min(fractions):.1%}",
                    f"{reached}/{len(group)}",
                    f"{statistics.median(walls):.0%}",
                ]
            )
    headers = [
        "strategy",
        "trials",
        "median of optimum",
        "worst of optimum",
        f"runs ≥ {GOAL_FRACTION:.0%}",
        "median wall / grid",
    ]
    print(markdown_table(headers, rows))
    goal_picks = [p for p in picks if p.strategy == "tpe" and p.budget == GOAL_BUDGET]
    if goal_picks:
        quality = all(
            (_fraction(median_of[p.label], grid_optimum) or 0.0) >= GOAL_FRACTION
            for p in goal_picks
        )
        wall = all(p.wall_s / grid_wall_s <= GOAL_WALL_FRACTION for p in goal_picks)
        print(
            f"\ngoal (tpe, {GOAL_BUDGET} trials: ≥ {GOAL_FRACTION:.0%} of the optimum in every"
            f" run, ≤ {GOAL_WALL_FRACTION:.0%} of the grid's wall):"
            f" quality {'met' if quality else 'not met'}, wall {'met' if wall else 'not met'}"
        )

    print(f"\n## {workload.name}: against the baselines\n")
    rows = []
    baseline_names = list(harness.baselines())
    for label in [optimum_label, *[p.label for p in goal_picks]]:
        row = [label, _fmt(median_of[label])]
        for name in baseline_names:
            row.append(_fmt(_fraction(median_of[label], median_of[name]), ".2f") + "x")
        rows.append(row)
    for name in baseline_names:
        rows.append([name, _fmt(median_of[name]), *["" for _ in baseline_names]])
    print(markdown_table(["setting", "median samples/s", *baseline_names], rows))

    print(f"\n## {workload.name}: pruning\n")
    rows = []
    for stats in pruning:
        others = ", ".join(f"{n} {reason}" for reason, n in stats.pruned_other.items()) or "-"
        rows.append(
            [
                stats.chain,
                stats.trials,
                stats.pruned_by_pruner,
                others,
                _fmt(stats.median_complete_s),
                f"{stats.saved_s:.0f}",
                f"{stats.saved_share:.1%}",
            ]
        )
    headers = [
        "study",
        "trials",
        "pruned by pruner",
        "other prunes",
        "median complete trial s",
        "saved s",
        "share of trial time saved",
    ]
    print(markdown_table(headers, rows))
    best_pick = max(
        (median_of[p.label] or 0.0 for p in picks if p.budget == budgets[-1]), default=0.0
    )
    for pruned in nearest:
        again = median_of[f"pruned {pruned.label}"]
        print(
            f"nearest pruned: {pruned.label} {describe(pruned.settings, batch_param)}, best partial"
            f" {pruned.best_intermediate:,.1f}, re-measured {_fmt(again)} samples/s"
            f" ({_fmt(_fraction(again, best_pick), '.1%')} of the best final pick)"
        )
    cut = [
        p.label
        for stats in pruning
        for p in stats.pruned
        if settings_key(p.settings) == settings_key(measured[0].settings)
    ]
    print(f"pruned trials with the grid's single-window best setting: {', '.join(cut) or 'none'}")

    write_json(
        folder / f"search-{workload.name}.json",
        {
            "machine": machine,
            "workload": {"name": workload.name, "options": dict(workload.options)},
            "window_s": args.window,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "grid": {
                "wall_s": grid_wall_s,
                "points": [
                    {"settings": p.settings.to_attrs(), "samples_per_sec": p.samples_per_sec}
                    for p in points
                ],
                "optimum_label": optimum_label,
                "optimum_settings": pool_settings(pool, optimum_label),
                "optimum_samples_per_sec": grid_optimum,
            },
            "picks": [
                {
                    "label": p.label,
                    "strategy": p.strategy,
                    "seed": p.seed,
                    "budget": p.budget,
                    "wall_s": p.wall_s,
                    "found_after_s": p.found_after_s,
                    "trial_number": p.trial_number,
                    "settings": p.settings.to_attrs(),
                    "median_samples_per_sec": median_of[p.label],
                }
                for p in picks
            ],
            "medians": median_of,
            "side_by_side": [
                {"labels": labels, "settings": s.to_attrs(), "samples_per_sec": runs}
                for (s, labels), runs in zip(entries, values, strict=True)
            ],
            "pruning": [
                {
                    **{k: v for k, v in dataclasses.asdict(stats).items() if k != "pruned"},
                    "saved_share": stats.saved_share,
                    "pruned": [
                        {
                            "label": p.label,
                            "settings": p.settings.to_attrs(),
                            "best_intermediate": p.best_intermediate,
                            "duration_s": p.duration_s,
                        }
                        for p in stats.pruned
                    ],
                }
                for stats in pruning
            ],
        },
    )
    print(f"\nresults: {folder / f'search-{workload.name}.json'}")
    return 0


def pool_settings(
    pool: dict[str, tuple[LoaderSettings, list[str]]], label: str
) -> dict[str, Any] | None:
    for settings, labels in pool.values():
        if label in labels:
            return settings.to_attrs()
    return None


if __name__ == "__main__":
    raise SystemExit(main())
