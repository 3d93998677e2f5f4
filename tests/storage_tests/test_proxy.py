"""The gRPC storage proxy for large fleets, served for real and used by a real study."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import ROOT, free_port, run_cli, study_cli

pytest.importorskip("grpc")


def test_a_study_through_the_grpc_proxy(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'fleet.db'}"
    port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "storage.proxy", "--storage", database, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        objective = "tests.tuner_tests.workloads:fast"
        result = study_cli(
            f"grpc://127.0.0.1:{port}",
            objective,
            "--n-trials",
            "3",
            "--remeasure-top",
            "0",
        )
        assert result.returncode == 0, result.stderr
    finally:
        proxy.terminate()
        proxy.wait(10)
    summaries = optuna.get_all_study_summaries(database)
    assert len(summaries) == 1 and summaries[0].n_trials == 3


def test_the_proxy_refuses_a_bad_storage(tmp_path: Path) -> None:
    result = run_cli("storage.proxy", "--storage", "nonsense")
    assert result.returncode == 2 and "not a storage URL" in result.stderr
