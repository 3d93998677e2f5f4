"""The pipeline model's fitted constants against measured grids: which values predict them best.

    python -m bench.overlap_fit docs/data/search-image-model-ed08bbb-2026-12-06.json \
        docs/data/search-text-model-1995b97-2026-12-06.json ...

Each file is a ``bench.search`` result holding its grid and the study's pipeline profile. For
each power, every grid setting is predicted from that profile
(:func:`tuner.pipeline._model.predict` with ``OVERLAP_POWER`` set to it; 40 stands for the plain
minimum) and compared with its measured window: the median absolute error per file, their mean,
and where the grid's fastest setting ranks among the predictions. Then, at the model's power, the
same for the crowded step's two constants (``THREAD_STALL_S`` x ``ONE_THREAD_SHARE``), with the
median rank and the mean share of the grid's top that the model's predicted best reads. Pure
arithmetic on stored results: nothing is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tuner.pipeline import PipelineProfile, _model
from tuner.search import LoaderSettings

POWERS = (1.25, 1.5, 2.0, 3.0, 6.0, 40.0)
STALLS_S = (0.0, 0.008, 0.010, 0.012, 0.014)
ONE_THREAD_SHARES = (1.0, 0.85, 0.8, 0.75)


@contextlib.contextmanager
def constants(values: Mapping[str, float]) -> Iterator[None]:
    """The model's module constants set to ``values`` for the block."""
    saved = {name: getattr(_model, name) for name in values}
    try:
        for name, value in values.items():
            setattr(_model, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(_model, name, value)


def grid_errors(result: dict, **values: float) -> tuple[float, int, float]:
    """(median absolute error, the rank the model gives the grid's fastest setting, the grid
    share of the model's fastest setting) with the model's constants set to ``values``."""
    profile = PipelineProfile.from_attrs(result["model"]["profile"])
    with constants(values):
        rows = [
            (point["samples_per_sec"], _model.predict(profile, settings).samples_per_sec)
            for point in result["grid"]["points"]
            if point["samples_per_sec"]
            for settings in [LoaderSettings.from_attrs(point["settings"])]
        ]
    error = statistics.median(abs(predicted / measured - 1) for measured, predicted in rows)
    fastest = max(rows, key=lambda row: row[0])
    rank = 1 + sum(predicted > fastest[1] for _, predicted in rows)
    predicted_top = max(rows, key=lambda row: row[1])
    return error, rank, predicted_top[0] / fastest[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overlap_fit", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="bench.search result files")
    args = parser.parse_args(argv)
    results = {path.name: json.loads(path.read_text()) for path in args.results}
    print(f"current power: {_model.OVERLAP_POWER:g}")
    for power in POWERS:
        cells, errors = [], []
        for name, result in results.items():
            error, rank, _ = grid_errors(result, OVERLAP_POWER=power)
            errors.append(error)
            cells.append(f"{name}: {error:.1%} (top #{rank})")
        print(f"power {power:>5g}: mean {statistics.mean(errors):.1%} | " + " | ".join(cells))
    print(
        f"crowded step (now {_model.THREAD_STALL_S * 1000:g} ms per batch, "
        f"{_model.ONE_THREAD_SHARE:g} of the cores at one thread):"
    )
    for stall in STALLS_S:
        for share in ONE_THREAD_SHARES:
            fits = [
                grid_errors(result, THREAD_STALL_S=stall, ONE_THREAD_SHARE=share)
                for result in results.values()
            ]
            print(
                f"stall {stall * 1000:>3g} ms, share {share:.2f}: "
                f"error mean {statistics.mean(f[0] for f in fits):.1%}, "
                f"top's rank median {statistics.median(f[1] for f in fits):g}, "
                f"predicted best reads {statistics.mean(f[2] for f in fits):.1%} of the top "
                f"(least {min(f[2] for f in fits):.1%})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
