"""``tuner.dashboard`` in a real browser: a short real study, its note, its trials and their
attrs and artifacts, as a user sees them in headless Chromium (Debian's, driven by Playwright).

Screenshots are saved under the test's tmp_path and copied to /tmp/dashboard.png (the note)
and /tmp/dashboard-trial.png (a trial with its artifacts), to look at after a run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests.conftest import ROOT, free_port, run_cli
from tests.tuner_tests.test_report import (
    CHROMIUM,
    CHROMIUM_ARGS,
    build_measured_study,
    require_chromium,
)
from tuner._cli import run_cli as run_main
from tuner.dashboard import main
from tuner.insight._note import save_study_note


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A short real study and a measured one in one database, served by ``tuner.dashboard``."""
    require_chromium()
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    result = run_cli(
        "tuner.study",
        "--hardware",
        "auto",
        "--objective",
        "tests.tuner_tests.workloads:fast",
        "--n-trials",
        "4",
        "--trial-seconds",
        "0.4",
        "--warmup-seconds",
        "0.1",
        "--no-progress",
        "--remeasure-top",
        "1",
        "--remeasure-rounds",
        "1",
        "--storage",
        url,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    (name,) = optuna.get_all_study_names(url)
    save_study_note(optuna.load_study(study_name=name, storage=url))
    build_measured_study(url)  # trials with telemetry.csv and steps.csv artifacts

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tuner.dashboard", "--storage", url, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "tuner.dashboard did not answer within 30 s"
            time.sleep(0.2)
        yield base, name
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.slow
@pytest.mark.browser
def test_the_dashboard_shows_the_study_its_note_trials_and_artifacts(
    dashboard: tuple[str, str], tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, name = dashboard
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(20_000)

            page.goto(f"{base}/dashboard")
            expect(page.get_by_text(name, exact=False).first).to_be_visible()
            expect(page.get_by_text("starving@local-test").first).to_be_visible()

            page.goto(f"{base}/dashboard/studies/1/note")
            expect(page.get_by_text("Speedup:", exact=False).first).to_be_visible()
            expect(page.get_by_text("Diagnosis:", exact=False).first).to_be_visible()
            expect(page.get_by_text("loader = DataLoader(", exact=False).first).to_be_visible()
            expect(page.get_by_role("heading", name="Machines")).to_be_visible()
            note_png = tmp_path / "dashboard.png"
            page.screenshot(path=str(note_png), full_page=True)

            page.goto(f"{base}/dashboard/studies/1/trials")
            for number in range(4):
                expect(page.get_by_text(f"Trial {number}", exact=True).first).to_be_visible()
            expect(page.get_by_text("data_wait_fraction").first).to_be_visible()
            expect(page.get_by_text("baseline").first).to_be_visible()
            expect(page.get_by_text("pytorch-default").first).to_be_visible()

            page.goto(f"{base}/dashboard/studies/2/trials")
            expect(page.get_by_text("bottleneck").first).to_be_visible()
            expect(page.get_by_text("telemetry.csv").first).to_be_visible()
            expect(page.get_by_text("steps.csv").first).to_be_visible()
            trial_png = tmp_path / "dashboard-trial.png"
            page.screenshot(path=str(trial_png))
            # The CSV opens in the trial view: its first column headers are on the page.
            card = page.get_by_text("telemetry.csv", exact=True).first.locator("..")
            card.get_by_role("button").first.click()
            expect(page.get_by_text("iowait_percent").first).to_be_visible()
            expect(page.get_by_text("available_memory_bytes").first).to_be_visible()
            page.screenshot(path=str(tmp_path / "dashboard-csv.png"))
        finally:
            browser.close()
    shutil.copy(note_png, "/tmp/dashboard.png")
    shutil.copy(trial_png, "/tmp/dashboard-trial.png")
    shutil.copy(tmp_path / "dashboard-csv.png", "/tmp/dashboard-csv.png")


def _dashboard_here(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``tuner.dashboard`` in this process, for the ways it refuses to start."""
    with pytest.raises(SystemExit) as exited:
        run_main("tuner.dashboard", main, list(argv))
    return int(exited.value.code or 0), capsys.readouterr().err


def test_bad_storage_or_port_is_one_line(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _dashboard_here(capsys, "--storage", f"sqlite:///{tmp_path / 'absent.db'}")
    assert code == 1 and "no database at" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "absent.db").exists()
    code, err = _dashboard_here(capsys, "--storage", "nosuchdb://user:secret@host/db")
    assert code == 2 and "cannot open storage" in err and "secret" not in err
    assert len(err.strip().splitlines()) == 1
    optuna.create_study(storage=sqlite_url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, err = _dashboard_here(capsys, "--storage", sqlite_url, "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err
    code, err = _dashboard_here(capsys, "--storage", sqlite_url, "--port", "70000")
    assert code == 2 and "--port" in err
