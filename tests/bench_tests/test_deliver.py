"""bench.deliver's plumbing: each workload's study flags parse, and the JSON recipe batches a
token budget through the workload's batch sampler. The measurements are the benchmark's."""

from __future__ import annotations

import pytest

from bench._harness import option_flags
from bench.deliver import WORKLOADS, sampling
from objectives import load_workload
from tuner.study import _objective_options, parser


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workloads_options_reach_the_study_as_flags(name: str) -> None:
    objective, options = WORKLOADS[name]
    args = parser().parse_args(
        ["--hardware", "auto", "--objective", objective, *option_flags(options)]
    )
    assert _objective_options(args) == options


def test_the_json_recipe_gives_a_token_budget_to_the_batch_sampler() -> None:
    workload = load_workload("text", {"sequences": 64, "vocab_size": 32, "max_length": 32})
    kwargs = sampling(workload, {"batch_param": "max_tokens", "batch": 256})
    assert set(kwargs) == {"batch_sampler"}
    batches = list(kwargs["batch_sampler"])
    assert sum(len(batch) for batch in batches) == 64
    assert all(
        len(batch) * max(workload.dataset.lengths[i] for i in batch) <= 256 for batch in batches
    )
    assert sampling(workload, {"batch_param": "batch_size", "batch": 32}) == {"shuffle": True}
