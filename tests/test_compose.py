"""docker-compose.yml and the Dockerfile: no engine runs here, so check what compose would read."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


SERVERS = {"postgres": "tuner-db", "mariadb": "tuner-mariadb"}
"""Each database server the compose file offers, under its own profile, with its volume."""


def test_services_and_volumes() -> None:
    compose = _compose()
    assert set(compose["services"]) == {*SERVERS, "dashboard", "worker"}
    for server, volume in SERVERS.items():
        service = compose["services"][server]
        assert service["profiles"] == [server]
        assert volume in compose["volumes"]
        assert any(v.startswith(f"{volume}:") for v in service["volumes"])
        assert "healthcheck" in service


def test_only_loopback_is_published() -> None:
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    for server in SERVERS:
        assert "ports" not in _compose()["services"][server]


def test_workers_scale_and_share_the_storage() -> None:
    services = _compose()["services"]
    worker = services["worker"]
    assert "container_name" not in worker  # --scale worker=3 needs unnamed containers
    storage = worker["environment"]["TUNER_STORAGE"]
    assert storage == services["dashboard"]["environment"]["TUNER_STORAGE"]
    # TUNER_STORAGE picks the server; PostgreSQL's URL is the default.
    assert storage.startswith("${TUNER_STORAGE:-postgresql+psycopg://")
    assert "--total-trials" in worker["command"]
    for service in (worker, services["dashboard"]):
        for server in SERVERS:
            # Waits for whichever server's profile is on; the other is not required.
            dependency = service["depends_on"][server]
            assert dependency == {"condition": "service_healthy", "required": False}


def test_the_mariadb_url_in_the_header_names_its_service() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    mariadb = _compose()["services"]["mariadb"]["environment"]
    assert f"mysql://{mariadb['MARIADB_USER']}:tuner@mariadb:3306/" in text
    assert mariadb["MARIADB_DATABASE"] == "tuner"


def test_dockerfile_installs_the_project() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install" in dockerfile and "tuner.study" in dockerfile
    assert "mysql" in dockerfile  # the driver for a MariaDB fleet
    assert "USER tuner" in dockerfile
