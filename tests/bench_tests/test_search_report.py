"""bench.search's tables from a stored result (data/): the judge's figures, no measuring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.search import main

DATA = Path(__file__).parent / "data"


def test_the_model_table_judges_the_models_predicted_best(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Image's first run at 08e3a21: the model's predicted best (`w2 b256`, grid #2) re-measured
    1,864.2 against the optimum's 1,923.0; three grid windows lay within 95% of the top's."""
    assert main(["--report", str(DATA / "search-image-model-08e3a21-2026-12-06.json")]) == 0
    out = capsys.readouterr().out
    assert "| model's predicted best, re-measured side by side | 1,864 samples/s, 96.9% of" in out
    assert "| grid settings within 95% of the top's window | 3 |" in out
    assert "2,225 samples/s in its window, 98.1% of the top's)" in out


def test_a_result_from_before_the_predicted_best_was_judged_still_reports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = DATA / "search-text-model-59a9a99-2026-12-06.json"
    assert not any(
        "model's predicted best" in entry["labels"]
        for entry in json.loads(path.read_text())["side_by_side"]
    )
    assert main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| median absolute error | 15.0% |" in out
    assert "re-measured side by side" not in out
