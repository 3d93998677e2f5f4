from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def image_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session, so the generated JPEGs are made once, as across trials."""
    return tmp_path_factory.mktemp("image-cache")


@pytest.fixture(autouse=True)
def _cache_dir_env(image_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(image_cache_dir))
    yield
