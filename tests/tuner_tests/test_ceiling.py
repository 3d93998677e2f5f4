"""The ceiling: the step alone on a prepared batch, and the early stop once the best is near it.

``compute_bound`` is a workload whose loader is trivially fast (a batch is a view of a prebuilt
tensor) and whose step takes 50 ms without using a CPU, as a GPU-bound step does: every
DataLoader setting reaches the ceiling, so a study of it should stop once the baselines and the
sampler's random start are done and its best has been re-measured.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import optuna
import pytest
import torch
from optuna.distributions import IntDistribution
from torch.utils.data import Dataset

from objectives import Workload, text_workload
from tests.conftest import run_cli
from tests.tuner_tests.workloads import fast
from tuner._naming import CEILING_ATTR, REMEASURED_ATTR
from tuner.insight import efficiency
from tuner.run import N_STARTUP_TRIALS
from tuner.run._ceiling import ceiling_stop_message, near_ceiling
from tuner.search._settings import LoaderSettings
from tuner.trial import _ceiling as _trial_ceiling
from tuner.trial._ceiling import measure_step_rates, strata
from tuner.trial._measure import measure

STEP_S = 0.05
BATCH = 64
CPU = torch.device("cpu")


def measure_ceiling(*args: Any, **kwargs: Any) -> float:
    """The step's best samples/sec, as the study stores it."""
    return measure_step_rates(*args, **kwargs).ceiling


class Prebuilt(Dataset):
    """Samples that cost nothing: a batch is a slice of one tensor made up front."""

    def __init__(self, size: int = 4096, width: int = 64) -> None:
        self.data = torch.rand(size, width, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.data[: len(indices)].clone()  # a view would ship the whole storage


def _as_is(batch: torch.Tensor) -> torch.Tensor:
    return batch


def _device_bound_step(batch: torch.Tensor, device: torch.device) -> None:
    batch.sum().item()
    time.sleep(STEP_S)


def compute_bound() -> Workload:
    return Workload(
        name="compute_bound",
        dataset=Prebuilt(),
        step=_device_bound_step,
        collate_fn=_as_is,
        default_batch_size=BATCH,
        batch_size_range=(BATCH, BATCH),
    )


def test_the_ceiling_is_the_step_alone_and_a_fast_loader_reaches_it() -> None:
    workload = compute_bound()
    settings = LoaderSettings(batch=BATCH, num_workers=0, torch_num_threads=1)
    ceiling = measure_ceiling(workload, settings, CPU, window_s=0.5, warmup_s=0.05)
    assert 0 < ceiling <= BATCH / STEP_S  # each step sleeps STEP_S at least
    measured = measure(workload, settings, CPU, window_s=0.5, warmup_s=0.05)
    share = efficiency(measured.samples_per_sec, ceiling)
    # Two windows of the same sleeping step, one with a loader whose batch is a slice: within
    # what a busy machine's scheduling moves a 50 ms sleep by, which a slow loader is not
    # (the test below: under half).
    assert share is not None and share >= 0.8


def test_a_slow_loader_stays_far_below_the_ceiling() -> None:
    workload = fast()  # its step is a sum: the loader is everything
    settings = LoaderSettings(batch=32, num_workers=0, torch_num_threads=1)
    ceiling = measure_ceiling(workload, settings, CPU, window_s=0.3, warmup_s=0.05)
    measured = measure(workload, settings, CPU, window_s=0.3, warmup_s=0.05)
    assert efficiency(measured.samples_per_sec, ceiling) < 0.5  # type: ignore[operator]


def test_the_ceiling_is_the_best_over_the_batches_tried() -> None:
    workload = fast()
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    small = measure_ceiling(workload, settings, CPU, window_s=0.2, warmup_s=0.0)
    either = measure_ceiling(workload, settings, CPU, window_s=0.2, warmup_s=0.0, batches=[8, 64])
    # The step costs about the same per batch whatever its size: 64 per step is far faster.
    assert either > 2 * small


def _one_then_many(dataset: Any, batch: int, seed: int) -> list[list[int]]:
    """A plan whose batches alternate 1 and ``batch`` samples, the single one first."""
    return [[0] if number % 2 == 0 else list(range(batch)) for number in range(40)]


def test_under_a_batch_sampler_the_ceiling_is_the_epochs_batches_not_its_first(
    clock: StepClock,
) -> None:
    workload = Workload(
        name="uneven",
        dataset=Prebuilt(),
        make_step=lambda device: _ClockedStep(clock, lambda samples: STEP_S),
        collate_fn=_as_is,
        batch_sampler=_one_then_many,
        batch_param="tokens",
        default_batch_size=BATCH,
        batch_size_range=(BATCH, BATCH),
    )
    settings = LoaderSettings(batch=BATCH, num_workers=0, torch_num_threads=1)
    ceiling = measure_ceiling(workload, settings, CPU, window_s=0.5, warmup_s=0.0)
    # Every step takes STEP_S, whatever its samples: the epoch's rate is its mean batch's,
    # 32.5 samples a step; the first batch alone gives 1 / STEP_S, the large one alone twice
    # the epoch's.
    epoch_rate = (1 + BATCH) / 2 / STEP_S
    assert ceiling == pytest.approx(epoch_rate, rel=0.02)


@pytest.mark.parametrize("tokens", [1024, 2048, 8192])
def test_the_chosen_batches_of_a_token_budget_hold_the_epochs_mean_samples(tokens: int) -> None:
    text = text_workload()
    assert text.batch_sampler is not None
    plan = [list(batch) for batch in text.batch_sampler(text.dataset, tokens, 0)]
    mean = sum(map(len, plan)) / len(plan)
    for count in range(1, 9):
        chosen = strata(plan, count)
        assert len(chosen) == count
        assert sum(map(len, chosen)) / count == pytest.approx(mean, rel=0.03)


def test_the_main_processs_peak_is_kept_per_batch_value() -> None:
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    steps = measure_step_rates(
        fast(), settings, CPU, window_s=0.05, warmup_s=0.0, batches=[8, 64, 512]
    )
    assert sorted(steps.peak_bytes) == [8, 64, 512]
    peaks = [steps.peak_bytes[batch] for batch in (8, 64, 512)]
    # A high-water mark, batch by batch. Estimated from PSS, which drops a little whenever
    # another process maps the same libraries: never down by more than that jitter.
    assert peaks[0] > 0
    assert all(later >= earlier - 4 * 2**20 for earlier, later in itertools.pairwise(peaks))


def _study_with_one_measured_trial(url: str, workload: Workload, batch: int) -> optuna.Study:
    settings = LoaderSettings(batch=batch, num_workers=0, torch_num_threads=1)
    study = optuna.create_study(storage=url, direction="maximize")
    study.set_user_attr(
        CEILING_ATTR, measure_ceiling(workload, settings, CPU, window_s=0.4, warmup_s=0.05)
    )
    measured = measure(workload, settings, CPU, window_s=0.4, warmup_s=0.05)
    study.add_trial(
        optuna.trial.create_trial(
            value=measured.samples_per_sec,
            params={"num_workers": 0},
            distributions={"num_workers": IntDistribution(0, 4)},
            user_attrs={"settings": settings.to_attrs(), **measured.to_attrs()},
        )
    )
    return study


def test_the_ceiling_is_the_best_over_the_thread_counts_tried() -> None:
    workload = fast()
    settings = LoaderSettings(batch=64, num_workers=0, torch_num_threads=1)
    rate = measure_ceiling(workload, settings, CPU, window_s=0.2, warmup_s=0.0, threads=[1, 2])
    assert rate > 0 and torch.get_num_threads() == 2  # both were tried, the last one stays set


class _SleepingStep:
    """A step that takes ``step_s(samples)`` seconds of sleep and no CPU."""

    def __init__(self, step_s: Callable[[int], float]) -> None:
        self.step_s = step_s

    def __call__(self, batch: torch.Tensor) -> None:
        time.sleep(self.step_s(len(batch)))

    def optimizer_step(self) -> None:
        pass


def sleeping(name: str, step_s: Callable[[int], float], largest: int) -> Workload:
    """A workload of prebuilt samples whose step sleeps ``step_s(samples)`` seconds."""
    return Workload(
        name=name,
        dataset=Prebuilt(),
        make_step=lambda device: _SleepingStep(step_s),
        collate_fn=_as_is,
        default_batch_size=BATCH,
        batch_size_range=(8, largest),
    )


class StepClock:
    """``time`` for the step timer: it moves only by the seconds a step says it took, so a climb
    over steps of 1 ms and 0.5 s is read exactly, whatever else the machine runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-9  # each reading later than the last, as a real clock's
        return self.now

    def process_time(self) -> float:
        return 0.0


class _ClockedStep:
    """A step that takes ``step_s(samples)`` seconds of :class:`StepClock` and no CPU."""

    def __init__(self, clock: StepClock, step_s: Callable[[int], float]) -> None:
        self.clock, self.step_s = clock, step_s

    def __call__(self, batch: torch.Tensor) -> None:
        self.clock.now += self.step_s(len(batch))

    def optimizer_step(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    """The step timer's clock, for steps made with :func:`clocked`."""
    step_clock = StepClock()
    monkeypatch.setattr(_trial_ceiling, "time", step_clock)
    return step_clock


def clocked(clock: StepClock, step_s: Callable[[int], float], largest: int) -> Workload:
    """:func:`sleeping`'s workload with steps timed on ``clock`` instead of slept."""
    return Workload(
        name="clocked",
        dataset=Prebuilt(),
        make_step=lambda device: _ClockedStep(clock, step_s),
        collate_fn=_as_is,
        default_batch_size=BATCH,
        batch_size_range=(8, largest),
    )


def test_the_climb_stops_at_a_batch_size_far_slower_than_the_best(clock: StepClock) -> None:
    # 1 ms per step up to 64 samples and 0.5 s beyond: the cliff.
    workload = clocked(clock, lambda samples: 0.001 if samples <= 64 else 0.5, 4096)
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    steps = measure_step_rates(
        workload, settings, CPU, 0.1, 0.0, batches=[4096, 2048, 1024, 128, 64, 8]
    )
    # The best is below the cliff, found smallest first: 64 samples a millisecond.
    assert steps.ceiling == pytest.approx(64 / 0.001, rel=1e-3)
    # 128 fell off the cliff, so 1024 and above were never tried.
    assert sorted(steps.rates[1]) == [8, 64, 128]


def test_the_climb_stops_past_the_best_once_a_step_is_slow(clock: StepClock) -> None:
    # 0.1 s a step at 8 samples (80 samples/s), 0.25 s at 64 (the best, 256 samples/s), 0.6 s
    # at 128 (213 samples/s: past the best, not half below it), 1.2 s at 256.
    seconds = {8: 0.1, 64: 0.25, 128: 0.6}
    workload = clocked(clock, lambda samples: seconds.get(samples, 1.2), 256)
    settings = LoaderSettings(batch=8, num_workers=0, torch_num_threads=1)
    steps = measure_step_rates(workload, settings, CPU, 0.1, 0.0, batches=[8, 64, 128, 256])
    assert sorted(steps.rates[1]) == [8, 64, 128]  # 256's steps were not taken
    assert steps.rates[1][64] == pytest.approx(256, rel=1e-3)
    assert steps.rates[1][128] == pytest.approx(128 / 0.6, rel=1e-3)


def test_a_best_near_the_ceiling_stops_the_study_once_re_measured(sqlite_url: str) -> None:
    study = _study_with_one_measured_trial(sqlite_url, compute_bound(), BATCH)
    assert near_ceiling(study, fraction=0.95) is not None
    assert ceiling_stop_message(study, fraction=0.95) is None  # one window decides nothing
    settings = LoaderSettings.from_attrs(study.trials[0].user_attrs["settings"])
    again = measure(compute_bound(), settings, CPU, window_s=0.4, warmup_s=0.05)
    study.set_user_attr(REMEASURED_ATTR, {"0": again.samples_per_sec})
    message = ceiling_stop_message(study, fraction=0.95)
    assert message is not None and message.startswith("stopping early: trial 0")
    assert "re-measured" in message and "of the ceiling" in message


def test_no_stop_before_the_first_trials_are_done(sqlite_url: str) -> None:
    study = _study_with_one_measured_trial(sqlite_url, compute_bound(), BATCH)
    study.set_user_attr(REMEASURED_ATTR, {"0": study.trials[0].value})
    assert ceiling_stop_message(study, min_trials=2, fraction=0.95) is None
    assert ceiling_stop_message(study, min_trials=1, fraction=0.95) is not None


def test_a_best_far_from_the_ceiling_goes_on(sqlite_url: str) -> None:
    study = _study_with_one_measured_trial(sqlite_url, fast(), 32)
    assert ceiling_stop_message(study) is None
    bare = optuna.create_study(storage=sqlite_url, study_name="no-ceiling", direction="maximize")
    assert ceiling_stop_message(bare) is None


@pytest.mark.slow
def test_a_study_of_a_compute_bound_workload_stops_early(sqlite_url: str) -> None:
    """A sampler's study (``gp``: the default ``model`` stops on its own rules, sooner) stops near
    the ceiling, though not before its random start."""
    result = run_cli(
        "tuner.study",
        "--hardware",
        "auto",
        "--sampler",
        "gp",
        "--objective",
        "tests.tuner_tests.test_ceiling:compute_bound",
        "--n-trials",
        "14",
        "--trial-seconds",
        "0.5",
        "--warmup-seconds",
        "0.1",
        "--no-progress",
        "--no-probe-batch",
        "--remeasure-top",
        "0",
        "--storage",
        sqlite_url,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "stopping early" in result.stdout + result.stderr
    (summary,) = optuna.get_all_study_summaries(sqlite_url)
    study = optuna.load_study(study_name=summary.study_name, storage=sqlite_url)
    ceiling = study.user_attrs[CEILING_ATTR]
    assert 0.8 * BATCH / STEP_S < ceiling <= BATCH / STEP_S
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    # Not before the baselines and the random start, and on a re-measured best.
    assert 2 + N_STARTUP_TRIALS <= len(study.trials) < 14
    assert all(trial.user_attrs["efficiency"] > 0.5 for trial in trials)
    assert study.user_attrs[REMEASURED_ATTR]
