"""Tuning for ranks: the 2-rank study's pick against the 1-rank pick as a rank applies it today
and against an independent grid of per-rank settings, all run as 2 ranks, side by side.

    python -m bench.ranks                                   # image and storage, 2 ranks
    python -m bench.ranks --workloads storage --rounds 5 --window-s 5 --out $D/ranks
    python -m bench.ranks --quick --workloads storage       # checks the script; measures nothing

For each workload two studies run as a user types them, each on its own SQLite file:
``python -m tuner.study`` (1 rank) and ``python -m tuner.study --nproc-per-node N``. The
contenders, each a per-rank setting:

* ``N-rank pick``: the N-rank study's pick, as ``tuner.loader`` applies it in a rank;
* ``1-rank pick, clamped``: what ``tuner.loader`` applies in each of N ranks where only the
  1-rank study exists (``rank_best_setting``: the 1-rank optimum clamped to 1/N of the CPUs and
  memory, with its warning);
* the grid: workers 0 to the cores per rank + 2 (storage, whose samples wait on storage: 0 to
  96), batch 32, 64 and 128, 1 and the cores per rank intra-op threads, every value of the
  workload's knobs.

Every contender runs the same plain N-rank loop: ``python -m torch.distributed.run --standalone
--nproc-per-node N -m bench.plain_loop`` (gloo on the CPU; each rank its ``DistributedSampler``
shard, the setting's DataLoader, the tuned threads, 3 warm-up batches, a barrier, then the
workload's step over ``--window-s``; the node's samples/s is the sum of the ranks' rates),
interleaved over ``--rounds`` rounds. A workload that hands over its model (``Workload.model``:
image and storage do) trains it under ``DistributedDataParallel``, as the tuner's ranks do.

Goal (issue 38): the N-rank pick at least 95% of the grid's best.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._harness import (
    GRID_BATCHES,
    STORAGE_WORKERS,
    USER_WORKLOADS,
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
from tuner.search import LoaderSettings

WORKLOADS = ("image", "storage")
SHARDABLE = ("image", "storage", "photos", "off_cpu")
"""Workloads whose samples a ``DistributedSampler`` can shard (text batches by token budget
through its own batch sampler)."""
RANKS = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments (``--quick``'s values in place of the defaults); usage errors exit 2."""
    p = study_bench_parser("python -m bench.ranks", __doc__, WORKLOADS)
    p.add_argument("--nproc-per-node", type=int, default=RANKS, help="ranks (2)")
    args = parse_study_bench_args(p, argv, SHARDABLE)
    if args.nproc_per_node < 2:
        p.error("--nproc-per-node must be at least 2")
    return args


def rank_workers(name: str, cores: int, ranks: int) -> list[int]:
    """The grid's workers per rank: 0 to the rank's share of the cores + 2; for storage, whose
    workers mostly wait, :data:`~bench._harness.STORAGE_WORKERS` up to 1/``ranks`` of its top."""
    if name == "storage":
        return [w for w in STORAGE_WORKERS if w <= STORAGE_WORKERS[-1] // ranks]
    return list(range(max(1, cores // ranks) + 3))


def rank_grid(
    name: str,
    cores: int,
    ranks: int,
    knobs: Mapping[str, Sequence[Any]],
    size: int | None = None,
    batches: Sequence[int] = GRID_BATCHES,
) -> list[LoaderSettings]:
    """The per-rank grid (:func:`rank_workers`, ``batches``, 1 and the rank's share of the
    cores' threads, every combination of ``knobs``); its first ``size``."""
    names = list(knobs)
    knob_values = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*knobs.values())
    ]
    threads = sorted({1, max(1, cores // ranks)})
    grid = plain_grid(rank_workers(name, cores, ranks), batches, threads, knob_values)
    return grid if size is None else grid[:size]


def _picks(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The two studies, run as a user types them; the N-rank pick and the 1-rank pick clamped
    as ``tuner.loader`` applies it in a rank (its warning kept)."""
    import tuner
    from tuner._loader import rank_best_setting

    objective, options = USER_WORKLOADS[name]
    ranks = args.nproc_per_node
    storages = {n: f"sqlite:///{folder / f'ranks-{name}-{n}rank.db'}" for n in (1, ranks)}
    walls = {}
    for n, storage in storages.items():
        flags = [*study_flags(args), "--nproc-per-node", str(n)]
        walls[n], printed = cli_study(objective, options, storage, flags)
        (folder / f"ranks-{name}-{n}rank-study.txt").write_text(printed)
    study = tuner.best_setting(objective=objective, storage=storages[ranks], nproc_per_node=ranks)
    pick = rank_best_setting(objective=objective, storage=storages[ranks], nproc_per_node=ranks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clamped = rank_best_setting(objective=objective, storage=storages[1], nproc_per_node=ranks)
    return {
        "objective": objective,
        "options": dict(options),
        "batch_param": pick.batch_param,
        "study_wall_s": {f"{n} rank": wall for n, wall in walls.items()},
        "figure": study.samples_per_sec,
        "holdout_rounds": list(study.holdout_rounds),
        "pick": pick.settings,
        "one_rank": tuner.best_setting(objective=objective, storage=storages[1]).settings,
        "clamped": clamped.settings,
        "clamp_warning": " ".join(str(w.message) for w in caught),
    }


def contenders(
    picks: Mapping[str, Any], grid: Sequence[LoaderSettings], ranks: int
) -> list[tuple[str, LoaderSettings]]:
    """(label, setting): the N-rank pick, the 1-rank pick clamped, then the grid's settings
    that are neither (a pick that is a grid setting is measured once, under its label)."""
    named = [(f"{ranks}-rank pick", picks["pick"]), ("1-rank pick, clamped", picks["clamped"])]
    seen = {settings_key(settings) for _, settings in named}
    return named + [("grid", s) for s in grid if settings_key(s) not in seen]


def verdict(
    entries: Sequence[tuple[str, LoaderSettings]],
    values: Sequence[Sequence[float]],
    grid: Sequence[LoaderSettings],
) -> dict[str, Any]:
    """The grid's best (among the grid's settings, a pick included where it is one) and the
    share of it each of the two picks (``entries[:2]``) reached."""
    in_grid = {settings_key(s) for s in grid}
    members = [i for i, (_, s) in enumerate(entries) if settings_key(s) in in_grid]
    grid_values = [values[i] for i in members]
    shares = {entries[i][0]: grid_share(values[i], grid_values)["share"] for i in range(2)}
    best = grid_share([], grid_values)["best_index"]
    return {"grid_best": None if best is None else entries[members[best]][1], "shares": shares}


def ranks_bench(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One workload: its studies, then every contender's plain N-rank loop, interleaved."""
    picks = _picks(name, folder, args)
    knobs = _knobs(picks["objective"], picks["options"])
    grid = rank_grid(
        name, usable_cpu_count(), args.nproc_per_node, knobs, args.grid_size, args.grid_batches
    )
    entries = contenders(picks, grid, args.nproc_per_node)
    measures = [_plain(picks, settings, args) for _, settings in entries]
    values = interleaved(measures, args.rounds, desc=name)
    judged = verdict(entries, values, grid)
    batch_param = picks["batch_param"]
    return {
        **{k: v for k, v in picks.items() if k not in ("pick", "one_rank", "clamped")},
        "one_rank_pick": describe(picks["one_rank"], batch_param),
        "grid_best": None
        if judged["grid_best"] is None
        else describe(judged["grid_best"], batch_param),
        "shares": judged["shares"],
        "rows": [
            {
                "label": label,
                "setting": describe(settings, batch_param),
                "settings": settings.to_attrs(),
                "in_grid": settings_key(settings) in {settings_key(s) for s in grid},
                "node_samples_per_sec": runs,
            }
            for (label, settings), runs in zip(entries, values, strict=True)
        ],
    }


def _knobs(objective: str, options: Mapping[str, Any]) -> Mapping[str, Sequence[Any]]:
    from objectives import load_workload

    return load_workload(objective, options).knobs


def _plain(
    picks: Mapping[str, Any], settings: LoaderSettings, args: argparse.Namespace
) -> Callable[[], float | None]:
    def measure() -> float | None:
        result = measure_plain(
            picks["objective"],
            picks["options"],
            settings,
            picks["batch_param"],
            args.window_s,
            nproc_per_node=args.nproc_per_node,
        )
        return None if result is None else float(result["samples_per_sec"])

    return measure


def table(result: Mapping[str, Any]) -> str:
    """Every contender by median, best first: setting, node samples/s (range), share of the
    grid's best."""
    best = [r for r in result["rows"] if r["setting"] == result["grid_best"]]
    reference = statistics.median(best[0]["node_samples_per_sec"]) if best else None
    rows = sorted(result["rows"], key=lambda r: -_median(r["node_samples_per_sec"]))
    return markdown_table(
        ["contender", "per-rank setting", "node samples/s (range)", "of the grid's best"],
        [
            [
                row["label"] + (" (grid's best)" if row["setting"] == result["grid_best"] else ""),
                f"`{row['setting']}`",
                spread(row["node_samples_per_sec"]),
                _share_text(row["node_samples_per_sec"], reference),
            ]
            for row in rows
        ],
    )


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _share_text(values: Sequence[float], reference: float | None) -> str:
    if not values or not reference:
        return "-"
    return f"{statistics.median(values) / reference:.1%}"


def summary_line(name: str, result: Mapping[str, Any], ranks: int) -> str:
    """One line per workload: each pick's share of the grid's best, and the goal."""
    shares = result["shares"]
    parts = [
        f"{label} {share:.1%}" if share is not None else f"{label} -"
        for label, share in shares.items()
    ]
    pick = shares.get(f"{ranks}-rank pick")
    goal = "-" if pick is None else ("met" if pick >= 0.95 else "not met")
    return f"{name}: of the grid's best `{result['grid_best']}`: {', '.join(parts)} (goal {goal})"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folder = output_dir(args.out, "ranks")
    machine = machine_summary()
    print_machine(machine)
    print(f"results in {folder}", flush=True)
    results: dict[str, Any] = {}
    for name in args.workloads:
        results[name] = ranks_bench(name, folder, args)
        print(summary_line(name, results[name], args.nproc_per_node), flush=True)
        write_json(
            folder / "ranks.json", {"machine": machine, "args": vars(args), "results": results}
        )
    for name, result in results.items():
        figure = figure_text(result["figure"], result["holdout_rounds"])
        print(
            f"\n## {name}: {args.nproc_per_node} ranks, {args.rounds} rounds of {args.window_s} s"
            f"\n\nthe {args.nproc_per_node}-rank study printed {figure} samples/s for the node;"
            f" the 1-rank pick `{result['one_rank_pick']}` is clamped in each rank\n"
        )
        print(table(result))
    print(f"\nload average after: {machine_summary()['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
