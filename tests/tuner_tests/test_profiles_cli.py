from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tuner.machine import auto_profile_name, detect_fingerprint


def test_detect_names_this_machine() -> None:
    result = run_cli("tuner.profiles", "detect", "--format", "json")
    assert result.returncode == 0, result.stderr
    detected = json.loads(result.stdout)
    fingerprint = detect_fingerprint()
    assert detected["auto"] == auto_profile_name(fingerprint)
    assert detected["fingerprint"]["logical_cpus"] == fingerprint.logical_cpus
    assert "g4dn.xlarge" not in detected["matches"]  # this 2-core box is no g4dn.xlarge


def test_list_and_show_without_a_database_create_nothing(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    listed = run_cli("tuner.profiles", "list", "--storage", storage)
    assert listed.returncode == 0, listed.stderr
    for name in (
        "g4dn.xlarge",
        "g4dn.2xlarge",
        "g5.xlarge",
        "p3.2xlarge",
        "p4d.24xlarge",
        "g6.xlarge",
    ):
        assert name in listed.stdout
    shown = run_cli(
        "tuner.profiles", "show", "g4dn.xlarge", "--storage", storage, "--format", "json"
    )
    profile = json.loads(shown.stdout)["profile"]
    assert (profile["vcpus"], profile["gpu_count"], profile["gpu_model"]) == (4, 1, "t4")
    assert not (tmp_path / "none.db").exists()


def test_unknown_profile_and_bad_catalog_are_usage_errors(tmp_path: Path) -> None:
    unknown = run_cli(
        "tuner.profiles", "show", "nope", "--storage", f"sqlite:///{tmp_path / 'x.db'}"
    )
    assert unknown.returncode == 2 and "g4dn.xlarge" in unknown.stderr
    catalog = tmp_path / "bad.json"
    catalog.write_text("{not json")
    bad = run_cli("tuner.profiles", "list", "--profiles", str(catalog))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
