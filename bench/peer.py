"""The tuner against a peer, loadtune 0.3.0, on the same workloads, judged by one harness.

    pip install loadtune==0.3.0
    python -m bench.peer --workload image
    python -m bench.peer --workload text --from-search /tmp/bench-search-text-XXXX

loadtune profiles a baseline (``num_workers=0``), reads its data-wait fraction, CPU use and
step-time jitter, and tries up to six settings its rules propose, each in a fresh interpreter
(its CLI's default mode; ``bench/loadtune_workloads.py`` is its workload file, wrapping the same
dataset and step). Its recommendation is what its CLI reports: the cheapest trial within 2% of
its best, when that beats the baseline, else the baseline.

The tuner: ``run_study`` with the default strategy and ``--n-trials`` trials (20), or, with
``--from-search DIR``, the default strategy's picks at that budget from ``bench.search``'s
results (its equivalent wall time, no second study). Both recommendations and both baselines
are then re-measured side by side by the same harness (interleaved rounds, medians). Wall time
is until each tool has printed its recommendation; "found at" is when the tuner's pick had been
measured (loadtune recommends only at its end).

Goal: at least loadtune's throughput in less wall time, and more where it leaves knobs untuned
(batch size, prefetch, threads, collate).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench._harness import (
    DEFAULT_STRATEGY,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    WORKLOADS,
    BenchWorkload,
    Harness,
    describe,
    machine_summary,
    markdown_table,
    median_or_none,
    output_dir,
    prepare_workload,
    print_machine,
    run_timed_study,
    study_config,
    write_json,
)
from tuner._attrs import trial_settings
from tuner.insight import best_trial
from tuner.run import SAMPLERS
from tuner.search import LoaderSettings, SearchSpace

REPOSITORY = Path(__file__).resolve().parent.parent
LOADTUNE_FILE = Path(__file__).resolve().parent / "loadtune_workloads.py"


def run_loadtune(workload: BenchWorkload, folder: Path) -> tuple[dict[str, Any], float]:
    """``loadtune tune`` with its defaults; its raw results and its wall time."""
    raw = folder / f"loadtune-{workload.name}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])
        ),
        "BENCH_LOADTUNE_WORKLOAD": workload.name,
        "BENCH_LOADTUNE_OPTIONS": json.dumps(dict(workload.options)),
    }
    command = [
        sys.executable,
        "-m",
        "loadtune.cli",
        "tune",
        str(LOADTUNE_FILE),
        "--no-plots",
        "--save-raw",
        str(raw),
        "--out",
        str(folder / f"loadtune-{workload.name}.md"),
    ]
    log = folder / f"loadtune-{workload.name}.log"
    started = time.monotonic()
    with log.open("w") as output:
        completed = subprocess.run(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    wall_s = time.monotonic() - started
    if completed.returncode != 0 or not raw.exists():
        raise SystemExit(f"loadtune exited {completed.returncode}; see {log}")
    return json.loads(raw.read_text()), wall_s


def loadtune_recommendation(raw: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The knobs loadtune's CLI recommends, and how many settings it measured."""
    from loadtune.experiment import Trial
    from loadtune.experiment import best_trial as loadtune_best
    from loadtune.knobs import Knobs

    trials = [
        Trial(Knobs.from_dict(t["knobs"]), t.get("reason", ""), t.get("result"))
        for t in raw["trials"]
    ]
    best = loadtune_best(trials)
    baseline = raw["baseline"]
    if best is not None and best.throughput > baseline["throughput"]:
        return best.knobs.to_dict(), 1 + len(trials)
    return dict(baseline["knobs"]), 1 + len(trials)


def loadtune_settings(
    knobs: dict[str, Any], workload: BenchWorkload, space: SearchSpace, default_threads: int
) -> LoaderSettings:
    """loadtune's knobs as the harness measures them; its ``None`` values are torch's defaults."""
    unsupported = [name for name in ("compile", "amp", "non_blocking") if knobs.get(name)]
    if unsupported:
        print(f"loadtune picked {unsupported}: the harness measures without them", file=sys.stderr)
    from bench.loadtune_workloads import TEXT_MAX_TOKENS

    workers = int(knobs["num_workers"])
    if workload.objective == "text":
        batch = TEXT_MAX_TOKENS
    else:
        batch = knobs.get("batch_size") or space.workload.default_batch_size
    prefetch = (knobs.get("prefetch_factor") or 2) if workers else None
    return space.settings(
        workers,
        batch,
        prefetch,
        bool(knobs.get("persistent_workers")) and workers > 0,
        bool(knobs.get("pin_memory")),
        knobs.get("num_threads") or default_threads,
        space.workload.default_knobs,
    )


def tuner_picks(
    workload: BenchWorkload,
    folder: Path,
    from_search: str | None,
    n_trials: int,
    window_s: float,
    warmup_s: float,
    strategy: str = DEFAULT_STRATEGY,
) -> list[tuple[str, LoaderSettings, float, int, float]]:
    """(label, setting, wall s, trials, found at s) of the tuner's ``strategy``."""
    if from_search:
        results = json.loads((Path(from_search) / f"search-{workload.name}.json").read_text())
        picks = [
            (
                f"tuner ({strategy} seed {p['seed']})",
                LoaderSettings.from_attrs(p["settings"]),
                float(p["wall_s"]),
                int(p.get("trials", n_trials)),  # fewer when the study stopped on its own
                float(p["found_after_s"]),
            )
            for p in results["picks"]
            if p["strategy"] == strategy and p["budget"] == n_trials
        ]
        if not picks:
            raise SystemExit(f"{from_search}: no {strategy} pick at {n_trials} trials")
        return picks
    config = study_config(
        workload,
        f"sqlite:///{folder / f'tuner-{workload.name}.db'}",
        window_s,
        warmup_s,
        n_trials=n_trials,
        seed=0,
        sampler=strategy,
    )
    timed = run_timed_study(config)
    best = best_trial(timed.result.study)
    if best is None:
        raise SystemExit("the tuner completed no trial")
    settings = trial_settings(best)
    assert best.datetime_complete is not None
    found_s = best.datetime_complete.timestamp() - timed.started_at
    trials = len(timed.trial_numbers)  # fewer than n_trials when the study stopped on its own
    return [(f"tuner ({strategy} seed 0)", settings, timed.wall_s, trials, found_s)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    parser.add_argument("--n-trials", type=int, default=20, help="the tuner's budget (20)")
    parser.add_argument("--from-search", help="reuse bench.search's results in this folder")
    parser.add_argument(
        "--strategy", choices=SAMPLERS, default=DEFAULT_STRATEGY, help="the tuner's --sampler"
    )
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="seconds (1.5)")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds (0.5)")
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (default 5)")
    parser.add_argument("--out", help="folder for loadtune's files and the results JSON")
    args = parser.parse_args(argv)
    try:
        import loadtune
    except ImportError:
        parser.error("needs loadtune: pip install loadtune==0.3.0")
    print(f"loadtune {loadtune.__version__}")

    default_threads = torch.get_num_threads()  # before anything here sets it: torch's default
    workload = WORKLOADS[args.workload]
    batch_param = "max_tokens" if workload.objective == "text" else "batch_size"
    folder = output_dir(args.out, f"peer-{workload.name}")
    machine = machine_summary()
    print_machine(machine)
    print(f"output in {folder}", flush=True)
    prepared = prepare_workload(
        workload, f"sqlite:///{folder / 'prepare.db'}", args.window, args.warmup
    )
    harness = Harness(prepared)

    raw, loadtune_wall_s = run_loadtune(workload, folder)
    knobs, loadtune_trials = loadtune_recommendation(raw)
    peer = loadtune_settings(knobs, workload, prepared.space, default_threads)
    print(
        f"loadtune: {loadtune_trials} settings in {loadtune_wall_s:.0f} s,"
        f" recommends {describe(peer, batch_param)}",
        flush=True,
    )
    ours = tuner_picks(
        workload, folder, args.from_search, args.n_trials, args.window, args.warmup, args.strategy
    )

    entries: list[tuple[str, LoaderSettings, float | None, int | None, float | None]] = [
        ("loadtune 0.3.0", peer, loadtune_wall_s, loadtune_trials, loadtune_wall_s),
        *ours,
        *[(name, s, None, None, None) for name, s in harness.baselines().items()],
    ]
    values = harness.side_by_side([entry[1] for entry in entries], args.rounds)
    medians = [median_or_none(runs) for runs in values]
    reference = medians[0]
    rows = []
    for (label, settings, wall, trials, found), median in zip(entries, medians, strict=True):
        rows.append(
            [
                label,
                describe(settings, batch_param),
                "-" if trials is None else trials,
                "-" if wall is None else f"{wall:.0f}",
                "-" if found is None else f"{found:.0f}",
                "-" if median is None else f"{median:,.1f}",
                "-" if median is None or not reference else f"{median / reference:.2f}x",
            ]
        )
    print(f"\n## {workload.name}: tuner and loadtune ({args.rounds} interleaved rounds)\n")
    headers = [
        "tool",
        "recommended setting",
        "settings measured",
        "wall s",
        "found at s",
        "median samples/s",
        "vs loadtune",
    ]
    print(markdown_table(headers, rows))
    print(
        f"\nloadtune's own numbers: baseline {raw['baseline']['throughput']:,.1f}"
        f" {'buckets' if workload.objective == 'text' else 'samples'}/s,"
        f" data wait {raw['baseline']['data_wait_frac']:.0%},"
        f" CPU {raw['baseline'].get('cpu_util_mean')}%; trials: "
        + "; ".join(
            f"{t['reason'].split(':')[0]} → {t['result'].get('throughput', 'error')}"
            for t in raw["trials"]
        )
    )
    write_json(
        folder / f"peer-{workload.name}.json",
        {
            "machine": machine,
            "workload": {"name": workload.name, "options": dict(workload.options)},
            "loadtune_raw": raw,
            "rows": [
                {
                    "label": label,
                    "settings": settings.to_attrs(),
                    "wall_s": wall,
                    "found_after_s": found,
                    "settings_measured": trials,
                    "samples_per_sec": runs,
                    "median": median,
                }
                for (label, settings, wall, trials, found), runs, median in zip(
                    entries, values, medians, strict=True
                )
            ],
        },
    )
    print(f"\nresults: {folder / f'peer-{workload.name}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
