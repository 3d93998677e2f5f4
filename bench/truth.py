"""The figure a study prints for its pick, against the plain loop a user runs with that setting.

    python -m bench.truth                                  # image, text, storage, off_cpu
    python -m bench.truth --workloads off_cpu --rounds 5 --window-s 5 --out $D/truth
    python -m bench.truth --quick --workloads storage      # checks the script; measures nothing

For each workload a default study runs as a user types it (``python -m tuner.study``, its own
SQLite file; ``--n-trials``, ``--trial-seconds`` and ``--warmup-seconds`` passed on), and its
printed figure (the median of the hold-out rounds, study attr ``holdout_samples_per_sec``) and
pick are read back through ``tuner.best_setting``. Then, over ``--rounds`` interleaved rounds
(the order rotated each round):

* ``plain loop``: ``python -m bench.plain_loop`` in a fresh interpreter,
  ``DataLoader(dataset, shuffle=True, drop_last=True, **setting)``, the tuned
  ``torch.set_num_threads``, 3 warm-up batches, then the workload's step for ``--window-s``;
* ``tuner now``: the same setting through the tuner's own one-trial measurement (the trial
  runner, with the study's window and warm-up), so a machine that drifted since the study shows
  as such.

``off_cpu`` (JPEG decoding workers, a step that sleeps as the host does while a device steps;
``bench/photos_workload.py``) also runs an independent grid in the same rounds, each setting in
the plain loop: workers 0 to the cores + 2, batch 32, 64 and 128, 1 and all intra-op threads.

Goals (issue 40): every workload's printed figure within 5% of the plain loop's median; on
``off_cpu`` the pick at least 95% of the grid's best.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._harness import (
    GRID_BATCHES,
    USER_WORKLOADS,
    Harness,
    cli_study,
    describe,
    figure_text,
    grid_share,
    interleaved,
    machine_summary,
    markdown_table,
    measure_plain,
    output_dir,
    parse_study_bench_args,
    plain_grid,
    print_machine,
    settings_key,
    spread,
    study_bench_parser,
    study_flags,
    write_json,
)
from tuner.machine import usable_cpu_count
from tuner.run import StudyConfig
from tuner.search import LoaderSettings

WORKLOADS = ("image", "text", "storage", "off_cpu")
GRID_WORKLOADS = frozenset({"off_cpu"})
"""Workloads whose pick is judged against an independent grid as well."""
AGREEMENT = 0.05
"""The printed figure is within 5% of the plain loop's median (issue 40)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments (``--quick``'s values in place of the defaults); usage errors exit 2."""
    p = study_bench_parser("python -m bench.truth", __doc__, WORKLOADS)
    return parse_study_bench_args(p, argv, USER_WORKLOADS)


def off_cpu_grid(
    cores: int, size: int | None = None, batches: Sequence[int] = GRID_BATCHES
) -> list[LoaderSettings]:
    """Workers 0 to ``cores`` + 2, ``batches``, 1 and ``cores`` intra-op threads (the first
    ``size`` of them, where given)."""
    grid = plain_grid(range(cores + 3), batches, sorted({1, cores}))
    return grid if size is None else grid[:size]


def agreement(figure: float, plain: Sequence[float]) -> dict[str, Any]:
    """The printed figure over the plain loop's median, and whether it is within
    :data:`AGREEMENT` (None without a completed plain loop)."""
    if not plain:
        return {"plain_median": None, "ratio": None, "within": None}
    median = statistics.median(plain)
    ratio = figure / median
    within = round(abs(ratio - 1), 9) <= AGREEMENT  # 1.05 is within 5%, in floating point too
    return {"plain_median": median, "ratio": ratio, "within": within}


def _study(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The default study, as a user types it; its pick and printed figure."""
    import tuner

    objective, options = USER_WORKLOADS[name]
    storage = f"sqlite:///{folder / f'truth-{name}.db'}"
    wall_s, printed = cli_study(objective, options, storage, study_flags(args))
    (folder / f"truth-{name}-study.txt").write_text(printed)
    best = tuner.best_setting(objective=objective, storage=storage)
    return {
        "objective": objective,
        "options": dict(options),
        "storage": storage,
        "study_wall_s": wall_s,
        "trial": best.trial_number,
        "finished_trials": best.finished_trials,
        "batch_param": best.batch_param,
        "settings": best.settings.to_attrs(),
        "label": describe(best.settings, best.batch_param),
        "figure": best.samples_per_sec,
        "figure_source": best.figure.source,
        "holdout_rounds": list(best.holdout_rounds),
    }


def _tuner_measure(
    study: Mapping[str, Any], args: argparse.Namespace
) -> Callable[[], float | None]:
    """The tuner's own measurement of the pick, with the study's window and warm-up."""
    from tuner.run import prepare

    config = StudyConfig(
        objective=study["objective"],
        objective_options=dict(study["options"]),
        storage=study["storage"],
        trial_seconds=args.trial_seconds,
        warmup_seconds=args.warmup_seconds,
        progress=False,
    )
    harness = Harness(prepare(config))
    settings = LoaderSettings.from_attrs(study["settings"])
    return lambda: harness.measure(settings)


def _plain(
    study: Mapping[str, Any], settings: LoaderSettings, window_s: float
) -> Callable[[], float | None]:
    def measure() -> float | None:
        result = measure_plain(
            study["objective"], study["options"], settings, study["batch_param"], window_s
        )
        return None if result is None else float(result["samples_per_sec"])

    return measure


def truth(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One workload: the study, then the pick's plain loop and tuner measurement (and, for
    :data:`GRID_WORKLOADS`, the grid's plain loops) in ``args.rounds`` interleaved rounds."""
    study = _study(name, folder, args)
    pick = LoaderSettings.from_attrs(study["settings"])
    grid = (
        off_cpu_grid(usable_cpu_count(), args.grid_size, args.grid_batches)
        if name in GRID_WORKLOADS
        else []
    )
    pick_in_grid = any(settings_key(s) == settings_key(pick) for s in grid)
    grid = [s for s in grid if settings_key(s) != settings_key(pick)]
    measures = [_plain(study, pick, args.window_s), _tuner_measure(study, args)]
    measures += [_plain(study, settings, args.window_s) for settings in grid]
    values = interleaved(measures, args.rounds, desc=name)
    result = {
        **study,
        "plain": values[0],
        "tuner_now": values[1],
        **agreement(study["figure"], values[0]),
    }
    if name in GRID_WORKLOADS:
        result.update(_grid_result(study, pick_in_grid, values[0], grid, values[2:]))
    return result


def _grid_result(
    study: Mapping[str, Any],
    pick_in_grid: bool,
    pick_values: list[float],
    grid: Sequence[LoaderSettings],
    grid_values: Sequence[list[float]],
) -> dict[str, Any]:
    """The grid's rows, its best and the pick's share of it. The pick, measured once per round,
    counts as a grid setting where it is one; elsewhere its share may exceed 1."""
    labels = [describe(s, study["batch_param"]) for s in grid]
    if pick_in_grid:
        labels, grid_values = [study["label"], *labels], [pick_values, *grid_values]
    share = grid_share(pick_values, grid_values)
    return {
        "pick_in_grid": pick_in_grid,
        "grid": [
            {"label": lab, "plain": runs} for lab, runs in zip(labels, grid_values, strict=True)
        ],
        "grid_best": None if share["best_index"] is None else labels[share["best_index"]],
        "pick_share": share["share"],
        "pick_reached": share["reached"],
    }


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def truth_row(name: str, result: Mapping[str, Any]) -> list[str]:
    """One row of the table: the pick, the printed figure with its hold-out spread, the plain
    loop and the tuner now (medians and ranges), and the ratios."""
    figure = figure_text(result["figure"], result["holdout_rounds"])
    plain, now = result["plain"], result["tuner_now"]
    plain_over_now = (
        f"{statistics.median(plain) / statistics.median(now):.3f}" if plain and now else "-"
    )
    return [
        name,
        f"`{result['label']}`",
        figure,
        spread(plain),
        "-" if result["ratio"] is None else f"{result['ratio']:.3f}",
        _yes_no(result["within"]),
        spread(now),
        plain_over_now,
    ]


TABLE_HEADERS = [
    "workload",
    "pick",
    "printed figure (hold-out rounds)",
    "plain loop (range)",
    "printed / plain",
    "within 5%",
    "tuner now (range)",
    "plain / tuner now",
]


def summary_line(name: str, result: Mapping[str, Any]) -> str:
    """One line per workload: the verdicts."""
    line = f"{name}: printed {result['figure']:,.0f}, plain loop {spread(result['plain'])}"
    if result["ratio"] is not None:
        line += f", ratio {result['ratio']:.3f} ({'within' if result['within'] else 'outside'} 5%)"
    if "pick_share" in result and result["pick_share"] is not None:
        line += f"; pick {result['pick_share']:.1%} of the grid's best `{result['grid_best']}`"
    return line


def grid_table(result: Mapping[str, Any]) -> str:
    """The grid's settings by median (the pick among them, marked), best first."""
    rows = [{"label": result["label"], "plain": result["plain"]}] * (not result["pick_in_grid"])
    rows += list(result["grid"])
    rows.sort(key=lambda row: -statistics.median(row["plain"]) if row["plain"] else 0.0)
    return markdown_table(
        ["setting", "plain loop (range)"],
        [
            [
                f"`{row['label']}`" + " (pick)" * (row["label"] == result["label"]),
                spread(row["plain"]),
            ]
            for row in rows
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folder = output_dir(args.out, "truth")
    machine = machine_summary()
    print_machine(machine)
    print(f"results in {folder}", flush=True)
    results: dict[str, Any] = {}
    for name in args.workloads:
        results[name] = truth(name, folder, args)
        print(summary_line(name, results[name]), flush=True)
        write_json(
            folder / "truth.json", {"machine": machine, "args": vars(args), "results": results}
        )
    rounds = f"{args.rounds} rounds of {args.window_s} s"
    print(f"\n## The printed figure against a plain loop ({rounds})\n")
    print(markdown_table(TABLE_HEADERS, [truth_row(n, r) for n, r in results.items()]))
    for name, result in results.items():
        if "grid" in result:
            print(f"\n### {name}: the pick in an independent grid\n\n{grid_table(result)}")
    print(f"\nload average after: {machine_summary()['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
