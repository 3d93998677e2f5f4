"""bench.overlap_fit on a stored bench.search result (data/): arithmetic only."""

from __future__ import annotations

import json
from pathlib import Path

from bench.overlap_fit import grid_errors, main
from tuner.pipeline import _model

RESULT = Path(__file__).parent / "data/search-storage-2026-12-04.json"


def test_each_value_is_tried_and_the_models_own_are_put_back() -> None:
    result = json.loads(RESULT.read_text())
    before = (_model.OVERLAP_POWER, _model.THREAD_STALL_S, _model.ONE_THREAD_SHARE)
    smooth, _, _ = grid_errors(result, OVERLAP_POWER=2.0)
    plain, rank, share = grid_errors(result, OVERLAP_POWER=40.0)
    assert 0.0 <= smooth < plain  # the storage grid of that day: 0.9% against 4.1%
    assert rank >= 1 and 0.0 < share <= 1.0
    grid_errors(result, THREAD_STALL_S=0.0, ONE_THREAD_SHARE=1.0)
    assert main([str(RESULT)]) == 0
    assert before == (_model.OVERLAP_POWER, _model.THREAD_STALL_S, _model.ONE_THREAD_SHARE)
