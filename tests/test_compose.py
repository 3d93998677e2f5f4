"""docker-compose.yml and the Dockerfile: no engine runs here, so check what compose would read."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_volume() -> None:
    compose = _compose()
    assert set(compose["services"]) == {"postgres", "dashboard", "worker"}
    assert "tuner-db" in compose["volumes"]
    assert any(v.startswith("tuner-db:") for v in compose["services"]["postgres"]["volumes"])


def test_only_loopback_is_published() -> None:
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    assert "ports" not in _compose()["services"]["postgres"]


def test_workers_scale_and_share_the_storage() -> None:
    services = _compose()["services"]
    worker = services["worker"]
    assert "container_name" not in worker  # --scale worker=3 needs unnamed containers
    assert (
        worker["environment"]["TUNER_STORAGE"]
        == services["dashboard"]["environment"]["TUNER_STORAGE"]
    )
    assert worker["environment"]["TUNER_STORAGE"].startswith("postgresql+psycopg://")
    assert "--total-trials" in worker["command"]
    assert worker["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_dockerfile_installs_the_project() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install" in dockerfile and "tuner.study" in dockerfile
    assert "USER tuner" in dockerfile
