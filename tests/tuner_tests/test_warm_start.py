from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from objectives import Workload
from tests.conftest import run_cli
from tests.tuner_tests.workloads import Vectors
from tuner.fleet._warm_start import _adapted
from tuner.machine import Profile, detect_fingerprint, scale_workers
from tuner.search import LoaderSettings, SearchSpace

FAST = "tests.tuner_tests.workloads:fast"
QUICK = [
    "--trial-seconds",
    "0.3",
    "--warmup-seconds",
    "0.1",
    "--no-progress",
    "--remeasure-top",
    "0",
]


@pytest.mark.slow
def test_a_new_profile_starts_from_the_most_similar_ones(tmp_path: Path) -> None:
    fingerprint = detect_fingerprint()
    memory_gib = fingerprint.usable_memory_bytes / 2**30
    # Two profiles that both describe this machine, so both may be tuned here.
    catalog = {
        "box-a": {"vcpus": fingerprint.usable_cpus, "memory_gib": round(memory_gib, 1)},
        "box-b": {"vcpus": fingerprint.usable_cpus, "memory_gib": round(memory_gib * 1.05, 1)},
    }
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(catalog))
    storage = f"sqlite:///{tmp_path / 't.db'}"
    common = ["--objective", FAST, "--storage", storage, "--profiles", str(profiles), *QUICK]
    first = run_cli("tuner.study", "--hardware", "box-a", "--n-trials", "4", *common)
    assert first.returncode == 0, first.stderr
    second = run_cli("tuner.study", "--hardware", "box-b", "--n-trials", "3", *common)
    assert second.returncode == 0, second.stderr
    assert f"warm start from {FAST}@box-a" in second.stderr
    trials = optuna.load_study(study_name=f"{FAST}@box-b", storage=storage).trials
    warm = [t for t in trials if t.user_attrs.get("warm_start_from")]
    # Right after the two baselines and the model's predicted best (the default strategy's).
    assert trials[2].user_attrs["model_seed"] == "predicted-best"
    assert [t.number for t in warm] == [3]
    assert warm[0].user_attrs["warm_start_from"] == f"{FAST}@box-a"
    listed = run_cli("tuner.profiles", "list", "--storage", storage, "--profiles", str(profiles))
    assert listed.returncode == 0 and "box-a" in listed.stdout and "box-b" in listed.stdout


def test_workers_scale_with_the_cpu_count() -> None:
    assert scale_workers(6, 8, 4) == 3
    assert scale_workers(3, 4, 96) == 72
    assert Profile("x", 4, 2**34).gpu_summary() == "no GPU"


def test_a_warm_start_is_bound_by_the_fixed_values() -> None:
    """A stored best with 8 persistent workers at prefetch 4, queued into a study run with
    ``--fix persistent_workers=false --fix prefetch_factor=2``, runs the user's values."""
    workload = Workload(name="v", dataset=Vectors(size=512), batch_size_range=(8, 64))
    space = SearchSpace(
        workload=workload,
        max_workers=16,
        max_threads=2,
        cuda=False,
        fixed={"persistent_workers": False, "prefetch_factor": 2},
    )
    stored = LoaderSettings(batch=32, num_workers=8, prefetch_factor=4, persistent_workers=True)
    box = Profile("box", 4, 2**34)
    adapted = _adapted(stored, box, box, space)
    assert adapted.num_workers == 8 and adapted.batch == 32
    assert adapted.persistent_workers is False and adapted.prefetch_factor == 2
