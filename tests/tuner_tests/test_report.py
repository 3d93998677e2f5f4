"""The HTML report: written from a study of real measurements, opened offline in Chromium.

The study is made here, trial by trial, the way the tuner records one: a real DataLoader loop
per setting (timed per step), the machine sampled while it runs, the user attrs, the diagnosis,
the two CSV artifacts uploaded before ``tell``. Its dataset waits on every sample without using
a CPU (as a remote read does) and its step takes 3 ms, so the baseline starves and a setting
with workers does not: the timeline must show the data wait going away.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.distributions import CategoricalDistribution, IntDistribution
from torch.utils.data import DataLoader

from objectives import Workload
from storage import open_artifact_store, read_trial_text, upload_trial_csv
from tests.cli_runner import CliRunner
from tests.conftest import forked_cli
from tests.tuner_tests.workloads import Vectors
from tuner._cli import run_cli as run_main
from tuner._naming import (
    BASELINE_PYTORCH_DEFAULT,
    BASELINE_RULE_OF_THUMB,
    CEILING_ATTR,
    METRIC_NAME,
)
from tuner.insight import efficiency
from tuner.insight._diagnosis import diagnose
from tuner.machine import detect_fingerprint
from tuner.report import main
from tuner.search._settings import LoaderSettings
from tuner.trial._measure import count_samples
from tuner.trial._telemetry import (
    STEPS_CSV,
    TELEMETRY_CSV,
    StepTimeline,
    TelemetrySampler,
    collect_trial_telemetry,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STEP_S = 0.003


class SlowSource(Vectors):
    """Each sample waits 0.3 ms on something outside the CPU."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.0003)
        return super().__getitem__(index)


def _device_like_step(batch: Any, device: torch.device) -> None:
    batch[0].sum().item()
    time.sleep(STEP_S)


def starving() -> Workload:
    return Workload(
        name="starving",
        dataset=SlowSource(size=2048),
        step=_device_like_step,
        default_batch_size=16,
        batch_size_range=(8, 32),
    )


def require_chromium() -> None:
    """Skip without Debian's chromium locally; under CI a missing browser is a failure."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is required in CI: apt-get install -y chromium")
        pytest.skip(f"no {CHROMIUM}")


def _loop(workload: Workload, settings: LoaderSettings, window_s: float) -> dict[str, Any]:
    """The measurement loop, with the per-step timeline the tuner's child records."""
    loader = DataLoader(workload.dataset, **settings.build_dataloader_kwargs(workload, 0))
    step = workload.train_step(torch.device("cpu"))
    timeline = StepTimeline()
    iterator = iter(loader)
    for _ in range(2):
        step(next(iterator))
    samples = steps = 0
    wait_s = 0.0
    window_started_at = time.monotonic()
    started = time.perf_counter()
    while time.perf_counter() - started < window_s:
        began = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            batch = next(iterator)
        got = time.perf_counter()
        step(batch)
        done = time.perf_counter()
        timeline.add(began - started, got - began, done - got)
        samples += count_samples(batch)
        steps += 1
        wait_s += got - began
    elapsed = time.perf_counter() - started
    del iterator
    return {
        "samples_per_sec": samples / elapsed,
        "data_wait_fraction": wait_s / elapsed,
        "batches": steps,
        "samples": samples,
        "window_s": elapsed,
        "device": "cpu",
        "window_started_at": window_started_at,
        "timeline": timeline.rows(),
    }


DISTRIBUTIONS = {
    "num_workers": IntDistribution(0, 4),
    "batch_size": CategoricalDistribution([8, 16, 32]),
    "prefetch_factor": IntDistribution(1, 8),
}


def add_measured_trial(
    study: optuna.Study,
    store: Any,
    settings: LoaderSettings,
    window_s: float = 0.4,
    **user_attrs: Any,
) -> optuna.trial.FrozenTrial:
    """One real trial of ``starving`` under ``settings``, recorded as the tuner records it."""
    params = {"num_workers": settings.num_workers, "batch_size": settings.batch}
    if settings.prefetch_factor is not None:
        params["prefetch_factor"] = settings.prefetch_factor
    study.enqueue_trial(params)
    trial = study.ask({k: v for k, v in DISTRIBUTIONS.items() if k in params})
    sampler = TelemetrySampler()
    stop = threading.Event()
    sampler.start(time.monotonic())

    def tick() -> None:  # what the supervisor does every 0.2 s
        while not stop.wait(0.1):
            sampler.sample(time.monotonic())

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        attrs = _loop(starving(), settings, window_s)
    finally:
        stop.set()
        ticker.join()
    telemetry = collect_trial_telemetry(sampler, attrs)
    attrs.update(telemetry.attrs)
    attrs["settings"] = settings.to_attrs()
    attrs["machine"] = {
        "profile": "local-test",
        **detect_fingerprint().to_attrs(),
    }
    attrs.update(user_attrs)
    ceiling = study.user_attrs.get(CEILING_ATTR)
    if ceiling:
        attrs["efficiency"] = efficiency(attrs["samples_per_sec"], ceiling)
    diagnosis = diagnose(attrs)
    if diagnosis is not None:
        attrs.update(diagnosis.to_attrs())
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    for name, text in telemetry.artifacts().items():
        upload_trial_csv(store, study, trial, name, text)
    study.tell(trial, attrs["samples_per_sec"])
    return study.trials[-1]


def build_measured_study(url: str, name: str = "starving@local-test") -> optuna.Study:
    """Both baselines and three tuned settings of ``starving``, each really measured."""
    study = optuna.create_study(storage=url, study_name=name, direction="maximize")
    study.set_metric_names([METRIC_NAME])
    study.set_user_attr("batch_param", "batch_size")
    # The step alone: 16 samples per 3 ms step, and a little for the sum.
    study.set_user_attr(CEILING_ATTR, 16 / (STEP_S + 0.0002))
    store = open_artifact_store(url)
    add_measured_trial(
        study,
        store,
        LoaderSettings(batch=16, num_workers=0, torch_num_threads=1),
        baseline=BASELINE_PYTORCH_DEFAULT,
    )
    add_measured_trial(
        study,
        store,
        LoaderSettings(batch=16, num_workers=2, prefetch_factor=2, torch_num_threads=1),
        baseline=BASELINE_RULE_OF_THUMB,
    )
    for workers, batch, prefetch in ((1, 8, 2), (2, 16, 4), (2, 32, 2)):
        settings = LoaderSettings(
            batch=batch, num_workers=workers, prefetch_factor=prefetch, torch_num_threads=1
        )
        add_measured_trial(study, store, settings)
    return study


def test_trials_carry_their_csv_artifacts(measured_url: str) -> None:
    study = optuna.load_study(study_name="starving@local-test", storage=measured_url)
    store = open_artifact_store(measured_url)
    baseline, *_ = study.trials
    steps = read_trial_text(store, study, baseline, STEPS_CSV)
    telemetry = read_trial_text(store, study, baseline, TELEMETRY_CSV)
    assert steps is not None and steps.startswith("t_s,steps,data_wait_s,step_s\n")
    assert telemetry is not None and telemetry.startswith("t_s,in_window,cpu_percent,")
    assert baseline.user_attrs["data_wait_fraction"] > 0.5
    assert baseline.user_attrs["bottleneck"] in ("input-bound", "cpu-bound")
    assert "timeline" not in baseline.user_attrs
    best = max(study.trials, key=lambda t: t.value or 0.0)
    assert best.value > 1.5 * baseline.value  # workers hide the wait
    assert best.user_attrs["data_wait_fraction"] < baseline.user_attrs["data_wait_fraction"]


def _report(tmp_path: Path, url: str, runner: CliRunner, *extra: str) -> Any:
    return forked_cli(
        runner,
        "tuner.report",
        "--hardware",
        "auto",
        "--storage",
        url,
        "--out",
        str(tmp_path / "report.html"),
        *extra,
        timeout=120,
    )


@pytest.mark.browser
def test_the_report_opens_offline_and_holds_its_plots(
    tmp_path: Path, measured_url: str, cli_runner: CliRunner
) -> None:
    require_chromium()
    result = _report(tmp_path, measured_url, cli_runner, "--study-name", "starving@local-test")
    assert result.returncode == 0, result.stderr
    page_file = tmp_path / "report.html"
    text = page_file.read_text()
    assert not re.search(r"<script[^>]+src=", text)  # plotly.js is inline
    assert not re.search(r"<link[^>]+href=", text)
    for div in ("throughput", "history", "importances", "timeline"):
        assert f'id="{div}"' in text, div
    for label in (BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB, "best", "ceiling"):
        assert label in text

    from playwright.sync_api import sync_playwright

    requested: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda request: requested.append(request.url))
            # Offline: anything but the file itself is refused.
            page.route(
                re.compile(r"^(?!file:).*"), lambda route: route.abort("internetdisconnected")
            )
            page.goto(page_file.as_uri())
            for div in ("throughput", "history", "importances", "timeline"):
                page.wait_for_selector(f"#{div} .main-svg", timeout=15_000)
            # The timeline has a panel per compared trial, each a step and a data-wait area.
            assert page.locator("#timeline .scatterlayer .trace").count() >= 6
            assert page.locator("table tr").count() == 4  # header, two baselines, best
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert [url for url in requested if not url.startswith("file:")] == []


def _report_here(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``tuner.report`` in this process (its exit code and stderr): the CLI's code path."""
    with pytest.raises(SystemExit) as exited:
        run_main("tuner.report", main, ["--hardware", "auto", *argv])
    return int(exited.value.code or 0), capsys.readouterr().err


def test_no_study_is_exit_code_1(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "report.html")
    absent = f"sqlite:///{tmp_path / 'absent.db'}"
    code, err = _report_here(capsys, "--storage", absent, "--out", out)
    assert code == 1 and "no study" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "absent.db").exists()
    code, err = _report_here(capsys, "--storage", sqlite_url, "--study-name", "nope", "--out", out)
    assert code == 1 and "no study nope" in err
    optuna.create_study(storage=sqlite_url, study_name="empty")
    code, err = _report_here(capsys, "--storage", sqlite_url, "--study-name", "empty", "--out", out)
    assert code == 1 and "no completed trial" in err
    assert not (tmp_path / "report.html").exists()


def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    optuna.create_study(storage=sqlite_url, study_name="s")
    for args in (
        ["--storage", sqlite_url, "--out", str(tmp_path / "no" / "dir" / "r.html")],
        ["--storage", "nosuchdb://x", "--out", str(tmp_path / "r.html")],
        ["--storage", sqlite_url, "--out", str(tmp_path)],
        ["--storage", sqlite_url],
    ):
        code, err = _report_here(capsys, "--study-name", "s", *args)
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1, err
