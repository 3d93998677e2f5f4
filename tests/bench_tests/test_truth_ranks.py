"""bench.truth's and bench.ranks' pure parts: their arguments, grids, contenders, ratios and
tables, on hand-made numbers. The measurements are the benchmarks'."""

from __future__ import annotations

import pytest

from bench import ranks, truth
from bench._harness import (
    GRID_BATCHES,
    QUICK,
    figure_text,
    grid_share,
    plain_grid,
    plain_loader,
    settings_key,
    spread,
    study_flags,
)
from objectives import load_workload
from tuner.search import LoaderSettings


def test_quick_replaces_the_defaults_but_not_what_was_given() -> None:
    args = truth.parse_args(["--quick", "--workloads", "storage", "--rounds", "4"])
    assert args.workloads == ["storage"]
    assert args.rounds == 4
    assert (args.window_s, args.n_trials, args.grid_size) == (
        QUICK["window_s"],
        QUICK["n_trials"],
        QUICK["grid_size"],
    )
    assert study_flags(args) == [
        "--trial-seconds",
        str(QUICK["trial_seconds"]),
        "--warmup-seconds",
        str(QUICK["warmup_seconds"]),
        "--n-trials",
        "3",
    ]


def test_without_quick_the_studies_keep_their_own_trial_count() -> None:
    args = truth.parse_args([])
    assert args.workloads == ["image", "text", "storage", "off_cpu"]
    assert "--n-trials" not in study_flags(args)
    assert ranks.parse_args([]).workloads == ["image", "storage"]


@pytest.mark.parametrize(
    ("parse", "argv"),
    [
        (truth.parse_args, ["--workloads", "nope"]),
        (truth.parse_args, ["--workloads", ","]),
        (truth.parse_args, ["--rounds", "0"]),
        (truth.parse_args, ["--window-s", "0"]),
        (ranks.parse_args, ["--workloads", "text"]),  # batches through its own batch sampler
        (ranks.parse_args, ["--nproc-per-node", "1"]),
    ],
)
def test_bad_arguments_exit_2(parse, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m bench.")


def test_the_figure_agrees_within_5_percent_of_the_plain_median() -> None:
    assert truth.agreement(105.0, [98.0, 100.0, 103.0]) == {
        "plain_median": 100.0,
        "ratio": 1.05,
        "within": True,
    }
    assert truth.agreement(106.0, [100.0])["within"] is False
    assert truth.agreement(94.0, [100.0])["within"] is False
    assert truth.agreement(100.0, [])["within"] is None


def test_the_pick_share_is_of_the_best_grid_median() -> None:
    share = grid_share([90.0, 95.0, 100.0], [[100.0], [80.0, 120.0, 110.0], []])
    assert share["best_index"] == 1
    assert share["share"] == pytest.approx(95.0 / 110.0)
    assert share["reached"] is False
    assert grid_share([105.0], [[100.0]])["reached"] is True
    assert grid_share([], [[100.0]]) == {"best_index": 0, "share": None, "reached": None}
    assert grid_share([1.0], [[]])["best_index"] is None


def test_the_off_cpu_grid_spans_workers_past_the_cores_and_both_thread_counts() -> None:
    grid = truth.off_cpu_grid(cores=2)
    assert {s.num_workers for s in grid} == {0, 1, 2, 3, 4}
    assert {s.batch for s in grid} == set(GRID_BATCHES)
    assert {s.torch_num_threads for s in grid} == {1, 2}
    assert len(grid) == 5 * 3 * 2 == len({settings_key(s) for s in grid})
    without = [s for s in grid if s.num_workers == 0]
    assert all(s.prefetch_factor is None and not s.persistent_workers for s in without)
    assert all(s.prefetch_factor == 2 and s.persistent_workers for s in grid if s.num_workers)
    assert len(truth.off_cpu_grid(cores=1)) == 4 * 3  # one thread count only
    assert truth.off_cpu_grid(cores=2, size=2) == grid[:2]


def test_repeated_values_make_one_grid_setting() -> None:
    assert len(plain_grid([0, 0, 1], [32], [1, 1])) == 2


def test_the_rank_grid_shares_the_cores_and_spans_the_knobs() -> None:
    image = ranks.rank_grid("image", 2, 2, {"collate": ("float", "uint8")})
    assert {s.num_workers for s in image} == {0, 1, 2, 3}
    assert {s.torch_num_threads for s in image} == {1}
    assert {s.knobs["collate"] for s in image} == {"float", "uint8"}
    assert len(image) == 4 * 3 * 2
    storage = ranks.rank_grid("storage", 2, 2, {})
    assert max(s.num_workers for s in storage) == 96  # half the 1-rank benchmarks' 192
    assert len(storage) == 10 * 3
    assert {s.torch_num_threads for s in ranks.rank_grid("image", 8, 2, {})} == {1, 4}
    assert len(ranks.rank_grid("storage", 2, 2, {}, size=3)) == 3


def _settings(workers: int, batch: int = 32) -> LoaderSettings:
    return plain_grid([workers], [batch], [1])[0]


def test_a_pick_that_is_a_grid_setting_is_measured_once_and_judged_in_the_grid() -> None:
    grid = [_settings(0), _settings(1), _settings(2)]
    picks = {"pick": _settings(1), "clamped": _settings(8)}
    entries = ranks.contenders(picks, grid, 2)
    assert [label for label, _ in entries] == [
        "2-rank pick",
        "1-rank pick, clamped",
        "grid",
        "grid",
    ]
    values = [[96.0, 97.0], [50.0], [80.0], [100.0, 98.0]]  # pick, clamped, w0, w2
    judged = ranks.verdict(entries, values, grid)
    assert judged["grid_best"] == _settings(2)
    assert judged["shares"]["2-rank pick"] == pytest.approx(96.5 / 99.0)
    assert judged["shares"]["1-rank pick, clamped"] == pytest.approx(50.0 / 99.0)


def test_the_ranks_table_and_summary_read_the_shares() -> None:
    result = {
        "grid_best": "w2 b32 pf2 persist t1",
        "shares": {"2-rank pick": 0.965, "1-rank pick, clamped": 0.5},
        "rows": [
            {
                "label": "2-rank pick",
                "setting": "w1 b32 pf2 persist t1",
                "node_samples_per_sec": [96.0, 98.0],
            },
            {
                "label": "grid",
                "setting": "w2 b32 pf2 persist t1",
                "node_samples_per_sec": [100.0, 98.0],
            },
            {"label": "grid", "setting": "w0 b32 t1", "node_samples_per_sec": []},
        ],
    }
    lines = ranks.table(result).splitlines()
    assert lines[2].startswith(
        "| grid (grid's best) | `w2 b32 pf2 persist t1` | 99 (98-100) | 100.0% |"
    )
    assert lines[3].endswith("| 97 (96-98) | 98.0% |")
    assert lines[4].endswith("| - | - |")
    line = ranks.summary_line("image", result, 2)
    assert "2-rank pick 96.5%" in line and "1-rank pick, clamped 50.0%" in line
    assert line.endswith("(goal met)")


def test_the_truth_row_and_summary() -> None:
    result = {
        "label": "w2 b64 pf2 persist t1",
        "figure": 500.0,
        "holdout_rounds": [480.0, 500.0, 520.0],
        "plain": [470.0, 490.0, 480.0],
        "tuner_now": [500.0, 490.0],
        **truth.agreement(500.0, [470.0, 490.0, 480.0]),
        "pick_share": 0.97,
        "grid_best": "w3 b64 pf2 persist t1",
    }
    row = truth.truth_row("off_cpu", result)
    assert row == [
        "off_cpu",
        "`w2 b64 pf2 persist t1`",
        "500 (480-520)",
        "480 (470-490)",
        "1.042",
        "yes",
        "495 (490-500)",
        "0.970",
    ]
    line = truth.summary_line("off_cpu", result)
    assert "ratio 1.042 (within 5%)" in line
    assert "pick 97.0% of the grid's best `w3 b64 pf2 persist t1`" in line
    assert figure_text(1234.4, []) == "1,234"
    assert spread([]) == "-"


def test_the_plain_loader_is_a_users_loader() -> None:
    workload = load_workload("storage", {"samples": 64, "latency_ms": 0})
    _, loader = plain_loader(workload, _settings(0, batch=16), "batch_size")
    assert (loader.batch_size, loader.drop_last, loader.num_workers) == (16, True, 0)
    assert type(loader.sampler).__name__ == "RandomSampler"
    text = load_workload("text", {"sequences": 64, "vocab_size": 32, "max_length": 32})
    budget = LoaderSettings(batch=256, num_workers=0)
    _, loader = plain_loader(text, budget, "max_tokens")
    assert loader.batch_size is None
    assert sum(len(batch) for batch in loader.batch_sampler) == 64
    with pytest.raises(ValueError, match="its own batch sampler"):
        plain_loader(text, budget, "max_tokens", sharded=True)
