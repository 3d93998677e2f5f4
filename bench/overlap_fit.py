"""The pipeline model's overlap power against measured grids: which power predicts them best.

    python -m bench.overlap_fit docs/data/search-image-model-2026-12-04.json \
        docs/data/search-text-model-2026-12-04.json ...

Each file is a ``bench.search`` result holding its grid and the study's pipeline profile. For
each power, every grid setting is predicted from that profile
(:func:`tuner.pipeline._model.predict` with ``OVERLAP_POWER`` set to it; 40 stands for the plain
minimum) and compared with its measured window: the median absolute error per file, their mean,
and where the grid's fastest setting ranks among the predictions. Pure arithmetic on stored
results: nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from tuner.pipeline import _model
from tuner.pipeline._profile import PipelineProfile
from tuner.search._settings import LoaderSettings

POWERS = (1.25, 1.5, 2.0, 3.0, 6.0, 40.0)


def grid_errors(result: dict, power: float) -> tuple[float, int]:
    """(median absolute error, the rank the model gives the grid's fastest setting)."""
    profile = PipelineProfile.from_attrs(result["model"]["profile"])
    saved, _model.OVERLAP_POWER = _model.OVERLAP_POWER, power
    try:
        rows = [
            (point["samples_per_sec"], _model.predict(profile, settings).samples_per_sec)
            for point in result["grid"]["points"]
            if point["samples_per_sec"]
            for settings in [LoaderSettings.from_attrs(point["settings"])]
        ]
    finally:
        _model.OVERLAP_POWER = saved
    error = statistics.median(abs(predicted / measured - 1) for measured, predicted in rows)
    fastest = max(rows, key=lambda row: row[0])
    rank = 1 + sum(predicted > fastest[1] for _, predicted in rows)
    return error, rank


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overlap_fit", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="bench.search result files")
    args = parser.parse_args(argv)
    results = {path.name: json.loads(path.read_text()) for path in args.results}
    print(f"current power: {_model.OVERLAP_POWER:g}")
    for power in POWERS:
        cells, errors = [], []
        for name, result in results.items():
            error, rank = grid_errors(result, power)
            errors.append(error)
            cells.append(f"{name}: {error:.1%} (top #{rank})")
        print(f"power {power:>5g}: mean {statistics.mean(errors):.1%} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
