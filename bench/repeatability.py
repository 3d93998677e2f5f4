"""Repeatability: how much one setting's measurement moves, and whether a short window tells
the truth about a long run.

    python -m bench.repeatability --workload image
    python -m bench.repeatability --workload text --from-search /tmp/bench-search-text-XXXX

One setting (the grid's re-measured optimum from ``bench.search``'s results with
``--from-search``, else the workload's hand-picked typical setting) measured by the same path as
a trial, ``--repeats`` times at each short window (interleaved: 1.5 s, 3 s, 1.5 s, 3 s, ...),
then once over a ``--long`` window (60 s). Goals: coefficient of variation (sample standard
deviation over mean) at most 5%; the median of the short windows within 5% of the long run.

Beside each short window it measures the machine's own floor: a fixed single-threaded matrix
product loop over a window of the same length, right after the setting's. No DataLoader is
involved, so its CV is the variation the machine itself puts into any measurement that long
(on a shared VM: neighbours and frequency changes), below which no setting's CV can go.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from bench._harness import (
    DEFAULT_WARMUP_S,
    WORKLOADS,
    Harness,
    describe,
    machine_summary,
    markdown_table,
    output_dir,
    prepare_workload,
    print_machine,
    write_json,
)
from bench.search import grid_optimum

GOAL_CV = 0.05
GOAL_AGREEMENT = 0.05


def _verdict(value: float, goal: float) -> str:
    return "ok" if value <= goal else f"over {goal:.0%}"


def machine_floor(window_s: float) -> float:
    """Products per second of a 256x256 float matrix product on one thread over ``window_s``."""
    matrix = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < window_s:
            matrix @ matrix
            count += 1
        return count / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)


def _cv(values: Sequence[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.repeatability",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    parser.add_argument("--from-search", help="measure the grid optimum of bench.search here")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per window (default 5)")
    parser.add_argument("--windows", default="1.5,3", help="short windows, s (default 1.5,3)")
    parser.add_argument("--long", type=float, default=60.0, help="long window, s (default 60)")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds (0.5)")
    parser.add_argument("--out", help="folder for the results JSON")
    args = parser.parse_args(argv)
    windows = [float(w) for w in args.windows.split(",")]
    if args.repeats < 2 or not windows or min(windows) <= 0 or args.long <= 0:
        parser.error("--repeats must be at least 2 and the windows positive")

    workload = WORKLOADS[args.workload]
    batch_param = "max_tokens" if workload.objective == "text" else "batch_size"
    folder = output_dir(args.out, f"repeatability-{workload.name}")
    machine = machine_summary()
    print_machine(machine)
    storage = f"sqlite:///{folder / 'prepare.db'}"
    harnesses = {
        window: Harness(prepare_workload(workload, storage, window, args.warmup))
        for window in [*windows, args.long]
    }
    space = harnesses[args.long].prepared.space
    if args.from_search:
        results = json.loads((Path(args.from_search) / f"search-{workload.name}.json").read_text())
        settings = grid_optimum(results)
        source = f"the grid optimum of {args.from_search}"
    else:
        settings = workload.typical(space)
        source = "the typical setting"
    print(f"setting: {describe(settings, batch_param)} ({source})", flush=True)

    harnesses[windows[0]].measure(settings)  # forkserver start and data caches: unmeasured
    short: dict[float, list[float]] = {window: [] for window in windows}
    floor: dict[float, list[float]] = {window: [] for window in windows}
    with tqdm(total=args.repeats * len(windows), file=sys.stderr, leave=False) as bar:
        for _ in range(args.repeats):
            for window in windows:
                value = harnesses[window].measure(settings)
                if value is not None:
                    short[window].append(value)
                floor[window].append(machine_floor(window))
                bar.update()
    print(f"long run: {args.long:g} s", file=sys.stderr, flush=True)
    long_value = harnesses[args.long].measure(settings)

    rows = []
    for window, values in short.items():
        if len(values) < 2:
            rows.append([f"{window:g}", len(values), "-", "-", "-", "-", "-", "-"])
            continue
        cv = _cv(values)
        median = statistics.median(values)
        agreement = median / long_value - 1 if long_value else None
        rows.append(
            [
                f"{window:g}",
                len(values),
                f"{median:,.1f}",
                f"{min(values):,.1f} – {max(values):,.1f}",
                f"{cv:.1%} ({_verdict(cv, GOAL_CV)})",
                f"{_cv(floor[window]):.1%}",
                "-" if long_value is None else f"{long_value:,.1f}",
                "-"
                if agreement is None
                else f"{agreement:+.1%} ({_verdict(abs(agreement), GOAL_AGREEMENT)})",
            ]
        )
    print(f"\n## {workload.name}: repeatability of {describe(settings, batch_param)}\n")
    headers = [
        "window s",
        "repeats",
        "median samples/s",
        "range",
        "CV",
        "machine floor CV",
        f"{args.long:g} s run",
        "median vs long run",
    ]
    print(markdown_table(headers, rows))
    write_json(
        folder / f"repeatability-{workload.name}.json",
        {
            "machine": machine,
            "workload": {"name": workload.name, "options": dict(workload.options)},
            "settings": settings.to_attrs(),
            "warmup_s": args.warmup,
            "short": {f"{w:g}": v for w, v in short.items()},
            "machine_floor": {f"{w:g}": v for w, v in floor.items()},
            "long_window_s": args.long,
            "long_samples_per_sec": long_value,
        },
    )
    print(f"\nresults: {folder / f'repeatability-{workload.name}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
