from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def image_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session, so the JPEGs are generated once, as across trials."""
    return tmp_path_factory.mktemp("image-cache")


@pytest.fixture(autouse=True)
def _cache_dir_env(image_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(image_cache_dir))
