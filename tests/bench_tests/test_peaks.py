"""bench.peaks: the settings it reads back are the ones the benchmarks' tables name."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._harness import WORKLOADS, describe, prepare_workload
from bench.peaks import main, parse_setting


@pytest.mark.parametrize(
    ("workload", "text"),
    [
        ("text", "w1 tok8192 pf2 persist t1"),
        ("text", "w0 tok16384 t2"),
        ("image", "w2 b64 pf5 t1 uint8"),
        ("image", "w0 b32 t2 float"),
    ],
)
def test_a_setting_reads_back_as_described(workload: str, text: str, tmp_path: Path) -> None:
    prepared = prepare_workload(WORKLOADS[workload], f"sqlite:///{tmp_path / 'p.db'}", 1.0, 0.5)
    settings = parse_setting(text, prepared.space)
    assert describe(settings, prepared.space.batch_param) == text


def test_an_unknown_knob_value_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--workload", "image", "--out", str(tmp_path), "w0 b32 t1 jpeg"]) == 2
    assert (
        capsys.readouterr().err.strip() == "bench.peaks: 'jpeg' is no value of the workload's knobs"
    )
