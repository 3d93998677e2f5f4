"""Search efficiency: the tuner against an exhaustive grid, and what pruning and baselines say.

    python -m bench.search --workload image
    python -m bench.search --workload text --budgets 10,20 --seeds 2 --rounds 3

1. The grid: every setting of a reduced, reasonable space (``bench._harness.WORKLOADS``),
   each measured once, exactly as a trial measures it; its wall time is what an exhaustive
   search costs on this machine.
2. The tuner: ``run_study`` as the CLI runs it (each of ``--strategies``: the default ``model``,
   ``gp``, ``tpe`` and plain ``random``),
   one SQLite file per strategy and seed so no study warm-starts another. The budgets are
   reached by resuming the same study (10, then +10, then +20 trials): the wall time for budget B
   counts the trial phases up to B plus B's own setup share and final re-measurement (the earlier
   stages' re-measurements would not have happened in a straight run of B trials). The tuner's
   pick at each budget is what ``tuner.best`` would return then: the re-measured winner. A
   study that stops on its own (its best near the ceiling) keeps its pick for larger budgets.
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
import json
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
    DEFAULT_STRATEGY,
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
from tuner._attrs import trial_settings
from tuner.insight import best_trial
from tuner.pipeline import PipelineModel, stored_profile
from tuner.run import SAMPLERS
from tuner.search import LoaderSettings

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
GOAL_FRACTION = 0.95
GOAL_WALL_FRACTION = 0.15
GOAL_BUDGET = 20
PREDICTED_BEST_LABEL = "model's predicted best"


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
    trials: int
    """Trials the study had finished (fewer than ``budget`` when it stopped on its own)."""

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
) -> tuple[list[Pick], optuna.Study, list[dict[str, Any]]]:
    """One study resumed up to each budget in turn; the pick and its equivalent wall per budget.

    Every stage passes the same ``--seed``: the tuner moves a resumed study's seed on by the
    trials it holds, so a stage does not replay the draws of the first.
    """
    storage = f"sqlite:///{folder / f'{workload.name}-{strategy}-seed{seed}.db'}"
    picks: list[Pick] = []
    trial_phases_s = 0.0  # the earlier stages' wall time, without their re-measurement
    offset_of: dict[int, tuple[TimedStudy, float]] = {}
    study: optuna.Study | None = None
    finished = 0
    for stage, budget in enumerate(budgets):
        config = study_config(
            workload,
            storage,
            window_s,
            warmup_s,
            study_name=f"{workload.name}-{strategy}-seed{seed}",
            n_trials=budget - finished,
            seed=seed,
            sampler=strategy,
        )
        timed = run_timed_study(config)
        study = timed.result.study
        for number in timed.trial_numbers:
            offset_of[number] = (timed, trial_phases_s)
        finished = len(study.get_trials(deepcopy=False, states=FINISHED))
        best = best_trial(study)
        if best is None:
            raise SystemExit(f"{strategy} seed {seed}: no trial completed by budget {budget}")
        stage_run, offset_s = offset_of[best.number]
        assert best.datetime_complete is not None
        picks.append(
            Pick(
                strategy,
                seed,
                budget,
                wall_s=trial_phases_s + timed.wall_s,
                settings=trial_settings(best),
                trial_number=best.number,
                found_after_s=offset_s + best.datetime_complete.timestamp() - stage_run.started_at,
                trials=finished,
            )
        )
        print(
            f"  {picks[-1].label}: {finished} trials, {timed.wall_s:.0f} s this stage"
            f" (setup {timed.setup_s:.0f} s, re-measure {timed.remeasure_s:.0f} s),"
            f" pick #{best.number} {describe(picks[-1].settings, workload_batch_param(workload))}",
            file=sys.stderr,
            flush=True,
        )
        trial_phases_s += timed.trials_end_s
        if finished < budget:
            # The study stopped on its own (its best reached the ceiling): a straight run of
            # any larger budget stops at the same trial, with the same pick.
            picks += [
                dataclasses.replace(picks[-1], budget=larger) for larger in budgets[stage + 1 :]
            ]
            break
    assert study is not None
    trajectory = []
    for trial in study.get_trials(deepcopy=False, states=FINISHED):
        if trial.number in offset_of and trial.datetime_complete is not None:
            stage_run, offset_s = offset_of[trial.number]
            trajectory.append(
                {
                    "number": trial.number,
                    "value": trial.value if trial.state == TrialState.COMPLETE else None,
                    "at_s": offset_s + trial.datetime_complete.timestamp() - stage_run.started_at,
                }
            )
    return picks, study, trajectory


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
                trial_settings(trial),
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


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Grid, studies, one side-by-side session; everything the report needs, JSON-safe."""
    workload = WORKLOADS[args.workload]
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
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
    print(f"grid: {grid_wall_s:.0f} s for {len(grid)} settings", flush=True)

    picks: list[Pick] = []
    pruning: list[PruningStats] = []
    trajectories: dict[str, list[dict[str, Any]]] = {}
    profiled: optuna.Study | None = None
    for strategy in strategies:
        for seed in range(args.seeds):
            chain_picks, study, trajectory = run_chain(
                workload, folder, strategy, seed, budgets, args.window, args.warmup
            )
            picks += chain_picks
            pruning.append(pruning_stats(f"{strategy} seed {seed}", study))
            trajectories[f"{strategy} seed {seed}"] = trajectory
            if profiled is None and stored_profile(study.user_attrs) is not None:
                profiled = study

    # One pool, each distinct setting measured once per round under every label it carries.
    pool: dict[str, tuple[LoaderSettings, list[str]]] = {}

    def add(label: str, settings: LoaderSettings) -> None:
        pool.setdefault(settings_key(settings), (settings, []))[1].append(label)

    ranked = sorted(
        (p for p in points if p.samples_per_sec is not None),
        key=lambda p: p.samples_per_sec or 0.0,
        reverse=True,
    )
    for rank, point in enumerate(ranked[: args.grid_top], start=1):
        add(f"grid #{rank}", point.settings)
    # Settings whose speed swings with the co-tenants' load (more intra-op threads than free
    # cores) can rank low in the grid's single windows and high an hour later: re-measure the
    # grid's best at each thread count too, so the optimum is not judged by one regime alone.
    for threads in sorted({p.settings.torch_num_threads for p in ranked}):
        best = next(p for p in ranked if p.settings.torch_num_threads == threads)
        add(f"grid best at {threads} threads", best.settings)
    for pick in picks:
        add(pick.label, pick.settings)
    model = model_on_grid(profiled, prepared, points)
    if model is not None:
        # The model's own answer, judged like the picks: is its top the optimum's equal?
        add(PREDICTED_BEST_LABEL, LoaderSettings.from_attrs(model["predicted_best"]))
    baselines = harness.baselines()
    for name, settings in baselines.items():
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
    return {
        "machine": machine,
        "workload": {
            "name": workload.name,
            "options": dict(workload.options),
            "batch_param": workload_batch_param(workload),
            "space_size": space_size(prepared.space),
        },
        "window_s": args.window,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "budgets": budgets,
        "strategies": strategies,
        "trajectories": trajectories,
        "model": model,
        "baselines": list(baselines),
        "grid": {
            "wall_s": grid_wall_s,
            "points": [
                {"settings": p.settings.to_attrs(), "samples_per_sec": p.samples_per_sec}
                for p in points
            ],
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
                "trials": p.trials,
                "settings": p.settings.to_attrs(),
            }
            for p in picks
        ],
        "side_by_side": [
            {"labels": labels, "settings": s.to_attrs(), "samples_per_sec": runs}
            for (s, labels), runs in zip(entries, values, strict=True)
        ],
        "pruning": [
            {
                "chain": stats.chain,
                "trials": stats.trials,
                "pruned_by_pruner": stats.pruned_by_pruner,
                "pruned_other": stats.pruned_other,
                "median_complete_s": stats.median_complete_s,
                "trial_time_s": stats.trial_time_s,
                "saved_s": stats.saved_s,
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
    }


def model_on_grid(
    study: optuna.Study | None, prepared: Any, points: Sequence[GridPoint]
) -> dict[str, Any] | None:
    """The pipeline model of a tuner study (its stored profile) against every grid point."""
    if study is None:
        return None
    profile = stored_profile(study.user_attrs)
    assert profile is not None
    widest = max(p.settings.num_workers for p in points)
    space = dataclasses.replace(prepared.space, max_workers=max(widest, prepared.space.max_workers))
    model = PipelineModel.build(profile, space, prepared.limits.host_bytes)
    return {
        "profile": profile.to_attrs(),
        "bound": model.bound,
        "predicted_best": model.best.to_attrs(),
        "predictions": [model.predict(p.settings) for p in points],
    }


def grid_entries(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The side-by-side entries whose setting is a grid point (and that completed)."""
    points = results["grid"]["points"]
    grid_keys = {settings_key(LoaderSettings.from_attrs(p["settings"])) for p in points}
    return [
        entry
        for entry in results["side_by_side"]
        if settings_key(LoaderSettings.from_attrs(entry["settings"])) in grid_keys
        and entry["samples_per_sec"]
    ]


def grid_optimum(results: dict[str, Any]) -> LoaderSettings:
    """The best grid setting as re-measured side by side: the optimum the picks are judged by."""
    best = max(grid_entries(results), key=lambda e: median_or_none(e["samples_per_sec"]) or 0.0)
    return LoaderSettings.from_attrs(best["settings"])


def report(results: dict[str, Any]) -> None:
    """Print the tables of one run's results (as written by :func:`measure`)."""
    name = results["workload"]["name"]
    batch_param = results["workload"].get("batch_param") or (
        "max_tokens" if name == "text" else "batch_size"
    )
    baselines = results.get("baselines", ["pytorch-default", "rule-of-thumb"])
    picks = results["picks"]
    budgets = results.get("budgets") or sorted({p["budget"] for p in picks})
    strategies = results.get("strategies") or list(dict.fromkeys(p["strategy"] for p in picks))
    grid = results["grid"]
    grid_wall_s = float(grid["wall_s"])

    def label_of(settings: dict[str, Any]) -> str:
        return describe(LoaderSettings.from_attrs(settings), batch_param)

    median_of: dict[str, float | None] = {}
    entry_of: dict[str, dict[str, Any]] = {}
    for entry in results["side_by_side"]:
        for label in entry["labels"]:
            median_of[label] = median_or_none(entry["samples_per_sec"])
            entry_of[label] = entry
    in_grid = grid_entries(results)
    optimum_entry = max(in_grid, key=lambda e: median_or_none(e["samples_per_sec"]) or 0.0)
    optimum = median_or_none(optimum_entry["samples_per_sec"])
    grid_ranked = [label for label in median_of if label.startswith("grid #")]
    grid_pick = max(grid_ranked, key=lambda label: median_of[label] or 0.0)
    grid_pick_value = median_of[grid_pick]

    points = grid["points"]
    failed = sum(p["samples_per_sec"] is None for p in points)
    print(f"\n## {name}: grid\n")
    print(
        f"{len(points)} settings in {grid_wall_s:.0f} s ({grid_wall_s / len(points):.1f} s each),"
        f" {failed} did not complete"
        + (
            f"; the tuner's own space holds {results['workload']['space_size']:,} settings."
            if "space_size" in results["workload"]
            else "."
        )
        + f" The grid's pick (its top {len(grid_ranked)} re-measured): {grid_pick}"
        f" {label_of(entry_of[grid_pick]['settings'])}, {_fmt(grid_pick_value)} samples/s."
        f" The optimum (best grid setting re-measured in the side-by-side session):"
        f" {label_of(optimum_entry['settings'])}, {_fmt(optimum)} samples/s"
        f" ({', '.join(optimum_entry['labels'])}).\n"
    )
    rows = []
    window_of = {
        settings_key(LoaderSettings.from_attrs(p["settings"])): p["samples_per_sec"] for p in points
    }
    for entry in in_grid:
        key = settings_key(LoaderSettings.from_attrs(entry["settings"]))
        rows.append(
            [
                ", ".join(entry["labels"]),
                label_of(entry["settings"]),
                _fmt(window_of.get(key)),
                _fmt(median_or_none(entry["samples_per_sec"])),
                " / ".join(f"{v:,.0f}" for v in entry["samples_per_sec"]),
            ]
        )
    headers = ["labels", "setting", "grid window", "re-measured median", "rounds"]
    print(markdown_table(headers, rows))

    print(f"\n## {name}: tuner picks ({results['rounds']} interleaved rounds)\n")
    rows = []
    for pick in picks:
        value = median_of.get(pick["label"])
        rows.append(
            [
                pick["strategy"],
                pick["seed"],
                pick["budget"]
                if pick.get("trials", pick["budget"]) >= pick["budget"]
                else f"{pick['budget']} (stopped at {pick['trials']})",
                f"{pick['wall_s']:.0f}",
                f"{pick['wall_s'] / grid_wall_s:.0%}",
                f"{pick['found_after_s']:.0f}",
                label_of(pick["settings"]),
                _fmt(value),
                _fmt(_fraction(value, optimum), ".1%"),
                _fmt(_fraction(value, grid_pick_value), ".1%"),
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
        "of optimum",
        "of grid's pick",
    ]
    print(markdown_table(headers, rows))

    print(f"\n## {name}: by strategy and budget\n")
    rows = []
    for strategy in strategies:
        for budget in budgets:
            group = [p for p in picks if p["strategy"] == strategy and p["budget"] == budget]
            if not group:
                continue
            fractions = [_fraction(median_of.get(p["label"]), optimum) or 0.0 for p in group]
            walls = [p["wall_s"] / grid_wall_s for p in group]
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
    goal_picks = [
        p for p in picks if p["strategy"] == DEFAULT_STRATEGY and p["budget"] == GOAL_BUDGET
    ]
    if goal_picks:
        quality = all(
            (_fraction(median_of.get(p["label"]), optimum) or 0.0) >= GOAL_FRACTION
            for p in goal_picks
        )
        wall = all(p["wall_s"] / grid_wall_s <= GOAL_WALL_FRACTION for p in goal_picks)
        goal = (
            f"{DEFAULT_STRATEGY}, {GOAL_BUDGET} trials: ≥ {GOAL_FRACTION:.0%} of the optimum in"
            f" every run, ≤ {GOAL_WALL_FRACTION:.0%} of the grid's wall"
        )
        print(
            f"\ngoal ({goal}):"
            f" quality {'met' if quality else 'not met'}, wall {'met' if wall else 'not met'}"
        )

    report_reach(results, optimum)
    report_model(results, optimum, label_of, median_of.get(PREDICTED_BEST_LABEL))

    print(f"\n## {name}: against the baselines\n")
    rows = []
    optimum_label = optimum_entry["labels"][0]
    compared = [optimum_label, grid_pick, *[p["label"] for p in goal_picks]]
    for label in dict.fromkeys(compared):
        row = [label, label_of(entry_of[label]["settings"]), _fmt(median_of[label])]
        for baseline in baselines:
            row.append(_fmt(_fraction(median_of[label], median_of.get(baseline)), ".2f") + "x")
        rows.append(row)
    for baseline in baselines:
        rows.append(
            [
                baseline,
                label_of(entry_of[baseline]["settings"]),
                _fmt(median_of.get(baseline)),
                *["" for _ in baselines],
            ]
        )
    print(markdown_table(["setting", "", "median samples/s", *baselines], rows))

    print(f"\n## {name}: pruning\n")
    rows = []
    for stats in results["pruning"]:
        others = ", ".join(f"{n} {r}" for r, n in stats["pruned_other"].items()) or "-"
        total = stats["trial_time_s"] + stats["saved_s"]
        rows.append(
            [
                stats["chain"],
                stats["trials"],
                stats["pruned_by_pruner"],
                others,
                _fmt(stats["median_complete_s"]),
                f"{stats['trial_time_s']:.0f}",
                f"{stats['saved_s']:.0f}",
                f"{stats['saved_s'] / total:.1%}" if total else "-",
            ]
        )
    headers = [
        "study",
        "trials",
        "pruned by pruner",
        "other prunes",
        "median complete trial s",
        "trial time s",
        "saved s",
        "share saved",
    ]
    print(markdown_table(headers, rows))
    last_picks = [p for p in picks if p["budget"] == budgets[-1]]
    best_final = max((median_of.get(p["label"]) or 0.0 for p in last_picks), default=0.0)
    print()
    for label, value in median_of.items():
        if label.startswith("pruned "):
            print(
                f"- re-measured pruned setting {label[len('pruned ') :]}:"
                f" {label_of(entry_of[label]['settings'])}, {_fmt(value)} samples/s,"
                f" {_fmt(_fraction(value, best_final), '.1%')} of the best final pick"
            )
    winners = {settings_key(LoaderSettings.from_attrs(optimum_entry["settings"])): "the optimum"}
    for pick in picks:
        key = settings_key(LoaderSettings.from_attrs(pick["settings"]))
        winners.setdefault(key, f"the pick of {pick['label']}")
    cut = [
        f"{pruned['label']} ({label_of(pruned['settings'])} = {winners[key]},"
        f" best partial {pruned['best_intermediate']:,.0f})"
        for stats in results["pruning"]
        for pruned in stats["pruned"]
        for key in [settings_key(LoaderSettings.from_attrs(pruned["settings"]))]
        if key in winners
    ]
    print("- pruned trials whose setting is the optimum or a pick at some budget:")
    for line in cut or ["none"]:
        print(f"  - {line}")


def report_reach(results: dict[str, Any], optimum: float | None) -> None:
    """Per study: the trials and the wall time until a trial's window reached 95% of the optimum
    (the optimum re-measured side by side; the trial by its own window)."""
    trajectories = results.get("trajectories") or {}
    if not trajectories or not optimum:
        return
    print(
        f"\n## {results['workload']['name']}: trials and wall to {GOAL_FRACTION:.0%}"
        " of the optimum\n"
    )
    rows = []
    for chain, trajectory in trajectories.items():
        reached = next(
            (
                (index, point)
                for index, point in enumerate(trajectory, start=1)
                if (point["value"] or 0.0) >= GOAL_FRACTION * optimum
            ),
            None,
        )
        best = max((p["value"] or 0.0 for p in trajectory), default=0.0)
        if reached is None:
            rows.append([chain, "not reached", "-", f"{best / optimum:.1%}", len(trajectory)])
        else:
            index, point = reached
            rows.append(
                [chain, index, f"{point['at_s']:.0f}", f"{best / optimum:.1%}", len(trajectory)]
            )
    headers = ["study", "trials to reach", "wall s", "best window / optimum", "trials run"]
    print(markdown_table(headers, rows))


def report_model(
    results: dict[str, Any],
    optimum: float | None,
    label_of: Any,
    predicted_best_median: float | None = None,
) -> None:
    """The pipeline model against the grid's own windows: error, ranks, the bound; and its
    predicted best's median in the side-by-side session, where that session measured it."""
    model = results.get("model")
    if not model:
        return
    points = results["grid"]["points"]
    pairs = [
        (p, predicted)
        for p, predicted in zip(points, model["predictions"], strict=True)
        if p["samples_per_sec"]
    ]
    errors = [abs(pred - p["samples_per_sec"]) / p["samples_per_sec"] for p, pred in pairs]
    by_measured = sorted(range(len(pairs)), key=lambda i: -pairs[i][0]["samples_per_sec"])
    by_model = sorted(range(len(pairs)), key=lambda i: -pairs[i][1])
    top_rank_in_model = by_model.index(by_measured[0]) + 1
    model_top_rank = by_measured.index(by_model[0]) + 1
    best = pairs[by_model[0]][0]
    top_window = pairs[by_measured[0]][0]["samples_per_sec"]
    # How flat the top is: a rank among settings one window cannot tell apart says little.
    near_top = sum(p["samples_per_sec"] >= GOAL_FRACTION * top_window for p, _ in pairs)
    print(f"\n## {results['workload']['name']}: the pipeline model on the grid\n")
    rows = [
        ["grid settings compared", len(pairs)],
        ["median absolute error", f"{statistics.median(errors):.1%}"],
        ["grid's top (by its window) ranked by the model", f"#{top_rank_in_model}"],
        [
            "model's top ranked by the grid",
            f"#{model_top_rank} ({label_of(best['settings'])},"
            f" {best['samples_per_sec']:,.0f} samples/s in its window,"
            f" {best['samples_per_sec'] / top_window:.1%} of the top's)",
        ],
        [f"grid settings within {GOAL_FRACTION:.0%} of the top's window", near_top],
        ["bound", f"{model['bound']:,.0f} samples/s"],
        [
            "optimum / bound",
            f"{optimum / model['bound']:.1%}" if optimum and model["bound"] else "-",
        ],
        ["model's predicted best in the tuner's space", label_of(model["predicted_best"])],
    ]
    if predicted_best_median is not None and optimum:
        rows.append(
            [
                "model's predicted best, re-measured side by side",
                f"{predicted_best_median:,.0f} samples/s,"
                f" {predicted_best_median / optimum:.1%} of the optimum",
            ]
        )
    print(markdown_table(["", ""], rows))
    by_workers: dict[int, list[float]] = {}
    for p, pred in pairs:
        workers = p["settings"]["num_workers"]
        by_workers.setdefault(workers, []).append(pred / p["samples_per_sec"])
    print(
        "\npredicted / measured, median per num_workers: "
        + ", ".join(f"w{w} {statistics.median(v):.2f}" for w, v in sorted(by_workers.items()))
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    parser.add_argument("--budgets", default="10,20,40", help="trial budgets (default 10,20,40)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per strategy (default 2)")
    parser.add_argument(
        "--strategies", default=",".join(SAMPLERS), help=f"default {','.join(SAMPLERS)}"
    )
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="seconds (1.5)")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds (0.5)")
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (default 5)")
    parser.add_argument("--grid-top", type=int, default=3, help="grid settings re-measured (3)")
    parser.add_argument(
        "--pruned-check", type=int, default=2, help="nearest pruned settings re-measured (2)"
    )
    parser.add_argument("--out", help="folder for the studies and results JSON")
    parser.add_argument("--report", metavar="JSON", help="print the tables of saved results only")
    args = parser.parse_args(argv)
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return 0
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    if not budgets or not all(b.isdigit() and int(b) > 0 for b in budgets):
        parser.error("--budgets takes positive integers, e.g. 10,20,40")
    if args.seeds < 1 or args.rounds < 1:
        parser.error("--seeds and --rounds must be positive")
    for strategy in args.strategies.split(","):
        if strategy.strip() not in SAMPLERS:
            parser.error(f"--strategies: {strategy!r} is not one of {', '.join(SAMPLERS)}")

    folder = output_dir(args.out, f"search-{args.workload}")
    results = measure(args, folder)
    path = folder / f"search-{args.workload}.json"
    write_json(path, results)
    report(results)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
