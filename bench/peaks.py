"""Settings' peak memory as a trial records it, each measured ``--repeat`` times.

    python -m bench.peaks --workload text --window 6 "w1 tok8192 pf2 t1" "w1 tok8192 pf2 persist t1"

Each setting (written as the benchmarks' tables write them, :func:`bench._harness.describe`)
runs as a trial does, in a supervised child, with the tree's PSS read exactly at every tick
(``bench.guard_precision.ExactGuard``), under the default limits. It prints the recorded peak
(the readings, or the trial's own estimate where higher: ``own_peak_host_memory_bytes``), the
trial's own estimate, samples/s and the epochs the window crossed. What the memory model's
docstrings quote (workers that are not persistent against persistent, over a window that
crosses an epoch's start; a step's transient peak between two readings) comes from here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench._harness import (
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    WORKLOADS,
    Harness,
    describe,
    output_dir,
    prepare_workload,
)
from bench.guard_precision import ExactGuard
from tuner.machine import format_bytes
from tuner.search import LoaderSettings, SearchSpace


def parse_setting(text: str, space: SearchSpace) -> LoaderSettings:
    """``w1 tok8192 pf2 persist t1 [knob values]``: the inverse of :func:`describe`."""
    workers, batch, prefetch, threads = 0, space.workload.default_batch_size, None, 1
    persistent = pin = False
    values = []
    for part in text.split():
        if part == "persist":
            persistent = True
        elif part == "pin":
            pin = True
        elif part.startswith("tok") and part[3:].isdigit():
            batch = int(part[3:])
        elif part[0] in "wbt" and part[1:].isdigit():
            number = int(part[1:])
            workers, batch, threads = {
                "w": (number, batch, threads),
                "b": (workers, number, threads),
                "t": (workers, batch, number),
            }[part[0]]
        elif part.startswith("pf") and part[2:].isdigit():
            prefetch = int(part[2:])
        else:
            values.append(part)
    knobs = dict(space.workload.default_knobs)
    for value in values:
        knob = next((k for k, c in space.workload.knobs.items() if value in map(str, c)), None)
        if knob is None:
            raise ValueError(f"{value!r} is no value of the workload's knobs")
        knobs[knob] = next(c for c in space.workload.knobs[knob] if str(c) == value)
    if workers and prefetch is None:
        prefetch = 2
    return space.settings(workers, batch, prefetch, persistent, pin, threads, knobs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peaks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("settings", nargs="+", help='e.g. "w1 tok8192 pf2 persist t1"')
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="text")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="seconds")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each setting")
    parser.add_argument("--out", help="folder for the study file (default: a new temporary one)")
    args = parser.parse_args(argv)
    folder: Path = output_dir(args.out, "peaks")
    prepared = prepare_workload(
        WORKLOADS[args.workload], f"sqlite:///{folder / 'peaks.db'}", args.window, args.warmup
    )
    try:
        settings = [parse_setting(text, prepared.space) for text in args.settings]
    except ValueError as error:
        print(f"bench.peaks: {error}", file=sys.stderr)
        return 2
    harness = Harness(prepared)
    harness.runner.supervisor.guard = ExactGuard(prepared.limits)
    batch_param = prepared.space.batch_param
    print("setting | recorded peak | own estimate | samples/s | epochs | outcome")
    for setting in settings:
        for _ in range(args.repeat):
            outcome = harness.runner.measure(setting)
            attrs = outcome.attrs
            print(
                f"{describe(setting, batch_param)} | "
                f"{format_bytes(attrs.get('peak_host_memory_bytes'))} | "
                f"{format_bytes(attrs.get('own_peak_host_memory_bytes'))} | "
                f"{attrs.get('samples_per_sec', 0.0):,.1f} | {attrs.get('epochs', '-')} | "
                f"{outcome.state}{' ' + outcome.reason if outcome.reason else ''}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
